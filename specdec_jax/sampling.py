"""Logits -> processed next-token distributions (temperature, top-k, top-p).

Exactness claims in this project are with respect to these *processed*
distributions (docs/algorithms.md, 'Notation'), so the drafter and the target go through the
same transform. ``temperature`` and ``top_p`` are traced (a sweep must not
recompile); ``top_k`` changes shapes of intermediate sorts, so it is static.

Greedy decoding is ``temperature == 0``: the processed distribution is the
one-hot of the argmax. Deferral *statistics* (max-prob, entropy, ...) are then
taken from the unscaled softmax of each model, as in SpecCascade App. C.3;
:func:`distributions` returns both.

The draws every decoder makes live here too: ``first_argmax`` (the greedy
law's token, vectorised on CPU) and ``sample_from_weights`` (one token per
row from unnormalised weights).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array

# How a token tree's children were drawn at one node (``verify.tree.Tree.draws``,
# ``drafting.tree.TreeProposal.draws``): the law a verifier tests each child
# against follows from it (``verify.tree.sibling_laws``).
WITHOUT_REPLACEMENT = "without-replacement"  # child j ~ q without the earlier siblings
WITH_REPLACEMENT = "with-replacement"  # every child ~ q, independently
POINT_MASS = "point-mass"  # deterministic children (Max-Gram): each its own point mass
TREE_DRAWS = (WITHOUT_REPLACEMENT, WITH_REPLACEMENT, POINT_MASS)


def check_tree_draws(draws: str) -> str:
    if draws not in TREE_DRAWS:
        raise ValueError(f"unknown tree drawing {draws!r}; a tree's children are drawn "
                         f"{', '.join(TREE_DRAWS)}.")
    return draws


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Static part of the sampling transform. ``top_k = 0`` disables top-k."""

    top_k: int = 0

    def __post_init__(self):
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}.")


@flax.struct.dataclass
class SamplingParams:
    """Traced hyperparameters: changing them does not recompile."""

    temperature: Array  # float32 []: 0 = greedy
    top_p: Array  # float32 []: 1 = off
    alpha: Array  # float32 []: lenience of the target function
    beta: Array  # float32 []: Lossy's beta (ignored by other methods)
    lenience: Array  # float32 [] >= 1: CS Drafting lenience between drafters (never the target)
    # float32 [] in (0, 1): SpecDec++ stops drafting once the predicted chance that
    # some draft of the block is rejected exceeds it (adaptive drafters only)
    stop_threshold: Array


@flax.struct.dataclass
class Distributions:
    probs: Array  # float32 [..., V]: processed distribution (sampling/verification)
    stats: Array  # float32 [..., V]: distribution deferral statistics are taken from


def validate_sampling(temperature: float, top_p: float) -> None:
    """Host-side checks of the traced sampling values (call before compiling)."""
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}.")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 disables it), got {top_p}.")


def _top_k_mask(logits_xV: Array, k: int) -> Array:
    kth_largest = jax.lax.top_k(logits_xV, k)[0][..., -1:]
    return logits_xV >= kth_largest


# Bit patterns of the non-negative float32s are ordered as the floats are: a
# bisection over [0, bits(1.0)] (30 halvings) finds any probability threshold.
_ONE_BITS = 0x3F800000
_BISECTIONS = (_ONE_BITS + 1).bit_length()  # halvings until hi - lo <= 1


def _top_p_threshold(probs_xV: Array, top_p: Array) -> Array:
    """float32 [..., 1]: the least probability top-p keeps in each row: top-p
    keeps the smallest set of most likely tokens whose mass reaches top_p, and
    every token tied with the least likely one kept (``probs >= threshold``).

    Token x is kept iff the mass of the tokens strictly more likely than x is
    below ``top_p`` (so the token that crosses ``top_p`` is kept). The rule is
    monotone in ``p(x)``: x is kept iff ``p(x) >= c``, with ``c`` the smallest
    float whose strictly-larger mass is below ``top_p``, found by bisection over
    float32 bit patterns. That is ~30 masked sums over the vocabulary instead of
    a sort: a sort of ``[rows, V]`` materialises its sorted values and indices,
    the largest temporaries of a tree round on TPU (two ``[28, 151936]``
    arrays for the 1.5B). The sums run in another order than a sorted cumsum,
    so a token whose strictly-larger mass is within rounding of ``top_p`` may
    fall on the other side; the rule is one function of the row either way."""
    probs_xV = probs_xV.astype(jnp.float32)

    def kept_above(bits):  # is the strictly-larger mass at threshold `bits` below top_p?
        threshold = jax.lax.bitcast_convert_type(bits, jnp.float32)
        return jnp.sum(jnp.where(probs_xV > threshold, probs_xV, 0.0), axis=-1,
                       keepdims=True) < top_p

    def halve(_, bounds):  # invariant: kept_above(hi); lo = -1 or not kept_above(lo)
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        open_ = hi - lo > 1
        ok = kept_above(jnp.maximum(mid, 0))
        return (jnp.where(open_ & ~ok, mid, lo), jnp.where(open_ & ok, mid, hi))

    shape = probs_xV.shape[:-1] + (1,)
    bounds = (jnp.full(shape, -1, jnp.int32), jnp.full(shape, _ONE_BITS, jnp.int32))
    # Unrolled: a loop body is counted once by XLA's cost analysis (the TPU
    # pricing reads it), and 30 small reductions need no loop.
    _, hi = jax.lax.fori_loop(0, _BISECTIONS, halve, bounds, unroll=True)
    return jax.lax.bitcast_convert_type(hi, jnp.float32)


