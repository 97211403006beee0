"""The one decoding round and the one loop over it (docs/algorithms.md, 'The
generic round'), as pure functions over a ``lax.while_loop``.

Every decoder (``chain.SpeculativeDecoder``, ``tree.TreeDecoder``, the
cascade baselines' ``DraftUntilDecoder``, ``autoregressive.AutoregressiveDecoder``)
runs ``RoundDecoder.round``:

    pending token t (last emitted, not yet fed to the target)
    draft:   the drafter proposes (a chain d_1 .. d_G, a ragged chain, a tree,
             or nothing) with the laws q it drew from           -> ``draft``
    score:   one target call over [t, drafts]  -> p at every context  -> ``score``
    verify:  pi = T(q, p); the verifier keeps j drafts along one path
             and draws a new token y                                -> ``verify``
    emit:    d_1 .. d_j, y (stopping at EOS, the stop rule, max_new_tokens)
    commit:  the target cache keeps [t, path], the drafter rewinds to
             what it proposed that was kept; pending = y            -> ``commit``
    count:   the round's calls, drafts and deferrals (``stats.count_round``)

A decoder supplies the four hooks (what differs: how it drafts, how the
target scores, which verifier, how the caches keep the path); this module
holds everything they share: the history and output buffers, the prefill of
both models, EOS handling for ragged batches, the cache-room checks, the
statistics and the loop.

Worked example (a chain, G = 3, a row whose target cache holds 10 tokens,
history 11 with t last): the target feeds 4 (lengths 14); the verifier
accepts j = 1: the round emits [d_1, y], the target rolls back to 10 + 1 + 1
= 12 (it keeps t and d_1), the history grows to 13 with y pending, and the
drafter keeps at most the first 12 history tokens it fed.

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
from specdec_jax.decode.stats import GenerationOutput, GenerationStats, count_round, zero_stats
from specdec_jax.drafting.base import Context, needs_features
from specdec_jax.drafting.model_drafter import has_nan
from specdec_jax.loops import write_rows
from specdec_jax.models.interface import (
    LanguageModel,
    Prompt,
    is_encoder_decoder,
    start_token_and_prefill,
    switch_writing_windows,
)
from specdec_jax.sampling import SamplingParams
from specdec_jax.target_functions import TargetFunction
from specdec_jax.verify.token import emitted_tokens

Array = jax.Array


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
class LoopState:
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


@flax.struct.dataclass
class Scored:
    """What the round's one target call returned."""

    logits: Array  # float32 [B, K, V]: p at every context fed (K = width, zero-padded)
    hidden: Array  # float32 [B, K, D]: the target's hidden states there
    cache: Any  # the target's cache holding every fed token (``commit`` keeps the path)
    width: Any  # int (or int32 []): tokens the call fed per row (what it cost)


