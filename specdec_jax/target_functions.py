"""Target functions T(q, p) -> pi (docs/algorithms.md, 'Target functions'; SpecCascade
Table 1).

Every method of the speculative cascades paper is a target function plugged
into one verification kernel (``verify.token``). A target function sees, at every
position, the drafter's and the target's processed distributions ``q, p``
(what is sampled and verified) and their statistics distributions
``q_stat, p_stat`` (what deferral rules are computed from: the same as
``q, p`` when sampling, the unscaled softmax under greedy decoding).

Deferral rules ``delta(q, p) in {0, 1}`` (1 = defer to the target) give the
mixture ``pi = (1 - delta) q + delta p``. Token-specific rules give
``pi(v) = q(v) (1 - r(v)) + p(v) sum_u r(u) q(u)`` (eq. 11).

Each target is a frozen dataclass (a static argument of the jitted loop);
``alpha`` and ``beta`` are traced so a sweep compiles once. ``__call__``
returns ``(pi, defer)`` where ``defer`` in [0, 1] per position is the
deferral indicator (for token rules: the mass ``sum_u r(u) q(u)`` handed to
the target), reported in the statistics.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

Array = jax.Array

# x log x at x = 0 is 0; clamping keeps 0 * log(0) from becoming NaN.
_TINY = 1e-30


def total_variation(p: Array, q: Array) -> Array:
    """D_TV(p, q) = sum_v max(0, p(v) - q(v)) over the last axis."""
    return jnp.sum(jnp.maximum(p - q, 0.0), axis=-1)


def neg_entropy(p: Array) -> Array:
    """sum_v p(v) log p(v) over the last axis (<= 0)."""
    return jnp.sum(p * jnp.log(jnp.maximum(p, _TINY)), axis=-1)


def _mixture(q: Array, p: Array, defer: Array) -> Array:
    return (1.0 - defer[..., None]) * q + defer[..., None] * p


@dataclasses.dataclass(frozen=True)
class TargetFunction:
    """Base class. ``bonus_from_target``: the bonus token after G accepted drafts
    follows ``p`` (SpecDecode, Lossy) instead of ``pi`` (every cascade).
    ``normalised``: ``pi`` sums to 1 at every position (a law to reproduce);
    only the lossy rule's weights do not."""

    name: ClassVar[str] = ""
    alpha_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    bonus_from_target: ClassVar[bool] = False
    normalised: ClassVar[bool] = True

    def validate(self, alpha: float, beta: float = 1.0) -> None:
        low, high = self.alpha_range
        if not low <= alpha <= high:
            raise ValueError(
                f"alpha={alpha} is outside [{low}, {high}], the range of method "
                f"{self.name!r}.")

    def __call__(self, q, p, q_stat, p_stat, alpha, beta):
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class SpecDecode(TargetFunction):
    """pi = p: lossless speculative decoding (Leviathan et al.)."""

    name: ClassVar[str] = "specdecode"
    bonus_from_target: ClassVar[bool] = True

    def validate(self, alpha: float, beta: float = 1.0) -> None:
        del alpha, beta  # no hyperparameter

    def __call__(self, q, p, q_stat, p_stat, alpha, beta):
        return p, jnp.ones(p.shape[:-1], jnp.float32)


@dataclasses.dataclass(frozen=True)
class Lossy(TargetFunction):
    """pi(v) = max(min(q(v), p(v) / (1 - alpha)), p(v) / beta); not normalised.

    ``alpha in [0, 1)``, ``beta >= 1 - alpha``. Lossy(0, 1) is SpecDecode.
    """

    name: ClassVar[str] = "lossy"
    alpha_range: ClassVar[tuple[float, float]] = (0.0, 1.0)
    bonus_from_target: ClassVar[bool] = True
    normalised: ClassVar[bool] = False

    def validate(self, alpha: float, beta: float = 1.0) -> None:
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha={alpha} is outside [0, 1), the range of method 'lossy'.")
        if not beta >= 1.0 - alpha:
            raise ValueError(f"lossy needs beta >= 1 - alpha = {1 - alpha}, got beta={beta}.")

    def __call__(self, q, p, q_stat, p_stat, alpha, beta):
        pi = jnp.maximum(jnp.minimum(q, p / (1.0 - alpha)), p / beta)
        return pi, jnp.ones(p.shape[:-1], jnp.float32)


