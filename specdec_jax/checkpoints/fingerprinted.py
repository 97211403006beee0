"""Artifacts tied to one model's weights: a directory holding a metadata file
(the model's name and weight fingerprint, plus whatever the artifact records)
and ``params/`` (an orbax checkpoint).

A trained head reads one model's hidden states (a SpecDec++ head, its
drafter's; a feature head, its target's), so it means nothing for another
model: loading checks the name and fingerprint first and refuses a mismatch
with an error that names both models.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

from specdec_jax.checkpoints import orbax_io
from specdec_jax.checkpoints.tree_paths import params_fingerprint
from specdec_jax.models.layers import IN_OUT
from specdec_jax.runtime.jsonio import read_json, write_json

PARAMS_DIR = "params"
SHOWN_CHARS = 12  # a fingerprint is named by its first characters in errors


def model_fingerprint(params: Any, model: Any = None) -> str:
    """The fingerprint of a model's weights, whatever their kernel layout
    (``model``, when given, says it; see ``tree_paths.params_fingerprint``)."""
    layout = getattr(getattr(model, "config", None), "kernel_layout", IN_OUT)
    return params_fingerprint(params, layout)


def save(path: str | os.PathLike, params: Any, meta: dict, *, meta_file: str, role: str,
         model_name: str, fingerprint: str) -> pathlib.Path:
    """Writes ``path/params`` (orbax) and then ``path/<meta_file>``: ``meta``
    plus ``{role: model_name, f"{role}_fingerprint": fingerprint}`` (written
    last and atomically: a directory whose metadata exists is whole)."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    orbax_io.save_params(path / PARAMS_DIR, params)
    write_json(path / meta_file, {**meta, role: model_name, f"{role}_fingerprint": fingerprint})
    return path


def load_meta(path: str | os.PathLike, *, meta_file: str, role: str, model_name: str,
              fingerprint: str, what: str, missing_hint: str, reads: str) -> dict:
    """The metadata of the artifact at ``path``, made for the ``role`` model
    ``model_name`` with weights ``fingerprint``; an error if there is none
    (``missing_hint`` says how to make one) or if it was made for another
    model, by name or by weights (``reads`` says why that matters)."""
    path = pathlib.Path(path)
    if not (path / meta_file).is_file():
        raise FileNotFoundError(f"{path} holds no {what} ({meta_file} missing); "
                                f"{missing_hint}.")
    meta = read_json(path / meta_file)
    made_for, made_with = meta.get(role), str(meta.get(f"{role}_fingerprint"))
    if made_for != model_name or made_with != fingerprint:
        raise ValueError(
            f"the {what} at {path} was trained for {role} {made_for!r} (weights "
            f"{made_with[:SHOWN_CHARS]}), not for {model_name!r} (weights "
            f"{fingerprint[:SHOWN_CHARS]}): {reads}. Train a head for this {role}.")
    return meta


def restore(path: str | os.PathLike, like: Any) -> Any:
    """The params saved by ``save`` at ``path``, shaped like ``like``."""
    return orbax_io.restore_params(pathlib.Path(path) / PARAMS_DIR, like)