@flax.struct.dataclass
class Verdict:
    """What a round's verification decided, in the shape every decoder emits
    and counts (D: the most drafts one round can accept, a chain's G or a
    tree's depth)."""

    accepted: Array  # int32 [B]: drafts kept (j)
    next_token: Array  # int32 [B]: y, drawn after the kept drafts
    drafts: Array  # int32 [B, D]: the drafts along the kept path (past j: scratch)
    defer: Array  # float32 [B, D + 1]: deferral indicator of the token drawn at each depth
    offered: Array  # int32 [B]: the most drafts this round could keep (its deepest path)
    nodes: Any  # int32 [B] or int: tokens drafted for verification
    by_rank: Array  # int32 [B, K]: kept drafts by their rank among their siblings
    verifier_state: Any = None  # carried to the next round (block-seed), or None
    path: Any = None  # int32 [B, D]: kept tree nodes, -1 past the path (trees only)
    # float32 [B]: log of the statistics law at y (autoregressive decoding only:
    # GenerationStats.sequence_logprob), or None
    logprob: Any = None


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
                     verifier_state, stats: GenerationStats) -> LoopState:
    """The loop state before the first round: nothing emitted, no row done, the
    caches and history as ``prefill`` left them; ``tokens_width`` is
    ``max_new_tokens`` plus the most one round can emit (slack for the last)."""
    batch = prefilled.length.shape[0]
    return LoopState(
        tokens=jnp.full((batch, tokens_width), pad_id, jnp.int32),
        num_generated=jnp.zeros((batch,), jnp.int32), history=prefilled.history,
        length=prefilled.length, done=jnp.zeros((batch,), bool),
        target_cache=prefilled.target_cache, drafter_state=prefilled.drafter_state,
        verifier_state=verifier_state, key=key, stats=stats, features=prefilled.features)


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
    every decoder shares (``state`` has tokens, num_generated, done and stats)."""
    state = loop_until_done(round_fn, state, rounds_per_sync)
    return GenerationOutput(tokens=state.tokens[:, :max_new_tokens],
                            lengths=state.num_generated, stats=state.stats)


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
    """Every decoder: the prefill of both models, ``generate`` = ``prefill``
    then ``decode``, the cache-room checks, and the one ``round``.

    A subclass has ``target``, ``drafter`` and ``verifier`` fields, defines
    ``max_new_tokens``, ``gamma`` (the scratch room a round needs beyond the
    emitted tokens), ``depth`` (the most drafts a round can keep),
    ``max_children`` (the widest node: 1 for chains) and the four hooks of the
    round (module docstring):

        draft(drafter_params, state, context, key, sp) -> (proposal, drafter_state)
        score(target_params, state, pending_B, proposal) -> Scored
        verify(key, state, proposal, dist, sp) -> Verdict
        commit(state, scored, proposal, drafter_state, verdict, keep_B)
            -> (target_cache, drafter_state, features)

    and, for its error messages, ``kind`` and ``scratch_room``.
    """

    kind: ClassVar[str] = "decoder"

    def scratch_room(self) -> str:
        return f"gamma {self.gamma}"

    def needed_room(self, prompt_width: int) -> tuple[int, str]:
        """The cache length this decoder needs after a prompt, and its terms in words."""
        needed = required_cache_length(prompt_width, self.max_new_tokens, self.gamma)
        return needed, (f"prompt width {prompt_width} + max_new_tokens "
                        f"{self.max_new_tokens} + room for {self.scratch_room()} (at least "
                        f"{MIN_SCRATCH}) + 1")

    def prefill_length(self, prompt_width: int, max_length: int | None) -> int:
        """``max_length`` (default: what this decoder needs), refused if too short."""
        needed, terms = self.needed_room(prompt_width)
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
        needed, terms = self.needed_room(prefilled.prompt_width)
        capacity = min(prefilled.target_cache.max_length, prefilled.history.shape[1])
        if capacity < needed:
            raise ValueError(
                f"the prefilled caches hold {capacity} positions but this {self.kind} needs "
                f"{needed} ({terms}); prefill with max_length={needed} or more.")
        state = self.init_state(prefilled, key)
        return run_rounds(lambda s: self.round(target_params, drafter_params, s, sp), state,
                          self.max_new_tokens, self.rounds_per_sync)

    def init_state(self, prefilled: Prefilled, key) -> LoopState:
        """The loop state before the first round: the output buffer has room for
        ``max_new_tokens`` and the most one round emits (``depth + 1``); the
        statistics count up to ``depth`` kept drafts a round, each drafter
        model and ``max_children`` sibling ranks."""
        batch = prefilled.length.shape[0]
        init_verifier = getattr(self.verifier, "init_state", lambda batch: None)
        return first_loop_state(
            prefilled, key, self.max_new_tokens + self.depth + 1, self.pad_id,
            verifier_state=init_verifier(batch),
            stats=zero_stats(batch, self.depth, len(self.drafter.model_names),
                             self.max_children))

    def round_keys(self, key) -> tuple[Array, Any, Array]:
        """(the next round's key, the drafter's, the verifier's)."""
        return tuple(jax.random.split(key, 3))

    def round(self, target_params, drafter_params, state: LoopState,
              sp: SamplingParams) -> LoopState:
        """One draft / score / verify / emit / commit / count round for every row
        not yet done: the round of every decoder (module docstring)."""
        key, draft_key, verify_key = self.round_keys(state.key)
        pending_B = jnp.take_along_axis(state.history, (state.length - 1)[:, None], 1)[:, 0]
        context = Context(history=state.history, length=state.length, features=state.features,
                          feature_length=state.target_cache.lengths)
        proposal, drafter_state = self.draft(drafter_params, state, context, draft_key, sp)
        scored = self.score(target_params, state, pending_B, proposal)
        dist = sampling.distributions(scored.logits, sp.temperature, sp.top_p,
                                      self.sampling_config)
        verdict = self.verify(verify_key, state, proposal, dist, sp)

        active_B = ~state.done
        candidates = emitted_tokens(verdict.drafts, verdict.accepted, verdict.next_token)
        tokens, num_generated, hit_eos = _emit(
            state.tokens, state.num_generated, candidates,
            jnp.where(active_B, verdict.accepted + 1, 0), self.eos_ids, self.max_new_tokens,
            self.stop_rule, pending_B)
        done = state.done | hit_eos | (num_generated >= self.max_new_tokens)
        # The target keeps the pending token and the kept drafts.
        keep_B = jnp.where(active_B, 1 + verdict.accepted, 0)
        emitted_B = num_generated - state.num_generated
        emitted_BxD1 = jnp.arange(verdict.defer.shape[1])[None, :] < emitted_B[:, None]
        stats = count_round(
            state.stats, active_B, target_fed=scored.width, target_single=scored.width == 1,
            drafter_calls_BxM=proposal.calls, drafter_fed_BxM=proposal.fed,
            drafter_single_BxM=proposal.single, accepted_B=verdict.accepted,
            rejected_B=verdict.accepted < verdict.offered, offered_B=verdict.offered,
            nodes_B=verdict.nodes, by_rank_BxK=verdict.by_rank,
            deferred_B=jnp.sum(jnp.where(emitted_BxD1, verdict.defer, 0.0), axis=-1),
            emitted_B=num_generated, nan_B=proposal.nan + has_nan(scored.logits))
        if verdict.logprob is not None:
            stats = stats.replace(sequence_logprob=stats.sequence_logprob + jnp.where(
                emitted_B > 0, verdict.logprob, 0.0))
        verifier_state = jax.tree_util.tree_map(
            lambda new, old: jnp.where(
                active_B.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
            verdict.verifier_state, state.verifier_state)
        target_cache, drafter_state, features = self.commit(
            state, scored, proposal, drafter_state, verdict, keep_B)
        return state.replace(
            tokens=tokens, num_generated=num_generated,
            # The history gains d_1 .. d_j, y (slots past length + keep are scratch).
            history=write_rows(state.history, candidates, state.length),
            length=state.length + keep_B, done=done, target_cache=target_cache,
            drafter_state=drafter_state, verifier_state=verifier_state, key=key,
            stats=stats, features=features)
