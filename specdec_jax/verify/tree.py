"""Exact verification of token trees (docs/algorithms.md, 'Token trees').

A round may draft a *tree* instead of a chain: ``N`` nodes per row, node ``i``
holding a drafted token ``x_i`` whose parent is ``par(i)`` (``-1`` = the
round's root, the last emitted token). The tree is data, so one compiled
program serves every tree of ``N`` nodes:

    parents  int32 [B, N]   par(i), -1 = root
    tokens   int32 [B, N]   x_i
    valid    bool  [B, N]   node i exists (a row with fewer nodes marks the rest False)

Requirements on the layout (``validate_tree`` checks them on the host):
``par(i) < i`` (topological order: a chain is ``par(i) = i - 1``), the parent
of a valid node is valid, and the children of a node appear in the order
they were drafted (the first drawn has the lowest index; they need not be
contiguous). A level-by-level (breadth-first) numbering meets all three.
Invalid nodes under a node must be its *last* children (with their
subtrees): a node's law removes the tokens of its valid earlier siblings
only (``sibling_laws``), which is what ``sample_children`` gives when its
children past the support of ``q`` are marked invalid.

Laws are given per *context*, index 0 = the root, index ``i + 1`` = node
``i``: ``q_BxN1xV[:, i + 1]`` is the drafter's law at node ``i``'s context,
the law node ``i``'s children were drawn from, ``pi_BxN1xV`` the target law
``pi = T(q, p)`` there (``p`` itself for speculative decoding, a cascade's
``pi`` otherwise). ``pi`` must be normalised (the lossy rule's weights are
not).

A tree says how its children were drawn (``Tree.draws``), and the law each
child is verified against follows from that alone (``sibling_laws``), so no
verifier can assume a law the drafter did not draw from:

    without-replacement  child j ~ q_j = q with the earlier siblings' tokens
                         removed, renormalised (Gumbel-top-k; the default)
    with-replacement     every child ~ q, independently (SpecInfer)
    point-mass           deterministic children (Max-Gram): child j's law is
                         the point mass on its own token

Every sampling verifier here is exact for every drawing: checked by exact
enumeration over all drafted trees (``tests/test_verify_tree.py``), including
traversal over children drawn with replacement (total variation from pi
below 5e-16; it then accepts 1.73 drafts against RRS's 1.67 on widths (2, 2)).

Every verifier returns ``TreeVerifyOutput``: the accepted node (``-1`` = the
root: no draft kept), its depth (= drafts accepted) and the next token. The
round emits the tokens on the path root -> node (``path_tokens``), then the
next token.

* ``GreedyTreeVerifier`` (``greedy``): the deepest node whose whole path
  matches ``argmax pi`` at each parent; the next token is ``argmax pi`` after it.
* ``RecursiveRejectionVerifier`` (``rrs``): recursive rejection sampling
  (SpecInfer; Jeon et al. for children drawn without replacement). At a node
  with children ``c_1 .. c_k`` start with ``r = pi``; accept ``c_j`` w.p.
  ``min(1, r(c_j) / q_j(c_j))`` and descend; on reject ``r <- norm((r -
  q_j)_+)``; all rejected -> emit ``y ~ r``; an accepted leaf emits ``y ~
  pi`` of the leaf.
* ``TraversalVerifier`` (``traversal``): traversal verification (Weng et al.),
  leaf to root over whole paths. Each node carries ``(alpha, P)``, initially
  ``alpha`` = its clipped joint ratio ``min(1, alpha_par P_par(x) / q_j(x))``
  (``alpha_root = 1``) and ``P = pi`` of its context. Nodes are visited in
  post-order (children in drafting order); a visited node, all of whose
  children were rejected, is accepted w.p. ``alpha`` (the root always is);
  a rejected node ``c`` with parent ``n`` and law ``q_c`` updates its parent

      S = sum_x (alpha_n P_n(x) - q_c(x))_+
      P_n <- norm((alpha_n P_n - q_c)_+),   alpha_n <- S / (S + 1 - alpha_n)   (0/0 -> 1)

  and the next sibling's ``alpha`` is computed from the updated parent. The
  accepted node emits ``y ~ P`` of its context. On a chain this is exactly
  the stateless block verifier (``verify.block.BlockVerifier``): ``alpha`` of
  node ``i`` is ``w_{i+1}``, the parent update gives ``h_i`` and the residual
  ``norm((w_i pi_{i+1} - q_{i+1})_+)``, and with the same key both draw the
  same uniforms and the same token.

Worked example (N = 3, parents [-1, -1, 0]: two root children, the first
with one child). Traversal visits node 2 (leaf, alpha_2), then node 0 (with
alpha_0 updated by node 2's rejection), then node 1 (alpha_1 from the root's
state after node 0's rejection), then the root. RRS tests node 0, and only if
it rejects node 0 does it test node 1; node 2 is tested only after node 0 is
accepted.

All functions are pure and jittable; the per-node loops are fixed-trip
``lax.fori_loop`` s over the node slots, one row at a time (``lax.map``, so
that a step that changes no law skips its ``[V]`` work: at the 152k
vocabulary, 20 nodes, on CPU, a row of traversal verification took 16 ms
this way against 90 ms vectorised over rows).
Under greedy decoding use ``greedy``: with one-hot laws the sampling
verifiers only ever consider each node's first child (the others have
probability 0 under their sequential laws).
Deterministic drafters (Max-Gram trees: ``draws = POINT_MASS``): a node's
children are a fixed set of distinct tokens chosen from the context, not
draws, so the law each child "was drawn from" is the point mass on its own
token, ``q_j = delta(c_j)``, whatever the order. RRS then accepts ``c_1``
w.p. ``r(c_1)``, else removes it from the residual (``(r - delta(c_1))_+``
zeroes ``c_1``) and accepts ``c_2`` w.p. ``r(c_2) / (1 - r(c_1))``, ...:
the children are tested in turn against ``pi`` restricted to what is left,
and the emitted token follows ``pi`` exactly (each step is a rejection step
of the residual against the law its child really had, the argument of the
general case). Traversal verification takes the same laws. Reading the
context's one-hot ``q`` of the first child as every child's law instead
(sequential laws from one one-hot) is exact too but never accepts a later
sibling (its law has no mass), so a deterministic tree would act as a chain.
Exactness needs the tree's shape to be fixed before its tokens are drawn, or
at least never to depend on a node's own token or on tokens drafted after it
in the verifier's visiting order (docs/algorithms.md, 'Token trees').
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.sampling import (
    POINT_MASS,
    WITH_REPLACEMENT,
    WITHOUT_REPLACEMENT,
    check_tree_draws,
    first_argmax,
    sample_from_weights,
)
from specdec_jax.verify.token import RESIDUAL_EPS, residual

Array = jax.Array

ROOT = -1  # parent index of the root's children; accepted "node" when no draft is kept


# ---------------------------------------------------------------------------
# The tree and its index helpers
# ---------------------------------------------------------------------------

@flax.struct.dataclass
class Tree:
    """A batch of token trees of ``N`` node slots (module docstring)."""

    parents: Array  # int32 [B, N]: parent node index, -1 = root
    tokens: Array  # int32 [B, N]: the drafted token of each node
    valid: Array  # bool [B, N]: the node exists
    # How each node's children were drawn (``sampling.TREE_DRAWS``): the laws
    # the verifiers test them against follow from it (``sibling_laws``).
    draws: str = flax.struct.field(pytree_node=False, default=WITHOUT_REPLACEMENT)
    # A bound on the depth of every tree of the batch, known when tracing (a
    # drafter's tree shape): traversal keeps one [V] law per depth of its path,
    # not per node. None: the node count (a chain's depth).
    max_depth: int | None = flax.struct.field(pytree_node=False, default=None)

    def __post_init__(self):
        check_tree_draws(self.draws)

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]


def chain(drafts_BxG: Array) -> Tree:
    """The chain ``X_1 .. X_G`` as a tree: ``par(i) = i - 1``."""
    batch, g = drafts_BxG.shape
    parents_BxG = jnp.broadcast_to(jnp.arange(g, dtype=jnp.int32) - 1, (batch, g))
    return Tree(parents=parents_BxG, tokens=drafts_BxG.astype(jnp.int32),
                valid=jnp.ones((batch, g), bool), max_depth=g)


def static_tree(widths: tuple[int, ...]) -> np.ndarray:
    """Parents (int32 [N]) of the full tree with ``widths[d]`` children per node
    at depth ``d``, numbered level by level.

    widths (2, 2) -> [-1, -1, 0, 0, 1, 1]; (3, 1) -> [-1, -1, -1, 0, 1, 2].
    """
    parents, level = [], [ROOT]
    for width in widths:
        next_level = []
        for node in level:
            for _ in range(width):
                next_level.append(len(parents))
                parents.append(node)
        level = next_level
    return np.asarray(parents, np.int32)


def validate_tree(parents, valid=None) -> None:
    """Host-side check of the layout the verifiers assume (module docstring)."""
    parents = np.asarray(parents)
    parents = parents.reshape(-1, parents.shape[-1])
    valid = np.ones(parents.shape, bool) if valid is None else \
        np.asarray(valid).reshape(parents.shape)
    index = np.arange(parents.shape[-1])
    if np.any(valid & ((parents < ROOT) | (parents >= index))):
        raise ValueError("tree nodes must come in topological order: -1 <= parents[i] < i.")
    parent_valid = np.take_along_axis(valid, np.maximum(parents, 0), axis=-1)
    if np.any(valid & (parents >= 0) & ~parent_valid):
        raise ValueError("a valid tree node has an invalid parent.")


def ancestor_mask(tree: Tree) -> Array:
    """bool [B, N, N]: row ``i`` marks the path root -> ``i`` (``i`` included).

    parents [-1, 0, 0, 1] -> rows {0}, {0, 1}, {0, 2}, {0, 1, 3}. Invalid nodes
    get empty rows. Built by doubling the reach of the parent relation.
    """
    n = tree.num_nodes
    index_N = jnp.arange(n)
    parent_BxNxN = (tree.parents[:, :, None] == index_N[None, None, :]) & tree.valid[:, :, None]
    reach = parent_BxNxN | (jnp.eye(n, dtype=bool)[None] & tree.valid[:, :, None])
    for _ in range(max(n - 1, 1).bit_length()):  # reach covers paths of 2^k steps
        reach = reach | (jnp.einsum("bij,bjk->bik", reach.astype(jnp.float32),
                                    reach.astype(jnp.float32)) > 0)
    return reach


def depths(tree: Tree) -> Array:
    """int32 [B, N]: depth of each node (the root's children have depth 1; 0 if invalid)."""
    return jnp.sum(ancestor_mask(tree), axis=-1).astype(jnp.int32)


def earlier_siblings(tree: Tree) -> Array:
    """bool [B, N, N]: row ``i`` marks the valid siblings drafted before node ``i``."""
    index_N = jnp.arange(tree.num_nodes)
    return ((tree.parents[:, :, None] == tree.parents[:, None, :]) & tree.valid[:, None, :]
            & (index_N[None, None, :] < index_N[None, :, None]))


def sibling_ranks(tree: Tree) -> Array:
    """int32 [B, N]: each node's rank among its valid siblings, in drafting
    order (0 = its parent's first child). parents [-1, -1, 0, 0, 1] -> [0, 1, 0, 1, 0]."""
    return jnp.sum(earlier_siblings(tree), axis=-1).astype(jnp.int32)


def node_depth(tree: Tree, node_B: Array) -> Array:
    """int32 [B]: depth of ``node`` (0 for the root, -1)."""
    depth_BxN1 = jnp.pad(depths(tree), ((0, 0), (1, 0)))
    return jnp.take_along_axis(depth_BxN1, (node_B + 1)[:, None], axis=1)[:, 0]


def path_nodes(tree: Tree, node_B: Array) -> Array:
    """int32 [B, N]: the nodes on the path root -> ``node`` in depth order, then -1.

    parents [-1, 0, 0, 2], node 3 -> [0, 2, 3, -1]; node -1 -> [-1, -1, -1, -1].
    """
    n = tree.num_nodes
    anc_BxNxN = ancestor_mask(tree)
    on_path_BxN = jnp.take_along_axis(anc_BxNxN, jnp.maximum(node_B, 0)[:, None, None],
                                      axis=1)[:, 0] & (node_B >= 0)[:, None]
    slot_BxN = jnp.where(on_path_BxN, jnp.cumsum(on_path_BxN, axis=1) - 1, n)  # n: dropped
    index_BxN = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), on_path_BxN.shape)
    out_BxN = jnp.full(on_path_BxN.shape, ROOT, jnp.int32)
    rows_B1 = jnp.arange(on_path_BxN.shape[0])[:, None]
    return out_BxN.at[rows_B1, slot_BxN].set(index_BxN, mode="drop")


