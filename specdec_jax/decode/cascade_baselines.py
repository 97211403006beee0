"""The cascade baselines of SpecCascade (Narasimhan et al.; docs/algorithms.md,
'Cascade baselines'): the oracle cascade, the sequential token cascade, the
original Big-Little Decoder, and the sequence-level cascade.

The oracle cascade *is* a chain round with ``G = 0``: the drafter gives
``q_1``, one target call gives ``p_1``, and the token is drawn from
``pi_1 = T_delta(q_1, p_1)``; ``api.make_decoder(method="oracle")`` builds it.

**Draft until told to stop** (``DraftUntilDecoder``). Both the sequential
cascade and the original BiLD let the drafter run on its own, one token at a
time, until a rule that reads only ``q`` stops it (or ``max_drafts`` tokens,
10 in the paper, so the target's catch-up stays bounded), then call the
target once on everything it missed. That is a chain round whose drafter is
a ``drafting.draft_until.DraftUntilDrafter`` (the loop SpecDec++'s drafters
share)::

    drafter: q_1; while not stop(q_i) and i <= M: d_i ~ q_i, feed d_i -> q_{i+1}
             (k = number of drafts; the drafter computed q_1 .. q_{k+1})
    target:  feed [pending, d_1 .. d_k] in one extend -> p_1 .. p_{k+1}
    token-cascade: keep d_1 .. d_k (delta(q_i) = 0 there, pi_i = q_i, so token
             verification accepts each with probability 1), then
             y ~ pi_{k+1} = T_delta(q_{k+1}, p_{k+1})   (p when the rule deferred)
    bild-original: j = first i <= k with D(q_i, p_i) > alpha, else k + 1;
             keep d_1 .. d_{j-1}, then y ~ p_j (the target's token: a
             deterministic rollback, no rejection sampling)

This is Alg. 2 of the paper with the target's calls batched: the target runs
exactly where the token-by-token loop would call it (at a deferral, or after
``M`` drafter tokens), so tokens, drafter calls and target calls match it.

Worked example (token cascade, M = 10, Chow alpha = 0.2): max q_1 = 0.9,
max q_2 = 0.95, max q_3 = 0.7 < 0.8: the drafter drafts d_1, d_2 and stops
(k = 2, 3 drafter calls); the target feeds [t, d_1, d_2] (K = 3) and y ~ pi_3;
the round emits d_1 d_2 y.

The target's extend runs at the smallest compiled width covering every row
(``target_widths``; rows feed their own tokens, then padding that the
rollback discards), so a round costs what its longest row needs.

**The sequence-level cascade** (``sequence_cascade``) combines two
autoregressive runs: the drafter's whole response, or the target's where the
drafter's sequence probability falls below ``1 - alpha``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specdec_jax import target_functions
from specdec_jax.decode import methods
from specdec_jax.decode.chain import SpeculativeDecoder, pick
from specdec_jax.decode.round import LoopState, Verdict
from specdec_jax.decode.stats import GenerationOutput
from specdec_jax.drafting.draft_until import (
    MAX_CONSECUTIVE_DRAFTS,
    DeferralStop,
    DraftUntilDrafter,
)
from specdec_jax.models.interface import LanguageModel
from specdec_jax.sampling import Distributions, SamplingParams, sample_from_weights
from specdec_jax.target_functions import TargetFunction
from specdec_jax.verify.token import TokenVerifier, leading_accepts

Array = jax.Array

MODES = methods.names_of(methods.DRAFT_UNTIL)  # token-cascade, bild-original
DEFAULT_TARGET_WIDTHS = (1, 2, 3, 4, 6, 8, 11)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftUntilDecoder(SpeculativeDecoder):
    """Sequential token cascade (``mode="token-cascade"``) or the original
    Big-Little Decoder (``mode="bild-original"``): a chain round whose drafter
    runs a model until a rule on ``q`` stops it (module docstring).

    token-cascade: ``rule`` (default Chow) decides from ``q`` alone, with the
    traced ``alpha``; it must not read the target. It is also the round's
    target function (``pi = T_delta(q, p)``), verified token by token.
    bild-original: the drafter falls back to the target when ``max q < 1 -
    fallback_alpha`` (static: one curve per fallback threshold, as in the
    paper's Figure 8), and the rollback threshold on ``D(q, p)`` is the
    traced ``alpha`` in [0, 10]. ``max_drafts`` caps a row's drafts (the
    round's gamma); ``drafter`` is a ``LanguageModel``.
    """

    target: LanguageModel
    drafter: Any
    mode: str
    max_new_tokens: int
    rule: target_functions.DeferralRule = target_functions.Chow()
    fallback_alpha: float = 0.5
    max_drafts: int = MAX_CONSECUTIVE_DRAFTS
    target_widths: tuple[int, ...] = DEFAULT_TARGET_WIDTHS
    # Set from the fields above (a chain round's configuration).
    target_fn: TargetFunction | None = None
    gamma: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}.")
        if self.max_drafts < 1:
            raise ValueError(f"max_drafts must be >= 1, got {self.max_drafts}.")
        if self.mode == "token-cascade" and self.rule.reads_target:
            raise ValueError(
                f"a sequential token cascade decides before calling the target, so its rule "
                f"must read only the drafter; {self.rule.name!r} reads the target. Use "
                "'chow', or the oracle cascade for rules that compare q with p.")
        if not 0.0 <= self.fallback_alpha <= 1.0:
            raise ValueError(f"fallback_alpha must be in [0, 1], got {self.fallback_alpha}.")
        token_cascade = self.mode == "token-cascade"
        # The round's pi: the cascade's own for the token cascade; BiLD's rollback
        # draws from p (``verify``), which the target function gives as pi = p.
        target_fn = self.rule if token_cascade else target_functions.SpecDecode()
        if (self.target_fn not in (None, target_fn) or self.gamma not in (0, self.max_drafts)
                or self.verifier != TokenVerifier()):
            raise ValueError("DraftUntilDecoder sets its own target function, gamma and "
                             "verifier from mode, rule and max_drafts; drop target_fn, gamma "
                             "and verifier.")
        if not isinstance(self.drafter, DraftUntilDrafter):
            stop = DeferralStop(self.rule if token_cascade else None, self.fallback_alpha)
            object.__setattr__(self, "drafter", DraftUntilDrafter(
                self.drafter, stop=stop, widths=self.target_widths))
        object.__setattr__(self, "target_fn", target_fn)
        object.__setattr__(self, "gamma", self.max_drafts)
        super().__post_init__()

    def verify(self, key, state: LoopState, proposal, dist: Distributions,
               sp: SamplingParams) -> Verdict:
        """token-cascade: the chain's token verification of ``pi = T_delta(q, p)``
        (it keeps every draft: ``pi_i = q_i`` where the rule did not defer).
        bild-original: the deterministic rollback at the first ``D(q_i, p_i) >
        alpha``, then ``y ~ p_j``: the target's token, counted as deferred."""
        if self.mode == "token-cascade":
            return super().verify(key, state, proposal, dist, sp)
        m, k_B = self.max_drafts, proposal.count
        # D(q_i, p_i) > alpha rolls back at i; positions past k were not drafted.
        reject_BxM = target_functions.BiLD().defer(proposal.q[:, :m], dist.probs[:, :m],
                                                   proposal.q_stat[:, :m], dist.stats[:, :m],
                                                   sp.alpha)
        accepted_B = jnp.minimum(leading_accepts(~reject_BxM), k_B)
        next_B = sample_from_weights(key, pick(dist.probs, accepted_B))
        # The new token (drawn at depth j) is the target's; the kept drafts are not.
        defer_BxM1 = (jnp.arange(m + 1)[None, :] == accepted_B[:, None]).astype(jnp.float32)
        return Verdict(accepted=accepted_B, next_token=next_B, drafts=proposal.tokens,
                       defer=defer_BxM1, offered=k_B, nodes=k_B, by_rank=accepted_B[:, None],
                       verifier_state=state.verifier_state)


def sequence_defers(sequence_logprob_B: Array, lengths_B: Array, alpha: float, *,
                    length_normalised: bool = False) -> Array:
    """SeqCascade [Chow] (docs/algorithms.md, 'Cascade baselines'): defer the whole response to the
    target iff ``q(response | prompt) < 1 - alpha``; with ``length_normalised``
    the score is the geometric mean ``exp(mean log q)`` instead.

    ``sequence_logprob`` is the drafter's ``GenerationStats.sequence_logprob``
    (the statistics distribution: under greedy decoding, the unscaled softmax).
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha} is outside [0, 1], the range of 'seq-cascade'.")
    score = sequence_logprob_B / jnp.maximum(lengths_B, 1) if length_normalised else \
        sequence_logprob_B
    return score < jnp.log(jnp.maximum(1.0 - alpha, 1e-30))


def sequence_cascade(drafter_out: GenerationOutput, target_out: GenerationOutput,
                     alpha: float, *, length_normalised: bool = False
                     ) -> tuple[GenerationOutput, Array]:
    """Combines the drafter's and the target's autoregressive outputs of the same
    prompts into the sequence-level cascade's output; returns ``(output,
    defers [B])``. The target's counters count only for deferred rows (a
    cascade runs the target only on those), the drafter's for every row."""
    defer_B = sequence_defers(drafter_out.stats.sequence_logprob, drafter_out.lengths, alpha,
                              length_normalised=length_normalised)
    width = max(drafter_out.tokens.shape[1], target_out.tokens.shape[1])
    pad = lambda t: jnp.pad(t, ((0, 0), (0, width - t.shape[1])))
    tokens = jnp.where(defer_B[:, None], pad(target_out.tokens), pad(drafter_out.tokens))
    lengths = jnp.where(defer_B, target_out.lengths, drafter_out.lengths)
    ds, ts = drafter_out.stats, target_out.stats
    gate = defer_B.astype(jnp.int32)
    stats = ds.replace(
        target_calls=gate * ts.target_calls, target_fed=gate * ts.target_fed,
        target_single_calls=gate * ts.target_single_calls,
        drafter_calls=ds.target_calls,
        drafter_calls_by_model=ds.target_calls[:, None],
        drafter_tokens_by_model=ds.target_fed[:, None],
        drafter_single_calls_by_model=ds.target_single_calls[:, None],
        deferred_mass=jnp.where(defer_B, lengths, 0).astype(jnp.float32),
        emitted=lengths, nan_logits=ds.nan_logits + gate * ts.nan_logits)
    return GenerationOutput(tokens=tokens, lengths=lengths, stats=stats), defer_B
