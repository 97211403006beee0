"""The acceptance prediction head of SpecDec++ (seed 004 §4; ALGORITHMS.md §6).

``f``: a ``(D + 1)``-layer residual MLP on the drafter's final hidden state
``e_i`` at a candidate token ``Y_i`` (the forward pass that feeds ``Y_i`` and
yields ``q_{i+1}``)::

    x_0 = e_i;   x_k = x_{k-1} + SiLU(W_k x_{k-1} + b_k)   k = 1 .. D
    f(e_i) = w^T x_D + b      (a logit; sigmoid(f) predicts P(Y_i accepted | Y_<i accepted))

No weights are shared between layers. ``D = 0`` is logistic regression on
the hidden state. The output layer starts at zero weights, so an untrained
head predicts sigmoid(b) for every token: the "constant predictor" a trained
head must beat.

A head only means something for the drafter whose features it read, so it is
saved with that drafter's name and a fingerprint of its parameters, and
``load_head`` refuses another drafter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints.tree_paths import params_fingerprint
from specdec_jax.models.layers import IN_OUT

META_FILE = "head.json"
PARAMS_DIR = "params"
MAX_DEPTH = 4


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    hidden_size: int  # the drafter's hidden size D_model
    depth: int = 3  # D residual layers (seed 004 recommends 3); 0 = logistic regression

    def __post_init__(self):
        if not 0 <= self.depth <= MAX_DEPTH:
            raise ValueError(f"acceptance head depth D must be in 0..{MAX_DEPTH} (the seed "
                             f"tries 0-4), got {self.depth}.")
        if self.hidden_size < 1:
            raise ValueError(f"hidden_size must be >= 1, got {self.hidden_size}.")


class _Net(nn.Module):
    depth: int

    @nn.compact
    def __call__(self, hidden_xD):
        x = hidden_xD.astype(jnp.float32)
        for k in range(self.depth):
            x = x + nn.silu(nn.Dense(x.shape[-1], name=f"residual_{k}")(x))
        return nn.Dense(1, kernel_init=nn.initializers.zeros, name="output")(x)[..., 0]


@dataclasses.dataclass(frozen=True)
class AcceptanceHead:
    """Hashable (a static argument of the jitted loop); parameters live apart."""

    config: HeadConfig

    @property
    def _net(self) -> _Net:
        return _Net(depth=self.config.depth)

    def init_params(self, rng: jax.Array, prior_acceptance: float = 0.5) -> dict:
        """Random residual layers, a zero output layer with bias logit(prior)."""
        params = self._net.init(rng, jnp.zeros((1, self.config.hidden_size)))["params"]
        prior = float(np.clip(prior_acceptance, 1e-4, 1 - 1e-4))
        bias = jnp.full((1,), np.log(prior / (1 - prior)), jnp.float32)
        return {**params, "output": {**params["output"], "bias": bias}}

    def logits(self, params: dict, hidden_xD: jax.Array) -> jax.Array:
        """f(e): float32 [...] for hidden states [..., D]."""
        return self._net.apply({"params": params}, hidden_xD)

    def accept_probs(self, params: dict, hidden_xD: jax.Array) -> jax.Array:
        return jax.nn.sigmoid(self.logits(params, hidden_xD))


def save_head(path: str | os.PathLike, head: AcceptanceHead, params: dict, *,
              drafter_name: str, fingerprint: str, extra: dict | None = None
              ) -> pathlib.Path:
    """Writes ``path/head.json`` (config, the drafter's name and
    ``drafter_fingerprint(drafter_params)``, ``extra``) and ``path/params`` (orbax)."""
    from specdec_jax.checkpoints import orbax_io  # noqa: PLC0415

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
    from specdec_jax.checkpoints import orbax_io  # noqa: PLC0415

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
