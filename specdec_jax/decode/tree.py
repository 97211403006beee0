"""Token trees: speculative rounds that draft a tree instead of a chain
(docs/algorithms.md, 'Token trees').

One round:

    pending token t (last emitted, not yet fed to the target)
    drafter: a tree of N nodes (tokens, parents, the law q at the root and at
             every node: ``drafting.tree``'s static, dynamic or Max-Gram trees)
    target:  one ``score_tree`` call over [t, node 0 .. node N - 1]
             -> p at the root and at every node
    pi = T(q, p) at every context (cascades stay exact in pi);
    tree verifier (``verify.tree``) -> the accepted node (depth a) and a new token y
    emit the path's a tokens, then y; both caches keep the path
    (``commit_path``); pending = y

Worked example (widths (2, 1): nodes 0, 1 at depth 1, node 2 under 0, node 3
under 1; a row whose target cache holds 10 tokens): the target scores 5
nodes (t at position 10, nodes 0 and 1 at 11, nodes 2 and 3 at 12, all in
scratch slots 10 .. 14); the verifier accepts node 2 (path 0 -> 2, a = 2):
the round emits [x_0, x_2, y], the target keeps slots 10, 11, 12 <- t, x_0,
x_2 (lengths 13), the drafter keeps x_0 (and x_2 if it scored it) and the
history grows by 3 with y pending.

The round is every decoder's (``decode.round``): the history and output
buffers, EOS / stop rule / ``max_new_tokens`` handling for ragged batches,
the statistics (``GenerationStats``; the accepted histogram
is over the path depth 0 .. depth, ``drafted`` counts each round's deepest
path as a chain's G, so ``accepted / drafted`` compares with a chain's,
``drafted_nodes`` every node, ``accepted_by_rank`` which sibling each accepted
draft was), the loop; this module supplies how a tree is drafted, scored,
verified and committed.

At temperature 0 every tree verifier's output is the target's argmax path (the
laws are one-hot), but the sampling verifiers see only each node's first child
(``verify.tree``); the round then runs the greedy tree verifier, so every
branch counts. At T > 0 each child is verified against the law it was drawn
from, which the drafter states (``proposal.draws``: without replacement, with
it, or point masses for Max-Gram's deterministic trees), so every verifier is
exact with every drafter; the one verifier name that asks for a drawing,
'rrs-replacement', is refused with a drafter that does not draw so.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.decode.round import (
    LoopState,
    RoundDecoder,
    Scored,
    Verdict,
    check_normalised_law,
)
from specdec_jax.drafting.base import is_drafter, needs_features
from specdec_jax.drafting.maxgram import MaxGramDrafter
from specdec_jax.drafting.model_drafter import ModelDrafter
from specdec_jax.drafting.tree import (
    DynamicTreeDrafter,
    MaxGramTreeDrafter,
    StaticTreeDrafter,
    TreeShape,
)
from specdec_jax.models.interface import LanguageModel, supports_trees, tree_with_root
from specdec_jax.sampling import Distributions, SamplingParams
from specdec_jax.target_functions import TargetFunction
from specdec_jax.verify import requested_draws
from specdec_jax.verify import tree as verify_tree

Array = jax.Array


def check_greedy_temperature(verifier: str | None, temperature: float,
                             where: str = "verifier") -> None:
    """Refuses the 'greedy' tree verifier at T > 0, where it would still decode
    the target's argmax path (the same output for every seed)."""
    if verifier == "greedy" and temperature > 0:
        raise ValueError(f"{where} 'greedy' verifies the target's argmax path whatever the "
                         f"temperature, so at temperature {temperature} it would not sample; "
                         "use 'traversal' (the default) or 'rrs', which verify greedily at "
                         "temperature 0 too.")


def check_drafter_draws(drafter, verifier) -> None:
    """Refuses a verifier that asks for a drawing the drafter does not make
    ('rrs-replacement': children drawn with replacement)."""
    wanted = requested_draws(verifier)
    draws = getattr(drafter, "draws", None)
    if wanted is None or draws is None or draws == wanted:
        return
    name = getattr(verifier, "name", verifier)
    kind = drafter.__name__ if isinstance(drafter, type) else type(drafter).__name__
    if draws == sampling.POINT_MASS:
        raise ValueError(f"the {name!r} verifier verifies children drawn {wanted}, and "
                         f"{kind}'s children are chosen, not drawn (point "
                         "masses); verify with 'traversal' (the default) or 'rrs'.")
    raise ValueError(f"the {name!r} verifier verifies children drawn {wanted}, and "
                     f"{kind} draws them {draws}; build the drafter with "
                     "replacement=True, or verify with 'traversal' (the default) or 'rrs'.")


