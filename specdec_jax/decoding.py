"""Generation loops: speculative (any target function x any verifier) and
autoregressive, as pure functions over a ``lax.while_loop``.

One speculative round (ALGORITHMS.md §1, DESIGN.md "The decoding core"):

    pending token t (last emitted, not yet fed to either model)
    drafter: feed t, d_1 .. d_G one at a time -> q_1 .. q_{G+1}, drafts d_1 .. d_G
    target:  feed [t, d_1 .. d_G] in one extend  -> p_1 .. p_{G+1}
    pi_i = T(q_i, p_i); verifier -> j accepted drafts and a new token y
    emit d_1 .. d_j, y; both caches keep old_length + 1 + j entries; pending = y

Worked example (G = 3, a row whose caches hold 10 tokens): the drafter feeds 4
tokens (lengths 14), the target feeds 4 (lengths 14); the verifier accepts
j = 1: the round emits [d_1, y], both caches roll back to 10 + 1 + 1 = 12
(they keep t and d_1), and y is pending for the next round.

Rows of a batch accept different numbers of tokens; finished rows (EOS or
``max_new_tokens``) stop advancing but ride along until every row is done.
No host synchronisation happens inside a generation; the statistics come back
with the tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.models.interface import LanguageModel, Prompt
from specdec_jax.targets import TargetFunction
from specdec_jax.verify import TokenVerifier, sample_from_weights

Array = jax.Array


@flax.struct.dataclass
class SamplingParams:
    """Traced hyperparameters: changing them does not recompile."""

    temperature: Array  # float32 []: 0 = greedy
    top_p: Array  # float32 []: 1 = off
    alpha: Array  # float32 []: lenience of the target function
    beta: Array  # float32 []: Lossy's beta (ignored by other methods)


@flax.struct.dataclass
class GenerationStats:
    """Per-row counters returned with every generation."""

    target_calls: Array  # int32 [B]: target forward calls (rounds, or steps for AR)
    drafter_calls: Array  # int32 [B]: drafter forward calls (G + 1 per round)
    accepted_histogram: Array  # int32 [B, G + 1]: rounds that accepted j drafts
    rejections: Array  # int32 [B]: rounds that rejected a draft (j < G)
    deferred_mass: Array  # float32 [B]: sum over emitted positions of the deferral indicator
    emitted: Array  # int32 [B]: tokens emitted (== lengths)
    nan_logits: Array  # int32 [B]: model calls whose logits held NaN (must stay 0)


@flax.struct.dataclass
class GenerationOutput:
    tokens: Array  # int32 [B, max_new_tokens]: generated tokens, padded with pad_id
    lengths: Array  # int32 [B]: valid tokens per row (includes the EOS if one was emitted)
    stats: GenerationStats


@flax.struct.dataclass
class Prefilled:
    """Both models' caches after the prompt, and the first pending token."""

    target_cache: Any
    drafter_cache: Any
    pending: Array  # int32 [B]
    prompt_width: int = flax.struct.field(pytree_node=False, default=0)


@flax.struct.dataclass
class _LoopState:
    tokens: Array  # int32 [B, N + G + 1]: output buffer (slack for the last round)
    num_generated: Array  # int32 [B]
    pending: Array  # int32 [B]: last emitted token, not yet fed to either model
    done: Array  # bool [B]
    target_cache: Any
    drafter_cache: Any
    verifier_state: Any
    key: Array
    stats: GenerationStats


def start_token_and_prefill(model: LanguageModel, params, prompt: Prompt, max_length: int):
    """Prefills a model and returns (cache, first pending token).

    Decoder-only models feed every prompt token but the last, which becomes the
    pending token. Encoder-decoder models encode the whole prompt and start the
    decoder from its start token.
    """
    batch = prompt.tokens.shape[0]
    cache = model.init_cache(batch, max_length)
    start_id = getattr(model, "decoder_start_token_id", None)
    if start_id is not None:
        cache = model.prefill(params, prompt, cache).cache
        return cache, jnp.full((batch,), start_id, jnp.int32)
    last_B = jnp.take_along_axis(prompt.tokens, (prompt.lengths - 1)[:, None], axis=1)[:, 0]
    cache = model.prefill(params, prompt.replace(lengths=prompt.lengths - 1), cache).cache
    return cache, last_B.astype(jnp.int32)


