"""Token-tree drafters (docs/algorithms.md, 'Token trees'): several continuations per round.

A tree drafter proposes ``N`` nodes instead of a chain of ``G`` tokens::

    proposal, state = drafter.propose_tree(params, state, context, with_next, key, sp, config)
    proposal.tokens   int32 [B, N]        node tokens
    proposal.parents  int32 [B, N]        parent node, -1 = the root (the pending token)
    proposal.q        float32 [B, N + 1, V]  drafting law at [root, node 0 .. N - 1]

Nodes are in topological order, depth by depth, and siblings are contiguous
(``parents`` is non-decreasing), so a verifier walks children as slices.
``q[:, 1 + i]`` is the law node i's children were drawn from, *before* the
without-replacement renormalisation (the verifier removes earlier siblings
itself, ``verify.tree.sibling_laws``); a node without children (a leaf) gets its law
only with ``with_next`` (one more drafter call: cascade targets need it for
the bonus token), else a zero row, as a chain's ``q[:, G]``.

Drawing children: at T > 0 the ``k`` children of a node are ``k`` draws
*without replacement* from ``q`` (Gumbel-top-k: the ``k`` largest of ``log q
+ Gumbel`` in decreasing order are, in that order, sequential draws without
replacement), or, for a drafter built with ``replacement=True`` (SpecInfer's
trees), ``k`` independent draws from ``q`` (repeats allowed); at T = 0 the
``k`` largest logits either way (a greedy round tests the target's argmax
path, no law). ``proposal.draws`` says which (``sampling.TREE_DRAWS``): the
verifiers take each child's law from it, so no pairing of a drafter and a
verifier can test a child against a law it was not drawn from. Where ``q`` keeps fewer than
``k`` tokens (top-p / top-k truncation), the children past its support are
distinct tokens with ``q = 0``: a verifier must never accept them (their
without-replacement law is undefined), and should stop there. One drafter call per depth
scores all of that depth's nodes (``score_tree`` on the drafter itself; the
nodes wait in the cache's scratch slots, so a depth's call sees its
ancestors). With one child per node a static tree is the chain: the same
keys give ``ModelDrafter``'s tokens and laws.

Exactness at T > 0 rests on each node's children being a prefix of its
without-replacement draws whose *length* never depends on those children's
own tokens (it may depend on the node, its ancestors and other branches).
Static shapes satisfy it trivially. The dynamic tree (EAGLE-2's expansion)
chooses *which frontier nodes get children* by their path probability, which
is allowed, and keeps every child of an expanded node; EAGLE-2's final
re-ranking to the best ``N`` nodes is left out, because keeping a child for
its own probability biases its law away from ``q`` (a verifier would no
longer be exact at T > 0). Its node budget is fixed by construction instead:
``N = k + (depth - 1) * m * k``.

Max-Gram trees are deterministic (children are a function of the context):
``proposal.draws == POINT_MASS`` says so, and child j's drafting law is then the
point mass on it (``q`` holds the one-hot of a node's first child, Max-Gram's
own chain proposal, for target functions that read ``q``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import sampling
from specdec_jax.drafting.base import Context, extend_from_history
from specdec_jax.drafting.maxgram import MaxGramDrafter, MaxGramState, match_runs
from specdec_jax.drafting.model_drafter import SingleModelDrafter, has_nan
from specdec_jax.models.interface import (
    LanguageModel,
    Prompt,
    start_token_and_prefill,
    supports_trees,
)
from specdec_jax.sampling import POINT_MASS, WITH_REPLACEMENT, WITHOUT_REPLACEMENT, first_argmax

Array = jax.Array


@flax.struct.dataclass
class TreeProposal:
    """A drafted token tree (module docstring)."""

    tokens: Array  # int32 [B, N]: node tokens
    parents: Array  # int32 [B, N]: parent node index, -1 = root; topological, siblings contiguous
    q: Array  # float32 [B, N + 1, V]: law children were drawn from at [root, node 0 .. N - 1]
    q_stat: Array  # float32 [B, N + 1, V]: what deferral statistics read
    calls: Array  # int32 [B, M]: forward calls per neural model
    fed: Array  # int32 [B, M]: tokens (nodes) fed by those calls
    single: Array  # int32 [B, M]: of those calls, the ones that fed one token
    nan: Array  # int32 [B]: calls whose logits held NaN (must stay 0)
    # How each node's children were drawn (``sampling.TREE_DRAWS``): without
    # replacement, with it, or chosen deterministically (Max-Gram: child j's law
    # is then the point mass on it, whatever q says).
    draws: str = flax.struct.field(pytree_node=False, default=WITHOUT_REPLACEMENT)

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """A static tree: ``parents[i]`` of every node (-1 = root), non-decreasing
    and ``< i`` (so depth by depth, siblings contiguous).

    ``TreeShape.from_widths((3, 2, 1))``: the root has 3 children, each of
    them 2, each of those 1: 3 + 6 + 6 = 15 nodes. Any other shape (Sequoia's,
    Medusa's sparse trees) is a parents tuple in this order.
    """

    parents: tuple[int, ...]

    def __post_init__(self):
        par = self.parents
        if not par:
            raise ValueError("TreeShape: a tree needs at least one node.")
        for i, p in enumerate(par):
            if not -1 <= p < i or (i and p < par[i - 1]):
                raise ValueError(
                    f"TreeShape: parents {par} must be -1 or an earlier node and non-decreasing "
                    f"(depth by depth, siblings contiguous); node {i} has parent {p}.")

    @classmethod
    def from_widths(cls, widths) -> TreeShape:
        widths = tuple(int(w) for w in widths)
        if not widths or min(widths) < 1:
            raise ValueError(f"TreeShape.from_widths: widths must be >= 1, got {widths}.")
        parents: list[int] = []
        level = [-1]
        for width in widths:
            start = len(parents)
            parents += [p for p in level for _ in range(width)]
            level = list(range(start, len(parents)))
        return cls(tuple(parents))

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @functools.cached_property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node, 1 for the root's children."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return tuple(out)

    @property
    def depth(self) -> int:
        return max(self.depths)

    @property
    def max_children(self) -> int:
        """The most children any node (the root included) has."""
        return max(self.parents.count(p) for p in set(self.parents))

    @functools.cached_property
    def levels(self) -> tuple[tuple[int, int], ...]:
        """``(start, stop)`` node range of each depth 1 .. depth."""
        d = np.asarray(self.depths)
        return tuple((int(np.argmax(d == k)), int(np.argmax(d == k)) + int(np.sum(d == k)))
                     for k in range(1, self.depth + 1))

    def level_slots(self, level: int) -> tuple[np.ndarray, np.ndarray, int]:
        """For the nodes of depth ``level + 1``: (their parent's index within
        the level above (the root level has one node), their rank among
        their siblings, the most children any node of the level above has)."""
        start, stop = self.levels[level]
        above = 0 if level == 0 else self.levels[level - 1][0]
        par = np.asarray(self.parents[start:stop])
        local = np.where(par < 0, 0, par - above)
        first = {p: start + int(np.argmax(par == p)) for p in set(par.tolist())}
        rank = np.asarray([i - first[p] for i, p in zip(range(start, stop), par.tolist(),
                                                         strict=True)])
        return local, rank, int(rank.max()) + 1


def draw_children(key: Array, probs_BxWxV: Array, logits_BxWxV: Array, k: int,
                  temperature: Array, replacement: bool = False) -> Array:
    """int32 [B, W, k]: ``k`` children of each of W nodes, in draw order.

    T > 0: Gumbel-top-k on ``log q`` (``k`` distinct tokens, sequential draws
    without replacement), or with ``replacement`` ``k`` independent Gumbel-max
    draws (tokens may repeat); T = 0: the k largest logits. With ``k = 1`` and
    ``W = 1`` both are ``verify.sample_from_weights`` draw for draw (the same
    noise)."""
    batch, width, vocab = probs_BxWxV.shape
    log_q = jnp.where(probs_BxWxV > 0, jnp.log(jnp.maximum(probs_BxWxV, 1e-38)), -jnp.inf)
    logits_BxWxV = logits_BxWxV.astype(jnp.float32)
    per_node = k if replacement else 1  # noise rows per node
    # Drawn flat, [B, W * per_node * V]: for W = 1 and one row, exactly the chain's [B, V] noise.
    noise = jax.random.gumbel(key, (batch, width * per_node * vocab), jnp.float32).reshape(
        batch, width, per_node, vocab)
    if not replacement:  # one top-k over whichever scores the temperature selects
        scores = jnp.where(temperature > 0, log_q + noise[:, :, 0], logits_BxWxV)
        return jax.lax.top_k(scores, k)[1].astype(jnp.int32)
    sampled_BxWxk = first_argmax(log_q[:, :, None, :] + noise)
    greedy_BxWxk = jax.lax.top_k(logits_BxWxV, k)[1]
    return jnp.where(temperature > 0, sampled_BxWxk, greedy_BxWxk).astype(jnp.int32)


@flax.struct.dataclass
class TreeDrafterState:
    cache: object  # the model's cache; cache.lengths = history tokens it holds
    # int32 [B]: depths of the last tree whose nodes sit in the cache's scratch
    # slots (the last depth is fed only with ``with_next``).
    scored_depth: Array


def _pick(x_BxWx_: Array, index_BxM: Array) -> Array:
    """``x[b, index[b, m]]`` along axis 1: [B, W, ...] -> [B, M, ...]."""
    return jnp.take_along_axis(x_BxWx_, index_BxM.reshape(index_BxM.shape + (1,) * (
        x_BxWx_.ndim - 2)), axis=1)


class FixedShapeDrafter:
    """Mixin of the drafters that draft one static ``shape`` every round: its
    depth, node count and widest node are the drafter's."""

    @property
    def depth(self) -> int:
        return self.shape.depth

    @property
    def num_nodes(self) -> int:
        return self.shape.num_nodes

    @property
    def max_children(self) -> int:
        return self.shape.max_children


@dataclasses.dataclass(frozen=True)
class _DraftedLevels:
    """What a model tree drafter records while it drafts, depth by depth (a
    Python loop, traced once): the laws of each block of rows (``q`` /
    ``q_stat``: [B, W, V] per depth, the root's first, concatenated by
    ``proposal``; or one [B, N + 1, V] block written in place) and the
    counters of the calls that scored them."""

    q: tuple[Array, ...]
    q_stat: tuple[Array, ...]
    calls_B: Array
    fed_B: Array
    single_B: Array
    nan_B: Array

    def scored(self, dist: sampling.Distributions, logits: Array, width: int
               ) -> _DraftedLevels:
        """After one call that scored ``width`` nodes, with these laws."""
        return _DraftedLevels(q=self.q + (dist.probs,), q_stat=self.q_stat + (dist.stats,),
                              calls_B=self.calls_B + 1, fed_B=self.fed_B + width,
                              single_B=self.single_B + int(width == 1),
                              nan_B=self.nan_B + has_nan(logits))

    def unscored(self, width: int) -> _DraftedLevels:
        """After a last level drafted without ``with_next``: no call, so no laws
        (zeros: verification reads only laws that children were drawn from)."""
        zeros = jnp.zeros((self.q[0].shape[0], width, self.q[0].shape[-1]), jnp.float32)
        return dataclasses.replace(self, q=self.q + (zeros,), q_stat=self.q_stat + (zeros,))

    def proposal(self, tokens_BxN: Array, parents_BxN: Array, draws: str) -> TreeProposal:
        return TreeProposal(tokens=tokens_BxN, parents=parents_BxN,
                            q=jnp.concatenate(self.q, axis=1),
                            q_stat=jnp.concatenate(self.q_stat, axis=1),
                            calls=self.calls_B[:, None], fed=self.fed_B[:, None],
                            single=self.single_B[:, None], nan=self.nan_B, draws=draws)


class _ModelTreeDrafter(SingleModelDrafter):
    """What the model tree drafters share: prefill, the round's first call
    (the pending token, catching up on what the cache lacks), and keeping an
    accepted path in the drafter's cache."""

    def select_params(self, named: dict):
        return named[self.name]

    @property
    def draws(self) -> str:
        """How this drafter draws a node's children (``sampling.TREE_DRAWS``)."""
        return WITH_REPLACEMENT if self.replacement else WITHOUT_REPLACEMENT

    def _check_model(self):
        if not supports_trees(self.model):
            raise ValueError(f"{type(self.model).__name__} cannot score token trees "
                             "(score_tree / commit_path); tree drafters need a decoder-only "
                             "model.")

    @property
    def widths(self) -> tuple[int, ...]:
        # A round that accepted a path of a nodes lags a + 1 tokens (<= depth + 1).
        return self.catch_up_widths or (1, self.depth + 1)

    def init(self, params, prompt: Prompt, max_length: int,
             encoder_decoder: bool) -> TreeDrafterState:
        """Prefills the model; its cache needs ``max_length`` >= the longest
        history + ``num_nodes`` (the tree's scratch slots)."""
        del encoder_decoder
        self._check_model()
        cache, _ = start_token_and_prefill(self.model, params, prompt, max_length)
        return TreeDrafterState(cache=cache, scored_depth=jnp.zeros_like(cache.lengths))

    def commit_path(self, state: TreeDrafterState, nodes_BxA: Array,
                    count_B: Array) -> TreeDrafterState:
        """Keeps the accepted nodes' keys/values (in the scratch slots after
        ``propose_tree``) for the nodes the drafter scored, so the next round
        feeds only what is left (the new pending token, and the last depth's
        node when it was drafted without ``with_next``); without it the next
        round re-feeds every accepted token from the history."""
        kept_B = jnp.minimum(count_B, state.scored_depth)
        return state.replace(cache=self.model.commit_path(state.cache, nodes_BxA, kept_B),
                             scored_depth=jnp.zeros_like(state.scored_depth))

    def _root(self, params, state, context, sp, config):
        """The round's first call (the history not yet fed, up to the pending
        token): ``(levels, logits, dist, cache)`` with the root's law [B, 1, V]."""
        logits, hidden, cache, calls_B, fed_B, single_B = extend_from_history(
            self.model, params, state.cache, context, None, self.widths)
        logits = logits[:, :1]
        dist = sampling.distributions(logits, sp.temperature, sp.top_p, config)
        levels = _DraftedLevels(q=(dist.probs,), q_stat=(dist.stats,), calls_B=calls_B,
                                fed_B=fed_B, single_B=single_B, nan_B=has_nan(logits))
        return levels, logits, dist, cache

    def _score_level(self, params, levels: _DraftedLevels, tokens_BxW, parents_BxN, cache,
                     start: int, sp, config):
        """One call that scores a drafted level (nodes ``start ..``):
        ``(levels, logits, dist, cache)`` with the level's laws [B, W, V]."""
        out = self.model.score_tree(params, tokens_BxW, parents_BxN, cache, start=start)
        dist = sampling.distributions(out.logits, sp.temperature, sp.top_p, config)
        return (levels.scored(dist, out.logits, tokens_BxW.shape[1]), out.logits, dist,
                out.cache)

    def _finish(self, levels: _DraftedLevels, level_tokens, parents_BxN, cache,
                with_next: bool) -> tuple[TreeProposal, TreeDrafterState]:
        """The proposal, and the state that remembers how many depths the cache
        holds in its scratch slots (``commit_path``)."""
        proposal = levels.proposal(jnp.concatenate(level_tokens, axis=1), parents_BxN,
                                   self.draws)
        scored = self.depth if with_next else self.depth - 1
        return proposal, TreeDrafterState(cache=cache,
                                          scored_depth=jnp.full_like(cache.lengths, scored))


@dataclasses.dataclass(frozen=True)
class StaticTreeDrafter(FixedShapeDrafter, _ModelTreeDrafter):
    """A fixed tree shape drafted from ``model`` (module docstring): depth d's
    nodes are drawn from the laws at depth d - 1 (keys ``split(key, depth +
    1)[d - 1]``, as ``ModelDrafter`` draws its chain) and scored in one call.
    ``replacement``: a node's children are independent draws (SpecInfer's
    trees; siblings may repeat) instead of draws without replacement."""

    model: LanguageModel
    shape: TreeShape
    name: str = "drafter"
    catch_up_widths: tuple[int, ...] | None = None
    replacement: bool = False

    def propose_tree(self, params, state: TreeDrafterState, context: Context, with_next: bool,
                     key: Array, sp: sampling.SamplingParams, config: sampling.SamplingConfig
                     ) -> tuple[TreeProposal, TreeDrafterState]:
        shape = self.shape
        keys = jax.random.split(key, shape.depth + 1)
        levels, logits, dist, cache = self._root(params, state, context, sp, config)
        batch = logits.shape[0]
        parents_BxN = jnp.broadcast_to(jnp.asarray(shape.parents, jnp.int32),
                                       (batch, shape.num_nodes))
        level_tokens = []
        for level, (start, stop) in enumerate(shape.levels):
            local, rank, k = shape.level_slots(level)
            children_BxWxk = draw_children(keys[level], levels.q[-1], logits, k,
                                           sp.temperature, self.replacement)
            tokens_BxW = children_BxWxk[:, local, rank]
            level_tokens.append(tokens_BxW)
            if level + 1 < shape.depth or with_next:
                levels, logits, dist, cache = self._score_level(
                    params, levels, tokens_BxW, parents_BxN, cache, start, sp, config)
            else:
                levels = levels.unscored(stop - start)
        return self._finish(levels, level_tokens, parents_BxN, cache, with_next)


@dataclasses.dataclass(frozen=True)
class DynamicTreeDrafter(_ModelTreeDrafter):
    """EAGLE-2's dynamic tree from ``model``: the root gets ``children``
    nodes; at each further depth the ``expand`` nodes of the depth above with
    the highest path probability under the drafter (``prod q_stat(x)`` along
    the path: the drafter's confidence, which at T = 0 is its unscaled
    softmax) get ``children`` each. ``N = children + (depth - 1) * expand *
    children`` nodes, one drafter call per depth over all that depth's nodes
    (every node's law is reported; the last depth's only with ``with_next``).
    No final re-ranking (module docstring: it would break exactness at T > 0).
    ``replacement`` as ``StaticTreeDrafter``'s.
    """

    model: LanguageModel
    depth: int = 4
    expand: int = 2
    children: int = 2
    name: str = "drafter"
    catch_up_widths: tuple[int, ...] | None = None
    replacement: bool = False

    def __post_init__(self):
        if self.depth < 1 or self.children < 1 or not 1 <= self.expand <= self.children:
            raise ValueError(
                f"DynamicTreeDrafter: need depth >= 1, children >= 1 and 1 <= expand <= children "
                f"(got depth={self.depth}, expand={self.expand}, children={self.children}).")

    @property
    def level_sizes(self) -> tuple[int, ...]:
        return (self.children,) + (self.expand * self.children,) * (self.depth - 1)

    @property
    def num_nodes(self) -> int:
        return sum(self.level_sizes)

    @property
    def max_children(self) -> int:
        return self.children

    def propose_tree(self, params, state: TreeDrafterState, context: Context, with_next: bool,
                     key: Array, sp: sampling.SamplingParams, config: sampling.SamplingConfig
                     ) -> tuple[TreeProposal, TreeDrafterState]:
        """Depth 0 (``children`` nodes) is scored and expanded on its own;
        depths 1 .. depth - 2, all ``expand * children`` nodes wide, are
        scored and expanded by one traced drafter call in a ``fori_loop``;
        the last depth is scored after it, only ``with_next``. So a compiled
        program holds at most three ``score_tree`` copies of the drafter's
        layers whatever the depth, not one per depth (on a TPU each copy
        brings its own weight prefetches and scratch). Same calls, keys and
        laws as one call per depth written out."""
        keys = jax.random.split(key, self.depth + 1)
        levels, logits, dist, cache = self._root(params, state, context, sp, config)
        batch = logits.shape[0]
        n, k, wide = self.num_nodes, self.children, self.expand * self.children
        tokens_BxW = draw_children(keys[0], dist.probs, logits, k, sp.temperature,
                                   self.replacement)[:, 0]  # the root's W = 1
        value_BxW = jnp.take_along_axis(dist.stats[:, 0], tokens_BxW, axis=1)
        parents_BxN = jnp.full((batch, n), -1, jnp.int32)  # later depths filled as drawn
        level_tokens = [tokens_BxW]
        if self.depth > 1:
            levels, logits, dist, cache = self._score_level(
                params, levels, tokens_BxW, parents_BxN, cache, 0, sp, config)
            tokens_BxW, value_BxW, parents_BxN = self._expand(
                keys[1], dist, logits, value_BxW, parents_BxN, 0, k, sp)
            level_tokens.append(tokens_BxW)
        middle = self.depth - 2  # depths scored and expanded inside the loop
        if middle <= 0:
            if with_next:  # the last depth's laws, for the bonus token
                levels, logits, dist, cache = self._score_level(
                    params, levels, tokens_BxW, parents_BxN, cache, n - tokens_BxW.shape[1], sp,
                    config)
            else:
                levels = levels.unscored(tokens_BxW.shape[1])
            return self._finish(levels, level_tokens, parents_BxN, cache, with_next)

        # The laws of all N + 1 rows in one buffer each, written in place by the
        # loop (rows not scored stay zero: the last depth's without ``with_next``).
        done = 1 + k  # rows written so far: the root's and depth 0's
        rest = jnp.zeros((batch, n + 1 - done, dist.probs.shape[-1]), jnp.float32)
        q_BxN1xV, q_stat_BxN1xV = (jnp.concatenate(laws + (rest,), axis=1)
                                   for laws in (levels.q, levels.q_stat))

        def score(start, tokens_BxW, parents_BxN, cache, laws):
            """Scores the nodes ``start ..`` and writes their laws at rows ``1 + start ..``."""
            out = self.model.score_tree(params, tokens_BxW, parents_BxN, cache, start=start)
            dist = sampling.distributions(out.logits, sp.temperature, sp.top_p, config)
            put = functools.partial(jax.lax.dynamic_update_slice_in_dim, start_index=1 + start,
                                    axis=1)
            q_BxN1xV, q_stat_BxN1xV, nan_B = laws
            return out, dist, (put(q_BxN1xV, dist.probs), put(q_stat_BxN1xV, dist.stats),
                               nan_B + has_nan(out.logits))

        def depth_fn(i, carry):
            drawn_BxR, tokens_BxW, value_BxW, parents_BxN, cache, laws = carry
            start = k + i * wide
            out, dist, laws = score(start, tokens_BxW, parents_BxN, cache, laws)
            tokens_BxW, value_BxW, parents_BxN = self._expand(
                keys[i + 2], dist, out.logits, value_BxW, parents_BxN, start, wide, sp)
            drawn_BxR = jax.lax.dynamic_update_slice_in_dim(drawn_BxR, tokens_BxW, i * wide, axis=1)
            return drawn_BxR, tokens_BxW, value_BxW, parents_BxN, out.cache, laws

        drawn_BxR, tokens_BxW, value_BxW, parents_BxN, cache, laws = jax.lax.fori_loop(
            0, middle, depth_fn, (jnp.zeros((batch, middle * wide), jnp.int32), tokens_BxW,
                                  value_BxW, parents_BxN, cache,
                                  (q_BxN1xV, q_stat_BxN1xV, jnp.zeros((batch,), jnp.int32))))
        level_tokens.append(drawn_BxR)
        calls = middle + int(with_next)
        if with_next:  # the last depth's laws, for the bonus token
            out, _, laws = score(n - wide, tokens_BxW, parents_BxN, cache, laws)
            cache = out.cache
        q_BxN1xV, q_stat_BxN1xV, nan_B = laws
        levels = _DraftedLevels(
            q=(q_BxN1xV,), q_stat=(q_stat_BxN1xV,), calls_B=levels.calls_B + calls,
            fed_B=levels.fed_B + calls * wide, single_B=levels.single_B + calls * int(wide == 1),
            nan_B=levels.nan_B + nan_B)
        return self._finish(levels, level_tokens, parents_BxN, cache, with_next)

    def _expand(self, key, dist, logits, value_BxW, parents_BxN, start, width: int, sp):
        """The next depth from a scored one (nodes ``start .. start + width - 1``):
        the ``expand`` nodes of highest path probability get ``children``
        each, drawn from their laws with ``key``. Returns the new depth's
        tokens [B, M * k] and path probabilities, and ``parents`` with its
        nodes' parents written at ``start + width ..``."""
        k = self.children
        # Sorted by node index so the next depth's parents stay non-decreasing.
        chosen_BxM = jnp.sort(jax.lax.top_k(value_BxW, self.expand)[1], axis=1)
        pick = functools.partial(_pick, index_BxM=chosen_BxM)
        stats_BxMxV = pick(dist.stats)
        kids_BxMxk = draw_children(key, pick(dist.probs), pick(logits), k, sp.temperature,
                                   self.replacement)
        child_value = _pick(value_BxW, chosen_BxM)[..., None] * jnp.take_along_axis(
            stats_BxMxV, kids_BxMxk, axis=2)  # [B, M, k]
        batch = kids_BxMxk.shape[0]
        new_parents = jnp.repeat(start + chosen_BxM, k, axis=1)  # [B, M * k]
        parents_BxN = jax.lax.dynamic_update_slice_in_dim(parents_BxN, new_parents,
                                                          start + width, axis=1)
        return kids_BxMxk.reshape(batch, -1), child_value.reshape(batch, -1), parents_BxN


def ranked_candidates(text_BxT: Array, n_B: Array, bigram_V: Array, max_ngram: int,
                      k: int) -> Array:
    """int32 [B, k]: ``k`` distinct next tokens for ``text[b, :n[b]]``, best
    first: the token after every earlier occurrence of the text's suffix
    (``maxgram.match_runs``), longer matches first and, among equally long
    ones, the most recent (so the first is Max-Gram's own proposal); then the
    bigram table's continuation of the last token; then the smallest token ids
    not yet taken (filler, so siblings stay distinct).

    Worked example: text [5 1 2 3 9 1 2 4 1 2], bigram[2] = 7: the suffix
    [1 2] ends at m = 2 and m = 6 (run 2; followed by 3 and 4), [2] nowhere
    else -> candidates 4, 3, 7, 0, ...
    """
    batch, width = text_BxT.shape
    run_BxT = match_runs(text_BxT, n_B, max_ngram)
    m_T = jnp.arange(width)
    score_BxT = jnp.where(run_BxT > 0, run_BxT * width + m_T[None, :], -1)
    next_BxT = jnp.take_along_axis(text_BxT, jnp.clip(m_T + 1, 0, width - 1)[None, :]
                                   .repeat(batch, 0), axis=1)
    last_B = jnp.take_along_axis(text_BxT, jnp.maximum(n_B - 1, 0)[:, None], axis=1)[:, 0]
    bigram_B = bigram_V[last_B].astype(jnp.int32)
    chosen_BxK = jnp.full((batch, k), -1, jnp.int32)
    filler_F = jnp.arange(k + 1, dtype=jnp.int32)
    for j in range(k):
        best_B = jnp.argmax(score_BxT, axis=1)
        has_match_B = jnp.max(score_BxT, axis=1) >= 0
        matched_B = jnp.take_along_axis(next_BxT, best_B[:, None], axis=1)[:, 0]
        bigram_free_B = ~jnp.any(chosen_BxK == bigram_B[:, None], axis=1)
        free_BxF = ~jnp.any(chosen_BxK[:, :, None] == filler_F[None, None, :], axis=1)
        filler_B = jnp.argmax(free_BxF, axis=1).astype(jnp.int32)
        token_B = jnp.where(has_match_B, matched_B, jnp.where(bigram_free_B, bigram_B, filler_B))
        chosen_BxK = chosen_BxK.at[:, j].set(token_B)
        score_BxT = jnp.where(next_BxT == token_B[:, None], -1, score_BxT)
    return chosen_BxK


@dataclasses.dataclass(frozen=True)
class MaxGramTreeDrafter(FixedShapeDrafter):
    """A static tree of Max-Gram proposals: each node's children are its
    context's ``ranked_candidates`` (every n-gram match, then the bigram
    table). With one child per node it is ``MaxGramDrafter``'s chain.
    Deterministic: ``q`` holds one-hots (module docstring)."""

    vocab_size: int
    shape: TreeShape
    max_ngram: int = 32
    name: str = "mag"
    model_names: tuple[str, ...] = ()
    draws: ClassVar[str] = POINT_MASS  # children chosen, not drawn

    @property
    def _chain(self) -> MaxGramDrafter:
        return MaxGramDrafter(self.vocab_size, self.max_ngram, self.name)

    def select_params(self, named: dict):
        return named[self.name]

    def init(self, params, prompt: Prompt, max_length: int,
             encoder_decoder: bool) -> MaxGramState:
        return self._chain.init(params, prompt, max_length, encoder_decoder)

    def rewind(self, state: MaxGramState, valid_B: Array) -> MaxGramState:
        return state

    def propose_tree(self, params, state: MaxGramState, context: Context, with_next: bool,
                     key: Array, sp: sampling.SamplingParams, config: sampling.SamplingConfig
                     ) -> tuple[TreeProposal, MaxGramState]:
        del key, sp, config  # deterministic
        shape = self.shape
        text_BxT, n_B = self._chain.text(state, context, shape.depth)
        batch, width = text_BxT.shape
        texts_BxWxT, n_BxW = text_BxT[:, None, :], n_B[:, None]  # the level above
        one_hot = functools.partial(jax.nn.one_hot, num_classes=self.vocab_size,
                                    dtype=jnp.float32)

        def candidates(texts_BxWxT, n_BxW, k):
            w = texts_BxWxT.shape[1]
            return ranked_candidates(texts_BxWxT.reshape(batch * w, width), n_BxW.reshape(-1),
                                     params, self.max_ngram, k).reshape(batch, w, k)

        qs, level_tokens = [], []
        for level in range(shape.depth):
            local, rank, k = shape.level_slots(level)
            cand_BxWxk = candidates(texts_BxWxT, n_BxW, k)
            qs.append(one_hot(cand_BxWxk[..., 0]))
            tokens_BxW = cand_BxWxk[:, local, rank]
            level_tokens.append(tokens_BxW)
            texts_BxWxT, n_BxW = texts_BxWxT[:, local], n_BxW[:, local]
            rows = jnp.arange(batch)[:, None]
            texts_BxWxT = texts_BxWxT.at[rows, jnp.arange(len(local))[None, :], n_BxW].set(
                tokens_BxW, mode="drop")
            n_BxW = n_BxW + 1
        leaves = texts_BxWxT.shape[1]
        qs.append(one_hot(candidates(texts_BxWxT, n_BxW, 1)[..., 0]) if with_next else
                  jnp.zeros((batch, leaves, self.vocab_size), jnp.float32))
        q = jnp.concatenate(qs, axis=1)
        zeros = jnp.zeros((batch, 0), jnp.int32)
        proposal = TreeProposal(
            tokens=jnp.concatenate(level_tokens, axis=1),
            parents=jnp.broadcast_to(jnp.asarray(shape.parents, jnp.int32),
                                     (batch, shape.num_nodes)),
            q=q, q_stat=q, calls=zeros, fed=zeros, single=zeros,
            nan=jnp.zeros((batch,), jnp.int32), draws=POINT_MASS)
        return proposal, state


def count_candidates(text_BxT: Array, n_B: Array, table: Array, *, max_ngram: int,
                     matches: int, k: int, run_power: float, bigram_mass: float,
                     unseen_mass: float) -> tuple[Array, Array]:
    """(tokens int32 [B, k], probs float32 [B, k]): the ``k`` likeliest next
    tokens of ``text[b, :n[b]]`` under Max-Gram's count model, best first.

    Every earlier occurrence ``m`` of the text's suffix (``match_runs``: run
    ``r_m > 0``) votes for the token after it with mass ``r_m ** run_power``
    (longer matches are likelier to continue alike); only the ``matches``
    longest (then most recent) occurrences vote. The bigram table's
    continuations of the last token (``table`` int [V] or [V, K], best first)
    add ``bigram_mass / (j + 1)`` for the j-th. Votes for one token add up
    (frequent continuations win), and

        prob(x) = mass(x) / (sum of all masses + unseen_mass)

    ``unseen_mass`` stands for every continuation no vote saw. Slots past the
    distinct tokens voted for get probability 0 (their tokens repeat others).

    Worked example (run_power 1, bigram_mass 1, unseen_mass 1): text
    [5 1 2 3 9 1 2 4 1 2], bigram[2] = 7: [1 2] ends at m = 2 and 6 (runs 2:
    votes 2 for 3, 2 for 4), [2] nowhere else; the bigram votes 1 for 7:
    tokens 4, 3, 7 (4 more recent than 3), probs 2/6, 2/6, 1/6.
    """
    batch, width = text_BxT.shape
    run_BxT = match_runs(text_BxT, n_B, max_ngram)
    key_BxT = jnp.where(run_BxT > 0, run_BxT * width + jnp.arange(width)[None, :], -1)
    key_BxC, m_BxC = jax.lax.top_k(key_BxT, min(matches, width))
    run_BxC = jnp.take_along_axis(run_BxT, m_BxC, axis=1)
    next_BxC = jnp.take_along_axis(text_BxT, jnp.minimum(m_BxC + 1, width - 1), axis=1)
    mass_BxC = jnp.where(key_BxC >= 0, run_BxC.astype(jnp.float32) ** run_power, 0.0)
    last_B = jnp.take_along_axis(text_BxT, jnp.maximum(n_B - 1, 0)[:, None], axis=1)[:, 0]
    bigram_BxK = table[last_B].reshape(batch, -1).astype(jnp.int32)
    rank_K = jnp.arange(bigram_BxK.shape[1], dtype=jnp.float32)
    tokens_BxA = jnp.concatenate([next_BxC.astype(jnp.int32), bigram_BxK], axis=1)
    mass_BxA = jnp.concatenate([mass_BxC, jnp.broadcast_to(bigram_mass / (rank_K + 1.0),
                                                           bigram_BxK.shape)], axis=1)
    if tokens_BxA.shape[1] < k:  # too few voters for k slots: pad with massless ones
        pad = k - tokens_BxA.shape[1]
        tokens_BxA = jnp.pad(tokens_BxA, ((0, 0), (0, pad)))
        mass_BxA = jnp.pad(mass_BxA, ((0, 0), (0, pad)))
    a = tokens_BxA.shape[1]
    voted_BxA = mass_BxA > 0
    same_BxAxA = (tokens_BxA[:, :, None] == tokens_BxA[:, None, :]) & voted_BxA[:, None, :]
    total_BxA = jnp.einsum("bij,bj->bi", same_BxAxA.astype(jnp.float32), mass_BxA)
    index_A = jnp.arange(a)
    first_BxA = voted_BxA & ~jnp.any(same_BxAxA & (index_A[None, None, :] < index_A[None, :, None]),
                                     axis=-1)
    # Ties between equal totals go to the lower index: the longer, more recent match.
    score_BxA = jnp.where(first_BxA, total_BxA, -1.0)
    best_BxK, index_BxK = jax.lax.top_k(score_BxA, k)
    tokens_BxK = jnp.take_along_axis(tokens_BxA, index_BxK, axis=1)
    z_B1 = jnp.sum(mass_BxA, axis=1, keepdims=True) + unseen_mass
    probs_BxK = jnp.where(best_BxK > 0, best_BxK / jnp.where(z_B1 > 0, z_B1, 1.0), 0.0)
    return tokens_BxK, probs_BxK


@dataclasses.dataclass(frozen=True)
class MaxGramTrieDrafter:
    """Max-Gram trees grown best first within a node budget.

    Each node's context is the text, then the path to it; its candidate
    children are ``count_candidates`` of that context (every earlier match of
    its suffix, merged by next token, ranked by summed match length; then the
    bigram table's continuations). A node's value is its estimated path
    probability, the product of its ancestors' candidate probabilities; the
    tree grows one node at a time by the most valuable candidate of any node
    already in it (EAGLE-2's best-first expansion with Max-Gram's counts),
    until it holds ``num_nodes`` nodes of depth at most ``depth``. Shared
    prefixes are one node by construction (a node's children are distinct
    tokens), and a copy of an earlier passage grows as a deep chain because
    after each copied token the same occurrence matches again, one longer.
    With path probabilities ``P`` estimated right, the tree maximises the
    expected accepted length ``sum_nodes P(node)`` (every node's value is at
    most its parent's, so the best ``num_nodes`` are a tree).

    Parents are data (one compiled program per budget); nodes are numbered
    in the order they were added: topological (``parents[i] < i``), siblings
    in decreasing probability, not contiguous. Deterministic: a node's law at
    T > 0 is the point mass on its own token (``proposal.draws``;
    ``verify.tree``'s point-mass laws), and ``q`` at a context holds the one-hot
    of its likeliest candidate (its first child; Max-Gram's chain proposal)
    for target functions that read ``q``.

    Params: the bigram table, int32 [V] (or [V, K]: K continuations per token,
    best first; the packaged table stores K = 8:
    ``data.bigram.load_table(name, columns=data.bigram.TOP_K)``). Cost:
    ``num_nodes`` sequential steps, each a suffix match over one text per row
    (no neural network).
    """

    vocab_size: int
    num_nodes: int = 32
    depth: int = 8
    max_ngram: int = 32
    children: int = 8  # candidate slots per node
    matches: int = 64  # occurrences voting at each node
    run_power: float = 2.0
    bigram_mass: float = 1.0
    unseen_mass: float = 1.0
    name: str = "mag"
    model_names: tuple[str, ...] = ()
    draws: ClassVar[str] = POINT_MASS  # children chosen, not drawn

    def __post_init__(self):
        if self.num_nodes < 1 or self.depth < 1 or self.children < 1 or self.matches < 1:
            raise ValueError(f"MaxGramTrieDrafter: num_nodes, depth, children and matches must "
                             f"be >= 1 (got {self.num_nodes}, {self.depth}, {self.children}, "
                             f"{self.matches}).")
        if self.depth == 1 and self.num_nodes > self.children:
            raise ValueError(f"MaxGramTrieDrafter: a depth-1 tree holds at most children = "
                             f"{self.children} nodes, not {self.num_nodes}.")

    @property
    def _chain(self) -> MaxGramDrafter:
        return MaxGramDrafter(self.vocab_size, self.max_ngram, self.name)

    @property
    def max_children(self) -> int:
        return self.children

    def select_params(self, named: dict):
        return named[self.name]

    def init(self, params, prompt: Prompt, max_length: int,
             encoder_decoder: bool) -> MaxGramState:
        table = params if jnp.ndim(params) == 1 else params[:, 0]  # [V, K]: check column 0
        return self._chain.init(table, prompt, max_length, encoder_decoder)

    def rewind(self, state: MaxGramState, valid_B: Array) -> MaxGramState:
        return state

    def candidates(self, params, text_BxT: Array, n_B: Array) -> tuple[Array, Array]:
        return count_candidates(text_BxT, n_B, params, max_ngram=self.max_ngram,
                                matches=self.matches, k=self.children,
                                run_power=self.run_power, bigram_mass=self.bigram_mass,
                                unseen_mass=self.unseen_mass)

    def grow(self, params, text_BxT: Array, n_B: Array) -> tuple[Array, Array, Array]:
        """(tokens [B, N], parents [B, N], first candidate [B, N + 1]) of the
        tree for the texts ``text[b, :n[b]]`` (``depth`` free slots after each)."""
        n_nodes, depth, k = self.num_nodes, self.depth, self.children
        batch, width = text_BxT.shape
        rows_B = jnp.arange(batch)
        pos_T = jnp.arange(width)
        tiny = jnp.float32(1e-30)  # massless slots still fill the budget, last

        def node_text(path_BxD, d_B):
            offset_BxT = pos_T[None, :] - n_B[:, None]
            in_path = (offset_BxT >= 0) & (offset_BxT < d_B[:, None])
            from_path = jnp.take_along_axis(path_BxD, jnp.clip(offset_BxT, 0, depth - 1), 1)
            return jnp.where(in_path, from_path, text_BxT), n_B + d_B

        tok_BxK, prob_BxK = self.candidates(params, text_BxT, n_B)
        cand_tok = jnp.zeros((batch, n_nodes + 1, k), jnp.int32).at[:, 0].set(tok_BxK)
        cand_lp = jnp.full((batch, n_nodes + 1, k), -jnp.inf).at[:, 0].set(
            jnp.log(jnp.maximum(prob_BxK, tiny)))
        carry = dict(
            cand_tok=cand_tok, cand_lp=cand_lp,
            paths=jnp.zeros((batch, n_nodes + 1, depth), jnp.int32),
            depth=jnp.zeros((batch, n_nodes + 1), jnp.int32),
            lp=jnp.zeros((batch, n_nodes + 1), jnp.float32),
            tokens=jnp.zeros((batch, n_nodes), jnp.int32),
            parents=jnp.zeros((batch, n_nodes), jnp.int32))

        def body_fn(i, c):
            # The most valuable candidate slot of any node in the tree becomes node i.
            value_BxS = (c["lp"][:, :, None] + c["cand_lp"]).reshape(batch, -1)
            slot_B = jnp.argmax(value_BxS, axis=1)
            par_B, j_B = slot_B // k, slot_B % k
            token_B = c["cand_tok"][rows_B, par_B, j_B]
            d_B = c["depth"][rows_B, par_B]
            path_BxD = c["paths"][rows_B, par_B].at[rows_B, d_B].set(token_B, mode="drop")
            node = i + 1
            text, n = node_text(path_BxD, d_B + 1)
            tok_BxK, prob_BxK = self.candidates(params, text, n)
            lp_BxK = jnp.where((d_B + 1 < depth)[:, None],
                               jnp.log(jnp.maximum(prob_BxK, tiny)), -jnp.inf)
            return dict(
                cand_tok=c["cand_tok"].at[:, node].set(tok_BxK),
                cand_lp=c["cand_lp"].at[rows_B, par_B, j_B].set(-jnp.inf)
                .at[:, node].set(lp_BxK),
                paths=c["paths"].at[:, node].set(path_BxD),
                depth=c["depth"].at[:, node].set(d_B + 1),
                lp=c["lp"].at[:, node].set(jnp.max(value_BxS, axis=1)),
                tokens=c["tokens"].at[:, i].set(token_B),
                parents=c["parents"].at[:, i].set(par_B.astype(jnp.int32) - 1))

        c = jax.lax.fori_loop(0, n_nodes, body_fn, carry)
        return c["tokens"], c["parents"], c["cand_tok"][:, :, 0]

    def propose_tree(self, params, state: MaxGramState, context: Context, with_next: bool,
                     key: Array, sp: sampling.SamplingParams, config: sampling.SamplingConfig
                     ) -> tuple[TreeProposal, MaxGramState]:
        del key, sp, config  # deterministic
        text_BxT, n_B = self._chain.text(state, context, self.depth)
        tokens_BxN, parents_BxN, first_BxN1 = self.grow(params, text_BxT, n_B)
        batch = tokens_BxN.shape[0]
        q = jax.nn.one_hot(first_BxN1, self.vocab_size, dtype=jnp.float32)
        if not with_next:  # a context without children reports no law (module docstring)
            has_child_BxN1 = jnp.zeros((batch, self.num_nodes + 1), bool).at[
                jnp.arange(batch)[:, None], parents_BxN + 1].set(True)
            q = jnp.where(has_child_BxN1[..., None], q, 0.0)
        zeros = jnp.zeros((batch, 0), jnp.int32)
        proposal = TreeProposal(tokens=tokens_BxN, parents=parents_BxN, q=q, q_stat=q,
                                calls=zeros, fed=zeros, single=zeros,
                                nan=jnp.zeros((batch,), jnp.int32), draws=POINT_MASS)
        return proposal, state