def is_tree_drafter(obj: Any) -> bool:
    return callable(getattr(obj, "propose_tree", None))


def tree_depth(drafter) -> int:
    """The deepest path a tree drafter can propose (a static bound)."""
    depth = getattr(drafter, "depth", None)
    if depth is None:
        depth = getattr(getattr(drafter, "shape", None), "depth", None)
    return int(depth) if depth is not None else int(drafter.num_nodes)


@dataclasses.dataclass(frozen=True)
class TreeSpec:
    """A tree request: static ``widths`` per depth, any static shape by its
    ``parents``, or a dynamic (EAGLE-2) tree of ``depth`` levels expanding
    the ``expand`` most probable nodes of each level into ``children`` each
    (``N = children + (depth - 1) expand children``).

    ``TreeSpec.parse("3,2,1,1")`` or ``TreeSpec.parse([3, 2, 1, 1])``: static,
    3 + 6 + 6 + 6 = 21 nodes; ``TreeSpec.parse("dynamic:5,2,2")``: dynamic,
    2 + 4 * 4 = 18 nodes; ``TreeSpec.parse("parents:-1,-1,0,0,2")`` (or a
    ``drafting.tree.TreeShape``): a custom static shape, here two root children,
    the first with two children, the third node with one (Sequoia's or Medusa's
    sparse trees are such shapes: parents depth by depth, siblings contiguous).
    """

    widths: tuple[int, ...] = ()
    dynamic: tuple[int, int, int] | None = None  # (depth, expand, children)
    parents: tuple[int, ...] = ()  # a custom static shape (TreeShape's parents)

    @classmethod
    def parse(cls, spec) -> TreeSpec:
        if isinstance(spec, TreeSpec):
            return spec
        if isinstance(spec, TreeShape):
            return cls(parents=spec.parents)
        if isinstance(spec, (tuple, list)):
            return cls(widths=_positive(spec, spec))
        text = str(spec).strip().replace(" ", "")
        if text.startswith("parents:"):
            try:
                parents = tuple(int(x) for x in text[len("parents:"):].split(","))
                return cls(parents=TreeShape(parents).parents)
            except ValueError as error:
                raise ValueError(f"tree {spec!r}: 'parents:P0,P1,...' lists each node's parent "
                                 f"(-1 = the root), e.g. 'parents:-1,-1,0,0,2'. {error}"
                                 ) from error
        if text.startswith("dynamic:"):
            numbers = _positive(re.split(",", text[len("dynamic:"):]), spec)
            if len(numbers) != 3:
                raise ValueError(f"tree {spec!r}: a dynamic tree is 'dynamic:DEPTH,EXPAND,"
                                 "CHILDREN', e.g. 'dynamic:5,2,2'.")
            depth, expand, children = numbers
            if expand > children:
                raise ValueError(f"tree {spec!r}: EXPAND ({expand}) may not exceed CHILDREN "
                                 f"({children}).")
            return cls(dynamic=(depth, expand, children))
        return cls(widths=_positive(text.split(","), spec))

    @property
    def shape(self) -> TreeShape | None:
        """The static shape (None for a dynamic tree)."""
        if self.dynamic is not None:
            return None
        return TreeShape(self.parents) if self.parents else TreeShape.from_widths(self.widths)

    @property
    def num_nodes(self) -> int:
        if self.dynamic is not None:
            depth, expand, children = self.dynamic
            return children + (depth - 1) * expand * children
        return self.shape.num_nodes

    @property
    def depth(self) -> int:
        return self.dynamic[0] if self.dynamic is not None else self.shape.depth

    def __str__(self) -> str:
        if self.dynamic is not None:
            return "dynamic:" + ",".join(map(str, self.dynamic))
        if self.parents:
            return "parents:" + ",".join(map(str, self.parents))
        return ",".join(map(str, self.widths))


def _positive(items, spec) -> tuple[int, ...]:
    try:
        numbers = tuple(int(x) for x in items)
    except (TypeError, ValueError):
        numbers = ()
    if not numbers or min(numbers) < 1:
        raise ValueError(f"tree {spec!r}: give widths per depth as positive integers, e.g. "
                         "'3,2,1,1', 'dynamic:DEPTH,EXPAND,CHILDREN', or a shape by its "
                         "parents, 'parents:-1,-1,0'.")
    return numbers