def required_cache_length(prompt_width: int, max_new_tokens: int, gamma: int) -> int:
    """Cache size that no round can overflow: a round starts with at most
    ``P - 1 + N - 1`` tokens fed and feeds ``G + 1`` more."""
    return prompt_width + max_new_tokens + gamma + 1


def _has_nan(logits) -> Array:
    return jnp.any(jnp.isnan(logits), axis=tuple(range(1, logits.ndim))).astype(jnp.int32)


def _emit(state_tokens_BxN, num_generated_B, candidates_BxK, num_valid_B, eos_ids,
          max_new_tokens):
    """Appends ``candidates[b, :num_valid[b]]`` to each row, stopping after an EOS
    and at ``max_new_tokens``. Returns (tokens, num_generated, hit_eos)."""
    batch, k = candidates_BxK.shape
    offsets_K = jnp.arange(k)
    is_eos_BxK = jnp.zeros((batch, k), bool)
    for eos in eos_ids:
        is_eos_BxK |= candidates_BxK == eos
    is_eos_BxK &= offsets_K[None, :] < num_valid_B[:, None]
    first_eos_B = jnp.min(jnp.where(is_eos_BxK, offsets_K[None, :], k), axis=-1)
    count_B = jnp.minimum(num_valid_B, first_eos_B + 1)
    count_B = jnp.minimum(count_B, max_new_tokens - num_generated_B)
    positions_BxK = num_generated_B[:, None] + offsets_K[None, :]
    positions_BxK = jnp.where(offsets_K[None, :] < count_B[:, None], positions_BxK,
                              state_tokens_BxN.shape[1])  # out of range: dropped
    rows_BxK = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, k))
    tokens = state_tokens_BxN.at[rows_BxK, positions_BxK].set(candidates_BxK, mode="drop")
    hit_eos_B = first_eos_B < count_B
    return tokens, num_generated_B + count_B, hit_eos_B


def _zero_stats(batch: int, gamma: int) -> GenerationStats:
    zeros = jnp.zeros((batch,), jnp.int32)
    return GenerationStats(target_calls=zeros, drafter_calls=zeros,
                           accepted_histogram=jnp.zeros((batch, gamma + 1), jnp.int32),
                           rejections=zeros, deferred_mass=jnp.zeros((batch,), jnp.float32),
                           emitted=zeros, nan_logits=zeros)


