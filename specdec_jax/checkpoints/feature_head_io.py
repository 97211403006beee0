"""Saving and loading feature draft heads (``drafting.feature``).

A head is a directory: ``feature_head.json`` (its config, the target's name
and the fingerprint of the target's weights, the restricted head's token ids
if any, and whatever the trainer records) and ``params/`` (an orbax
checkpoint of the trainable ``net``). A head predicts one target's features
and scores them with that target's output head, so ``load_feature_head``
refuses another target (``fingerprinted``).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax
import numpy as np

from specdec_jax.checkpoints import fingerprinted
from specdec_jax.drafting.feature import FeatureDrafter
from specdec_jax.models import feature_head
from specdec_jax.models.feature_head import FeatureHead, FeatureHeadConfig

META_FILE = "feature_head.json"
ROLE = "target"


def target_fingerprint(target_params: Any, target: Any = None) -> str:
    """The fingerprint of the target's weights, whatever their kernel layout."""
    return fingerprinted.model_fingerprint(target_params, target)


def save_feature_head(path: str | os.PathLike, head: FeatureHead, net_params: dict, *,
                      target_name: str, fingerprint: str, token_ids=None,
                      extra: dict | None = None) -> pathlib.Path:
    """Writes ``path/feature_head.json`` and ``path/params`` (orbax)."""
    meta = {"config": head.config.to_dict(),
            "token_ids": None if token_ids is None else np.asarray(token_ids).tolist(),
            **(extra or {})}
    return fingerprinted.save(path, net_params, meta, meta_file=META_FILE, role=ROLE,
                              model_name=target_name, fingerprint=fingerprint)


def is_feature_head(path: str | os.PathLike) -> bool:
    return (pathlib.Path(path) / META_FILE).is_file()


def load_feature_head(path: str | os.PathLike, *, target_name: str, target: Any,
                      target_params: Any, name: str = "feature"
                      ) -> tuple[FeatureDrafter, dict, dict]:
    """``(drafter, drafter_params, metadata)`` for a saved head, its params
    sharing the target's embedding and output head; an error if it was
    trained for another target (by name or by weights)."""
    meta = fingerprinted.load_meta(
        path, meta_file=META_FILE, role=ROLE, model_name=target_name,
        fingerprint=target_fingerprint(target_params, target), what="feature head",
        missing_hint="train one with configs/runs/feature_head_*.gin",
        reads="it predicts that target's hidden states")
    head = FeatureHead(FeatureHeadConfig.from_dict(meta["config"]))
    net = fingerprinted.restore(path, head.init_net(jax.random.PRNGKey(0)))
    params = feature_head.drafter_params(target, target_params, net, meta.get("token_ids"))
    return FeatureDrafter(head, name=name), params, meta