def path_tokens(tree: Tree, node_B: Array, pad: int = 0) -> Array:
    """int32 [B, N]: the tokens on the path root -> ``node`` (the accepted drafts),
    then ``pad``. parents [-1, 0, 0], tokens [5, 6, 7], node 2 -> [5, 7, pad]."""
    nodes_BxN = path_nodes(tree, node_B)
    tokens_BxN = jnp.take_along_axis(tree.tokens, jnp.maximum(nodes_BxN, 0), axis=1)
    return jnp.where(nodes_BxN >= 0, tokens_BxN, pad)


def emitted_tokens(tree: Tree, node_B: Array, next_token_B: Array, pad: int = 0) -> Array:
    """int32 [B, N + 1]: the accepted drafts then the next token at index depth(node)."""
    path_BxN1 = jnp.pad(path_tokens(tree, node_B, pad), ((0, 0), (0, 1)), constant_values=pad)
    at_B1 = node_depth(tree, node_B)[:, None]
    return jnp.where(jnp.arange(path_BxN1.shape[1])[None, :] == at_B1,
                     next_token_B[:, None], path_BxN1)


def node_law(tree_row: Tree, q_N1xV: Array, i: Array) -> Array:
    """float32 [V]: the law node ``i``'s token was drawn from, as ``tree.draws``
    says, for one row's tree (``tree_row`` and ``q_N1xV`` without the batch axis).

    With replacement: ``q`` at the parent's context. Without: that ``q`` with
    the tokens of the node's earlier siblings removed and renormalised, the
    ``q_j`` of sequential sampling without replacement (what
    ``sample_children`` reports). Example: q = [0.5, 0.3, 0.2], siblings drawn
    1 then 0 -> laws [0.5, 0.3, 0.2] and [5/7, 0, 2/7]. Point masses: the
    one-hot of the node's own token (siblings 1, 0 -> [0, 1, 0], [1, 0, 0]).

    The walks make a node's law when they test it (a few nodes a round): the
    whole [N, V] array (``sibling_laws``) and its intermediates were the largest
    temporaries of a tree round (a 27-node tree at the 152k vocabulary: 18.5 MB each).
    """
    v = q_N1xV.shape[-1]
    token = tree_row.tokens[i]
    if tree_row.draws == POINT_MASS:
        # Deterministic children are not draws from a law: each is its own
        # point mass, whatever ``q`` says (module docstring).
        return jax.nn.one_hot(token, v, dtype=jnp.float32) * tree_row.valid[i]
    parent = tree_row.parents[i]
    q_V = q_N1xV[parent + 1]
    if tree_row.draws == WITH_REPLACEMENT:
        return q_V
    index_N = jnp.arange(tree_row.tokens.shape[-1])
    earlier_N = (tree_row.parents == parent) & tree_row.valid & (index_N < i)
    removed_V = jnp.zeros((v,), bool).at[tree_row.tokens].max(earlier_N)
    kept_V = jnp.where(removed_V, 0.0, q_V)
    mass = jnp.sum(kept_V)
    return kept_V / jnp.where(mass > 0, mass, 1.0)