@dataclasses.dataclass(frozen=True)
class SpeculativeDecoder:
    """Static configuration of a speculative generation (hashable: closes over jit).

    ``target_fn`` is any target function of ``targets.py``; ``verifier`` any
    verifier of ``verify.py`` / ``verify_block.py``.
    """

    target: LanguageModel
    drafter: LanguageModel
    target_fn: TargetFunction
    gamma: int
    max_new_tokens: int
    verifier: Any = TokenVerifier()
    sampling_config: sampling.SamplingConfig = sampling.SamplingConfig()
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0

    def _draft(self, drafter_params, cache, pending_B, key, sp: SamplingParams):
        """Feeds [pending, d_1 .. d_G] to the drafter one token at a time.

        Returns drafts [B, G], q and q_stat [B, G + 1, V], the drafter cache
        (lengths + G + 1) and a NaN counter.
        """

        def body_fn(carry, step_key):
            cache, token_B = carry
            out = self.drafter.extend(drafter_params, token_B[:, None], cache)
            dist = sampling.distributions(out.logits[:, 0], sp.temperature, sp.top_p,
                                          self.sampling_config)
            next_B = sample_from_weights(step_key, dist.probs)
            return (out.cache, next_B), (next_B, dist.probs, dist.stats, _has_nan(out.logits))

        keys = jax.random.split(key, self.gamma + 1)
        (cache, _), (tokens_TxB, q_TxBxV, qs_TxBxV, nan_TxB) = jax.lax.scan(
            body_fn, (cache, pending_B), keys)
        # [G + 1, B, ...] -> [B, G + 1, ...]; the last sampled token is unused.
        drafts_BxG = jnp.moveaxis(tokens_TxB, 0, 1)[:, : self.gamma]
        return (drafts_BxG, jnp.moveaxis(q_TxBxV, 0, 1), jnp.moveaxis(qs_TxBxV, 0, 1), cache,
                jnp.sum(nan_TxB, axis=0))

    def prefill(self, target_params, drafter_params, prompt: Prompt,
                max_length: int | None = None) -> Prefilled:
        """Feeds the prompt to both models. Deterministic (no key), so one
        prefill can seed many decodes: other seeds, verifiers, target
        functions, hyperparameters, or any ``gamma`` whose
        ``required_cache_length`` fits in ``max_length`` (default: this
        decoder's own requirement)."""
        width = prompt.tokens.shape[1]
        needed = required_cache_length(width, self.max_new_tokens, self.gamma)
        max_length = needed if max_length is None else max_length
        if max_length < needed:
            raise ValueError(f"max_length {max_length} is below the {needed} positions this "
                             f"decoder needs (prompt width {width} + max_new_tokens "
                             f"{self.max_new_tokens} + gamma {self.gamma} + 1).")
        target_cache, pending = start_token_and_prefill(self.target, target_params, prompt,
                                                        max_length)
        drafter_cache, _ = start_token_and_prefill(self.drafter, drafter_params, prompt,
                                                   max_length)
        return Prefilled(target_cache=target_cache, drafter_cache=drafter_cache,
                         pending=pending, prompt_width=width)

    def init_state(self, prefilled: Prefilled, key) -> _LoopState:
        batch = prefilled.pending.shape[0]
        return _LoopState(
            tokens=jnp.full((batch, self.max_new_tokens + self.gamma + 1), self.pad_id,
                            jnp.int32),
            num_generated=jnp.zeros((batch,), jnp.int32), pending=prefilled.pending,
            done=jnp.zeros((batch,), bool), target_cache=prefilled.target_cache,
            drafter_cache=prefilled.drafter_cache,
            verifier_state=self.verifier.init_state(batch), key=key,
            stats=_zero_stats(batch, self.gamma))

    def round(self, target_params, drafter_params, state: _LoopState,
              sp: SamplingParams) -> _LoopState:
        """One draft-score-verify-rollback round for every row not yet done."""
        key, draft_key, verify_key = jax.random.split(state.key, 3)
        old_target_len = state.target_cache.lengths
        old_drafter_len = state.drafter_cache.lengths
        drafts_BxG, q_BxG1xV, q_stat, drafter_cache, drafter_nan = self._draft(
            drafter_params, state.drafter_cache, state.pending, draft_key, sp)

        fed_BxG1 = jnp.concatenate([state.pending[:, None], drafts_BxG], axis=1)
        out = self.target.extend(target_params, fed_BxG1, state.target_cache)
        dist = sampling.distributions(out.logits, sp.temperature, sp.top_p,
                                      self.sampling_config)
        pi_BxG1xV, defer_BxG1 = self.target_fn(q_BxG1xV, dist.probs, q_stat, dist.stats,
                                               sp.alpha, sp.beta)
        g = self.gamma
        bonus_BxV = dist.probs[:, g] if self.target_fn.bonus_from_target else pi_BxG1xV[:, g]
        verdict = self.verifier(verify_key, drafts_BxG, q_BxG1xV[:, :g], pi_BxG1xV[:, :g],
                                bonus_BxV, state.verifier_state)
        accepted_B = verdict.num_accepted

        # Candidates: d_1 .. d_j then y at index j (G + 1 slots).
        candidates = jnp.concatenate([drafts_BxG, drafts_BxG[:, :1]], axis=1)
        candidates = jnp.where(jnp.arange(g + 1)[None, :] == accepted_B[:, None],
                               verdict.next_token[:, None], candidates)
        active_B = ~state.done
        tokens, num_generated, hit_eos = _emit(
            state.tokens, state.num_generated, candidates,
            jnp.where(active_B, accepted_B + 1, 0), self.eos_ids, self.max_new_tokens)
        done = state.done | hit_eos | (num_generated >= self.max_new_tokens)

        keep_B = jnp.where(active_B, 1 + accepted_B, 0)
        emitted_pos_BxG1 = jnp.arange(g + 1)[None, :] < (num_generated - state.num_generated
                                                         )[:, None]
        stats = state.stats
        active = active_B.astype(jnp.int32)
        stats = stats.replace(
            target_calls=stats.target_calls + active,
            drafter_calls=stats.drafter_calls + active * (g + 1),
            accepted_histogram=stats.accepted_histogram + active[:, None] * jax.nn.one_hot(
                accepted_B, g + 1, dtype=jnp.int32),
            rejections=stats.rejections + active * (accepted_B < g),
            deferred_mass=stats.deferred_mass + jnp.sum(
                jnp.where(emitted_pos_BxG1, defer_BxG1, 0.0), axis=-1),
            emitted=num_generated,
            nan_logits=stats.nan_logits + active * (drafter_nan + _has_nan(out.logits)))
        verifier_state = jax.tree_util.tree_map(
            lambda new, old: jnp.where(
                active_B.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
            verdict.state, state.verifier_state)
        return state.replace(
            tokens=tokens, num_generated=num_generated,
            pending=jnp.where(active_B, verdict.next_token, state.pending), done=done,
            target_cache=out.cache.replace(lengths=old_target_len + keep_B),
            drafter_cache=drafter_cache.replace(lengths=old_drafter_len + keep_B),
            verifier_state=verifier_state, key=key, stats=stats)

    def generate(self, target_params, drafter_params, prompt: Prompt, key,
                 sp: SamplingParams) -> GenerationOutput:
        """Prefills, then runs rounds until every row is done. Pure; jit it (see ``api``)."""
        return self.decode(target_params, drafter_params,
                           self.prefill(target_params, drafter_params, prompt), key, sp)

    def decode(self, target_params, drafter_params, prefilled: Prefilled, key,
               sp: SamplingParams) -> GenerationOutput:
        """Runs rounds from a ``prefill`` until every row is done. Pure; jit it."""
        needed = required_cache_length(prefilled.prompt_width, self.max_new_tokens, self.gamma)
        capacity = min(prefilled.target_cache.max_length, prefilled.drafter_cache.max_length)
        if capacity < needed:
            raise ValueError(
                f"the prefilled caches hold {capacity} positions but this decoder needs "
                f"{needed} (prompt width {prefilled.prompt_width} + max_new_tokens "
                f"{self.max_new_tokens} + gamma {self.gamma} + 1); prefill with "
                f"max_length={needed} or more.")
        state = self.init_state(prefilled, key)

        def cond_fn(state):
            return ~jnp.all(state.done)

        def body_fn(state):
            return self.round(target_params, drafter_params, state, sp)

        state = jax.lax.while_loop(cond_fn, body_fn, state)
        return GenerationOutput(tokens=state.tokens[:, : self.max_new_tokens],
                                lengths=state.num_generated, stats=state.stats)


@dataclasses.dataclass(frozen=True)
class AutoregressiveDecoder:
    """Target-only sampling, one token per call: the baseline every method is
    measured against, on the same machinery (prefill, sampling, EOS, stats)."""

    target: LanguageModel
    max_new_tokens: int
    sampling_config: sampling.SamplingConfig = sampling.SamplingConfig()
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0

    def generate(self, target_params, drafter_params, prompt: Prompt, key,
                 sp: SamplingParams) -> GenerationOutput:
        del drafter_params
        batch, width = prompt.tokens.shape
        max_length = required_cache_length(width, self.max_new_tokens, 0)
        cache, pending = start_token_and_prefill(self.target, target_params, prompt,
                                                 max_length)
        state = _LoopState(
            tokens=jnp.full((batch, self.max_new_tokens + 1), self.pad_id, jnp.int32),
            num_generated=jnp.zeros((batch,), jnp.int32), pending=pending,
            done=jnp.zeros((batch,), bool), target_cache=cache, drafter_cache=None,
            verifier_state=None, key=key, stats=_zero_stats(batch, 0))

        def cond_fn(state):
            return ~jnp.all(state.done)

        def body_fn(state):
            key, step_key = jax.random.split(state.key)
            out = self.target.extend(target_params, state.pending[:, None], state.target_cache)
            dist = sampling.distributions(out.logits[:, 0], sp.temperature, sp.top_p,
                                          self.sampling_config)
            next_B = sample_from_weights(step_key, dist.probs)
            active_B = ~state.done
            tokens, num_generated, hit_eos = _emit(
                state.tokens, state.num_generated, next_B[:, None], active_B.astype(jnp.int32),
                self.eos_ids, self.max_new_tokens)
            active = active_B.astype(jnp.int32)
            stats = state.stats.replace(
                target_calls=state.stats.target_calls + active, emitted=num_generated,
                nan_logits=state.stats.nan_logits + active * _has_nan(out.logits))
            return state.replace(
                tokens=tokens, num_generated=num_generated,
                pending=jnp.where(active_B, next_B, state.pending),
                done=state.done | hit_eos | (num_generated >= self.max_new_tokens),
                target_cache=out.cache.replace(
                    lengths=state.target_cache.lengths + active), key=key, stats=stats)

        state = jax.lax.while_loop(cond_fn, body_fn, state)
        return GenerationOutput(tokens=state.tokens[:, : self.max_new_tokens],
                                lengths=state.num_generated, stats=state.stats)