def make_tree_drafter(drafter, tree, draws: str | None = None) -> Any:
    """A tree drafter from a chain drafter and a tree request (``TreeSpec.parse``):
    a ``LanguageModel`` or ``ModelDrafter`` -> ``StaticTreeDrafter`` /
    ``DynamicTreeDrafter`` (drawing children with replacement when ``draws``
    asks: ``sampling.WITH_REPLACEMENT``); a ``MaxGramDrafter`` ->
    ``MaxGramTreeDrafter`` (static shapes only). A tree drafter given as is
    (``tree`` None) is kept."""
    if tree is None:
        if is_tree_drafter(drafter):
            return drafter
        raise ValueError("tree decoding needs a tree shape (tree=...) or a tree drafter.")
    if is_tree_drafter(drafter):
        raise ValueError(f"{type(drafter).__name__} already drafts trees; drop tree=.")
    spec = TreeSpec.parse(tree)
    if isinstance(drafter, MaxGramDrafter):
        if spec.dynamic is not None:
            raise ValueError("Max-Gram trees are static (its children carry no probability to "
                             "rank); give widths, e.g. '3,2,1,1'.")
        return MaxGramTreeDrafter(drafter.vocab_size, spec.shape, max_ngram=drafter.max_ngram,
                                  name=drafter.name)
    name = "drafter"
    if isinstance(drafter, ModelDrafter):
        drafter, name = drafter.model, drafter.name
    if is_drafter(drafter) or not supports_trees(drafter):
        raise ValueError(
            f"{type(drafter).__name__} cannot draft trees: tree decoding takes a decoder-only "
            "drafter model (score_tree / commit_path) or Max-Gram; cascades and feature heads "
            "draft chains only for now.")
    replacement = draws == sampling.WITH_REPLACEMENT
    if spec.dynamic is not None:
        depth, expand, children = spec.dynamic
        return DynamicTreeDrafter(drafter, depth=depth, expand=expand, children=children,
                                  name=name, replacement=replacement)
    return StaticTreeDrafter(drafter, spec.shape, name=name, replacement=replacement)