def sibling_laws(tree: Tree, q_BxN1xV: Array) -> Array:
    """float32 [B, N, V]: every node's ``node_law`` at once (for tests and
    analysis; the verifiers make only the rows they test)."""
    nodes_N = jnp.arange(tree.num_nodes)
    laws_of_row = lambda tree_row, q_N1xV: jax.vmap(  # noqa: E731
        lambda i: node_law(tree_row, q_N1xV, i))(nodes_N)
    return jax.vmap(laws_of_row)(tree, q_BxN1xV)


class Children(NamedTuple):
    tokens: Array  # int32 [..., K]: the children in drafting order
    laws: Array  # float32 [..., K, V]: the law child j was drawn from (q_j)
    valid: Array  # bool [..., K]: False where q has fewer than K tokens to offer


def sample_children(key: Array, q_xV: Array, k: int, temperature_zero) -> Children:
    """``k`` children drawn from ``q`` without replacement, in drafting order.

    At T > 0: Gumbel-top-k (the ``k`` largest ``log q + Gumbel`` in decreasing
    order are a sequential sample without replacement: child ``j`` follows
    ``q_j`` = ``q`` with children ``1 .. j-1`` removed, renormalised). At
    ``temperature_zero`` (traced bool allowed): the top-``k`` tokens of ``q``
    (pass the statistics law there: the processed one is one-hot), each
    reported with the one-hot law it was "drawn" from. A child is invalid
    where ``q`` gives its token no mass (``k`` above the support of ``q``).
    """
    v = q_xV.shape[-1]
    log_q = jnp.where(q_xV > 0, jnp.log(jnp.maximum(q_xV, 1e-38)), -jnp.inf)
    gumbel = jax.random.gumbel(key, q_xV.shape, jnp.float32)
    scores = log_q + jnp.where(temperature_zero, 0.0, gumbel)
    _, tokens_xK = jax.lax.top_k(scores, k)
    tokens_xK = tokens_xK.astype(jnp.int32)
    one_hot_xKxV = jax.nn.one_hot(tokens_xK, v, dtype=jnp.float32)
    earlier_xKxV = jnp.cumsum(one_hot_xKxV, axis=-2) - one_hot_xKxV
    kept_xKxV = jnp.where(earlier_xKxV > 0, 0.0, q_xV[..., None, :])
    mass_xKx1 = jnp.sum(kept_xKxV, axis=-1, keepdims=True)
    laws_xKxV = kept_xKxV / jnp.where(mass_xKx1 > 0, mass_xKx1, 1.0)
    laws_xKxV = jnp.where(temperature_zero, one_hot_xKxV, laws_xKxV)
    valid_xK = jnp.take_along_axis(q_xV, tokens_xK, axis=-1) > 0
    return Children(tokens=tokens_xK, laws=laws_xKxV, valid=valid_xK)


