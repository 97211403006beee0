"""The drafter interface: what a speculative round asks of whatever drafts.

A round (``decode.chain.SpeculativeDecoder``) holds the whole token history of
every row (prompt + emitted tokens; the last one is the *pending* token, not
yet fed to any model) and asks its drafter for ``G`` proposals::

    proposal, state = drafter.propose(params, state, Context(history, length),
                                      G, with_next, key, sp, config)
    ... the target verifies proposal.tokens against proposal.q ...
    state = drafter.rewind(state, valid)

``proposal.q[:, i]`` is the distribution ``d_{i+1}`` was *actually drawn
from* given ``d_1 .. d_i`` (docs/algorithms.md, 'Drafter cascades'): a neural drafter's processed
distribution, a one-hot for Max-Gram, the lenient review law of a vertical
cascade. Exactness of every verifier rests on this. With ``with_next`` the
drafter also reports ``q[:, G]``, its law at position ``G + 1`` (cascade
targets need it for the bonus token); otherwise that slot is zero and the
drafter may skip the work (one neural step per round saved).

After verification the history keeps ``valid`` tokens the drafter saw as
proposed (the old history plus the accepted drafts) and gains one token it
did not propose. ``rewind`` drops whatever the drafter fed beyond ``valid``;
the next ``propose`` catches up on what it has not fed (``extend_from_history``
does it in one call). So drafters never need to be told what was emitted:
they read it from the history.

Every drafter is a frozen dataclass (hashable: a static argument of the
jitted loop) with

    name: str; model_names: tuple[str, ...]      (neural models it runs, in order)
    select_params(named) -> params               (its params from a name -> params dict)
    init(params, prompt, max_length, encoder_decoder) -> state   (prefill; no key)
    propose(...) -> (Proposal, state);   rewind(state, valid_B) -> state

``proposal.calls[:, m]`` counts forward calls of ``model_names[m]`` for each
row, ``proposal.fed[:, m]`` the tokens those calls fed (a cost model prices
both).
"""

from __future__ import annotations

from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.loops import write_rows
from specdec_jax.models.interface import LanguageModel, Prompt

Array = jax.Array


@flax.struct.dataclass
class Context:
    """The sequence so far, as every drafter sees it.

    ``features`` is given only to drafters that declare ``needs_target_features``
    (``needs_features``): ``features[b, s]`` is the target's last hidden state
    after it fed ``history[b, s]`` (what predicts token ``s + 1``), known for
    ``s < feature_length[b]`` (the tokens the target's cache holds). The
    target computed them while scoring; no extra call is made for them.
    """

    history: Array  # int32 [B, S]: prompt then emitted tokens (decoder-side ids)
    length: Array  # int32 [B]: tokens in history; history[b, length[b] - 1] is pending
    features: Any = None  # [B, S, D] target hidden states, or None
    feature_length: Any = None  # int32 [B]: features[b, :feature_length[b]] are known


@flax.struct.dataclass
class Proposal:
    tokens: Array  # int32 [B, G]: d_1 .. d_G
    q: Array  # float32 [B, G + 1, V]: law of d_i given d_<i; [:, G] = law at G + 1 or 0
    q_stat: Array  # float32 [B, G + 1, V]: what deferral statistics read (docs: 'Notation')
    hidden: Any  # float32 [B, G + 1, D]: state that produced q[:, i] (neural only) or None
    calls: Array  # int32 [B, M]: forward calls per neural model
    fed: Array  # int32 [B, M]: tokens fed by those calls
    single: Array  # int32 [B, M]: of those calls, the ones that fed one token (K = 1
    #                runs a cheaper matrix-vector path on CPU: a cost model prices it apart)
    nan: Array  # int32 [B]: calls whose logits held NaN (must stay 0)
    # int32 [B] or None: drafts each row offers for verification (adaptive drafters
    # stop rows early, SpecDec++); None = all G. Slots past it are scratch.
    count: Any = None


