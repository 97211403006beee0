"""Target-only sampling, one token per call: the baseline every method is
measured against, run by the same round as every other decoder.

Autoregressive decoding is a chain round with ``G = 0`` and nothing drafting:
the round feeds the pending token alone (``K = 1``), draws ``y ~ p_1`` and
keeps it. So the prefill, the sampling, EOS and stop-rule handling, the cache
length (``required_cache_length(P, N, 0)``: the same scratch as a speculative
decoder's, so both score with one function) and the statistics are the
speculative decoders' own, and greedy speculative decoding can be compared
with it token for token.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.decode.round import LoopState, Verdict
from specdec_jax.drafting.base import Proposal
from specdec_jax.models.interface import LanguageModel
from specdec_jax.sampling import Distributions, SamplingParams
from specdec_jax.target_functions import TargetFunction

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class NothingDrafted:
    """The drafter of autoregressive decoding: it proposes no token and runs no
    model (``model_names`` is empty), so a round is the target's step alone."""

    name: str = "none"
    model_names: tuple[str, ...] = ()

    def select_params(self, named: dict) -> None:
        del named

    def init(self, params, prompt, max_length: int, encoder_decoder: bool) -> None:
        del params, prompt, max_length, encoder_decoder

    def propose(self, params, state, context, num: int, with_next: bool, key, sp, config
                ) -> tuple[Proposal, None]:
        del params, num, with_next, key, sp, config
        batch = context.length.shape[0]
        none_BxM = jnp.zeros((batch, 0), jnp.int32)
        return Proposal(tokens=none_BxM, q=None, q_stat=None, hidden=None, calls=none_BxM,
                        fed=none_BxM, single=none_BxM,
                        nan=jnp.zeros((batch,), jnp.int32)), state

    def rewind(self, state, valid_B: Array) -> None:
        del valid_B
        return state


@dataclasses.dataclass(frozen=True)
class TargetAlone(TargetFunction):
    """pi = p, the target's own law, deferring nothing (there is no drafter to
    defer from: the statistics' deferred mass stays 0)."""

    name: ClassVar[str] = "autoregressive"
    bonus_from_target: ClassVar[bool] = True

    def __call__(self, q, p, q_stat, p_stat, alpha, beta):
        del q, q_stat, p_stat, alpha, beta
        return p, jnp.zeros(p.shape[:-1], jnp.float32)


@dataclasses.dataclass(frozen=True)
class AutoregressiveDecoder(SpeculativeDecoder):
    """Target-only sampling, one token per call (module docstring); its
    ``rounds_per_sync`` counts steps. ``AutoregressiveDecoder(target=...,
    max_new_tokens=...)``: the drafter, target function and ``gamma`` are fixed."""

    target: LanguageModel
    drafter: Any = NothingDrafted()
    target_fn: TargetFunction = TargetAlone()
    gamma: int = 0
    max_new_tokens: int = 64

    def __post_init__(self):
        if self.gamma != 0 or not isinstance(self.drafter, NothingDrafted):
            raise ValueError("AutoregressiveDecoder drafts nothing; pass only target= and "
                             "max_new_tokens= (use SpeculativeDecoder to draft).")
        super().__post_init__()

    def round_keys(self, key):
        """Nothing drafts: one key for the step's draw, one for the next step."""
        key, step_key = jax.random.split(key)
        return key, None, step_key

    def verify(self, key, state: LoopState, proposal, dist: Distributions,
               sp: SamplingParams) -> Verdict:
        """y ~ p_1, and the log of the statistics law at y: a sequence-level
        cascade defers on its sum (``GenerationStats.sequence_logprob``)."""
        verdict = super().verify(key, state, proposal, dist, sp)
        stat_at_y_B = jnp.take_along_axis(dist.stats[:, 0], verdict.next_token[:, None],
                                          axis=-1)[:, 0]
        return verdict.replace(logprob=jnp.log(jnp.maximum(stat_at_y_B, 1e-30)))
