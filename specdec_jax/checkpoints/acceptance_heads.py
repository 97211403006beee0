"""Saving and loading SpecDec++ acceptance heads (``drafting.acceptance_head``).

A head is a directory: ``head.json`` (its config, the drafter's name and the
fingerprint of the drafter's weights) and ``params/`` (an orbax checkpoint). A
head only means something for the drafter whose hidden states it read, so
``load_head`` refuses a head saved for another drafter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax

from specdec_jax.checkpoints import orbax_io
from specdec_jax.checkpoints.tree_paths import params_fingerprint
from specdec_jax.drafting.acceptance_head import AcceptanceHead, HeadConfig
from specdec_jax.models.layers import IN_OUT

META_FILE = "head.json"
PARAMS_DIR = "params"


def save_head(path: str | os.PathLike, head: AcceptanceHead, params: dict, *,
              drafter_name: str, fingerprint: str, extra: dict | None = None
              ) -> pathlib.Path:
    """Writes ``path/head.json`` (config, the drafter's name and
    ``drafter_fingerprint(drafter_params)``, ``extra``) and ``path/params`` (orbax)."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    orbax_io.save_params(path / PARAMS_DIR, params)
    meta = {"config": dataclasses.asdict(head.config), "drafter": drafter_name,
            "drafter_fingerprint": fingerprint, **(extra or {})}
    (path / META_FILE).write_text(json.dumps(meta, indent=1))
    return path


def drafter_fingerprint(params: Any, model: Any = None) -> str:
    """The fingerprint of a model's weights, whatever their kernel layout
    (``model``, when given, says it; see ``tree_paths.params_fingerprint``)."""
    layout = getattr(getattr(model, "config", None), "kernel_layout", IN_OUT)
    return params_fingerprint(params, layout)


def load_head(path: str | os.PathLike, *, drafter_name: str, drafter_params: Any,
              drafter: Any = None) -> tuple[AcceptanceHead, dict, dict]:
    """(head, params, metadata) of a saved head; an error if it was trained for
    another drafter (by name or by weights) or the drafter's hidden size differs.
    ``drafter`` (the model) tells the kernel layout of ``drafter_params``."""
    return load_head_for(path, drafter_name=drafter_name,
                         fingerprint=drafter_fingerprint(drafter_params, drafter))


def load_head_for(path: str | os.PathLike, *, drafter_name: str, fingerprint: str
                  ) -> tuple[AcceptanceHead, dict, dict]:
    """``load_head`` given the drafter's fingerprint (``drafter_fingerprint``,
    also stored in data manifests) instead of its params."""
    path = pathlib.Path(path)
    if not (path / META_FILE).exists():
        raise FileNotFoundError(f"{path} holds no acceptance head ({META_FILE} missing); train "
                                "one with configs/runs/specdecpp_*.gin.")
    meta = json.loads((path / META_FILE).read_text())
    if meta["drafter"] != drafter_name or meta["drafter_fingerprint"] != fingerprint:
        raise ValueError(
            f"the acceptance head at {path} was trained for drafter {meta['drafter']!r} "
            f"(weights {meta['drafter_fingerprint'][:12]}), not for {drafter_name!r} "
            f"(weights {fingerprint[:12]}): its predictions read that drafter's hidden "
            "states. Train a head for this drafter.")
    head = AcceptanceHead(HeadConfig(**meta["config"]))
    like = head.init_params(jax.random.PRNGKey(0))
    return head, orbax_io.restore_params(path / PARAMS_DIR, like), meta