class Drafter(Protocol):
    name: str
    model_names: tuple[str, ...]

    def select_params(self, named: dict) -> Any: ...

    def init(self, params: Any, prompt: Prompt, max_length: int,
             encoder_decoder: bool) -> Any: ...

    def propose(self, params: Any, state: Any, context: Context, num: int, with_next: bool,
                key: Array, sp: sampling.SamplingParams, config: sampling.SamplingConfig
                ) -> tuple[Proposal, Any]: ...

    def rewind(self, state: Any, valid_B: Array) -> Any: ...


def is_drafter(obj: Any) -> bool:
    return callable(getattr(obj, "propose", None)) and callable(getattr(obj, "rewind", None))


def needs_features(drafter: Any) -> bool:
    """Whether a drafter (or one inside a cascade) reads the target's hidden
    states (``Context.features``); most drafters do not, and their decoding
    loop keeps no feature buffer."""
    return bool(getattr(drafter, "needs_target_features", False))


def pad_history(context: Context, extra: int) -> Context:
    """Room for ``extra`` more tokens per row (a level's own proposals)."""
    return context.replace(history=jnp.pad(context.history, ((0, 0), (0, extra))))


def append(context: Context, tokens_BxK: Array, count_B: Array | None = None) -> Context:
    """Appends ``tokens[b, :count[b]]`` to each row (all K when count is None)."""
    k = tokens_BxK.shape[1]
    count = jnp.full_like(context.length, k) if count_B is None else count_B
    # replace (not a new Context): the target's features stay with the context.
    return context.replace(history=write_rows(context.history, tokens_BxK, context.length,
                                              count),
                           length=context.length + count)


