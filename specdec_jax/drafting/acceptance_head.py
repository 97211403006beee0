"""The acceptance prediction head of SpecDec++ (Huang et al., §4; docs/algorithms.md,
'Adaptive drafting (SpecDec++)').

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
``checkpoints.acceptance_head_io.load_head`` refuses another drafter.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

MAX_DEPTH = 4


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    hidden_size: int  # the drafter's hidden size D_model
    depth: int = 3  # D residual layers (SpecDec++ recommends 3); 0 = logistic regression

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
