"""Block verification (Sun et al., *Block Verification Accelerates Speculative Decoding*;
docs/algorithms.md, 'Block verification'): one decision for the whole draft block instead of a
token-by-token accept loop, keeping the output distributed exactly as the
target while accepting more tokens in expectation.

Inputs are those of every verifier (``verify.token``): drafts ``X_1 .. X_G``,
drafter conditionals ``q_i = q(.|X^{i-1})`` and target conditionals
``p_i`` (``i = 1 .. G``, ``pi_BxGxV``) and the bonus ``p_{G+1}``. ``p`` may be
any target distribution ``pi = T(q, p)``: block-verified cascades come for
free. Index convention of every ``[B, G + 1]`` array below: column ``i`` is
the prefix length ``i`` (``i = 0`` the empty prefix).

Stateless forward form (the default, ``BlockVerifier``, name ``block``):

    w_0 = 1,   w_i = min(1, w_{i-1} p_i(X_i) / q_i(X_i))          (log space)
    S_i = sum_x (w_i p_{i+1}(x) - q_{i+1}(x))_+                    i < G
    h_i = S_i / (S_i + 1 - w_i)   (i < G, 0/0 -> 1),    h_G = w_G
    eta_i ~ U(0, 1) independently;   tau = max({0} u {i : eta_i <= h_i})
    next token y ~ bonus                                  if tau = G
               y ~ norm((w_tau p_{tau+1} - q_{tau+1})_+)     otherwise

The clipped running product is one vectorised expression: with the prefix
log ratios ``L_i = sum_{j <= i} log(p_j(X_j) / q_j(X_j))`` (``L_0 = 0``),
``log w_i = L_i - max_{j <= i} L_j`` (a cumsum and a cummax).

Worked example (G = 3): h = [0.9, 0.2, 0.6], eta = [0.5, 0.7, 0.4] ->
eta_i <= h_i at i = 1 and i = 3 -> tau = 3: all drafts kept, y from the bonus.
Unlike token verification, a rejection at i = 2 does not end the block:
acceptance looks at the *last* index that passes.

Seed form (``SeedBlockVerifier``, name ``block-seed``; Alg. 3 of Sun et al.,
*Optimal Block-Level Draft Verification*, as published) uses
the unclipped joint ratios ``rho_i = exp(L_i)``:

    remain(k) = sum_x (rho_k p_{k+1}(x) - q_{k+1}(x))_+,
    rej(k)    = sum_x (q_{k+1}(x) - rho_k p_{k+1}(x))_+,   h(k) = remain / rej
    eta_0 <= min(1, rho_G) -> tau = G; else for i = 1 .. G: eta_i <= h(G - i)
        -> tau = G - i (h(0) = 1 stops it)
    y ~ bonus if tau = G, else y ~ norm((rho_tau p_{tau+1} - q_{tau+1})_+)

The backward search with independent uniforms is ``tau = max({0} u {k :
eta_k <= h'_k})`` with ``h'_G = min(1, rho_G)``, ``h'_k = min(1, h(k))``: the
same vectorised decision as the forward form. The seed form is exact only
with its *carried state* (``SeedBlockState`` below): after a correction at
``tau < G`` the next ``G - tau - 1`` positions (the rest of the old block)
follow residual conditionals instead of ``p``.

For G = 1 both forms are token verification: h_1 = min(1, p/q) and the
residual is norm((p - q)_+); with one-hot (greedy) q and p both reduce to
"accept while the draft is argmax p, then emit argmax p".

Numerics: float32, every product of ratios in log space, and every
``(r p - q)_+`` evaluated as ``(a p - b q)_+`` with ``a = r / max(1, r)``,
``b = 1 / max(1, r)`` (both <= 1; the normalisation and the ratio
remain/rej do not change), so an unclipped ratio of 1e40 cannot overflow.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax.verify.token import (
    RESIDUAL_EPS,
    StatelessVerifier,
    VerifyOutput,
    block_lengths,
    correction_or_bonus,
    gather_token_probs,
)

Array = jax.Array

# Log ratios are clipped to +-LOG_RATIO_CLIP: p(x) = 0 gives -1e30 ("ratio 0"),
# q(x) = 0 for an emitted correction token (e.g. outside the drafter's top-k)
# gives +1e30 ("ratio infinite"). exp() is only ever taken of values <= 0.
LOG_RATIO_CLIP = 1e30

# Draft-block lengths the seed form's state has room for (one slot per
# possible residual zone; a round with G drafts uses the first G - 1 slots).
MAX_GAMMA = 32


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------

def token_log_ratios(drafts_BxG: Array, q_BxGxV: Array, pi_BxGxV: Array) -> Array:
    """[B, G]: log(pi_i(X_i) / q_i(X_i)), clipped to +-LOG_RATIO_CLIP."""
    log_q = jnp.log(gather_token_probs(q_BxGxV, drafts_BxG))
    log_pi = jnp.log(jnp.maximum(gather_token_probs(pi_BxGxV, drafts_BxG), 0.0))
    return jnp.clip(log_pi - log_q, -LOG_RATIO_CLIP, LOG_RATIO_CLIP)


def prefix_log_ratios(log_ratio_BxG: Array) -> Array:
    """[B, G] -> [B, G + 1]: L_i = sum_{j <= i} log_ratio_j, with L_0 = 0.

    [[log 2, log 3]] -> [[0, log 2, log 6]].
    """
    zeros_B1 = jnp.zeros_like(log_ratio_BxG[:, :1])
    return jnp.concatenate([zeros_B1, jnp.cumsum(log_ratio_BxG, axis=1)], axis=1)


def scaled_difference(log_r: Array, pi_xV: Array, q_xV: Array) -> Array:
    """(r pi - q) / max(1, r) elementwise, with r = exp(log_r) broadcast over V.

    Equal to ``a pi - b q`` with ``a, b <= 1``, so it never overflows; its
    positive and negative parts keep every ratio and normalisation of
    ``(r pi - q)_+`` and ``(q - r pi)_+``.
    """
    shift = jnp.maximum(log_r, 0.0)[..., None]
    return jnp.exp(log_r[..., None] - shift) * pi_xV - jnp.exp(-shift) * q_xV


def scaled_residual(log_r: Array, pi_xV: Array, q_xV: Array) -> Array:
    """Weights proportional to (r pi - q)_+; ``pi`` itself where that has
    (numerically) no mass (docs/algorithms.md, 'Token verification')."""
    res = jnp.maximum(scaled_difference(log_r, pi_xV, q_xV), 0.0)
    empty = jnp.sum(res, axis=-1, keepdims=True) <= RESIDUAL_EPS
    return jnp.where(empty, jnp.maximum(pi_xV, 0.0), res)


def last_passing(eta_BxG: Array, h_BxG1: Array) -> Array:
    """tau = max({0} u {i in 1..G : eta_i <= h_i}) as int32 [B].

    eta = [[0.5, 0.7, 0.4]], h = [[1, 0.9, 0.2, 0.6]] -> [3].
    """
    g = eta_BxG.shape[1]
    passes_BxG = eta_BxG <= h_BxG1[:, 1:]
    return jnp.max(jnp.where(passes_BxG, jnp.arange(1, g + 1)[None, :], 0),
                   axis=-1).astype(jnp.int32)


def _next_token(key: Array, tau_B: Array, log_scale_BxG1: Array, q_BxGxV: Array,
                pi_BxGxV: Array, bonus_BxV: Array, count_B: Array | None = None) -> Array:
    """y ~ bonus if tau = G (the row's count), else norm((r_tau pi_{tau+1} - q_{tau+1})_+)."""
    log_r_B = jnp.take_along_axis(log_scale_BxG1, tau_B[:, None], axis=1)[:, 0]
    return correction_or_bonus(
        key, tau_B, q_BxGxV, pi_BxGxV, bonus_BxV,
        weights_fn=lambda pi_BxV, q_BxV: scaled_residual(log_r_B, pi_BxV, q_BxV),
        count_B=count_B)


# ---------------------------------------------------------------------------
# Stateless forward form
# ---------------------------------------------------------------------------

def block_weights(drafts_BxG: Array, q_BxGxV: Array, pi_BxGxV: Array,
                  count_B: Array | None = None) -> tuple[Array, Array]:
    """Forward form. Returns (w, h), both float32 [B, G + 1], index i = prefix length.

    ``w[:, i]`` is the clipped joint ratio ``w_i`` (``w[:, 0] = 1``);
    ``h[:, i]`` the probability of keeping the prefix of length ``i``
    (``h[:, 0] = 1``: the empty prefix is always a fallback). A row that
    offers only ``n = count[b]`` drafts is a block of length ``n``: ``h_n =
    w_n`` and ``h_i = 0`` past it (the recursion up to ``n`` only reads
    positions ``<= n``, so it is that block's own).

    Example: ratios p/q = [2, 0.25, 4] -> L = [0, log 2, log 0.5, log 2],
    cummax L = [0, log 2, log 2, log 2] -> w = [1, 1, 0.25, 1].
    """
    g = drafts_BxG.shape[1]
    log_rho_BxG1 = prefix_log_ratios(token_log_ratios(drafts_BxG, q_BxGxV, pi_BxGxV))
    log_w_BxG1 = log_rho_BxG1 - jax.lax.cummax(log_rho_BxG1, axis=1)
    w_BxG1 = jnp.exp(log_w_BxG1)
    # S_i for i = 1 .. G-1 uses the conditionals at position i + 1.
    s_BxGm1 = jnp.sum(jnp.maximum(w_BxG1[:, 1:g, None] * pi_BxGxV[:, 1:] - q_BxGxV[:, 1:],
                                  0.0), axis=-1)
    denom = s_BxGm1 + 1.0 - w_BxG1[:, 1:g]
    h_inner = jnp.where(denom > 0, s_BxGm1 / jnp.where(denom > 0, denom, 1.0), 1.0)
    ones_B1 = jnp.ones_like(w_BxG1[:, :1])
    h_BxG1 = jnp.concatenate([ones_B1, jnp.minimum(h_inner, 1.0), w_BxG1[:, g:]], axis=1)
    if count_B is not None:
        prefix_G1 = jnp.arange(g + 1)[None, :]
        n_B1 = block_lengths(drafts_BxG, count_B)[:, None]
        h_BxG1 = jnp.where(prefix_G1 < n_B1, h_BxG1,
                           jnp.where(prefix_G1 == n_B1, w_BxG1, 0.0))
    return w_BxG1, h_BxG1


@dataclasses.dataclass(frozen=True)
class BlockVerifier(StatelessVerifier):
    """Stateless block verification (module docstring): one decision for the
    block, ``tau`` = the last prefix length ``i`` whose test ``eta_i <= h_i``
    passes (0 when none does)."""

    name: str = "block"

    def decide(self, eta_BxG: Array, sample_key: Array, drafts_BxG: Array, q_BxGxV: Array,
               pi_BxGxV: Array, bonus_BxV: Array, count_B: Array | None
               ) -> tuple[Array, Array]:
        w_BxG1, h_BxG1 = block_weights(drafts_BxG, q_BxGxV, pi_BxGxV, count_B)
        tau_B = last_passing(eta_BxG, h_BxG1)
        return tau_B, _next_token(sample_key, tau_B, jnp.log(w_BxG1), q_BxGxV, pi_BxGxV,
                                  bonus_BxV, count_B)


# ---------------------------------------------------------------------------
# Seed form with carried residual zones
# ---------------------------------------------------------------------------

@flax.struct.dataclass
class SeedBlockState:
    """Live residual zones of the seed form, carried between rounds.

    A correction at ``tau < G - 1`` in some round opens a *zone*: the
    ``G - tau - 1`` positions after the correction token, up to the end of that
    round's block. There the paper's ``M_b,next`` replaces the verifier
    conditional ``v`` that round used by its residual

        v_res(x | prefix) = norm((R v(x | prefix) - q(x | prefix))_+),
        R = M_v(prefix) / M_q(prefix)

    (joint probabilities of the emitted tokens since the zone's block start,
    zone-round verifier over drafter; updated token by token, the tokens of
    later rounds included, always with the zone-round verifier ``v`` at that
    position). A round that starts inside a zone and corrects inside it opens
    a new zone on top: its ``v`` is the carried conditional of the older zone
    where that one still covers, ``p`` beyond. Zones end in creation order
    (each ends with its own block, and blocks start later and later), so at
    the start of a round zone ``s`` covers exactly the round's first ``s + 1``
    positions, at most ``G - 1`` zones are live, and slot ``s`` = "zone
    covering ``s + 1`` positions" is also the stacking order (older = lower
    slot = applied first). Fields, ``Z = MAX_GAMMA`` slots (a round with
    ``G`` drafts uses slots ``0 .. G - 2``):

        live:      bool    [B, Z]  slot s holds a zone covering the next s + 1
                                   positions
        log_ratio: float32 [B, Z]  log R of that zone for the round's first
                                   position (the prefix emitted so far)

    Worked example (G = 4). Round 1 (no zone) corrects at tau = 1: it emits
    X_1 and y at block position 2; its block positions 3, 4 become a zone,
    i.e. the next round's positions 1, 2: slot 1, log R = log rho_1 +
    log(p_2(y) / q_2(y)). Round 2: positions 1, 2 verify against
    v_j = norm((R_j p_j - q_j)_+), R_1 = R, R_2 = R p_1(X'_1) / q_1(X'_1).
    It corrects at tau' = 0 with y' (one token emitted): the old zone keeps
    one position (slot 0) and log R += log(p_1(y') / q_1(y')); a new zone
    covers round 2's positions 2 .. 4 = round 3's positions 1 .. 3 (slot 2),
    log R = 0 + log(v_1(y') / q_1(y')). Round 3: position 1 chains
    p -> slot 0 -> slot 2, positions 2, 3 use p -> slot 2, position 4 is p.
    Slot 2's running R is updated with the chained conditional below it
    (slot 0's residual at position 1, p at positions 2, 3).
    """

    live: Array  # bool [B, Z]
    log_ratio: Array  # float32 [B, Z]


def carried_conditionals(state: SeedBlockState, drafts_BxG: Array, q_BxGxV: Array,
                         pi_BxGxV: Array) -> tuple[Array, Array]:
    """The round's verifier conditionals under the live zones.

    Returns ``v_BxGxV`` (``pi`` transformed zone by zone, oldest first, where
    a zone covers) and ``log_r_BxSxG`` (``S = G - 1``): ``log R`` of zone slot
    ``s`` at each position ``j`` of the block (for the drafted prefix
    ``X^{j-1}``; defined for ``j <= s + 1``, 0 elsewhere).
    """
    batch, g = drafts_BxG.shape
    v_BxGxV = pi_BxGxV
    log_r_rows = []
    for s in range(g - 1):  # static: zone slot s covers positions 0 .. s (0-indexed)
        n = s + 1
        below_BxNxV = v_BxGxV[:, :n]
        log_ratio_BxN = token_log_ratios(drafts_BxG[:, :n], q_BxGxV[:, :n], below_BxNxV)
        log_r_BxN = state.log_ratio[:, s, None] + prefix_log_ratios(log_ratio_BxN)[:, :n]
        residual_BxNxV = scaled_residual(log_r_BxN, below_BxNxV, q_BxGxV[:, :n])
        residual_BxNxV = residual_BxNxV / jnp.sum(residual_BxNxV, axis=-1, keepdims=True)
        covered_BxNx1 = state.live[:, s, None, None]
        v_BxGxV = v_BxGxV.at[:, :n].set(jnp.where(covered_BxNx1, residual_BxNxV,
                                                  below_BxNxV))
        log_r_rows.append(jnp.pad(log_r_BxN, ((0, 0), (0, g - n))))
    if not log_r_rows:
        return v_BxGxV, jnp.zeros((batch, 0, g), jnp.float32)
    return v_BxGxV, jnp.stack(log_r_rows, axis=1)


def seed_block_weights(drafts_BxG: Array, q_BxGxV: Array, v_BxGxV: Array
                       ) -> tuple[Array, Array]:
    """Seed form against verifier conditionals ``v``. Returns (log_rho, h),
    float32 [B, G + 1], index k = prefix length: ``h[:, k] = min(1,
    remain(k) / rej(k))`` for ``0 < k < G`` (0/0 -> 1), ``h[:, G] = min(1,
    rho_G)``, ``h[:, 0] = 1``.

    Example (V = 2, G = 2): q_2 = [0.5, 0.5], v_2 = [0.8, 0.2], rho_1 = 0.5:
    remain(1) = (0.4 - 0.5)_+ + (0.1 - 0.5)_+ = 0 -> h(1) = 0 (every
    continuation of X_1 is already over-drafted: never stop at X_1).
    """
    g = drafts_BxG.shape[1]
    log_rho_BxG1 = prefix_log_ratios(token_log_ratios(drafts_BxG, q_BxGxV, v_BxGxV))
    diff_BxGm1xV = scaled_difference(log_rho_BxG1[:, 1:g], v_BxGxV[:, 1:], q_BxGxV[:, 1:])
    remain_BxGm1 = jnp.sum(jnp.maximum(diff_BxGm1xV, 0.0), axis=-1)
    rej_BxGm1 = jnp.sum(jnp.maximum(-diff_BxGm1xV, 0.0), axis=-1)
    h_inner = jnp.where(rej_BxGm1 > 0,
                        remain_BxGm1 / jnp.where(rej_BxGm1 > 0, rej_BxGm1, 1.0), 1.0)
    ones_B1 = jnp.ones_like(log_rho_BxG1[:, :1])
    h_last_B1 = jnp.exp(jnp.minimum(log_rho_BxG1[:, g:], 0.0))
    h_BxG1 = jnp.concatenate([ones_B1, jnp.minimum(h_inner, 1.0), h_last_B1], axis=1)
    return log_rho_BxG1, h_BxG1


def advance_state(state: SeedBlockState, drafts_BxG: Array, q_BxGxV: Array, pi_BxGxV: Array,
                  log_r_BxSxG: Array, log_rho_BxG1: Array, tau_B: Array,
                  next_token_B: Array) -> SeedBlockState:
    """State for the next round after emitting ``X_1 .. X_tau, y`` (tau + 1 tokens).

    * A surviving zone (slot ``s >= tau + 1``) moves to slot ``s - tau - 1``;
      its ``log R`` becomes ``log R_s(X^tau) + log(u_s(y) / q_{tau+1}(y))``,
      ``u_s`` the conditional below it at position ``tau + 1``.
    * A correction at ``tau <= G - 2`` opens a zone in slot ``G - tau - 2``
      with ``log R = log rho_tau + log(v_{tau+1}(y) / q_{tau+1}(y))``, ``v`` the
      round's verifier conditional (every older zone below it).
    """
    batch, g = drafts_BxG.shape
    num_slots = state.live.shape[1]
    j_B = jnp.minimum(tau_B, g - 1)  # position of y (tau = G: unused, nothing survives)
    pick_BxV = lambda x_BxGxV: jnp.take_along_axis(x_BxGxV, j_B[:, None, None], axis=1)[:, 0]
    q_BxV, cur_BxV = pick_BxV(q_BxGxV), pick_BxV(pi_BxGxV)
    log_q_y_B = jnp.log(jnp.take_along_axis(q_BxV, next_token_B[:, None], axis=1)[:, 0])

    def log_ratio_of_y(dist_BxV):
        prob_B = jnp.take_along_axis(dist_BxV, next_token_B[:, None], axis=1)[:, 0]
        return jnp.clip(jnp.log(jnp.maximum(prob_B, 0.0)) - log_q_y_B,
                        -LOG_RATIO_CLIP, LOG_RATIO_CLIP)

    # Re-run the zone chain at the single position of y, now that y is known.
    updated = []
    for s in range(g - 1):
        log_r_B = jnp.take_along_axis(log_r_BxSxG[:, s], j_B[:, None], axis=1)[:, 0]
        updated.append(log_r_B + log_ratio_of_y(cur_BxV))
        residual_BxV = scaled_residual(log_r_B, cur_BxV, q_BxV)
        residual_BxV = residual_BxV / jnp.sum(residual_BxV, axis=-1, keepdims=True)
        covers_B1 = (state.live[:, s] & (j_B <= s))[:, None]
        cur_BxV = jnp.where(covers_B1, residual_BxV, cur_BxV)
    log_tau_B = jnp.take_along_axis(log_rho_BxG1, tau_B[:, None], axis=1)[:, 0]
    new_zone_log_r_B = log_tau_B + log_ratio_of_y(cur_BxV)

    emitted_B1 = (tau_B + 1)[:, None]
    slots_1xZ = jnp.arange(num_slots)[None, :]
    if updated:
        updated_BxZ = jnp.pad(jnp.stack(updated, axis=1), ((0, 0), (0, num_slots - g + 1)))
    else:
        updated_BxZ = jnp.zeros((batch, num_slots), jnp.float32)
    source_BxZ = slots_1xZ + emitted_B1
    in_range_BxZ = source_BxZ < g - 1
    source_BxZ = jnp.minimum(source_BxZ, num_slots - 1)
    live_BxZ = in_range_BxZ & jnp.take_along_axis(state.live, source_BxZ, axis=1)
    log_ratio_BxZ = jnp.where(live_BxZ, jnp.take_along_axis(updated_BxZ, source_BxZ, axis=1),
                              0.0)
    opens_BxZ = (tau_B <= g - 2)[:, None] & (slots_1xZ == g - 2 - tau_B[:, None])
    return SeedBlockState(
        live=live_BxZ | opens_BxZ,
        log_ratio=jnp.where(opens_BxZ, new_zone_log_r_B[:, None], log_ratio_BxZ))


@dataclasses.dataclass(frozen=True)
class SeedBlockVerifier:
    """Sun et al.'s block verification (Alg. 3) with carried residual zones.

    Reaches the Theorem 1 optimum of E[tau] in a fresh round and is exact over
    many rounds only because of the carried state (``SeedBlockState``); the
    incoming ``pi_BxGxV`` is the target's conditional on the current prefix
    and ``q_BxGxV`` the drafter's, from which ``__call__`` builds the carried
    verifier conditionals itself. ``pi`` must be normalised: the carried
    zones are conditionals of the law being reproduced, so the lossy rule's
    unnormalised weights have none (``needs_normalised_law``; the decoder
    refuses that pairing). Supports ``G <= max_gamma`` drafts per round.
    """

    name: str = "block-seed"
    max_gamma: int = MAX_GAMMA
    needs_normalised_law: ClassVar[bool] = True

    def init_state(self, batch_size: int) -> SeedBlockState:
        return SeedBlockState(live=jnp.zeros((batch_size, self.max_gamma), bool),
                              log_ratio=jnp.zeros((batch_size, self.max_gamma), jnp.float32))

    def __call__(self, key: Array, drafts_BxG: Array, q_BxGxV: Array, pi_BxGxV: Array,
                 bonus_BxV: Array, state: SeedBlockState,
                 count_B: Array | None = None) -> VerifyOutput:
        if count_B is not None:
            raise ValueError("block-seed carries residual zones sized by a fixed draft length "
                             "from round to round, so it cannot verify adaptive (ragged) "
                             "draft blocks; use the 'token' or 'block' verifier.")
        if drafts_BxG.shape[1] > self.max_gamma:
            raise ValueError(f"G = {drafts_BxG.shape[1]} drafts exceed max_gamma = "
                             f"{self.max_gamma} of {type(self).__name__}.")
        accept_key, sample_key = jax.random.split(key)
        v_BxGxV, log_r_BxSxG = carried_conditionals(state, drafts_BxG, q_BxGxV, pi_BxGxV)
        log_rho_BxG1, h_BxG1 = seed_block_weights(drafts_BxG, q_BxGxV, v_BxGxV)
        tau_B = last_passing(jax.random.uniform(accept_key, drafts_BxG.shape), h_BxG1)
        next_B = _next_token(sample_key, tau_B, log_rho_BxG1, q_BxGxV, v_BxGxV, bonus_BxV)
        new_state = advance_state(state, drafts_BxG, q_BxGxV, pi_BxGxV, log_r_BxSxG,
                                  log_rho_BxG1, tau_B, next_B)
        return VerifyOutput(num_accepted=tau_B, next_token=next_B, state=new_state)
