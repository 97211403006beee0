"""Saving and loading SpecDec++ acceptance heads (``drafting.acceptance_head``).

A head is a directory: ``head.json`` (its config, the drafter's name and the
fingerprint of the drafter's weights) and ``params/`` (an orbax checkpoint). A
head only means something for the drafter whose hidden states it read, so
``load_head`` refuses a head saved for another drafter (``fingerprinted``).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import jax

from specdec_jax.checkpoints import fingerprinted
from specdec_jax.drafting.acceptance_head import AcceptanceHead, HeadConfig

META_FILE = "head.json"
ROLE = "drafter"


def save_head(path: str | os.PathLike, head: AcceptanceHead, params: dict, *,
              drafter_name: str, fingerprint: str, extra: dict | None = None
              ) -> pathlib.Path:
    """Writes ``path/head.json`` (config, the drafter's name and
    ``drafter_fingerprint(drafter_params)``, ``extra``) and ``path/params`` (orbax)."""
    return fingerprinted.save(path, params,
                              {"config": dataclasses.asdict(head.config), **(extra or {})},
                              meta_file=META_FILE, role=ROLE, model_name=drafter_name,
                              fingerprint=fingerprint)


def drafter_fingerprint(params: Any, model: Any = None) -> str:
    """The fingerprint of a model's weights, whatever their kernel layout
    (``model``, when given, says it; see ``tree_paths.params_fingerprint``)."""
    return fingerprinted.model_fingerprint(params, model)


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
    meta = fingerprinted.load_meta(
        path, meta_file=META_FILE, role=ROLE, model_name=drafter_name, fingerprint=fingerprint,
        what="acceptance head", missing_hint="train one with configs/runs/specdecpp_*.gin",
        reads="its predictions read that drafter's hidden states")
    head = AcceptanceHead(HeadConfig(**meta["config"]))
    like = head.init_params(jax.random.PRNGKey(0))
    return head, fingerprinted.restore(path, like), meta
