"""Saving and loading feature draft heads (``drafting.feature``).

A head is a directory: ``feature_head.json`` (its config, the target's name
and the fingerprint of the target's weights, the restricted head's token ids
if any, and whatever the trainer records) and ``params/`` (an orbax
checkpoint of the trainable ``net``). A head predicts one target's features
and scores them with that target's output head, so ``load_feature_head``
refuses another target.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import jax
import numpy as np

from specdec_jax.checkpoints import orbax_io
from specdec_jax.checkpoints.acceptance_heads import drafter_fingerprint
from specdec_jax.drafting.feature import FeatureDrafter
from specdec_jax.models import feature_head
from specdec_jax.models.feature_head import FeatureHead, FeatureHeadConfig

META_FILE = "feature_head.json"
PARAMS_DIR = "params"


def target_fingerprint(target_params: Any, target: Any = None) -> str:
    """The fingerprint of the target's weights, whatever their kernel layout."""
    return drafter_fingerprint(target_params, target)


def save_feature_head(path: str | os.PathLike, head: FeatureHead, net_params: dict, *,
                      target_name: str, fingerprint: str, token_ids=None,
                      extra: dict | None = None) -> pathlib.Path:
    """Writes ``path/feature_head.json`` and ``path/params`` (orbax)."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    orbax_io.save_params(path / PARAMS_DIR, net_params)
    meta = {"config": head.config.to_dict(), "target": target_name,
            "target_fingerprint": fingerprint,
            "token_ids": None if token_ids is None else np.asarray(token_ids).tolist(),
            **(extra or {})}
    (path / META_FILE).write_text(json.dumps(meta, indent=1))
    return path


def is_feature_head(path: str | os.PathLike) -> bool:
    return (pathlib.Path(path) / META_FILE).is_file()


def load_feature_head(path: str | os.PathLike, *, target_name: str, target: Any,
                      target_params: Any, name: str = "feature"
                      ) -> tuple[FeatureDrafter, dict, dict]:
    """``(drafter, drafter_params, metadata)`` for a saved head, its params
    sharing the target's embedding and output head; an error if it was
    trained for another target (by name or by weights)."""
    path = pathlib.Path(path)
    if not is_feature_head(path):
        raise FileNotFoundError(f"{path} holds no feature head ({META_FILE} missing); train "
                                "one with configs/runs/feature_head_*.gin.")
    meta = json.loads((path / META_FILE).read_text())
    fingerprint = target_fingerprint(target_params, target)
    if meta["target"] != target_name or meta["target_fingerprint"] != fingerprint:
        raise ValueError(
            f"the feature head at {path} was trained for target {meta['target']!r} (weights "
            f"{meta['target_fingerprint'][:12]}), not for {target_name!r} (weights "
            f"{fingerprint[:12]}): it predicts that target's hidden states. Train a head for "
            "this target.")
    head = FeatureHead(FeatureHeadConfig.from_dict(meta["config"]))
    like = head.init_net(jax.random.PRNGKey(0))
    net = orbax_io.restore_params(path / PARAMS_DIR, like)
    params = feature_head.drafter_params(target, target_params, net, meta.get("token_ids"))
    return FeatureDrafter(head, name=name), params, meta