# ---------------------------------------------------------------------------
# Verifiers
# ---------------------------------------------------------------------------

@flax.struct.dataclass
class TreeVerifyOutput:
    node: Array  # int32 [B]: the accepted node, -1 = root (no draft kept)
    num_accepted: Array  # int32 [B]: depth of that node (drafts accepted)
    next_token: Array  # int32 [B]: the correction or bonus token emitted after them


def normalised(weights_xV: Array) -> Array:
    return weights_xV / jnp.sum(weights_xV, axis=-1, keepdims=True)


def _is_child(tree_row: Tree, i: Array, node: Array) -> Array:
    return tree_row.valid[i] & (tree_row.parents[i] == node)


@dataclasses.dataclass(frozen=True)
class GreedyTreeVerifier:
    """Longest root path matching the target's argmax at each parent (T = 0).

    Among equally deep matching nodes (only possible with repeated sibling
    tokens) the lowest index wins. ``key`` and ``q`` are unused.
    """

    name: str = "greedy"

    def __call__(self, key: Array, tree: Tree, q_BxN1xV: Array,
                 pi_BxN1xV: Array) -> TreeVerifyOutput:
        del key, q_BxN1xV
        n = tree.num_nodes
        best_BxN1 = first_argmax(pi_BxN1xV)  # [B, N + 1, V] -> [B, N + 1]
        want_BxN = jnp.take_along_axis(best_BxN1, tree.parents + 1, axis=1)
        match_BxN = tree.valid & (tree.tokens == want_BxN)
        anc_BxNxN = ancestor_mask(tree)
        ok_BxN = tree.valid & jnp.all(match_BxN[:, None, :] | ~anc_BxNxN, axis=-1)
        depth_BxN = jnp.sum(anc_BxNxN, axis=-1)
        score_BxN = jnp.where(ok_BxN, depth_BxN * (n + 1) + (n - jnp.arange(n)), -1)
        node_B = jnp.where(jnp.any(ok_BxN, axis=1), jnp.argmax(score_BxN, axis=1),
                           ROOT).astype(jnp.int32)
        next_B = jnp.take_along_axis(best_BxN1, (node_B + 1)[:, None], axis=1)[:, 0]
        return TreeVerifyOutput(node=node_B, num_accepted=node_depth(tree, node_B),
                                next_token=next_B.astype(jnp.int32))