def extend_from_history(model: LanguageModel, params, cache, context: Context,
                        extra_BxK: Array | None, widths: tuple[int, ...]):
    """Feeds the tokens of ``history[:length]`` the cache lacks, then ``extra``.

    Returns ``(logits [B, 1 + K, V], hidden [B, 1 + K, D], cache, calls_B,
    fed_B, single_B)``: index 0 is the output after the pending token ``history[length -
    1]``, index ``i`` the output after ``extra[:, i - 1]``; the cache then
    holds ``length + K`` tokens.

    A row lacks ``c = length - cache.lengths >= 1`` tokens (the pending one,
    plus any the drafter did not feed: a draft it never had to score, tokens
    another drafter proposed). Rather than a ragged feed, every row feeds a
    window of a static width ``w >= c`` that *ends* at the pending token,
    re-feeding ``w - c`` tokens it already holds (same tokens, same positions,
    same keys and values: harmless). ``widths`` are the window sizes compiled;
    the smallest that covers every row runs (``lax.switch``), and rows further
    behind than the largest are first caught up in chunks.

    Worked example (w = 2): a row with history [a b c d], cache holding [a b]
    (the drafter never fed c) feeds [c d] from position 2; a row holding
    [a b c] feeds [c d] from position 2 as well, rewriting c.
    """
    batch = context.length.shape[0]
    extra_BxK = jnp.zeros((batch, 0), jnp.int32) if extra_BxK is None else extra_BxK
    k = extra_BxK.shape[1]
    history_BxS, length_B = context.history, context.length
    sizes = sorted(set(widths))
    widest = sizes[-1]
    rows_B1 = jnp.arange(batch)[:, None]

    def gather(positions_BxW):
        safe = jnp.clip(positions_BxW, 0, history_BxS.shape[1] - 1)
        return history_BxS[rows_B1, safe]

    def window(width):
        def run(cache, chunk):
            # A chunk (``chunk``: some row lacks more than ``widest``) feeds the
            # ``widest`` tokens after what each row holds and keeps them only for
            # the rows that far behind; the last call feeds the window that ends
            # at the pending token, then ``extra``.
            behind_B = chunk & (length_B - cache.lengths > widest)
            start_B = jnp.where(chunk, cache.lengths, jnp.maximum(length_B - width, 0))
            positions_BxW = start_B[:, None] + jnp.arange(width + k)[None, :]
            from_extra = jnp.clip(positions_BxW - length_B[:, None], 0, max(k - 1, 0))
            tokens = jnp.where(positions_BxW < length_B[:, None], gather(positions_BxW),
                               jnp.take_along_axis(extra_BxK, from_extra, axis=1) if k else 0)
            # The head runs on the 1 + K kept positions only: the re-fed tokens
            # before the pending one only refill the cache (a catch-up call of
            # width 2 would otherwise pay the 151,936-row Qwen head twice). A
            # chunk's outputs are dropped (clipped: any position will do).
            index_Bx1K = jnp.clip((length_B - 1 - start_B)[:, None] + jnp.arange(1 + k)[None, :],
                                  0, width + k - 1)
            out = model.extend(params, tokens.astype(jnp.int32), cache.replace(lengths=start_B),
                               logits_at=index_Bx1K)
            lengths = jnp.where(chunk, jnp.where(behind_B, start_B + width, cache.lengths),
                                length_B + k)
            return out.logits, out.hidden, out.cache.replace(lengths=lengths)
        return run

    def counted(counters, calls_B, fed):
        calls, fed_B, single = counters
        return calls + calls_B, fed_B + calls_B * fed, single + calls_B * (fed == 1)

    zero_counters = (jnp.zeros((batch,), jnp.int32),) * 3
    if len(sizes) == 1:
        # One width (on CPU, ``(1,)``): a row two tokens behind is the common
        # case, and its first call needs no output head, so chunks get their
        # own call that skips it.
        def chunk_body(carry):
            cache, counters = carry
            behind_B = length_B - cache.lengths > widest
            tokens = gather(cache.lengths[:, None] + jnp.arange(widest)[None, :])
            out = model.extend(params, tokens, cache, logits_at=jnp.zeros((batch, 0), jnp.int32))
            lengths = jnp.where(behind_B, cache.lengths + widest, cache.lengths)
            return (out.cache.replace(lengths=lengths),
                    counted(counters, behind_B.astype(jnp.int32), widest))

        cache, counters = jax.lax.while_loop(
            lambda carry: jnp.any(length_B - carry[0].lengths > widest), chunk_body,
            (cache, zero_counters))
        logits, hidden, cache = window(widest)(cache, jnp.bool_(False))
        return (logits, hidden, cache,
                *counted(counters, jnp.ones((batch,), jnp.int32), widest + k))

    # Several widths: chunks are a rare fallback (the widest window covers a
    # round), so they run through the widest window's call, its outputs
    # dropped. Each compiled call is a copy of the model's layers in the
    # program (on TPU each copy's weight prefetches also take HBM scratch): a
    # separate chunk call added ~40-70 MB to a v5e program's temporaries.
    def body_fn(carry):
        cache, _, _, _, counters = carry
        lacking_B = length_B - cache.lengths
        chunk = jnp.any(lacking_B > widest)
        branch = jnp.where(chunk, len(sizes) - 1,
                           jnp.sum(jnp.max(lacking_B) > jnp.asarray(sizes))).astype(jnp.int32)
        width = jnp.asarray(sizes, jnp.int32)[branch]
        # Not ``interface.switch_writing_windows``: here its branches would each keep
        # a copy of every layer's cache (SpecDec++ on v5e: 0.265 -> 0.330 GiB).
        logits, hidden, cache = jax.lax.switch(branch, [window(w) for w in sizes], cache, chunk)
        calls_B = jnp.where(chunk, lacking_B > widest, True).astype(jnp.int32)
        return (cache, logits, hidden, ~chunk,
                counted(counters, calls_B, jnp.where(chunk, width, width + k)))

    outputs = jax.eval_shape(lambda c: window(widest)(c, jnp.bool_(False))[:2], cache)
    zeros = [jnp.zeros(x.shape, x.dtype) for x in outputs]
    cache, logits, hidden, _, counters = jax.lax.while_loop(
        lambda carry: ~carry[3], body_fn, (cache, *zeros, jnp.bool_(False), zero_counters))
    return (logits, hidden, cache, *counters)


def pad_to(x_BxKxV: Array, size: int) -> Array:
    """Zero-pads axis 1 to ``size`` (a missing q_{G+1} is a zero row)."""
    return jnp.pad(x_BxKxV, ((0, 0), (0, size - x_BxKxV.shape[1])) +
                   ((0, 0),) * (x_BxKxV.ndim - 2))
