"""Chains: the round drafts ``G`` tokens in a row (or fewer, where an adaptive
or draft-until drafter stops a row early), the target scores them in one
``extend`` and a chain verifier (token or block) keeps a prefix.

    drafter: d_1 .. d_G and the laws q_1 .. q_G they were drawn from (and
             q_{G+1} when the target function needs it); any strategy of
             ``drafting/`` (a model, Max-Gram, CS Drafting, a feature head)
    target:  feed [t, d_1 .. d_G] in one extend  -> p_1 .. p_{G+1}
    pi_i = T(q_i, p_i); verifier -> j kept drafts and a new token y
    the target cache keeps old_length + 1 + j entries; the drafter rewinds

``G = 0`` is a round without drafts: the oracle cascade (y ~ T(q_1, p_1))
and, with no drafter, autoregressive decoding (``decode.autoregressive``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specdec_jax.decode.round import (
    LoopState,
    RoundDecoder,
    Scored,
    Verdict,
    check_normalised_law,
    extend_bucketed,
)
from specdec_jax.drafting.base import is_drafter
from specdec_jax.drafting.model_drafter import ModelDrafter
from specdec_jax.loops import write_rows
from specdec_jax.models.interface import LanguageModel
from specdec_jax.sampling import Distributions, SamplingParams, sample_from_weights
from specdec_jax.target_functions import TargetFunction
from specdec_jax.verify.token import TokenVerifier, VerifyOutput, block_lengths


def pick(x_BxKxV: jax.Array, index_B: jax.Array) -> jax.Array:
    """``x[b, index[b]]``: [B, K, ...] -> [B, ...]."""
    return jnp.take_along_axis(x_BxKxV, index_B[:, None, None], axis=1)[:, 0]


@dataclasses.dataclass(frozen=True)
class SpeculativeDecoder(RoundDecoder):
    """Static configuration of a speculative generation (hashable: closes over jit).

    ``drafter`` is any strategy of ``specdec_jax.drafting`` (a bare
    ``LanguageModel`` is wrapped in a ``ModelDrafter``); ``target_fn`` any
    target function of ``target_functions.py``; ``verifier`` any chain
    verifier of ``verify/`` (``token``, ``block``, ``block-seed``).

    The drafter is asked for ``q_{G+1}`` only when the target function needs
    it (cascades draw their bonus token from ``pi_{G+1} = T(q_{G+1},
    p_{G+1})``); ``specdecode`` and ``lossy`` draw it from ``p_{G+1}``, so a
    neural drafter skips its ``(G+1)``-th step there.
    """

    target: LanguageModel
    drafter: Any
    target_fn: TargetFunction
    gamma: int
    max_new_tokens: int
    verifier: Any = TokenVerifier()
    # None: ask the drafter for q_{G+1} only when the target function needs it.
    # True forces the classic G + 1 drafter steps (to measure what skipping saves).
    draft_next_q: bool | None = None

    def __post_init__(self):
        if not is_drafter(self.drafter):
            object.__setattr__(self, "drafter", ModelDrafter(self.drafter))
        super().__post_init__()
        check_normalised_law(self.verifier, self.target_fn,
                             "use the 'token' or 'block' verifier for it")

    @property
    def depth(self) -> int:
        return self.gamma

    @property
    def max_children(self) -> int:
        return 1  # a chain's drafts are all first children

    @property
    def needs_next_q(self) -> bool:
        if self.draft_next_q is not None:
            return self.draft_next_q
        return not self.target_fn.bonus_from_target

    def draft(self, drafter_params, state: LoopState, context, key, sp: SamplingParams):
        return self.drafter.propose(drafter_params, state.drafter_state, context, self.gamma,
                                    self.needs_next_q, key, sp, self.sampling_config)

    def score(self, target_params, state: LoopState, pending_B, proposal) -> Scored:
        """``[t, d_1 .. d_G]`` in one call; a ragged proposal (``count``) only as
        wide as its longest row needs (``extend_bucketed``)."""
        fed_BxG1 = jnp.concatenate([pending_B[:, None], proposal.tokens], axis=1)
        if proposal.count is None:
            out = self.target.extend(target_params, fed_BxG1, state.target_cache)
            return Scored(logits=out.logits, hidden=out.hidden, cache=out.cache,
                          width=self.gamma + 1)
        logits, hidden, cache, width = extend_bucketed(
            self.target, target_params, fed_BxG1,
            jnp.max(jnp.where(state.done, 0, proposal.count)) + 1, state.target_cache,
            self.drafter.target_widths(self.gamma))
        return Scored(logits=logits, hidden=hidden, cache=cache, width=width)

    def verify(self, key, state: LoopState, proposal, dist: Distributions,
               sp: SamplingParams) -> Verdict:
        """pi = T(q, p) at every position, then the chain verifier (``G = 0``:
        no drafts to verify, y ~ the bonus law)."""
        g = self.gamma
        pi_BxG1xV, defer_BxG1 = self.target_fn(proposal.q, dist.probs, proposal.q_stat,
                                               dist.stats, sp.alpha, sp.beta)
        bonus_BxG1xV = dist.probs if self.target_fn.bonus_from_target else pi_BxG1xV
        offered_B = block_lengths(proposal.tokens, proposal.count)
        bonus_BxV = pick(bonus_BxG1xV, offered_B)
        if g == 0:
            verdict = VerifyOutput(num_accepted=jnp.zeros_like(state.length),
                                   next_token=sample_from_weights(key, bonus_BxV),
                                   state=state.verifier_state)
        elif proposal.count is None:  # verifiers written before ragged blocks take no count_B
            verdict = self.verifier(key, proposal.tokens, proposal.q[:, :g], pi_BxG1xV[:, :g],
                                    bonus_BxV, state.verifier_state)
        else:
            verdict = self.verifier(key, proposal.tokens, proposal.q[:, :g], pi_BxG1xV[:, :g],
                                    bonus_BxV, state.verifier_state, count_B=proposal.count)
        accepted_B = verdict.num_accepted
        return Verdict(accepted=accepted_B, next_token=verdict.next_token,
                       drafts=proposal.tokens, defer=defer_BxG1, offered=offered_B,
                       nodes=offered_B, by_rank=accepted_B[:, None],  # all first children
                       verifier_state=verdict.state)

    def commit(self, state: LoopState, scored: Scored, proposal, drafter_state,
               verdict: Verdict, keep_B):
        """The target keeps ``old_length + keep``; the drafter keeps what it fed
        of ``history[:length + j]``; the scoring call's hidden states are the
        target's features of the pending token and the drafts (those past what
        it keeps are scratch)."""
        old_length_B = state.target_cache.lengths
        kept_B = jnp.where(state.done, 0, verdict.accepted)
        features = None if state.features is None else write_rows(
            state.features, scored.hidden, old_length_B)
        return (scored.cache.replace(lengths=old_length_B + keep_B),
                self.drafter.rewind(drafter_state, state.length + kept_B), features)
