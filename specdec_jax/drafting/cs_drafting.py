"""Cascade Speculative Drafting (Chen et al.; docs/algorithms.md, 'Drafter cascades and
Max-Gram').

**Vertical cascade.** ``VerticalCascade(model, inner)`` drafts by speculative
decoding *of* ``model`` *with* ``inner`` as its drafter: ``inner`` proposes
``inner_gamma`` tokens, ``model`` scores them in one call and reviews them
with lenience ``l >= 1`` (``sp.lenience``, traced), until the level has the
tokens its caller asked for. No neural model then drafts autoregressively
except through its own reviews. Recursion (``inner`` itself a cascade) gives
the paper's deeper cascades.

**Lenient review.** Sampling (T > 0): accept ``s ~ q`` with probability
``min(1, l p(s) / q(s))``; on rejection draw from ``norm((l p - q)_+)``; after
``k`` accepts the bonus is drawn from ``p``. This is the kernel of
``verify.token`` with the unnormalised target ``l p``. Greedy (T = 0), the paper's
rule: accept ``s`` if it is ``argmax p`` or ``q_stat(s) <= l p_stat(s)``
(unscaled softmaxes); a rejection emits ``argmax p``. ``l = 1`` at T > 0 is
ordinary, lossless speculative sampling. Lenience is applied only here,
between drafters: the target's review is the round's verifier, which never
sees it, so the output law stays the target's.

**The law of a level's proposals** (what the level reports as ``q``; the
caller's review is exact only with it). At a position inside an inner round,
given the prefix, the level emits ``s`` if accepted, else a residual sample,
so its token follows

    L(x) = min(q(x), l p(x)) + (1 - sum_u min(q(u), l p(u))) * norm((l p - q)_+)(x)

which is ``p`` when ``l = 1`` (a lossless inner level reports the reviewing
model's own distribution) and differs from both ``q`` and ``p`` otherwise. A
bonus position follows ``p``. Greedy proposals are deterministic: their law is
the one-hot of the token. Using the inner drafter's ``q`` instead of ``L`` is
the classic mistake; ``tests/test_drafting.py`` shows the target-level
chi-square test rejecting it.

Worked example (l = 2, V = 2): q = [0.9, 0.1], p = [0.6, 0.4]: min(q, 2p) =
[0.9, 0.1] covers all the mass, so L = q; with p = [0.3, 0.7]: min = [0.6,
0.1], (2p - q)_+ = [0, 1.3] -> L = [0.6, 0.4].

**Horizontal cascade.** ``HorizontalCascade((a, b, ...), (k_a, k_b, ...))``:
the first ``k_a`` positions of a block from ``a``, the next ``k_b`` from
``b`` (seeing ``a``'s proposals as context), and so on: later positions are
less likely to be accepted, so cheaper drafters make them.

**K-matrix** (``cs_drafter``): Chen et al.'s Alg. 1 composition of both from an
upper-triangular matrix and a list of drafters, largest first, Max-Gram last.
Layer ``i`` (the target's layer is 0; layer ``i > 0`` is what drafter ``i -
1`` reviews) is a horizontal cascade over drafters ``i .. n-1`` with segment
lengths ``K[i][i:]``; drafter ``j`` in any layer reviews layer ``j + 1``
(vertical), drafts alone when it is Max-Gram or when layer ``j + 1`` is
empty. The paper's decoder-only setting ``[[2, 10], [0, 10]]`` with ``[d,
mag]``: the target reviews 12 tokens, the first 2 from ``d`` reviewing 10
Max-Gram tokens per call, the last 10 straight from Max-Gram. A zero entry
leaves a drafter out of a layer: ``[[4, 0], [0, 10]]`` is the pure vertical
cascade, ``[[2, 10], [0, 0]]`` the pure horizontal one. Following the paper's
App. B, a review of Max-Gram is never lenient.

**Feature heads** (``drafting/feature.py``) take a model's place anywhere.
As a segment or as an inner level they draft as usual; inside a level the
history runs past the target's features (the level's own proposals), and
the head feeds those tokens on its own predicted features (``base.append`` keeps
the target's features in the level's context; ``needs_target_features`` on
both cascades tells the decoding loop to keep them). As a reviewer
(``FeatureVerticalCascade``) the head cannot score a block in one call: its
input at position i is its own prediction at i - 1, so the k inner drafts go
in one at a time (k one-token calls of the one-layer head, counted); the
review and the reported law are the ones above, with the head's ``p``.

Static shapes: a vertical level runs inner rounds until every row has the
tokens asked for and keeps exactly that many (the paper's loop may keep an
overshoot; here a caller asks for a fixed count and the next segment or round
re-proposes the rest).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import loops, sampling
from specdec_jax.drafting.base import (
    Context,
    Drafter,
    Proposal,
    append,
    extend_from_history,
    needs_features,
    pad_history,
    pad_to,
)
from specdec_jax.drafting.feature import FeatureDrafter
from specdec_jax.drafting.maxgram import MaxGramDrafter
from specdec_jax.drafting.model_drafter import ModelDrafter, has_nan
from specdec_jax.loops import write_rows
from specdec_jax.models.interface import LanguageModel, Prompt, start_token_and_prefill
from specdec_jax.sampling import first_argmax
from specdec_jax.verify.token import (
    TokenVerifier,
    emitted_tokens,
    gather_token_probs,
    leading_accepts,
)

Array = jax.Array



# ---------------------------------------------------------------------------
# Lenient review
# ---------------------------------------------------------------------------

def lenient_law(q_xV: Array, p_xV: Array, lenience: Array) -> Array:
    """L = min(q, l p) + (1 - sum min(q, l p)) norm((l p - q)_+): the law of a
    token that a lenient review of ``s ~ q`` emits (module docstring)."""
    lp = lenience * p_xV
    kept = jnp.minimum(q_xV, lp)
    excess = jnp.maximum(lp - q_xV, 0.0)
    mass = jnp.sum(excess, axis=-1, keepdims=True)
    rejected = jnp.maximum(1.0 - jnp.sum(kept, axis=-1, keepdims=True), 0.0)
    return kept + jnp.where(mass > 0, rejected * excess / jnp.where(mass > 0, mass, 1.0), 0.0)


@flax.struct.dataclass
class Review:
    num_accepted: Array  # int32 [B]: leading inner drafts kept (0 .. k)
    tokens: Array  # int32 [B, k + 1]: the kept drafts, then the new token at num_accepted
    law: Array  # float32 [B, k + 1, V]: law of the token emitted at each position


def lenient_review(key: Array, drafts_BxK: Array, q_BxKxV: Array, q_stat_BxKxV: Array,
                   p_BxK1xV: Array, p_stat_BxK1xV: Array, lenience: Array,
                   temperature: Array, lenient: bool = True, law_fn=lenient_law) -> Review:
    """Reviews ``k`` inner drafts against ``p`` (``k + 1`` positions, the last
    for the bonus) with lenience (module docstring). ``lenient = False``: a
    lossless review (``l`` must then be 1; greedy accepts argmax matches only)."""
    k = drafts_BxK.shape[1]
    sampled = TokenVerifier()(key, drafts_BxK, q_BxKxV, lenience * p_BxK1xV[:, :k],
                              p_BxK1xV[:, k])
    # Greedy: the paper's rule on the statistics distributions.
    argmax_p_BxK1 = first_argmax(p_BxK1xV)
    matches = drafts_BxK == argmax_p_BxK1[:, :k]
    close = (gather_token_probs(q_stat_BxKxV, drafts_BxK)
             <= lenience * gather_token_probs(p_stat_BxK1xV[:, :k], drafts_BxK))
    greedy_accepted_B = leading_accepts(matches | close if lenient else matches)
    greedy_next_B = jnp.take_along_axis(argmax_p_BxK1, greedy_accepted_B[:, None], axis=1)[:, 0]
    greedy = temperature <= 0
    accepted_B = jnp.where(greedy, greedy_accepted_B, sampled.num_accepted)
    next_B = jnp.where(greedy, greedy_next_B, sampled.next_token)
    tokens = emitted_tokens(drafts_BxK, accepted_B, next_B)
    law = jnp.concatenate([law_fn(q_BxKxV, p_BxK1xV[:, :k], lenience),
                           p_BxK1xV[:, k:]], axis=1)
    law = jnp.where(greedy, jax.nn.one_hot(tokens, p_BxK1xV.shape[-1], dtype=jnp.float32), law)
    return Review(num_accepted=accepted_B, tokens=tokens, law=law)


# ---------------------------------------------------------------------------
# Vertical cascade
# ---------------------------------------------------------------------------

@flax.struct.dataclass
class VerticalState:
    cache: Any  # the reviewing model's cache
    inner: Any  # the inner drafter's state


@flax.struct.dataclass
class _InnerLoop:
    context: Context  # the level's history: outer history + its proposals so far
    count: Array  # int32 [B]: proposals made this call
    tokens: Array  # int32 [B, C]: proposals (C = asked + overshoot room)
    law: Array  # float32 [B, C, V]
    stat: Array  # float32 [B, C, V]
    cache: Any
    inner: Any
    key: Array
    calls: Array  # int32 [B, M]
    fed: Array  # int32 [B, M]
    single: Array  # int32 [B, M]
    nan: Array  # int32 [B]


@dataclasses.dataclass(frozen=True)
class VerticalCascade:
    """``model`` drafts by reviewing ``inner``'s proposals (module docstring).

    ``lenient = False`` reviews with ``l = 1`` whatever ``sp.lenience`` says
    (the seed never relaxes a review of Max-Gram). Params: a dict name ->
    params holding ``name`` and everything ``inner`` needs.
    ``reviews_per_check``: inner reviews between two host reads of the review
    loop's condition (``loops.checked_while_loop``; same drafts for every value).
    """

    model: LanguageModel
    inner: Drafter
    inner_gamma: int
    name: str = "drafter"
    lenient: bool = True
    catch_up_widths: tuple[int, ...] = (2,)
    reviews_per_check: int = 1

    def __post_init__(self):
        if self.inner_gamma < 1:
            raise ValueError(f"inner_gamma must be >= 1, got {self.inner_gamma}.")
        loops.check_every(self.reviews_per_check, "reviews_per_check")

    @staticmethod
    def review_law(q_xV: Array, p_xV: Array, lenience: Array) -> Array:
        """The law this level reports for a reviewed position (``lenient_law``)."""
        return lenient_law(q_xV, p_xV, lenience)

    @property
    def needs_target_features(self) -> bool:
        """True when the reviewer or a drafter below it reads the target's
        hidden states (the decoding loop then keeps them)."""
        return needs_features(self.model) or needs_features(self.inner)

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.name,) + self.inner.model_names

    def select_params(self, named: dict):
        return named

    def _slack(self) -> int:
        """Positions a call may use beyond what its caller asked (overshoot)."""
        return 2 * (self.inner_gamma + 2) + max(self.catch_up_widths)

    # The reviewer's side, three hooks (``FeatureVerticalCascade`` overrides them).

    def _init_reviewer(self, params, prompt: Prompt, max_length: int, encoder_decoder: bool):
        del encoder_decoder  # the model knows its own kind
        cache, _ = start_token_and_prefill(self.model, params, prompt, max_length)
        return cache

    def _score(self, params, reviewer, context: Context, drafts_BxK: Array):
        """``(logits [B, k + 1, V], reviewer state holding the level's history
        and the k drafts, calls_B, fed_B, single_B)``: one call of the model."""
        logits, _, cache, calls_B, fed_B, single_B = extend_from_history(
            self.model, params, reviewer, context, drafts_BxK, self.catch_up_widths)
        return logits, cache, calls_B, fed_B, single_B

    def _rewind_reviewer(self, reviewer, valid_B: Array):
        return reviewer.replace(lengths=jnp.minimum(reviewer.lengths, valid_B))

    def init(self, params, prompt: Prompt, max_length: int, encoder_decoder: bool
             ) -> VerticalState:
        length = max_length + self._slack()
        cache = self._init_reviewer(params[self.name], prompt, length, encoder_decoder)
        inner = self.inner.init(self.inner.select_params(params), prompt, length,
                                encoder_decoder)
        return VerticalState(cache=cache, inner=inner)

    def propose(self, params, state: VerticalState, context: Context, num: int,
                with_next: bool, key: Array, sp: sampling.SamplingParams,
                config: sampling.SamplingConfig) -> tuple[Proposal, VerticalState]:
        k = self.inner_gamma
        need = num + int(with_next)
        room = need + k + 1
        batch = context.length.shape[0]
        vocab = self.model.vocab_size
        lenience = sp.lenience if self.lenient else jnp.float32(1.0)
        model_params, inner_params = params[self.name], self.inner.select_params(params)
        num_models = len(self.model_names)

        def cond_fn(loop: _InnerLoop):
            return jnp.any(loop.count < need)

        def body_fn(loop: _InnerLoop) -> _InnerLoop:
            key, inner_key, review_key = jax.random.split(loop.key, 3)
            active_B = loop.count < need
            inner_prop, inner_state = self.inner.propose(
                inner_params, loop.inner, loop.context, k, False, inner_key, sp, config)
            logits, cache, calls_B, fed_B, single_B = self._score(
                model_params, loop.cache, loop.context, inner_prop.tokens)
            dist = sampling.distributions(logits, sp.temperature, sp.top_p, config)
            review = lenient_review(review_key, inner_prop.tokens, inner_prop.q[:, :k],
                                    inner_prop.q_stat[:, :k], dist.probs, dist.stats,
                                    lenience, sp.temperature, self.lenient,
                                    law_fn=self.review_law)
            emitted_B = jnp.where(active_B, review.num_accepted + 1, 0)
            start_B = loop.context.length
            # Keep what the reviewer fed up to the last accepted draft; the new
            # token is caught up by the next window.
            kept_B = start_B + jnp.where(active_B, review.num_accepted, 0)
            active = active_B.astype(jnp.int32)[:, None]
            stat_BxK1xV = dist.stats
            return _InnerLoop(
                context=append(loop.context, review.tokens, emitted_B),
                count=loop.count + emitted_B,
                tokens=write_rows(loop.tokens, review.tokens, loop.count, emitted_B),
                law=write_rows(loop.law, review.law, loop.count, emitted_B),
                stat=write_rows(loop.stat, stat_BxK1xV, loop.count, emitted_B),
                cache=self._rewind_reviewer(cache, kept_B),
                inner=self.inner.rewind(inner_state, kept_B),
                key=key,
                calls=loop.calls + active * jnp.concatenate(
                    [calls_B[:, None], inner_prop.calls], axis=1),
                fed=loop.fed + active * jnp.concatenate([fed_B[:, None], inner_prop.fed], 1),
                single=loop.single + active * jnp.concatenate([single_B[:, None],
                                                               inner_prop.single], 1),
                nan=loop.nan + active[:, 0] * (has_nan(logits) + inner_prop.nan))

        zeros_BxM = jnp.zeros((batch, num_models), jnp.int32)
        loop = loops.checked_while_loop(cond_fn, body_fn, _InnerLoop(
            context=pad_history(context, room), count=jnp.zeros((batch,), jnp.int32),
            tokens=jnp.zeros((batch, room), jnp.int32),
            law=jnp.zeros((batch, room, vocab), jnp.float32),
            stat=jnp.zeros((batch, room, vocab), jnp.float32), cache=state.cache,
            inner=state.inner, key=key, calls=zeros_BxM, fed=zeros_BxM, single=zeros_BxM,
            nan=jnp.zeros((batch,), jnp.int32)), self.reviews_per_check)
        mask = lambda x: pad_to(x[:, :need], num + 1)  # q_{G+1} only when asked for
        proposal = Proposal(tokens=loop.tokens[:, :num], q=mask(loop.law),
                            q_stat=mask(loop.stat), hidden=None, calls=loop.calls,
                            fed=loop.fed, single=loop.single, nan=loop.nan)
        return proposal, VerticalState(cache=loop.cache, inner=loop.inner)

    def rewind(self, state: VerticalState, valid_B: Array) -> VerticalState:
        return VerticalState(cache=self._rewind_reviewer(state.cache, valid_B),
                             inner=self.inner.rewind(state.inner, valid_B))


@dataclasses.dataclass(frozen=True)
class FeatureVerticalCascade(VerticalCascade):
    """A feature head (``model``: a ``FeatureDrafter``) drafts by reviewing
    ``inner``'s proposals, e.g. Max-Gram's.

    The review and the law it reports are ``VerticalCascade``'s (``lenient_review``,
    ``lenient_law``; ``p`` is the head's law). What differs is the scoring: the
    head's input at a position is its own predicted feature after the previous
    one, so the ``k`` inner drafts cannot be scored in one parallel call; they
    are fed one at a time (``FeatureDrafter.score``: ``k`` one-token calls of
    the one-layer head, plus one for the token the previous review emitted,
    plus the round's catch-up on the target's features in its first inner
    round). ``calls`` counts each of them. ``name`` must be the head's name
    (its params live under it); ``catch_up_widths`` is unused.
    """

    model: FeatureDrafter

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.model, FeatureDrafter):
            raise ValueError("FeatureVerticalCascade reviews with a FeatureDrafter; got "
                             f"{type(self.model).__name__} (use VerticalCascade for a model).")
        if self.name != self.model.name:
            raise ValueError(f"FeatureVerticalCascade name {self.name!r} must be its feature "
                             f"drafter's name {self.model.name!r} (the params key).")

    def _init_reviewer(self, params, prompt: Prompt, max_length: int, encoder_decoder: bool):
        return self.model.init(params, prompt, max_length, encoder_decoder)

    def _score(self, params, reviewer, context: Context, drafts_BxK: Array):
        logits, _, state, calls_B, fed_B, single_B = self.model.score(params, reviewer,
                                                                      context, drafts_BxK)
        return logits, state, calls_B, fed_B, single_B

    def _rewind_reviewer(self, reviewer, valid_B: Array):
        return self.model.rewind(reviewer, valid_B)


# ---------------------------------------------------------------------------
# Horizontal cascade
# ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class HorizontalCascade:
    """Positions of a block split between drafters, in order (module docstring)."""

    drafters: tuple[Drafter, ...]
    lengths: tuple[int, ...]
    name: str = "horizontal"

    def __post_init__(self):
        if len(self.drafters) != len(self.lengths) or not self.drafters:
            raise ValueError("HorizontalCascade needs one length per drafter and at least one "
                             "drafter.")
        if any(k < 1 for k in self.lengths):
            raise ValueError(f"segment lengths must be >= 1, got {self.lengths}.")

    @property
    def gamma(self) -> int:
        return sum(self.lengths)

    @property
    def needs_target_features(self) -> bool:
        """True when any segment's drafter reads the target's hidden states."""
        return any(needs_features(d) for d in self.drafters)

    @property
    def vocab_size(self) -> int:
        return self.drafters[0].vocab_size

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(n for d in self.drafters for n in d.model_names)

    def select_params(self, named: dict):
        return named

    def init(self, params, prompt: Prompt, max_length: int, encoder_decoder: bool):
        return tuple(d.init(d.select_params(params), prompt, max_length, encoder_decoder)
                     for d in self.drafters)

    def propose(self, params, state, context: Context, num: int, with_next: bool,
                key: Array, sp: sampling.SamplingParams, config: sampling.SamplingConfig):
        if num != self.gamma:
            raise ValueError(f"this horizontal cascade drafts {self.gamma} tokens per round "
                             f"(segments {self.lengths}); the decoder asked for {num}. Set "
                             f"gamma={self.gamma}.")
        keys = jax.random.split(key, len(self.drafters))
        context = pad_history(context, num + 1)
        parts, states = [], []
        for index, (drafter, k) in enumerate(zip(self.drafters, self.lengths)):
            last = index == len(self.drafters) - 1
            prop, st = drafter.propose(drafter.select_params(params), state[index], context, k,
                                       with_next and last, keys[index], sp, config)
            context = append(context, prop.tokens)
            parts.append(prop)
            states.append(st)
        cat = lambda xs, axis: jnp.concatenate(xs, axis=axis)
        q = cat([p.q[:, :k] for p, k in zip(parts, self.lengths)] + [parts[-1].q[:, -1:]], 1)
        q_stat = cat([p.q_stat[:, :k] for p, k in zip(parts, self.lengths)] +
                     [parts[-1].q_stat[:, -1:]], 1)
        proposal = Proposal(tokens=cat([p.tokens for p in parts], 1), q=q, q_stat=q_stat,
                            hidden=None, calls=cat([p.calls for p in parts], 1),
                            fed=cat([p.fed for p in parts], 1),
                            single=cat([p.single for p in parts], 1),
                            nan=sum(p.nan for p in parts))
        return proposal, tuple(states)

    def rewind(self, state, valid_B: Array):
        return tuple(d.rewind(s, valid_B) for d, s in zip(self.drafters, state))


# ---------------------------------------------------------------------------
# K-matrix composition
# ---------------------------------------------------------------------------

def parse_k_matrix(spec: str | Sequence[Sequence[int]], num_drafters: int
                   ) -> tuple[tuple[int, ...], ...]:
    """Validates a K-matrix (JSON text or nested lists) for ``num_drafters``."""
    example = "e.g. [[2, 10], [0, 10]] for two drafters"
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as err:
            raise ValueError(f"K-matrix {spec!r} is not JSON ({err.msg}); {example}.") from err
    try:
        rows = tuple(tuple(row) for row in spec)
    except TypeError as err:
        raise ValueError(f"K-matrix must be a list of rows, {example}.") from err
    if len(rows) != num_drafters or any(len(row) != num_drafters for row in rows):
        raise ValueError(f"K-matrix must be {num_drafters} x {num_drafters}, one row and "
                         f"column per drafter; got {[len(r) for r in rows]} ({example}).")
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"K-matrix entry [{i}][{j}] = {value!r} is not an integer.")
            if j < i and value != 0:
                raise ValueError(f"K-matrix must be upper-triangular: entry [{i}][{j}] = "
                                 f"{value} lies below the diagonal; set it to 0.")
            if value < 0:
                raise ValueError(f"K-matrix entry [{i}][{j}] = {value} is negative; entries "
                                 "are token counts (0 leaves a drafter out of a layer).")
    if not any(rows[0]):
        raise ValueError(f"K-matrix row 0 (the target's layer) has no positive entry; "
                         f"{example}.")
    return rows


def cs_drafter(k_matrix, drafters: Sequence[ModelDrafter | FeatureDrafter | MaxGramDrafter]
               ) -> Drafter:
    """The CS Drafting composition of ``drafters`` (largest first, Max-Gram
    last) under ``k_matrix`` (module docstring). Drafts ``sum(K[0])`` tokens.

    A ``FeatureDrafter`` (EAGLE-style head on the target's features) takes
    any place a model takes: a segment of a layer, a level reviewed by a model
    above it (``VerticalCascade`` feeds it the level's history; it walks the
    tokens past the target's features on its own predictions), or a reviewer
    of the layer below it (``FeatureVerticalCascade``: it scores the inner
    drafts one at a time)."""
    drafters = tuple(drafters)
    if not drafters:
        raise ValueError("cs_drafter needs at least one drafter.")
    rows = parse_k_matrix(k_matrix, len(drafters))
    reviewers = (ModelDrafter, FeatureDrafter)
    for index, leaf in enumerate(drafters):
        if isinstance(leaf, MaxGramDrafter) and index != len(drafters) - 1:
            raise ValueError("Max-Gram cannot review other drafters; list it last.")
        if not isinstance(leaf, (*reviewers, MaxGramDrafter)):
            raise ValueError(f"drafter {index} must be a ModelDrafter, FeatureDrafter or "
                             f"MaxGramDrafter, got {type(leaf).__name__}.")
        if callable(getattr(leaf, "target_widths", None)):
            raise ValueError(f"drafter {index} ({type(leaf).__name__}) stops rows early "
                             "(SpecDec++); a cascade's segments draft fixed lengths. Use it "
                             "alone, or its FeatureDrafter in the cascade.")
    vocab = {leaf.vocab_size for leaf in drafters}
    if len(vocab) > 1:
        raise ValueError(f"the drafters have different vocabularies {sorted(vocab)}; every "
                         "drafter of a cascade must share the target's tokenizer.")

    gamma = sum(rows[0])
    # A drafter in an early segment misses the later segments' accepted tokens:
    # a second, wider catch-up window covers a whole round without chunking.
    widths = (1, 2, gamma + 2)
    # A feature head re-feeds the positions whose target features a round
    # revealed (at most gamma + 1) in one window, wherever it sits.
    window = gamma + 1

    def layer(i: int) -> list[tuple[Drafter, int]]:
        segments = []
        for j in range(i, len(drafters)):
            if rows[i][j] == 0:
                continue
            leaf = drafters[j]
            if isinstance(leaf, FeatureDrafter):
                leaf = dataclasses.replace(leaf, window=window)
            inner = layer(j + 1) if isinstance(leaf, reviewers) and j + 1 < len(drafters) \
                else []
            if inner:
                inner_drafter = inner[0][0] if len(inner) == 1 else HorizontalCascade(
                    tuple(d for d, _ in inner), tuple(k for _, k in inner))
                common = dict(inner=inner_drafter, name=leaf.name,
                              inner_gamma=sum(k for _, k in inner),
                              lenient=not isinstance(inner_drafter, MaxGramDrafter))
                if isinstance(leaf, FeatureDrafter):
                    leaf = FeatureVerticalCascade(model=leaf, **common)
                else:
                    leaf = VerticalCascade(model=leaf.model, catch_up_widths=widths[1:],
                                           **common)
            elif isinstance(leaf, ModelDrafter):
                leaf = dataclasses.replace(leaf, catch_up_widths=widths)
            segments.append((leaf, rows[i][j]))
        return segments

    top = layer(0)
    # Always a HorizontalCascade at the top, so the round's gamma is fixed by K.
    return HorizontalCascade(tuple(d for d, _ in top), tuple(k for _, k in top))


def drafter_gamma(drafter: Drafter) -> int | None:
    """The block length a drafter fixes itself (horizontal cascades), else None."""
    return getattr(drafter, "gamma", None)
