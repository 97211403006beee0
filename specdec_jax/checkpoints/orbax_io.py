"""Orbax save/restore of parameter trees (training checkpoints, converted weights).

Converting a GGUF file costs a dequantisation pass; saving the converted tree
with orbax makes later loads a plain array read, sharded if a target
sharding is given.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax


def save_params(path: os.PathLike, params: Any) -> pathlib.Path:
    """Writes ``params`` to a new orbax checkpoint directory at ``path``."""
    import orbax.checkpoint as ocp  # noqa: PLC0415

    path = pathlib.Path(path).absolute()
    if path.exists():
        raise FileExistsError(f"{path} exists; orbax never overwrites a checkpoint. Choose a "
                              "new directory or delete the old one.")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, params)
    return path


def restore_params(path: os.PathLike, like: Any | None = None) -> Any:
    """Reads a checkpoint written by :func:`save_params`, by any number of
    processes on any mesh.

    ``like`` (a tree of arrays or ``jax.ShapeDtypeStruct`` with shardings,
    e.g. ``sharding.abstract_params``) fixes dtypes, shapes and placement and
    is checked against the file; each process reads only the shards its
    devices hold. Without it, the whole tree lands on this process's first
    device (whatever layout it was saved from).
    """
    import orbax.checkpoint as ocp  # noqa: PLC0415

    path = pathlib.Path(path).absolute()
    if not path.exists():
        raise FileNotFoundError(f"no orbax checkpoint at {path}.")
    with ocp.StandardCheckpointer() as checkpointer:
        if like is None:  # the stored shapes and dtypes, placed on one local device
            device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            like = jax.tree_util.tree_map(
                lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                checkpointer.metadata(path).item_metadata.tree)
        abstract = jax.tree_util.tree_map(
            lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else
            jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), like)
        return checkpointer.restore(path, abstract)
