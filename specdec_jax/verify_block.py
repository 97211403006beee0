"""Block verification (Sun et al., *Optimal Block-Level Draft Verification*;
ALGORITHMS.md §3): one decision for the whole draft block instead of a
token-by-token accept loop, keeping the output distributed exactly as the
target while accepting more tokens in expectation.

Stateless forward form (the default, ``BlockVerifier``). With drafts
``X_1 .. X_G``, drafter conditionals ``q_i`` and target conditionals ``p_i``
(``p`` may be any target distribution ``pi = T(q, p)``: block-verified
cascades come for free):

    w_0 = 1,   w_i = min(1, w_{i-1} p_i(X_i) / q_i(X_i))             (log space)
    S_i = sum_x (w_i p_{i+1}(x) - q_{i+1}(x))_+                       i < G
    h_i = S_i / (S_i + 1 - w_i)   (i < G, 0/0 -> 1),    h_G = w_G
    eta_i ~ U(0, 1) independently;   tau = max({0} u {i : eta_i <= h_i})
    next token y ~ bonus                               if tau = G
               y ~ norm((w_tau p_{tau+1} - q_{tau+1})_+)  otherwise

Worked example (G = 3): h = [0.9, 0.2, 0.6], eta = [0.5, 0.7, 0.4] ->
eta_i <= h_i at i = 1 and i = 3 -> tau = 3: all drafts kept, y from the bonus.
Unlike token verification, a rejection at i = 2 does not end the block:
acceptance looks at the *last* index that passes.

For G = 1 this is token verification: h_1 = w_1 = min(1, p/q) and the
residual is norm((p - q)_+).

``SeedBlockVerifier`` (the seed's Alg. 3 with carried residual state) is not
implemented yet; ``get_verifier("block-seed")`` raises a clear error.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specdec_jax.verify import VerifyOutput, correction_or_bonus, gather_token_probs, residual

Array = jax.Array

# Ratios are taken in log space; probabilities below this floor count as 0.
_LOG_FLOOR = -1e30


def block_weights(drafts_BxG: Array, q_BxGxV: Array, pi_BxGxV: Array) -> tuple[Array, Array]:
    """Returns (w, h), both float32 [B, G + 1], index i = prefix length.

    ``w[:, i]`` is the clipped joint ratio ``w_i`` (``w[:, 0] = 1``);
    ``h[:, i]`` the probability of keeping the prefix of length ``i``
    (``h[:, 0] = 1``: the empty prefix is always a fallback).
    """
    g = drafts_BxG.shape[1]
    log_q = jnp.log(gather_token_probs(q_BxGxV, drafts_BxG))
    log_pi = jnp.log(jnp.maximum(gather_token_probs(pi_BxGxV, drafts_BxG), 0.0))
    log_ratio_BxG = jnp.maximum(log_pi - log_q, _LOG_FLOOR)
    log_w = [jnp.zeros(drafts_BxG.shape[:1], jnp.float32)]
    for i in range(g):  # G is static and small: a clipped running sum
        log_w.append(jnp.minimum(0.0, log_w[-1] + log_ratio_BxG[:, i]))
    w_BxG1 = jnp.exp(jnp.stack(log_w, axis=1))
    # S_i for i = 1 .. G-1 uses the conditionals at position i + 1.
    s_BxGm1 = jnp.sum(jnp.maximum(w_BxG1[:, 1:g, None] * pi_BxGxV[:, 1:] - q_BxGxV[:, 1:],
                                  0.0), axis=-1)
    denom = s_BxGm1 + 1.0 - w_BxG1[:, 1:g]
    h_inner = jnp.where(denom > 0, s_BxGm1 / jnp.where(denom > 0, denom, 1.0), 1.0)
    ones_B1 = jnp.ones_like(w_BxG1[:, :1])
    h_BxG1 = jnp.concatenate([ones_B1, jnp.minimum(h_inner, 1.0), w_BxG1[:, g:]], axis=1)
    return w_BxG1, h_BxG1


@dataclasses.dataclass(frozen=True)
class BlockVerifier:
    """Stateless block verification (see module docstring)."""

    name: str = "block"

    def init_state(self, batch_size: int) -> None:
        del batch_size
        return None

    def __call__(self, key: Array, drafts_BxG: Array, q_BxGxV: Array, pi_BxGxV: Array,
                 bonus_BxV: Array, state: Any = None) -> VerifyOutput:
        accept_key, sample_key = jax.random.split(key)
        g = drafts_BxG.shape[1]
        w_BxG1, h_BxG1 = block_weights(drafts_BxG, q_BxGxV, pi_BxGxV)
        eta_BxG = jax.random.uniform(accept_key, drafts_BxG.shape)
        passes_BxG = eta_BxG <= h_BxG1[:, 1:]
        tau_B = jnp.max(jnp.where(passes_BxG, jnp.arange(1, g + 1)[None, :], 0), axis=-1)
        w_tau_B1 = jnp.take_along_axis(w_BxG1, tau_B[:, None], axis=1)
        next_B = correction_or_bonus(
            sample_key, tau_B, q_BxGxV, pi_BxGxV, bonus_BxV,
            weights_fn=lambda pi_BxV, q_BxV: residual(w_tau_B1 * pi_BxV, q_BxV))
        return VerifyOutput(num_accepted=tau_B.astype(jnp.int32), next_token=next_B,
                            state=state)
