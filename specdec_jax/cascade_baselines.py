"""The cascade baselines of SpecCascade that are not one speculative round
(docs/algorithms.md, 'Cascade baselines'): the sequential token cascade, the original Big-Little
Decoder, and the sequence-level cascade.

The oracle cascade *is* a speculative round with ``G = 0``: the drafter
gives ``q_1``, one target call gives ``p_1``, and the token is drawn from
``pi_1 = T_delta(q_1, p_1)``; ``api.make_decoder(method="oracle")`` builds it.

**Draft until told to stop** (``DraftUntilDecoder``). Both the sequential
cascade and the original BiLD let the drafter run on its own, one token at a
time, until a rule that reads only ``q`` stops it (or ``max_drafts`` tokens,
10 in the paper, so the target's catch-up stays bounded), then call the
target once on everything it missed::

    drafter: q_1; while not stop(q_i) and i <= M: d_i ~ q_i, feed d_i -> q_{i+1}
             (k = number of drafts; the drafter computed q_1 .. q_{k+1})
    target:  feed [pending, d_1 .. d_k] in one extend -> p_1 .. p_{k+1}
    token-cascade: keep d_1 .. d_k (delta(q_i) = 0 there, pi_i = q_i), then
             y ~ pi_{k+1} = T_delta(q_{k+1}, p_{k+1})   (p when the rule deferred)
    bild-original: j = first i <= k with D(q_i, p_i) > alpha, else k + 1;
             keep d_1 .. d_{j-1}, then y ~ p_j (the target's token: a
             deterministic rollback, no rejection sampling)

This is Alg. 2 of the paper with the target's calls batched: the target runs
exactly where the token-by-token loop would call it (at a deferral, or after
``M`` drafter tokens), so tokens, drafter calls and target calls match it.

Worked example (token cascade, M = 10, Chow alpha = 0.2): max q_1 = 0.9,
max q_2 = 0.95, max q_3 = 0.7 < 0.8: the drafter drafts d_1, d_2 and stops
(k = 2, 3 drafter calls); the target feeds [t, d_1, d_2] (K = 3) and y ~ p_3;
the round emits d_1 d_2 y.

The target's extend runs at the smallest compiled width covering every row
(``target_widths``; rows feed their own tokens, then padding that the
rollback discards), so a round costs what its longest row needs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import sampling, target_functions
from specdec_jax.decoding import (
    DecoderOptions,
    GenerationOutput,
    count_round,
    emit_round,
    extend_bucketed,
    initial_history,
    required_cache_length,
    run_rounds,
    zero_stats,
)
from specdec_jax.drafting.base import Context, extend_from_history
from specdec_jax.drafting.model_drafter import has_nan
from specdec_jax.loops import write_rows
from specdec_jax.models.interface import (
    LanguageModel,
    Prompt,
    is_encoder_decoder,
    start_token_and_prefill,
)
from specdec_jax.sampling import SamplingParams, sample_from_weights
from specdec_jax.verify.token import leading_accepts

Array = jax.Array

# The paper lets the drafter run at most 10 tokens before the target is called
# (App. E.1, following Kim et al.); longer runs make the target's catch-up slow.
MAX_CONSECUTIVE_DRAFTS = 10
MODES = ("token-cascade", "bild-original")


@flax.struct.dataclass
class _Drafts:
    cache: Any
    tokens: Array  # int32 [B, M]: d_1 .. d_M (slots past count are scratch)
    q: Array  # float32 [B, M + 1, V]: processed q_1 .. q_{M+1}
    q_stat: Array  # float32 [B, M + 1, V]
    count: Array  # int32 [B]: drafts made (k)
    drafting: Array  # bool [B]: row still drafting
    calls: Array  # int32 [B]: drafter calls this round
    nan: Array  # int32 [B]
    key: Array


@flax.struct.dataclass
class _State:
    tokens: Array  # int32 [B, N + M + 1]
    num_generated: Array  # int32 [B]
    history: Array  # int32 [B, S]
    length: Array  # int32 [B]: history[length - 1] is pending
    done: Array  # bool [B]
    target_cache: Any
    drafter_cache: Any
    key: Array
    stats: Any


@dataclasses.dataclass(frozen=True)
class DraftUntilDecoder(DecoderOptions):
    """Sequential token cascade (``mode="token-cascade"``) or
    the original Big-Little Decoder (``mode="bild-original"``).

    token-cascade: ``rule`` (default Chow) decides from ``q`` alone, with the
    traced ``alpha``; it must not read the target. bild-original: the drafter
    falls back to the target when ``max q < 1 - fallback_alpha`` (static: one
    curve per fallback threshold, as in the paper's Figure 8), and the
    rollback threshold on ``D(q, p)`` is the traced ``alpha`` in [0, 10].
    """

    target: LanguageModel
    drafter: LanguageModel
    mode: str
    max_new_tokens: int
    rule: target_functions.DeferralRule = target_functions.Chow()
    fallback_alpha: float = 0.5
    max_drafts: int = MAX_CONSECUTIVE_DRAFTS
    target_widths: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 11)

    def __post_init__(self):
        super().__post_init__()
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

    def _stop(self, q_stat_BxV: Array, sp: SamplingParams) -> Array:
        """bool [B]: stop drafting before sampling at this position."""
        if self.mode == "token-cascade":
            return self.rule.defer(None, None, q_stat_BxV, None, sp.alpha)
        return jnp.max(q_stat_BxV, axis=-1) < 1.0 - self.fallback_alpha

    def _draft(self, params, cache, context: Context, key, sp) -> _Drafts:
        m = self.max_drafts
        config = self.sampling_config
        logits, _, cache, calls_B, _, _ = extend_from_history(self.drafter, params, cache,
                                                              context, None, (1,))
        first = sampling.distributions(logits[:, 0], sp.temperature, sp.top_p, config)
        batch, vocab = first.probs.shape
        q = jnp.zeros((batch, m + 1, vocab), jnp.float32).at[:, 0].set(first.probs)
        q_stat = jnp.zeros((batch, m + 1, vocab), jnp.float32).at[:, 0].set(first.stats)
        drafts = _Drafts(cache=cache, tokens=jnp.zeros((batch, m), jnp.int32), q=q,
                         q_stat=q_stat, count=jnp.zeros((batch,), jnp.int32),
                         drafting=~self._stop(first.stats, sp), calls=calls_B,
                         nan=has_nan(logits), key=key)

        def cond_fn(d: _Drafts):
            return jnp.any(d.drafting)

        def body_fn(d: _Drafts):
            key, step_key = jax.random.split(d.key)
            i_B = d.count  # every drafting row is at the same step, finished rows lag
            q_i = jnp.take_along_axis(d.q, i_B[:, None, None], axis=1)[:, 0]
            token_B = sample_from_weights(step_key, q_i)
            out = self.drafter.extend(params, token_B[:, None], d.cache)
            dist = sampling.distributions(out.logits[:, 0], sp.temperature, sp.top_p, config)
            go = d.drafting
            count = d.count + go
            cache = out.cache.replace(lengths=jnp.where(go, out.cache.lengths,
                                                        d.cache.lengths))
            tokens = write_rows(d.tokens, token_B[:, None], i_B, go.astype(jnp.int32))
            q = write_rows(d.q, dist.probs[:, None], count, go.astype(jnp.int32))
            q_stat = write_rows(d.q_stat, dist.stats[:, None], count, go.astype(jnp.int32))
            drafting = go & ~self._stop(dist.stats, sp) & (count < m)
            return d.replace(cache=cache, tokens=tokens, q=q, q_stat=q_stat, count=count,
                             drafting=drafting, calls=d.calls + go,
                             nan=d.nan + go * has_nan(out.logits), key=key)

        return jax.lax.while_loop(cond_fn, body_fn, drafts)

    def round(self, target_params, drafter_params, state: _State, sp: SamplingParams
              ) -> _State:
        key, draft_key, sample_key = jax.random.split(state.key, 3)
        m = self.max_drafts
        context = Context(history=state.history, length=state.length)
        pending_B = jnp.take_along_axis(state.history, (state.length - 1)[:, None], 1)[:, 0]
        d = self._draft(drafter_params, state.drafter_cache, context, draft_key, sp)
        active_B = ~state.done
        k_B = d.count

        fed_BxM1 = jnp.concatenate([pending_B[:, None], d.tokens], axis=1)
        old_target_len = state.target_cache.lengths
        needed = jnp.max(jnp.where(active_B, k_B + 1, 1))
        logits, _, target_cache, width = extend_bucketed(
            self.target, target_params, fed_BxM1, needed, state.target_cache, self.target_widths)
        dist = sampling.distributions(logits, sp.temperature, sp.top_p, self.sampling_config)
        pick = lambda x, i_B: jnp.take_along_axis(x, i_B[:, None, None], axis=1)[:, 0]

        if self.mode == "token-cascade":
            accepted_B = k_B
            q_k1, p_k1 = pick(d.q, k_B), pick(dist.probs, k_B)
            defer_B = self.rule.defer(q_k1, p_k1, pick(d.q_stat, k_B), pick(dist.stats, k_B),
                                      sp.alpha).astype(jnp.float32)
            weights = (1.0 - defer_B[:, None]) * q_k1 + defer_B[:, None] * p_k1
            rolled_back_B = jnp.zeros_like(k_B, bool)
        else:
            # D(q_i, p_i) > alpha rolls back at i; positions past k were not drafted.
            reject_BxM = target_functions.BiLD().defer(d.q[:, :m], dist.probs[:, :m],
                                              d.q_stat[:, :m], dist.stats[:, :m], sp.alpha)
            accepted_B = jnp.minimum(leading_accepts(~reject_BxM), k_B)
            rolled_back_B = accepted_B < k_B
            weights = pick(dist.probs, accepted_B)
            defer_B = jnp.ones_like(k_B, jnp.float32)  # the new token is the target's
        next_B = sample_from_weights(sample_key, weights)

        candidates, tokens, num_generated, done, keep_B = emit_round(
            self, state, d.tokens, accepted_B, next_B, pending_B)
        y_emitted_B = num_generated - state.num_generated == accepted_B + 1

        calls_Bx1 = d.calls[:, None]  # one drafter model, fed one token a call
        stats = count_round(
            state.stats, active_B, target_fed=width, target_single=width == 1,
            drafter_calls_BxM=calls_Bx1, drafter_fed_BxM=calls_Bx1,
            drafter_single_BxM=calls_Bx1, accepted_B=accepted_B, rejected_B=rolled_back_B,
            offered_B=k_B, nodes_B=k_B, by_rank_BxK=accepted_B[:, None],
            deferred_B=jnp.where(y_emitted_B, defer_B, 0.0), emitted_B=num_generated,
            nan_B=d.nan + has_nan(logits))
        history = write_rows(state.history, candidates, state.length)
        drafter_cache = d.cache.replace(lengths=jnp.minimum(
            d.cache.lengths, state.length + jnp.where(active_B, accepted_B, 0)))
        return state.replace(
            tokens=tokens, num_generated=num_generated, history=history,
            length=state.length + keep_B, done=done,
            target_cache=target_cache.replace(lengths=old_target_len + keep_B),
            drafter_cache=drafter_cache, key=key, stats=stats)

    def generate(self, target_params, drafter_params, prompt: Prompt, key,
                 sp: SamplingParams) -> GenerationOutput:
        """Prefills both models, then runs rounds until every row is done. Pure; jit it."""
        batch, width = prompt.tokens.shape
        max_length = required_cache_length(width, self.max_new_tokens, self.max_drafts)
        target_cache, _ = start_token_and_prefill(self.target, target_params, prompt,
                                                  max_length)
        drafter_cache, _ = start_token_and_prefill(self.drafter, drafter_params, prompt,
                                                   max_length)
        history, length = initial_history(
            prompt, max_length, is_encoder_decoder(self.target),
            getattr(self.target, "decoder_start_token_id", None))
        state = _State(
            tokens=jnp.full((batch, self.max_new_tokens + self.max_drafts + 1), self.pad_id,
                            jnp.int32),
            num_generated=jnp.zeros((batch,), jnp.int32), history=history, length=length,
            done=jnp.zeros((batch,), bool), target_cache=target_cache,
            drafter_cache=drafter_cache, key=key,
            stats=zero_stats(batch, self.max_drafts, 1))
        return run_rounds(lambda s: self.round(target_params, drafter_params, s, sp), state,
                          self.max_new_tokens, self.rounds_per_sync)


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