def _top_p_mask(probs_xV: Array, top_p: Array) -> Array:
    """Keeps the smallest set of most likely tokens whose mass reaches top_p,
    and every token tied with the least likely one kept (``_top_p_threshold``)."""
    return probs_xV >= _top_p_threshold(probs_xV, top_p)


def distributions(logits_xV: Array, temperature: Array, top_p: Array,
                  config: SamplingConfig = SamplingConfig()) -> Distributions:
    """Processed distribution and statistics distribution for each row of logits."""
    logits = logits_xV.astype(jnp.float32)
    unscaled = jax.nn.softmax(logits, axis=-1)
    safe_t = jnp.where(temperature > 0, temperature, 1.0)
    scaled = logits / safe_t
    if config.top_k:
        scaled = jnp.where(_top_k_mask(scaled, min(config.top_k, logits.shape[-1])), scaled,
                           -jnp.inf)
    probs = jax.nn.softmax(scaled, axis=-1)
    # top_p is traced: the cond skips the threshold's ~30 passes when it is off.
    # Only the [..., 1] threshold comes out of the cond, so the processed law is
    # one elementwise pass over the softmax, not a [..., V] cond result too (on
    # TPU 18.5 MB for a 27-node tree). The threshold is one of these very
    # probabilities, so it must be computed from them, not from a recomputation.
    threshold = jax.lax.cond(top_p < 1.0, lambda p: _top_p_threshold(p, top_p),
                             lambda p: jnp.zeros(p.shape[:-1] + (1,), jnp.float32), probs)
    kept = jnp.where(probs >= threshold, probs, 0.0)
    probs = jnp.where(top_p < 1.0, kept / jnp.sum(kept, axis=-1, keepdims=True), probs)
    one_hot = jax.nn.one_hot(first_argmax(logits), logits.shape[-1], dtype=jnp.float32)
    greedy = temperature <= 0
    return Distributions(probs=jnp.where(greedy, one_hot, probs),
                         stats=jnp.where(greedy, unscaled, probs))


# ``jnp.argmax`` lowers to a two-operand reduction (value and index together),
# which XLA's CPU backend does not vectorise: over the 152k vocabulary of the
# Qwen models it took ~1 ms a row, and a decoding round takes several (the
# greedy law of every call, Gumbel draws, the verifiers). ``first_argmax``
# returns the same index from two one-operand reductions that XLA vectorises,
# on CPU only: on TPU the two passes over the row made the compiler keep more
# scratch (the 1.5B's autoregressive generate program, v5e: 90 MB of HBM
# temporaries with ``jnp.argmax``, 112 MB with the two reductions).
def _max_then_min(x: jax.Array) -> jax.Array:
    top = jnp.max(x, axis=-1, keepdims=True)  # NaN if the row holds one
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    is_top = (x == top) | jnp.isnan(x)
    return jnp.min(jnp.where(is_top, index, x.shape[-1]), axis=-1)


def _argmax(x: jax.Array) -> jax.Array:
    return jnp.argmax(x, axis=-1).astype(jnp.int32)


def first_argmax(x: jax.Array) -> jax.Array:
    """int32 ``[...]``: ``jnp.argmax(x, -1)`` (the first index of the maximum,
    or of the first NaN, as argmax); on CPU as a max followed by a min over
    indices, two one-operand reductions that XLA vectorises."""
    return jax.lax.platform_dependent(x, cpu=_max_then_min, default=_argmax)


def sample_from_weights(key: Array, weights_BxV: Array) -> Array:
    """Samples one index per row from non-negative, not necessarily normalised weights.

    Gumbel-max, draw for draw what ``jax.random.categorical(key, log w)``
    returns (a test checks the indices are equal), but ``first_argmax`` in
    place of ``jnp.argmax``: XLA on CPU fuses the Gumbel noise into argmax's
    two-operand reduction, which it does not vectorise (4.4 ms per row at the
    152k vocabulary vs 1.0 ms; a round draws G + 1 or more of these).

    When every row has one positive weight (every greedy draw: a one-hot law,
    or its residual), that index is the draw whatever the noise, so the noise
    is not drawn (0.9 ms of a 1.5B step's ~40 on 2 CPU cores at 152k tokens).
    """
    positive_BxV = weights_BxV > 0

    def draw(_):
        logits = jnp.where(positive_BxV, jnp.log(jnp.maximum(weights_BxV, 1e-38)), -jnp.inf)
        return first_argmax(logits + jax.random.gumbel(key, logits.shape, logits.dtype))

    def the_only_one(_):
        return first_argmax(positive_BxV.astype(jnp.float32))

    only_one = jnp.all(jnp.sum(positive_BxV, axis=-1) == 1)
    return jax.lax.cond(only_one, the_only_one, draw, None)