@dataclasses.dataclass(frozen=True)
class SamplingTreeVerifier:
    """Base of the tree verifiers that sample (RRS, traversal): each node gets
    one uniform, each child is tested against the law it was drawn from
    (``sibling_laws``; a walk makes a node's row, ``node_law``, only when it
    tests the node), and a subclass's ``walk_row`` walks one row's tree to
    ``(accepted node, weights the next token is drawn from)``. Rows run one
    after another (``lax.map``), so each walk takes its own data-dependent
    branches instead of touching every [V] row of the batch."""

    needs_normalised_law: ClassVar[bool] = True

    def __call__(self, key: Array, tree: Tree, q_BxN1xV: Array,
                 pi_BxN1xV: Array) -> TreeVerifyOutput:
        accept_key, sample_key = jax.random.split(key)
        u_BxN = jax.random.uniform(accept_key, tree.tokens.shape)
        node_B, weights_BxV = jax.lax.map(lambda args: self.walk_row(*args),
                                          (tree, q_BxN1xV, pi_BxN1xV, u_BxN))
        return TreeVerifyOutput(node=node_B, num_accepted=node_depth(tree, node_B),
                                next_token=sample_from_weights(sample_key, weights_BxV))


@dataclasses.dataclass(frozen=True)
class RecursiveRejectionVerifier(SamplingTreeVerifier):
    """Recursive rejection sampling over each node's children (module docstring).

    Each child is tested against the law it was drawn from (``sibling_laws``
    of the tree's ``draws``): its sequential law ``q_j`` without replacement
    (Jeon et al.), ``q`` with replacement (SpecInfer), its point mass for
    deterministic children.

    One fixed-trip loop over the node slots in index order: slot ``i`` is
    tested iff it is a child of the current node; children of a node come
    after it and its siblings in drafting order, so this is the recursion.
    Example: parents [-1, -1, 0, 1]: node 0 rejected, node 1 accepted ->
    current node 1; slot 2 (child of 0) is skipped, slot 3 tested.
    """

    name: str = "rrs"

    def sibling_residual(self, r_V: Array, law_V: Array) -> Array:
        """The law left for the next sibling after one with law ``law`` was
        rejected: ``norm((r - law)_+)`` (``r`` itself if that has no mass)."""
        return normalised(residual(r_V, law_V))

    def walk_row(self, tree_row: Tree, q_N1xV: Array, pi_N1xV: Array, u_N: Array
                 ) -> tuple[Array, Array]:
        n = tree_row.tokens.shape[-1]

        def test(i, node, r_V):
            """Slot ``i`` is a child of ``node``: accept it, or leave the residual."""
            x = tree_row.tokens[i]
            law_V = node_law(tree_row, q_N1xV, i)
            accept = (law_V[x] > 0) & (u_N[i] * law_V[x] < r_V[x])
            r_V = jax.lax.cond(accept, lambda: pi_N1xV[i + 1],
                               lambda: self.sibling_residual(r_V, law_V))
            return jnp.where(accept, i, node), r_V

        def body_fn(i, carry):
            node, r_V = carry  # int32 []: current node; float32 [V]: its law left
            # A real branch per row (``lax.map`` in ``__call__``): slots that are not
            # children of the current node touch no [V] row.
            return jax.lax.cond(_is_child(tree_row, i, node), test,
                                lambda i, node, r_V: (node, r_V), i, node, r_V)

        return jax.lax.fori_loop(0, n, body_fn, (jnp.int32(ROOT), pi_N1xV[0]))