# Bisection steps for the tuned beta: 1/beta lives in (0, 1/(1 - alpha)], and
# 64 halvings take that interval below float32 resolution.
BETA_BISECTION_STEPS = 64


def tuned_beta(q: Array, p: Array, alpha: Array) -> Array:
    """Per position, the ``beta >= 1 - alpha`` of Tran-Thien's lossy rule (App. E.6):

        sum_v (q(v) - p(v) / (1 - alpha))_+  =  sum_v (p(v) / beta - q(v))_+

    The left side is the drafter mass Lossy rejects; the right side the mass its
    residual hands back, so ``pi`` sums to 1. In ``u = 1 / beta`` the right side
    ``g(u)`` is continuous and increasing from ``g(0) = 0`` to ``g(1/(1-alpha))
    = left + alpha / (1 - alpha) >= left``, so bisection on ``u`` finds a root
    (the paper searched a 1000-point grid). Returns float32 [...].
    """
    left = jnp.sum(jnp.maximum(q - p / (1.0 - alpha), 0.0), axis=-1)
    g = lambda u: jnp.sum(jnp.maximum(p * u[..., None] - q, 0.0), axis=-1)

    def halve(_, bounds):
        low, high = bounds
        mid = 0.5 * (low + high)
        below = g(mid) <= left
        return jnp.where(below, mid, low), jnp.where(below, high, mid)

    high = jnp.broadcast_to(1.0 / (1.0 - alpha), left.shape).astype(jnp.float32)
    low, high = jax.lax.fori_loop(0, BETA_BISECTION_STEPS, halve, (jnp.zeros_like(high), high))
    return 1.0 / jnp.maximum(0.5 * (low + high), _TINY)


@dataclasses.dataclass(frozen=True)
class LossyTuned(Lossy):
    """Lossy with ``beta`` solved per position (``tuned_beta``); the traced beta is ignored.

    Under greedy decoding (one-hot ``q, p``) it accepts exactly the drafts whose
    argmax matches the target's: it is then lossless, like Lossy(alpha, 1).
    """

    name: ClassVar[str] = "lossy-tuned"

    def validate(self, alpha: float, beta: float = 1.0) -> None:
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha={alpha} is outside [0, 1), the range of method "
                             "'lossy-tuned'.")

    def __call__(self, q, p, q_stat, p_stat, alpha, beta):
        return super().__call__(q, p, q_stat, p_stat, alpha, tuned_beta(q, p, alpha)[..., None])


@dataclasses.dataclass(frozen=True)
class DeferralRule(TargetFunction):
    """pi = (1 - delta) q + delta p for a rule delta(q_stat, p_stat, alpha).

    ``reads_target``: the rule needs ``p``. A sequential token cascade, which
    decides before the target runs, can only use rules that do not.
    """

    reads_target: ClassVar[bool] = True

    def defer(self, q, p, q_stat, p_stat, alpha) -> Array:
        """bool [...]: 1 = defer. The processed ``q, p`` enter only where the paper
        says so: BiLD*'s cross-entropy of ``q`` and OPT's ``D_TV(p, q)``, which
        under greedy decoding is ``1[argmax p != argmax q]`` (Narasimhan et al., Lemma 8)."""
        raise NotImplementedError

    def __call__(self, q, p, q_stat, p_stat, alpha, beta):
        defer = self.defer(q, p, q_stat, p_stat, alpha).astype(jnp.float32)
        return _mixture(q, p, defer), defer


@dataclasses.dataclass(frozen=True)
class BiLD(DeferralRule):
    """BiLD*: defer iff D(q, p) > alpha, D = cross-entropy -sum q log p.

    Under greedy decoding (one-hot ``q``) D is ``-log p(argmax q)``; that is
    what the cross-entropy of the one-hot processed ``q`` against the statistics
    ``p`` gives, so one formula serves both.
    """

    name: ClassVar[str] = "bild"
    alpha_range: ClassVar[tuple[float, float]] = (0.0, 10.0)

    def defer(self, q, p, q_stat, p_stat, alpha):
        cross_entropy = -jnp.sum(q * jnp.log(jnp.maximum(p_stat, _TINY)), axis=-1)
        return cross_entropy > alpha


@dataclasses.dataclass(frozen=True)
class Chow(DeferralRule):
    """defer iff max_v q(v) < 1 - alpha."""

    name: ClassVar[str] = "chow"
    reads_target: ClassVar[bool] = False

    def defer(self, q, p, q_stat, p_stat, alpha):
        return jnp.max(q_stat, axis=-1) < 1.0 - alpha