@dataclasses.dataclass(frozen=True)
class TreeDecoder(RoundDecoder):
    """Static configuration of a tree generation (hashable: closes over jit).

    ``drafter`` drafts trees (``propose_tree``: ``drafting.tree``);
    ``target`` must score them (``score_tree`` / ``commit_path``: the
    decoder-only models); ``verifier`` is a tree verifier
    (``verify.get_verifier(..., tree=True)``), which tests each child against the
    law the drafter says it was drawn from (``proposal.draws``). The drafter
    reports its law at the leaves only when the target function needs it
    (cascades draw the bonus token from ``pi``); ``specdecode`` and ``lossy``
    draw it from ``p``.
    """

    target: LanguageModel
    drafter: Any
    target_fn: TargetFunction
    max_new_tokens: int
    verifier: Any = verify_tree.TraversalVerifier()
    kind: ClassVar[str] = "tree decoder"

    def __post_init__(self):
        super().__post_init__()
        if not is_tree_drafter(self.drafter):
            raise ValueError(f"{type(self.drafter).__name__} does not draft trees "
                             "(make_tree_drafter builds one).")
        if needs_features(self.drafter):
            raise ValueError("tree decoding keeps no target features; feature drafters draft "
                             "chains only for now.")
        if not supports_trees(self.target):
            raise ValueError(f"{type(self.target).__name__} cannot score token trees "
                             "(score_tree / commit_path); tree decoding needs a decoder-only "
                             "target.")
        check_normalised_law(self.verifier, self.target_fn,
                             "use the 'greedy' tree verifier (T = 0) or a chain")
        check_drafter_draws(self.drafter, self.verifier)

    @property
    def num_nodes(self) -> int:
        return int(self.drafter.num_nodes)

    @property
    def depth(self) -> int:
        return tree_depth(self.drafter)

    @property
    def max_children(self) -> int:
        """The widest node's child count (the sibling ranks the statistics keep)."""
        return int(getattr(self.drafter, "max_children", self.num_nodes))

    @property
    def gamma(self) -> int:
        """The cache room a round needs beyond the emitted tokens (the tree's
        scratch slots): what ``required_cache_length`` takes as ``gamma``."""
        return self.num_nodes

    def scratch_room(self) -> str:
        return f"{self.num_nodes} tree nodes"

    @property
    def needs_next_q(self) -> bool:
        return not self.target_fn.bonus_from_target

    def draft(self, drafter_params, state: LoopState, context, key, sp: SamplingParams):
        return self.drafter.propose_tree(drafter_params, state.drafter_state, context,
                                         self.needs_next_q, key, sp, self.sampling_config)

    def score(self, target_params, state: LoopState, pending_B, proposal) -> Scored:
        """One call over the pending token (node 0) and the N drafted nodes."""
        fed_tokens, fed_parents = tree_with_root(pending_B, proposal.tokens.astype(jnp.int32),
                                                 proposal.parents.astype(jnp.int32))
        out = self.target.score_tree(target_params, fed_tokens, fed_parents, state.target_cache)
        return Scored(logits=out.logits, hidden=out.hidden, cache=out.cache,
                      width=proposal.num_nodes + 1)

    def run_verifier(self, key, tree: verify_tree.Tree, q_BxN1xV, pi_BxN1xV,
                     sp: SamplingParams):
        """The configured tree verifier, or greedy at temperature 0 (module
        docstring): the accepted node and the new token."""
        if isinstance(self.verifier, verify_tree.GreedyTreeVerifier):
            return self.verifier(key, tree, q_BxN1xV, pi_BxN1xV)
        greedy = verify_tree.GreedyTreeVerifier()
        return jax.lax.cond(sp.temperature <= 0, lambda: greedy(key, tree, q_BxN1xV, pi_BxN1xV),
                            lambda: self.verifier(key, tree, q_BxN1xV, pi_BxN1xV))

    def verify(self, key, state: LoopState, proposal, dist: Distributions,
               sp: SamplingParams) -> Verdict:
        """pi = T(q, p) at every context, then ``run_verifier`` on the tree."""
        depth, n = self.depth, proposal.num_nodes
        batch = proposal.tokens.shape[0]
        tree = verify_tree.Tree(parents=proposal.parents.astype(jnp.int32),
                                tokens=proposal.tokens.astype(jnp.int32),
                                valid=jnp.ones((batch, n), bool), draws=proposal.draws,
                                max_depth=depth)
        pi_BxN1xV, defer_BxN1 = self.target_fn(proposal.q, dist.probs, proposal.q_stat,
                                               dist.stats, sp.alpha, sp.beta)
        if self.target_fn.bonus_from_target:
            # At a leaf only the bonus token is drawn: from p (as a chain's p_{G+1}).
            has_child_BxN1 = jnp.zeros((batch, n + 1), bool).at[
                jnp.arange(batch)[:, None], tree.parents + 1].set(True)
            pi_BxN1xV = jnp.where(has_child_BxN1[..., None], pi_BxN1xV, dist.probs)
        verdict = self.run_verifier(key, tree, proposal.q, pi_BxN1xV, sp)
        path_BxD = verify_tree.path_nodes(tree, verdict.node)[:, :depth]  # -1 past the path
        # Token j of the round is drawn at the context root -> path[j - 1].
        context_BxD1 = jnp.concatenate([jnp.full((batch, 1), -1, jnp.int32), path_BxD], 1)
        # Each kept draft's rank among its siblings ([B, N] -> [B, D] -> [B, K]).
        rank_BxD = jnp.take_along_axis(verify_tree.sibling_ranks(tree),
                                       jnp.maximum(path_BxD, 0), axis=1)
        by_rank_BxK = jnp.sum(jax.nn.one_hot(rank_BxD, self.max_children, dtype=jnp.int32)
                              * (path_BxD >= 0)[..., None], axis=1)
        return Verdict(
            accepted=verdict.num_accepted, next_token=verdict.next_token,
            drafts=verify_tree.path_tokens(tree, verdict.node, self.pad_id)[:, :depth],
            defer=jnp.take_along_axis(defer_BxN1, jnp.maximum(context_BxD1, -1) + 1, axis=1),
            # A chain's G: the most drafts this round could keep (its deepest path).
            offered=jnp.max(verify_tree.depths(tree), axis=1), nodes=n, by_rank=by_rank_BxK,
            path=path_BxD)

    def commit(self, state: LoopState, scored: Scored, proposal, drafter_state,
               verdict: Verdict, keep_B):
        """Both caches keep the path: the target [t, path], the drafter the path
        nodes it scored (the last depth is scored only with the leaves' laws)."""
        batch = keep_B.shape[0]
        path_BxD = verdict.path
        target_nodes = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32),
                                        jnp.maximum(path_BxD, 0) + 1], axis=1)
        target_cache = self.target.commit_path(scored.cache, target_nodes, keep_B)
        kept_B = jnp.where(state.done, 0, verdict.accepted)
        if callable(getattr(self.drafter, "commit_path", None)):
            scored_depth = self.depth if self.needs_next_q else self.depth - 1
            drafter_state = self.drafter.commit_path(drafter_state, jnp.maximum(path_BxD, 0),
                                                     jnp.minimum(kept_B, scored_depth))
        else:
            drafter_state = self.drafter.rewind(drafter_state, state.length)
        return target_cache, drafter_state, None