@dataclasses.dataclass(frozen=True)
class TraversalVerifier(SamplingTreeVerifier):
    """Traversal verification (Weng et al.), leaf to root (module docstring).

    How the children were drawn (``tree.draws``; the paper's setting is
    without replacement) only changes the sibling laws ``q_j``. A fixed-trip
    loop of ``2 N + 1`` steps walks the tree depth first: each step either
    enters the next unvisited child of the current node (fixing that child's
    ``alpha`` from the parent's current state) or, when none is left, tests
    the current node (accept w.p. ``alpha``; the root always accepts) and on
    rejection updates the parent and returns to it. Node ``i`` is tested with
    uniform ``u_i``, so on a chain the uniforms are the block verifier's ``eta``.
    """

    name: str = "traversal"

    def walk_row(self, tree_row: Tree, q_N1xV: Array, pi_N1xV: Array, u_N: Array
                 ) -> tuple[Array, Array]:
        n = tree_row.tokens.shape[-1]
        index_N = jnp.arange(n, dtype=jnp.int32)
        max_depth = min(tree_row.max_depth or n, n)

        def law_of_token(c):  # q_j(x) of node c's own token
            return node_law(tree_row, q_N1xV, c)[tree_row.tokens[c]]

        def body_fn(_, carry):
            # node: current node, at depth `level` of the walk's path; after: its
            # children up to this index are done; alpha_N1 [N + 1]: alpha per
            # context. P per context: a node's P differs from its pi only after a
            # child of it was rejected, which happens only while the walk is below
            # it, so only the path's nodes need their own P: p_DxV [max_depth + 1,
            # V] holds it for depth d once changed_D[d] (a new node at depth d
            # starts unchanged: its P is read from pi, no [V] copy).
            node, after, level, alpha_N1, p_DxV, changed_D, done, accepted, accepted_level = carry
            is_next = _is_child(tree_row, index_N, node) & (index_N > after)
            child = jnp.min(jnp.where(is_next, index_N, n))
            enter = ~done & (child < n)
            leave = ~done & (child >= n)
            # Enter ``child``: alpha = min(1, alpha_node P_node(x) / q_j(x)).
            c = jnp.minimum(child, n - 1)
            x = tree_row.tokens[c]
            # Only entering a child reads its law (a [V] row: a real branch).
            law_x = jax.lax.cond(enter, law_of_token, lambda c: jnp.float32(0.0), c)
            p_x = jnp.where(changed_D[level], p_DxV[level, x], pi_N1xV[node + 1, x])
            ratio = alpha_N1[node + 1] * p_x / jnp.where(law_x > 0, law_x, 1.0)
            alpha_child = jnp.where(law_x > 0, jnp.minimum(ratio, 1.0), 0.0)
            # Leave ``node``: test it; on rejection update its parent.
            accept = leave & ((node == ROOT) | (u_N[jnp.maximum(node, 0)]
                                                < alpha_N1[node + 1]))
            reject = leave & ~accept
            parent = tree_row.parents[jnp.maximum(node, 0)]
            up = jnp.maximum(level - 1, 0)

            def reject_update(state):
                # The parent's (alpha, P) after its child ``node`` (law q_j) is rejected.
                alpha_N1, p_DxV = state
                alpha_p = alpha_N1[parent + 1]
                p_V = jnp.where(changed_D[up], p_DxV[up], pi_N1xV[parent + 1])
                diff_V = alpha_p * p_V - node_law(tree_row, q_N1xV, jnp.maximum(node, 0))
                s = jnp.sum(jnp.maximum(diff_V, 0.0))
                denom = s + 1.0 - alpha_p
                alpha_p = jnp.where(denom > 0, s / jnp.where(denom > 0, denom, 1.0), 1.0)
                p_V = jnp.where(s > RESIDUAL_EPS,
                                jnp.maximum(diff_V, 0.0) / jnp.maximum(s, RESIDUAL_EPS), p_V)
                return alpha_N1.at[parent + 1].set(alpha_p), p_DxV.at[up].set(p_V)

            alpha_N1 = alpha_N1.at[c + 1].set(jnp.where(enter, alpha_child, alpha_N1[c + 1]))
            # A real branch per row (``lax.map`` in ``__call__``): only rejections touch [V] rows.
            alpha_N1, p_DxV = jax.lax.cond(reject, reject_update, lambda state: state,
                                           (alpha_N1, p_DxV))
            deeper = jnp.minimum(level + 1, max_depth)
            changed_D = changed_D.at[deeper].set(jnp.where(enter, False, changed_D[deeper]))
            changed_D = changed_D.at[up].set(changed_D[up] | reject)
            new_node = jnp.where(enter, c, jnp.where(reject, parent, node))
            new_after = jnp.where(enter, c, jnp.where(reject, node, after))
            new_level = jnp.where(enter, level + 1, jnp.where(reject, up, level))
            accepted = jnp.where(accept, node, accepted)
            accepted_level = jnp.where(accept, level, accepted_level)
            return (new_node, new_after, new_level, alpha_N1, p_DxV, changed_D, done | accept,
                    accepted, accepted_level)

        alpha_N1 = jnp.ones((n + 1,), jnp.float32)
        p_DxV = jnp.zeros((max_depth + 1,) + pi_N1xV.shape[1:], jnp.float32)
        changed_D = jnp.zeros((max_depth + 1,), bool)
        init = (jnp.int32(ROOT), jnp.int32(ROOT), jnp.int32(0), alpha_N1, p_DxV, changed_D,
                jnp.bool_(False), jnp.int32(ROOT), jnp.int32(0))
        *_, p_DxV, changed_D, _, accepted, accepted_level = jax.lax.fori_loop(
            0, 2 * n + 1, body_fn, init)
        return accepted, jnp.where(changed_D[accepted_level], p_DxV[accepted_level],
                                   pi_N1xV[accepted + 1])
