"""Generation loops: speculative (any target function x any verifier) and
autoregressive, as pure functions over a ``lax.while_loop``.

One speculative round (docs/algorithms.md, 'The generic round'):

    pending token t (last emitted, not yet fed to either model)
    drafter: G proposals d_1 .. d_G with the laws q_1 .. q_G they were drawn
             from (and q_{G+1} when the target function needs it); any
             strategy of ``drafting/`` (a model, Max-Gram, CS Drafting)
    target:  feed [t, d_1 .. d_G] in one extend  -> p_1 .. p_{G+1}
    pi_i = T(q_i, p_i); verifier -> j accepted drafts and a new token y
    emit d_1 .. d_j, y; the target cache keeps old_length + 1 + j entries,
    the drafter rewinds to what it proposed that was kept; pending = y

Worked example (G = 3, a row whose target cache holds 10 tokens, history 11
with t last): the target feeds 4 (lengths 14); the verifier accepts j = 1:
the round emits [d_1, y], the target rolls back to 10 + 1 + 1 = 12 (it keeps
t and d_1), the history grows to 13 with y pending, and the drafter keeps at
most the first 12 history tokens it fed.

Rows of a batch accept different numbers of tokens; finished rows (EOS or
``max_new_tokens``) stop advancing but ride along until every row is done.
No host synchronisation happens inside a generation; the statistics come back
with the tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import loops, sampling
from specdec_jax.drafting.base import Context, is_drafter, needs_features
from specdec_jax.drafting.model_drafter import ModelDrafter, has_nan
from specdec_jax.loops import write_rows
from specdec_jax.models.interface import (
    LanguageModel,
    Prompt,
    is_encoder_decoder,
    start_token_and_prefill,
    switch_writing_windows,
)
from specdec_jax.sampling import SamplingParams, sample_from_weights
from specdec_jax.target_functions import TargetFunction
from specdec_jax.verify.token import TokenVerifier, VerifyOutput, block_lengths, emitted_tokens

Array = jax.Array


@flax.struct.dataclass
class GenerationStats:
    """Per-row counters returned with every generation."""

    target_calls: Array  # int32 [B]: target forward calls (rounds, or steps for AR)
    target_fed: Array  # int32 [B]: tokens those calls fed (a cost model prices them)
    target_single_calls: Array  # int32 [B]: target calls that fed one token
    drafter_calls: Array  # int32 [B]: neural drafter forward calls, all models
    drafter_calls_by_model: Array  # int32 [B, M]: per drafter model (drafter.model_names)
    drafter_tokens_by_model: Array  # int32 [B, M]: tokens those calls fed
    drafter_single_calls_by_model: Array  # int32 [B, M]: those calls that fed one token
    accepted_histogram: Array  # int32 [B, G + 1]: rounds that accepted j drafts
    rejections: Array  # int32 [B]: rounds that rejected a draft (j < the drafts offered)
    drafted: Array  # int32 [B]: drafts offered for verification (G per round, or fewer
    #                 when an adaptive drafter stops early; a tree's deepest path, the
    #                 most drafts its round can accept); discarded = drafted - accepted
    drafted_nodes: Array  # int32 [B]: tokens drafted for verification (= drafted for
    #                 chains; every node of a tree, N per round)
    # int32 [B, K]: accepted drafts by their rank among their siblings (0 = their
    # parent's first-drawn child; a chain's drafts are all rank 0, K = 1)
    accepted_by_rank: Array
    deferred_mass: Array  # float32 [B]: sum over emitted positions of the deferral indicator
    emitted: Array  # int32 [B]: tokens emitted (== lengths)
    nan_logits: Array  # int32 [B]: model calls whose logits held NaN (must stay 0)
    # float32 [B]: sum of log q_stat(token) over the emitted tokens (autoregressive
    # decoders only; a sequence-level cascade defers on it; 0 elsewhere)
    sequence_logprob: Array

    def accepted(self) -> Array:
        """int32 [B]: drafts accepted per row, sum over rounds (from the histogram)."""
        histogram = self.accepted_histogram
        return (histogram * jnp.arange(histogram.shape[-1])).sum(-1)


@flax.struct.dataclass
class GenerationOutput:
    tokens: Array  # int32 [B, max_new_tokens]: generated tokens, padded with pad_id
    lengths: Array  # int32 [B]: valid tokens per row (includes the EOS if one was emitted)
    stats: GenerationStats


@flax.struct.dataclass
class Prefilled:
    """The target's cache and the drafter's state after the prompt, and the history."""

    target_cache: Any
    drafter_state: Any
    history: Array  # int32 [B, S]: prompt (decoder-only) or start token; room for the output
    length: Array  # int32 [B]: history[b, length[b] - 1] is the first pending token
    prompt_width: int = flax.struct.field(pytree_node=False, default=0)
    # [B, S, D]: the target's hidden states along the history, for drafters that
    # read them (drafting.needs_features); None otherwise.
    features: Any = None


@flax.struct.dataclass
class _LoopState:
    tokens: Array  # int32 [B, N + G + 1]: output buffer (slack for the last round)
    num_generated: Array  # int32 [B]
    history: Array  # int32 [B, S]: prompt + emitted; what drafters read
    length: Array  # int32 [B]: tokens in history; the last one is pending
    done: Array  # bool [B]
    target_cache: Any
    drafter_state: Any
    verifier_state: Any
    key: Array
    stats: GenerationStats
    features: Any = None  # [B, S, D] target hidden states (feature drafters) or None


# Scratch positions every decoder keeps past the prompt and the new tokens, however few
# it needs (the autoregressive target: none). A model's attention reduces over the
# whole cache, masked or not, and XLA orders that sum by the cache's length: a stored
# target's logits for one context moved by up to 0.40 between caches of 236 and 241
# positions (the 1.5B on CPU), enough for greedy speculative and autoregressive
# decoding to part on HumanEval prompts. With one length for the autoregressive target
# and every decoder whose drafts or tree nodes fit in it, they score with one function.
MIN_SCRATCH = 64


def scratch_positions(gamma: int) -> int:
    """The cache room a decoder keeps beyond the prompt and the new tokens when
    its rounds feed up to ``gamma + 1`` tokens: ``max(gamma, MIN_SCRATCH)``."""
    return max(gamma, MIN_SCRATCH)


def required_cache_length(prompt_width: int, max_new_tokens: int, gamma: int) -> int:
    """Cache size that no round can overflow: a round starts with at most
    ``P - 1 + N - 1`` tokens fed and feeds ``G + 1`` more; at least
    ``MIN_SCRATCH`` positions of room, so decoders share one length."""
    return prompt_width + max_new_tokens + scratch_positions(gamma) + 1


@dataclasses.dataclass(frozen=True)
class EndOfBlockStop:
    """Ends a row when a line ends and the next starts at column 0: the end of a
    top-level Python function (HumanEval's "stop at the end of the function").

    Token classes come from the tokenizer (``data.humaneval.end_of_block_stop``):
    ``line_end_ids`` are tokens whose text ends with a newline,
    ``indented_ids`` tokens whose text starts with whitespace. A row stops at
    the first token outside ``indented_ids`` that follows a line end; that
    token is emitted (like an EOS) and the task's stop strings cut it from the
    text. Hashable (tuples), so it is a static argument like ``eos_ids``.
    """

    vocab_size: int
    line_end_ids: tuple[int, ...]
    indented_ids: tuple[int, ...]

    def hits(self, previous_BxK: Array, tokens_BxK: Array) -> Array:
        """bool [B, K]: ``tokens[b, k]`` ends the block, given the token before it."""
        table = lambda ids: jnp.zeros((self.vocab_size,), bool).at[jnp.asarray(ids)].set(True)
        return table(self.line_end_ids)[previous_BxK] & ~table(self.indented_ids)[tokens_BxK]


def _emit(state_tokens_BxN, num_generated_B, candidates_BxK, num_valid_B, eos_ids,
          max_new_tokens, stop_rule=None, previous_B=None):
    """Appends ``candidates[b, :num_valid[b]]`` to each row, stopping after an EOS
    (or where ``stop_rule`` hits, ``previous`` being the token before the
    candidates) and at ``max_new_tokens``. Returns (tokens, num_generated, hit_eos)."""
    batch, k = candidates_BxK.shape
    offsets_K = jnp.arange(k)
    is_eos_BxK = jnp.zeros((batch, k), bool)
    for eos in eos_ids:
        is_eos_BxK |= candidates_BxK == eos
    if stop_rule is not None:
        previous_BxK = jnp.concatenate([previous_B[:, None], candidates_BxK[:, :-1]], axis=1)
        is_eos_BxK |= stop_rule.hits(previous_BxK, candidates_BxK)
    is_eos_BxK &= offsets_K[None, :] < num_valid_B[:, None]
    first_eos_B = jnp.min(jnp.where(is_eos_BxK, offsets_K[None, :], k), axis=-1)
    count_B = jnp.minimum(num_valid_B, first_eos_B + 1)
    count_B = jnp.minimum(count_B, max_new_tokens - num_generated_B)
    tokens = write_rows(state_tokens_BxN, candidates_BxK, num_generated_B, count_B)
    hit_eos_B = first_eos_B < count_B
    return tokens, num_generated_B + count_B, hit_eos_B


def extend_bucketed(model: LanguageModel, params, tokens_BxW: Array, needed: Array, cache,
                    widths: tuple[int, ...]):
    """Extends by ``tokens[:, :w]`` for the smallest compiled ``w >= needed``
    (``lax.switch``: one program), so a round whose rows need few positions
    does not pay for all ``W``. Returns (logits and hidden states zero-padded
    to [B, W, ...], cache holding ``w`` more tokens, w); the caller rolls the
    cache back."""
    full = tokens_BxW.shape[1]
    sizes = sorted({min(w, full) for w in widths} | {full})

    def run(width):
        def fn(cache):
            out = model.extend(params, tokens_BxW[:, :width], cache)
            pad = lambda x: jnp.pad(x, ((0, 0), (0, full - width), (0, 0)))  # noqa: E731
            return (pad(out.logits), pad(out.hidden)), out.cache
        return fn

    branch = jnp.sum(needed > jnp.asarray(sizes)).astype(jnp.int32)
    (logits, hidden), new = switch_writing_windows(branch, [run(w) for w in sizes], cache,
                                                   most=full)
    return logits, hidden, new, jnp.asarray(sizes, jnp.int32)[branch]


def emit_round(decoder, state, drafts_BxG, accepted_B, next_B, pending_B):
    """A round's output for every row not yet done: the accepted drafts, then the
    new token (stopping at EOS, the decoder's stop rule, or max_new_tokens).

    Returns (candidates [B, G + 1], tokens, num_generated, done, keep [B]); ``keep``
    is what the target's cache keeps of the round (pending + accepted drafts).
    """
    candidates = emitted_tokens(drafts_BxG, accepted_B, next_B)
    active_B = ~state.done
    tokens, num_generated, hit_eos = _emit(
        state.tokens, state.num_generated, candidates, jnp.where(active_B, accepted_B + 1, 0),
        decoder.eos_ids, decoder.max_new_tokens, decoder.stop_rule, pending_B)
    done = state.done | hit_eos | (num_generated >= decoder.max_new_tokens)
    keep_B = jnp.where(active_B, 1 + accepted_B, 0)
    return candidates, tokens, num_generated, done, keep_B


def zero_stats(batch: int, gamma: int, num_models: int = 0,
               ranks: int = 1) -> GenerationStats:
    """All-zero statistics for ``batch`` rows, ``gamma`` drafts a round (a
    tree's depth), ``num_models`` drafters and ``ranks`` sibling ranks (a
    tree's widest node; 1 for chains): where every decoding loop starts counting."""
    zeros = jnp.zeros((batch,), jnp.int32)
    by_model = jnp.zeros((batch, num_models), jnp.int32)
    return GenerationStats(target_calls=zeros, target_fed=zeros, target_single_calls=zeros,
                           drafter_calls=zeros,
                           drafter_calls_by_model=by_model, drafter_tokens_by_model=by_model,
                           drafter_single_calls_by_model=by_model,
                           accepted_histogram=jnp.zeros((batch, gamma + 1), jnp.int32),
                           rejections=zeros, drafted=zeros, drafted_nodes=zeros,
                           accepted_by_rank=jnp.zeros((batch, ranks), jnp.int32),
                           deferred_mass=jnp.zeros((batch,), jnp.float32),
                           emitted=zeros, nan_logits=zeros,
                           sequence_logprob=jnp.zeros((batch,), jnp.float32))


def count_round(stats: GenerationStats, active_B: Array, *, target_fed, target_single,
                drafter_calls_BxM: Array, drafter_fed_BxM: Array, drafter_single_BxM: Array,
                accepted_B: Array, rejected_B: Array, offered_B: Array, nodes_B,
                by_rank_BxK: Array, deferred_B: Array, emitted_B: Array,
                nan_B: Array) -> GenerationStats:
    """The statistics after one round of every decoder (chains, trees, the
    cascade baselines): each count grows on the rows still ``active``.

    ``target_fed`` / ``target_single``: tokens the target call fed and whether
    it fed one; ``drafter_*_BxM``: each drafter model's calls, tokens fed and
    one-token calls; ``accepted_B`` drafts kept, ``rejected_B`` whether a draft
    was rejected, ``offered_B`` the most drafts the round could accept (a
    chain's G, a tree's deepest path), ``nodes_B`` the tokens drafted for
    verification, ``by_rank_BxK`` the accepted drafts by sibling rank,
    ``deferred_B`` the deferral indicators summed over the emitted positions,
    ``emitted_B`` the row's tokens so far, ``nan_B`` calls with NaN logits.
    """
    active = active_B.astype(jnp.int32)
    active_Bx1 = active[:, None]
    histogram = stats.accepted_histogram
    return stats.replace(
        target_calls=stats.target_calls + active,
        target_fed=stats.target_fed + active * target_fed,
        target_single_calls=stats.target_single_calls + active * target_single,
        drafter_calls=stats.drafter_calls + active * jnp.sum(drafter_calls_BxM, axis=-1),
        drafter_calls_by_model=stats.drafter_calls_by_model + active_Bx1 * drafter_calls_BxM,
        drafter_tokens_by_model=stats.drafter_tokens_by_model + active_Bx1 * drafter_fed_BxM,
        drafter_single_calls_by_model=stats.drafter_single_calls_by_model +
        active_Bx1 * drafter_single_BxM,
        accepted_histogram=histogram + active_Bx1 * jax.nn.one_hot(
            accepted_B, histogram.shape[-1], dtype=jnp.int32),
        rejections=stats.rejections + active * rejected_B,
        drafted=stats.drafted + active * offered_B,
        drafted_nodes=stats.drafted_nodes + active * nodes_B,
        accepted_by_rank=stats.accepted_by_rank + active_Bx1 * by_rank_BxK,
        deferred_mass=stats.deferred_mass + jnp.where(active_B, deferred_B, 0.0),
        emitted=emitted_B,
        nan_logits=stats.nan_logits + active * nan_B)


def initial_history(prompt: Prompt, width: int, encoder_decoder: bool, start_id: int | None
                    ) -> tuple[Array, Array]:
    """(history [B, width], length [B]) before the first round."""
    batch, prompt_width = prompt.tokens.shape
    if encoder_decoder:
        history = jnp.zeros((batch, width), jnp.int32).at[:, 0].set(start_id)
        return history, jnp.ones((batch,), jnp.int32)
    history = jnp.pad(prompt.tokens.astype(jnp.int32), ((0, 0), (0, width - prompt_width)))
    return history, prompt.lengths.astype(jnp.int32)


def check_normalised_law(verifier, target_fn: TargetFunction, advice: str) -> None:
    """Refuses a verifier that needs a normalised ``pi`` (``needs_normalised_law``:
    it reproduces that law over many rounds or along a tree's residuals) with a
    target function whose ``pi`` is unnormalised by design (the lossy rule)."""
    if getattr(verifier, "needs_normalised_law", False) and not target_fn.normalised:
        raise ValueError(
            f"the {verifier.name!r} verifier needs a normalised pi, and {target_fn.name!r} "
            f"weighs tokens with an unnormalised pi by design; {advice}.")


def first_loop_state(prefilled: Prefilled, key, tokens_width: int, pad_id: int, *,
                     verifier_state, stats: GenerationStats) -> _LoopState:
    """The loop state before the first round: nothing emitted, no row done, the
    caches and history as ``prefill`` left them; ``tokens_width`` is
    ``max_new_tokens`` plus the most one round can emit (slack for the last)."""
    batch = prefilled.length.shape[0]
    return _LoopState(
        tokens=jnp.full((batch, tokens_width), pad_id, jnp.int32),
        num_generated=jnp.zeros((batch,), jnp.int32), history=prefilled.history,
        length=prefilled.length, done=jnp.zeros((batch,), bool),
        target_cache=prefilled.target_cache, drafter_state=prefilled.drafter_state,
        verifier_state=verifier_state, key=key, stats=stats, features=prefilled.features)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderOptions:
    """The options every decoder takes (keyword-only, after its own fields):
    how it samples, which tokens end a row, what pads a finished row, and how
    often its loop reads the loop condition."""

    sampling_config: sampling.SamplingConfig = sampling.SamplingConfig()
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0
    stop_rule: EndOfBlockStop | None = None  # ends rows besides eos_ids
    # Rounds between two reads of the loop condition (``loop_until_done``):
    # > 1 saves a GPU's per-round host sync; outputs are identical.
    rounds_per_sync: int = 1

    def __post_init__(self):
        check_rounds_per_sync(self.rounds_per_sync)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoundDecoder(DecoderOptions):
    """What every decoder of draft-score-verify rounds (chains, trees) shares:
    the prefill of both models, ``generate`` = ``prefill`` then ``decode``, and
    the cache-room checks. A subclass has ``target`` and ``drafter`` fields and defines
    ``max_new_tokens``, ``gamma`` (the scratch room a round needs beyond the
    emitted tokens), ``init_state``, ``round`` and, for its error messages,
    ``kind`` and ``scratch_room``."""

    kind: ClassVar[str] = "decoder"

    def scratch_room(self) -> str:
        return f"gamma {self.gamma}"

    def _needed_room(self, prompt_width: int) -> tuple[int, str]:
        """The cache length this decoder needs after a prompt, and its terms in words."""
        needed = required_cache_length(prompt_width, self.max_new_tokens, self.gamma)
        return needed, (f"prompt width {prompt_width} + max_new_tokens "
                        f"{self.max_new_tokens} + room for {self.scratch_room()} (at least "
                        f"{MIN_SCRATCH}) + 1")

    def prefill_length(self, prompt_width: int, max_length: int | None) -> int:
        """``max_length`` (default: what this decoder needs), refused if too short."""
        needed, terms = self._needed_room(prompt_width)
        max_length = needed if max_length is None else max_length
        if max_length < needed:
            raise ValueError(f"max_length {max_length} is below the {needed} positions this "
                             f"{self.kind} needs ({terms}).")
        return max_length

    def prefill(self, target_params, drafter_params, prompt: Prompt,
                max_length: int | None = None) -> Prefilled:
        """Feeds the prompt to the target and the drafter. Deterministic (no key),
        so one prefill can seed many decodes: other seeds, verifiers, target
        functions, hyperparameters, or any ``gamma`` whose
        ``required_cache_length`` fits in ``max_length`` (default: this
        decoder's own requirement)."""
        width = prompt.tokens.shape[1]
        max_length = self.prefill_length(width, max_length)
        features = None
        if needs_features(self.drafter):
            target_cache, _, features = start_token_and_prefill(
                self.target, target_params, prompt, max_length, all_hidden=True)
        else:
            target_cache, _ = start_token_and_prefill(self.target, target_params, prompt,
                                                      max_length)
        encoder_decoder = is_encoder_decoder(self.target)
        drafter_state = self.drafter.init(drafter_params, prompt, max_length, encoder_decoder)
        history, length = initial_history(prompt, max_length, encoder_decoder,
                                          getattr(self.target, "decoder_start_token_id", None))
        return Prefilled(target_cache=target_cache, drafter_state=drafter_state,
                         history=history, length=length, prompt_width=width,
                         features=features)

    def generate(self, target_params, drafter_params, prompt: Prompt, key,
                 sp: SamplingParams) -> GenerationOutput:
        """Prefills, then runs rounds until every row is done. Pure; jit it (see ``api``)."""
        return self.decode(target_params, drafter_params,
                           self.prefill(target_params, drafter_params, prompt), key, sp)

    def decode(self, target_params, drafter_params, prefilled: Prefilled, key,
               sp: SamplingParams) -> GenerationOutput:
        """Runs rounds from a ``prefill`` until every row is done. Pure; jit it."""
        needed, terms = self._needed_room(prefilled.prompt_width)
        capacity = min(prefilled.target_cache.max_length, prefilled.history.shape[1])
        if capacity < needed:
            raise ValueError(
                f"the prefilled caches hold {capacity} positions but this {self.kind} needs "
                f"{needed} ({terms}); prefill with max_length={needed} or more.")
        state = self.init_state(prefilled, key)
        return run_rounds(lambda s: self.round(target_params, drafter_params, s, sp), state,
                          self.max_new_tokens, self.rounds_per_sync)


@dataclasses.dataclass(frozen=True)
class SpeculativeDecoder(RoundDecoder):
    """Static configuration of a speculative generation (hashable: closes over jit).

    ``drafter`` is any strategy of ``specdec_jax.drafting`` (a bare
    ``LanguageModel`` is wrapped in a ``ModelDrafter``); ``target_fn`` any
    target function of ``target_functions.py``; ``verifier`` any verifier of
    ``verify.py`` / ``verify.block.py``.

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
    def needs_next_q(self) -> bool:
        if self.draft_next_q is not None:
            return self.draft_next_q
        return not self.target_fn.bonus_from_target

    def init_state(self, prefilled: Prefilled, key) -> _LoopState:
        batch = prefilled.length.shape[0]
        return first_loop_state(
            prefilled, key, self.max_new_tokens + self.gamma + 1, self.pad_id,
            verifier_state=self.verifier.init_state(batch),
            stats=zero_stats(batch, self.gamma, len(self.drafter.model_names)))

    def round(self, target_params, drafter_params, state: _LoopState,
              sp: SamplingParams) -> _LoopState:
        """One draft-score-verify-rollback round for every row not yet done."""
        key, draft_key, verify_key = jax.random.split(state.key, 3)
        g = self.gamma
        old_target_len = state.target_cache.lengths
        context = Context(history=state.history, length=state.length, features=state.features,
                          feature_length=old_target_len)
        pending_B = jnp.take_along_axis(state.history, (state.length - 1)[:, None], 1)[:, 0]
        proposal, drafter_state = self.drafter.propose(
            drafter_params, state.drafter_state, context, g, self.needs_next_q, draft_key, sp,
            self.sampling_config)
        drafts_BxG = proposal.tokens
        count_B = proposal.count  # None: every row offers all G drafts

        fed_BxG1 = jnp.concatenate([pending_B[:, None], drafts_BxG], axis=1)
        if count_B is None:
            out = self.target.extend(target_params, fed_BxG1, state.target_cache)
            logits, hidden, target_cache, fed_width = out.logits, out.hidden, out.cache, g + 1
        else:  # adaptive drafting: score only as wide as the longest row needs
            logits, hidden, target_cache, fed_width = extend_bucketed(
                self.target, target_params, fed_BxG1,
                jnp.max(jnp.where(state.done, 0, count_B)) + 1, state.target_cache,
                self.drafter.target_widths(g))
        dist = sampling.distributions(logits, sp.temperature, sp.top_p,
                                      self.sampling_config)
        pi_BxG1xV, defer_BxG1 = self.target_fn(proposal.q, dist.probs, proposal.q_stat,
                                               dist.stats, sp.alpha, sp.beta)
        bonus_BxG1xV = dist.probs if self.target_fn.bonus_from_target else pi_BxG1xV
        offered_B = block_lengths(drafts_BxG, count_B)
        bonus_BxV = jnp.take_along_axis(bonus_BxG1xV, offered_B[:, None, None], axis=1)[:, 0]
        if g == 0:  # the oracle cascade: no drafts to verify, y ~ pi_1
            verdict = VerifyOutput(num_accepted=jnp.zeros_like(state.length),
                                   next_token=sample_from_weights(verify_key, bonus_BxV),
                                   state=state.verifier_state)
        elif count_B is None:  # verifiers written before ragged blocks take no count_B
            verdict = self.verifier(verify_key, drafts_BxG, proposal.q[:, :g],
                                    pi_BxG1xV[:, :g], bonus_BxV, state.verifier_state)
        else:
            verdict = self.verifier(verify_key, drafts_BxG, proposal.q[:, :g],
                                    pi_BxG1xV[:, :g], bonus_BxV, state.verifier_state,
                                    count_B=count_B)
        accepted_B = verdict.num_accepted

        active_B = ~state.done
        candidates, tokens, num_generated, done, keep_B = emit_round(
            self, state, drafts_BxG, accepted_B, verdict.next_token, pending_B)
        emitted_pos_BxG1 = jnp.arange(g + 1)[None, :] < (num_generated - state.num_generated
                                                         )[:, None]
        stats = count_round(
            state.stats, active_B, target_fed=fed_width, target_single=int(g == 0),
            drafter_calls_BxM=proposal.calls, drafter_fed_BxM=proposal.fed,
            drafter_single_BxM=proposal.single, accepted_B=accepted_B,
            rejected_B=accepted_B < offered_B, offered_B=offered_B, nodes_B=offered_B,
            by_rank_BxK=accepted_B[:, None],  # a chain's drafts: all first children
            deferred_B=jnp.sum(jnp.where(emitted_pos_BxG1, defer_BxG1, 0.0), axis=-1),
            emitted_B=num_generated, nan_B=proposal.nan + has_nan(logits))
        verifier_state = jax.tree_util.tree_map(
            lambda new, old: jnp.where(
                active_B.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
            verdict.state, state.verifier_state)
        # The history gains d_1 .. d_j, y (slots past length + keep are scratch);
        # the drafter keeps what it fed of history[:length + j].
        history = write_rows(state.history, candidates, state.length)
        # The scoring call's hidden states are the target's features of the
        # pending token and the drafts; those past what it keeps are scratch.
        features = None if state.features is None else write_rows(
            state.features, hidden, old_target_len)
        return state.replace(
            features=features,
            tokens=tokens, num_generated=num_generated, history=history,
            length=state.length + keep_B, done=done,
            target_cache=target_cache.replace(lengths=old_target_len + keep_B),
            drafter_state=self.drafter.rewind(
                drafter_state, state.length + jnp.where(active_B, accepted_B, 0)),
            verifier_state=verifier_state, key=key, stats=stats)


def check_rounds_per_sync(rounds_per_sync: int) -> None:
    loops.check_every(rounds_per_sync, "rounds_per_sync")


def loop_until_done(body_fn, state, rounds_per_sync: int = 1):
    """Runs ``body_fn`` while any row of ``state`` is not done (``state.done``:
    bool [B]), reading that condition once every ``rounds_per_sync`` rounds
    (``loops.checked_while_loop``: a GPU's host sync per read); the loop every
    decoder shares. Outputs are the same for every value."""
    return loops.checked_while_loop(lambda s: ~jnp.all(s.done), body_fn, state,
                                    rounds_per_sync)


def run_rounds(round_fn, state, max_new_tokens: int, rounds_per_sync: int = 1
               ) -> GenerationOutput:
    """Runs ``round_fn`` until every row is done (``loop_until_done``); the loop
    every round-based decoder shares (``state`` has tokens, num_generated, done
    and stats)."""
    state = loop_until_done(round_fn, state, rounds_per_sync)
    return GenerationOutput(tokens=state.tokens[:, :max_new_tokens],
                            lengths=state.num_generated, stats=state.stats)


@flax.struct.dataclass
class _AutoregressiveState:
    tokens: Array  # int32 [B, N + 1]
    num_generated: Array  # int32 [B]
    pending: Array  # int32 [B]: last emitted token, not yet fed
    done: Array  # bool [B]
    target_cache: Any
    key: Array
    stats: GenerationStats


@dataclasses.dataclass(frozen=True)
class AutoregressiveDecoder(DecoderOptions):
    """Target-only sampling, one token per call: the baseline every method is
    measured against, on the same machinery (prefill, sampling, EOS, stats;
    its ``rounds_per_sync`` counts steps)."""

    target: LanguageModel
    max_new_tokens: int

    def generate(self, target_params, drafter_params, prompt: Prompt, key,
                 sp: SamplingParams) -> GenerationOutput:
        del drafter_params
        batch, width = prompt.tokens.shape
        max_length = required_cache_length(width, self.max_new_tokens, 0)
        cache, pending = start_token_and_prefill(self.target, target_params, prompt,
                                                 max_length)
        state = _AutoregressiveState(
            tokens=jnp.full((batch, self.max_new_tokens + 1), self.pad_id, jnp.int32),
            num_generated=jnp.zeros((batch,), jnp.int32), pending=pending,
            done=jnp.zeros((batch,), bool), target_cache=cache, key=key,
            stats=zero_stats(batch, 0))

        def body_fn(state):
            key, step_key = jax.random.split(state.key)
            out = self.target.extend(target_params, state.pending[:, None], state.target_cache)
            dist = sampling.distributions(out.logits[:, 0], sp.temperature, sp.top_p,
                                          self.sampling_config)
            next_B = sample_from_weights(step_key, dist.probs)
            active_B = ~state.done
            logprob_B = jnp.log(jnp.maximum(jnp.take_along_axis(
                dist.stats, next_B[:, None], axis=-1)[:, 0], 1e-30))
            tokens, num_generated, hit_eos = _emit(
                state.tokens, state.num_generated, next_B[:, None], active_B.astype(jnp.int32),
                self.eos_ids, self.max_new_tokens, self.stop_rule, state.pending)
            active = active_B.astype(jnp.int32)
            emitted_B = num_generated > state.num_generated
            stats = state.stats.replace(
                target_calls=state.stats.target_calls + active,
                target_fed=state.stats.target_fed + active,
                target_single_calls=state.stats.target_single_calls + active,
                emitted=num_generated,
                nan_logits=state.stats.nan_logits + active * has_nan(out.logits),
                sequence_logprob=state.stats.sequence_logprob + jnp.where(emitted_B, logprob_B,
                                                                          0.0))
            return state.replace(
                tokens=tokens, num_generated=num_generated,
                pending=jnp.where(active_B, next_B, state.pending),
                done=state.done | hit_eos | (num_generated >= self.max_new_tokens),
                target_cache=out.cache.replace(
                    lengths=state.target_cache.lengths + active), key=key, stats=stats)

        state = loop_until_done(body_fn, state, self.rounds_per_sync)
        return GenerationOutput(tokens=state.tokens[:, : self.max_new_tokens],
                                lengths=state.num_generated, stats=state.stats)