@dataclasses.dataclass(frozen=True)
class Diff(DeferralRule):
    """defer iff max_v q(v) < max_v p(v) - alpha."""

    name: ClassVar[str] = "diff"

    def defer(self, q, p, q_stat, p_stat, alpha):
        return jnp.max(q_stat, axis=-1) < jnp.max(p_stat, axis=-1) - alpha


@dataclasses.dataclass(frozen=True)
class OPT(DeferralRule):
    """defer iff max_v q(v) < max_v p(v) - alpha * D_TV(p, q): the optimal plug-in rule."""

    name: ClassVar[str] = "opt"

    def defer(self, q, p, q_stat, p_stat, alpha):
        tv = total_variation(p, q)
        return jnp.max(q_stat, axis=-1) < jnp.max(p_stat, axis=-1) - alpha * tv


@dataclasses.dataclass(frozen=True)
class DiffLog(DeferralRule):
    """defer iff sum q log q < sum p log p - alpha (log-loss variant, App. C.1)."""

    name: ClassVar[str] = "difflog"
    alpha_range: ClassVar[tuple[float, float]] = (0.0, 10.0)  # nats, like BiLD

    def defer(self, q, p, q_stat, p_stat, alpha):
        return neg_entropy(q_stat) < neg_entropy(p_stat) - alpha


@dataclasses.dataclass(frozen=True)
class OPTLog(DeferralRule):
    """defer iff sum q log q < sum p log p - alpha * D_TV(p, q) (App. C.2)."""

    name: ClassVar[str] = "optlog"
    alpha_range: ClassVar[tuple[float, float]] = (0.0, 10.0)  # nats, like BiLD

    def defer(self, q, p, q_stat, p_stat, alpha):
        tv = total_variation(p, q)
        return neg_entropy(q_stat) < neg_entropy(p_stat) - alpha * tv


@dataclasses.dataclass(frozen=True)
class TokenRule(TargetFunction):
    """pi(v) = q(v) (1 - r(v)) + p(v) sum_u r(u) q(u) for a token rule r (eq. 11).

    Normalised by construction: sum_v pi = (1 - m) + m with m = sum_u r(u) q(u).
    """

    def reject(self, q_stat, p_stat, alpha) -> Array:
        raise NotImplementedError

    def __call__(self, q, p, q_stat, p_stat, alpha, beta):
        r = self.reject(q_stat, p_stat, alpha).astype(jnp.float32)
        handed_over = jnp.sum(r * q, axis=-1)
        pi = q * (1.0 - r) + p * handed_over[..., None]
        return pi, handed_over


def _max_last(x: Array) -> Array:
    return jnp.max(x, axis=-1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class TokenV1(TokenRule):
    """r(v) = 1[q(v) < max_u p(u) - alpha] (eq. 13)."""

    name: ClassVar[str] = "token-v1"

    def reject(self, q_stat, p_stat, alpha):
        return q_stat < _max_last(p_stat) - alpha


@dataclasses.dataclass(frozen=True)
class TokenV2(TokenRule):
    """r(v) = 1[p(v) < max_u p(u) - alpha] (eq. 14)."""

    name: ClassVar[str] = "token-v2"

    def reject(self, q_stat, p_stat, alpha):
        return p_stat < _max_last(p_stat) - alpha


@dataclasses.dataclass(frozen=True)
class TokenV3(TokenRule):
    """r(v) = 1[p(v) < max_u p(u) (1 - alpha)] (eq. 15): "SpecCascade [Token]"."""

    name: ClassVar[str] = "token-v3"

    def reject(self, q_stat, p_stat, alpha):
        return p_stat < _max_last(p_stat) * (1.0 - alpha)


TARGETS: dict[str, type[TargetFunction]] = {
    cls.name: cls for cls in (SpecDecode, Lossy, LossyTuned, BiLD, Chow, Diff, OPT, DiffLog, OPTLog,
                              TokenV1, TokenV2, TokenV3)
}


def get_target(name: str) -> TargetFunction:
    """The target function of a name (a chain method's: ``decode.methods``)."""
    if name not in TARGETS:
        raise ValueError(f"unknown target function {name!r}; choose one of "
                         f"{', '.join(TARGETS)}.")
    return TARGETS[name]()
