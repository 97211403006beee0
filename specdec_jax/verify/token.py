"""Token-level verification with a generic target distribution (docs/algorithms.md,
'Token verification').

One round drafted ``G`` tokens ``x_1 .. x_G`` from the drafter, whose
(processed) next-token distributions were ``q_1 .. q_G``. The target function
gave ``pi_1 .. pi_G`` at the same positions and a bonus distribution for
position ``G + 1``. Token verification (``GenSpecSample``) is:

    a_j ~ Bernoulli(min(1, pi_j(x_j) / q_j(x_j)))          j = 1 .. G
    j*  = number of leading accepts (0 .. G)
    y   ~ norm((pi_{j*+1} - q_{j*+1})_+)   if j* < G       ("residual")
    y   ~ bonus                            if j* = G

For ``pi = p`` the emitted sequence is distributed exactly as sampling from
``p``; for a normalised cascade target ``pi`` each emitted token follows
``pi`` at its position. ``pi`` of the Lossy target is not normalised; the
kernel uses it as given, which is exactly the Lossy procedure.

Worked example (G = 3): accepts a = [1, 0, 1] -> j* = 1 (acceptance stops at
the first reject); the round emits x_1 and y ~ norm((pi_2 - q_2)_+): 2 tokens.
With a = [1, 1, 1], it emits x_1 x_2 x_3 and y ~ bonus: 4 tokens.

Greedy decoding passes one-hot ``q`` and ``pi``: acceptance is then 0 or 1
and the residual is the one-hot of ``argmax pi``, so the same kernel serves
both without a separate code path.

Every verifier is a frozen dataclass (hashable, a static argument) with

    init_state(batch_size) -> state              (carried across rounds)
    __call__(key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state, count_B=None)
        -> VerifyOutput(num_accepted_B, next_token_B, state)

Ragged blocks (adaptive draft lengths, SpecDec++): with ``count_B`` row ``b``
offers only ``d_1 .. d_{count[b]}`` (slots past it are scratch) and
``bonus[b]`` is the law at position ``count[b] + 1``. Verification is then
exactly the verification of that row's shorter block: acceptance stops at
``count`` at the latest, and a row that accepts all it offered draws the
bonus, not a residual. Because where a row stops drafting depends only on the
drafter's side, the output law stays the target's (docs/algorithms.md, 'Adaptive
drafting (SpecDec++)').
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.sampling import sample_from_weights

Array = jax.Array

# Residual mass below this is numerical noise (float32 sums of ~1e5 terms);
# such a residual is replaced by pi itself (docs/algorithms.md, 'Token verification').
RESIDUAL_EPS = 1e-9


@flax.struct.dataclass
class VerifyOutput:
    num_accepted: Array  # int32 [B]: leading draft tokens accepted (0 .. G)
    next_token: Array  # int32 [B]: the correction or bonus token emitted after them
    state: Any  # verifier state carried to the next round (None when stateless)


def gather_token_probs(probs_BxGxV: Array, tokens_BxG: Array) -> Array:
    """[B, G, V], [B, G] -> [B, G]: probability each distribution gives its token."""
    return jnp.take_along_axis(probs_BxGxV, tokens_BxG[..., None], axis=-1)[..., 0]


def residual(pi_BxV: Array, q_BxV: Array) -> Array:
    """(pi - q)_+, falling back to pi where that has (numerically) no mass."""
    res = jnp.maximum(pi_BxV - q_BxV, 0.0)
    empty_B1 = jnp.sum(res, axis=-1, keepdims=True) <= RESIDUAL_EPS
    return jnp.where(empty_B1, jnp.maximum(pi_BxV, 0.0), res)


def leading_accepts(accept_BxG: Array) -> Array:
    """bool [B, G] -> int32 [B]: length of the all-True prefix of each row.

    [[1, 1, 0, 1]] -> [2]; [[0, 1, 1, 1]] -> [0]; [[1, 1, 1, 1]] -> [4].
    """
    return jnp.sum(jnp.cumprod(accept_BxG.astype(jnp.int32), axis=-1), axis=-1)


def emitted_tokens(drafts_BxG: Array, num_accepted_B: Array, next_token_B: Array) -> Array:
    """int32 [B, G + 1]: the accepted drafts, then the new token at index j.

    drafts [[a, b, c]], j = [1], y = [z] -> [[a, z, c, z]] (slots past j are scratch).
    """
    g = drafts_BxG.shape[1]
    tokens = jnp.concatenate([drafts_BxG, next_token_B[:, None]], axis=1)
    return jnp.where(jnp.arange(g + 1)[None, :] == num_accepted_B[:, None],
                     next_token_B[:, None], tokens)


def block_lengths(drafts_BxG: Array, count_B: Array | None) -> Array:
    """int32 [B]: drafts each row offers (all ``G`` unless ``count`` says fewer)."""
    g = drafts_BxG.shape[1]
    full_B = jnp.full(drafts_BxG.shape[:1], g, jnp.int32)
    return full_B if count_B is None else jnp.clip(count_B.astype(jnp.int32), 0, g)


def correction_or_bonus(key: Array, num_accepted_B: Array, q_BxGxV: Array, pi_BxGxV: Array,
                        bonus_BxV: Array, weights_fn=residual,
                        count_B: Array | None = None) -> Array:
    """Samples the token emitted after ``num_accepted`` drafts.

    Row b draws from ``weights_fn(pi[b, j], q[b, j])`` at ``j = num_accepted[b]``
    when ``j`` is below the drafts it offered (``count[b]``, default ``G``),
    else from ``bonus[b]``.
    """
    g = q_BxGxV.shape[1]
    offered_B = block_lengths(q_BxGxV[..., 0], count_B)
    index_B = jnp.clip(num_accepted_B, 0, max(g - 1, 0))
    pick = lambda x_BxGxV: jnp.take_along_axis(x_BxGxV, index_B[:, None, None], axis=1)[:, 0]
    weights_BxV = weights_fn(pick(pi_BxGxV), pick(q_BxGxV))
    weights_BxV = jnp.where((num_accepted_B >= offered_B)[:, None], bonus_BxV, weights_BxV)
    return sample_from_weights(key, weights_BxV)


@dataclasses.dataclass(frozen=True)
class StatelessVerifier:
    """Base of verifiers that carry nothing from one round to the next.

    Both kinds of test here draw one uniform per draft (token verification
    compares ``u_i q_i(x_i) < pi_i(x_i)``, block verification ``eta_i <= h_i``),
    so ``__call__`` draws them, with one key, and a second key for the token
    emitted after the accepted drafts; a subclass's ``decide`` turns them into
    ``(num_accepted_B, next_token_B)``. The state passes through untouched."""

    def init_state(self, batch_size: int) -> None:
        del batch_size
        return None

    def __call__(self, key: Array, drafts_BxG: Array, q_BxGxV: Array, pi_BxGxV: Array,
                 bonus_BxV: Array, state: Any = None,
                 count_B: Array | None = None) -> VerifyOutput:
        accept_key, sample_key = jax.random.split(key)
        u_BxG = jax.random.uniform(accept_key, drafts_BxG.shape)
        num_accepted_B, next_token_B = self.decide(u_BxG, sample_key, drafts_BxG, q_BxGxV,
                                                   pi_BxGxV, bonus_BxV, count_B)
        return VerifyOutput(num_accepted=num_accepted_B, next_token=next_token_B, state=state)


@dataclasses.dataclass(frozen=True)
class TokenVerifier(StatelessVerifier):
    """Token-by-token verification (Leviathan et al.; SpecCascade Alg. 4)."""

    name: str = "token"

    def decide(self, u_BxG: Array, sample_key: Array, drafts_BxG: Array, q_BxGxV: Array,
               pi_BxGxV: Array, bonus_BxV: Array, count_B: Array | None
               ) -> tuple[Array, Array]:
        q_tok_BxG = gather_token_probs(q_BxGxV, drafts_BxG)
        pi_tok_BxG = gather_token_probs(pi_BxGxV, drafts_BxG)
        # Accept iff u < pi/q, i.e. u * q < pi (no division: q(x) > 0 for a drawn x).
        num_accepted_B = jnp.minimum(leading_accepts(u_BxG * q_tok_BxG < pi_tok_BxG),
                                     block_lengths(drafts_BxG, count_B))
        return num_accepted_B, correction_or_bonus(sample_key, num_accepted_B, q_BxGxV,
                                                   pi_BxGxV, bonus_BxV, count_B=count_B)
