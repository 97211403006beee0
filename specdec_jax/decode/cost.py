"""The one cost model, as pure functions: a round's seconds from its calls'
seconds (``round_seconds``, the one formula for chains, trees, cascades and
adaptive drafting), tokens per round from acceptance (Leviathan et al.; its
token-tree form under Sequoia's positional acceptance model), the draft length
they predict fastest (``best_gamma``), and a generation's counted calls priced
at per-call latencies (``CostModel``).

Nothing here times anything: the latencies come from ``runtime.calibration``
(in-loop timings on this machine), the counts from ``GenerationStats``, and
every job and benchmark prices with these functions.

Full sweeps on a 2-core CPU are too slow to time every point at batch 1, so a
sweep counts what each method did (calls and tokens fed, per model) on batched
runs, and prices the counts with latencies measured at batch 1:

    seconds(model) = single_calls * t1 + (calls - single_calls) * a
                     + (fed - single_calls) * b
    relative latency = (seconds(target) + seconds(drafter)) / seconds(AR target)

``t1`` is the median of a one-token call (on CPU it takes a cheaper
matrix-vector path, so it is priced on its own) and ``a + b K`` the
least-squares fit of a K-token call for K >= 2. A prefill is compute-bound,
unlike those memory-bound steps, so it is measured on its own and priced per
prompt token; a model is charged its prefill only for examples where it ran.
A speculative round also costs something beyond its model calls (sampling,
verification, cache rollback, the loop's control flow): ``round_overhead_s``
prices it per round. Every report that prints a modelled latency prints, on
its wall-clock subset, how well it agrees with measured time
(``agreement_stats``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from specdec_jax.decode import methods
from specdec_jax.decode.tree import TreeSpec

ALPHA_TOLERANCE = 1e-9  # bisection bracket of acceptance_for_tokens_per_round




def tokens_per_round(alpha, gamma: int) -> float:
    """Expected tokens per round with ``gamma`` drafts. A rate ``alpha`` (each
    draft accepted with that probability independently) gives
    ``(1 - alpha^(G+1)) / (1 - alpha)`` (``G + 1`` at ``alpha = 1``); a list of
    per-position rates ``[a_1, ...]`` (``a_i``: draft ``i`` accepted given the
    earlier ones were) gives ``1 + sum_i prod_{j<=i} a_j``."""
    if not isinstance(alpha, (int, float)):
        if len(alpha) < gamma:
            raise ValueError(f"{len(alpha)} per-position rates for G = {gamma}.")
        return 1.0 + float(sum(np.prod(alpha[:i]) for i in range(1, gamma + 1)))
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance rate must be in [0, 1], got {alpha}.")
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def acceptance_for_tokens_per_round(tokens: float, gamma: int) -> float:
    """The ``alpha`` with ``tokens_per_round(alpha, gamma) == tokens`` (bisection;
    the function increases in alpha from 1 to G + 1)."""
    if not 1.0 <= tokens <= gamma + 1:
        raise ValueError(f"tokens per round must be in [1, {gamma + 1}] at G = {gamma}, "
                         f"got {tokens}.")
    low, high = 0.0, 1.0 - ALPHA_TOLERANCE
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if tokens_per_round(mid, gamma) < tokens else (low, mid)
    return (low + high) / 2


def round_seconds(*, target_call_s: float, drafter_calls=(), overhead_s: float = 0.0
                  ) -> float:
    """One round of any decoder, the one formula every prediction and price
    uses: its one target call, every drafter call it makes, given as ``(calls
    per round, seconds per call)`` pairs, and the loop's own overhead.

    A chain of ``G`` drafts: the target scores ``G + 1`` tokens and the drafter
    steps ``G`` times (plus a catch-up after a round that kept them all); a
    tree: the target scores the root and ``N`` nodes, the drafter its root and
    one call per depth; a cascade or an adaptive drafter: each model's calls
    per round as a run counted them."""
    return target_call_s + float(sum(n * s for n, s in drafter_calls)) + overhead_s


def predicted_speedup(*, tokens_per_round: float, round_s: float, target_step_s: float
                      ) -> float:
    """Speculative decoding over the autoregressive target at batch 1: tokens
    per round over the round's seconds, against one target step per token."""
    return tokens_per_round * target_step_s / round_s


def call_on_line(steps: Mapping[int, float], width: int) -> float:
    """Seconds of a ``width``-token call from calls timed at some widths (``steps``:
    at least the 1-token step and one wider call): the straight line through the
    nearest timed widths on either side, and past the widest the line through
    the two widest (a few-row call is bound by the weight read plus a per-row
    share of the products)."""
    widths = sorted(int(k) for k in steps)
    if widths[0] != 1 or len(widths) < 2:
        raise ValueError(f"pricing a call by width needs the target's 1-token step and one "
                         f"wider call; got widths {widths}.")
    if width in steps:
        return float(steps[width])
    high = next((w for w in widths if w > width), widths[-1])
    low = max(w for w in widths if w < high) if width > widths[-1] else max(
        w for w in widths if w < width)
    share = (width - low) / (high - low)
    return float(steps[low] + share * (steps[high] - steps[low]))


def best_gamma(*, target_steps: dict, drafter_step_s: float, alpha: float,
               gammas=range(1, 9)) -> tuple[int, dict]:
    """The draft length ``G`` with the highest predicted speedup at batch 1, and
    the prediction for every candidate.

    ``target_steps``: measured target calls by width, at least ``{1: t_1,
    K: t_K}``; widths between are a straight line through the nearest measured
    ones (a few-row call is bound by the weight read plus a per-row share).
    ``alpha``: the per-draft acceptance expected of the pair. A round is one
    scoring call of ``G + 1`` tokens and ``G + alpha^G`` drafter steps (the
    draft steps, and a catch-up step after a round that kept all ``G``).
    """
    def call_s(width: int) -> float:
        return call_on_line(target_steps, width)

    call_s(1)  # the widths' check
    table = {}
    for gamma in gammas:
        round_s = round_seconds(target_call_s=call_s(gamma + 1),
                                drafter_calls=[(gamma + alpha ** gamma, drafter_step_s)])
        tokens = tokens_per_round(alpha, gamma)
        table[gamma] = {"tokens_per_round": tokens, "round_s": round_s,
                        "predicted_speedup": predicted_speedup(
                            tokens_per_round=tokens, round_s=round_s,
                            target_step_s=call_s(1))}
    best = max(table, key=lambda g: table[g]["predicted_speedup"])
    return best, table


# --- token trees -------------------------------------------------------------------------


def sibling_ranks(parents) -> np.ndarray:
    """int [N]: each node's rank among its siblings (0 = its parent's first
    child), for ``parents`` in a tree drafter's order (topological, siblings
    contiguous: ``drafting.tree.TreeShape``)."""
    parents = np.asarray(parents, np.int64)
    ranks = np.zeros(parents.shape, np.int64)
    for i in range(1, parents.size):
        ranks[i] = ranks[i - 1] + 1 if parents[i] == parents[i - 1] else 0
    return ranks


def tree_reach(parents, alpha: float) -> np.ndarray:
    """float [N]: the probability that a round's accepted path passes through
    each node, under the positional acceptance model of Sequoia (Chen et al.,
    2024) with one rate: at any node, its children are tried in rank order and
    each matches the target with probability ``alpha``, independently, so the
    child of rank ``r`` is the one taken with ``alpha (1 - alpha)^r``; a node
    is reached with the product of those along its path."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance rate must be in [0, 1], got {alpha}.")
    parents = np.asarray(parents, np.int64)
    step = alpha * (1.0 - alpha) ** sibling_ranks(parents)
    reach = np.zeros(parents.shape, np.float64)
    for i, parent in enumerate(parents):
        reach[i] = step[i] * (1.0 if parent < 0 else reach[parent])
    return reach


def tree_tokens_per_round(parents, alpha: float) -> float:
    """Expected tokens per round of a token tree at a per-draft acceptance rate
    ``alpha``: 1 (the token the target adds) + the expected accepted depth, the
    sum of every node's ``tree_reach``. On a chain (``parents[i] = i - 1``) it is
    ``tokens_per_round(alpha, G)``; extra siblings pay ``alpha (1 - alpha)^r``
    of their parent's reach each.

    Worked example (widths (2, 1), alpha 0.5: nodes 0, 1 under the root, node
    2 under 0, node 3 under 1): reach 0.5, 0.25, 0.25, 0.125; 2.125 tokens
    (the chain of depth 2: 1.75)."""
    return 1.0 + float(tree_reach(parents, alpha).sum())


def expected_dynamic_tree(depth: int, expand: int, children: int,
                          alpha: float) -> tuple[int, ...]:
    """The parents of the tree EAGLE-2's expansion (``drafting.tree.
    DynamicTreeDrafter``) grows when the drafter's path probabilities rank
    nodes as ``tree_reach`` does: the root gets ``children`` nodes, and at each
    further depth the ``expand`` nodes of the depth above with the highest
    reach (ties to the lower index, as ``lax.top_k``) get ``children`` each.
    Its node count and the width of every depth are the drafter's, whatever
    it expands; which nodes grow is this model's guess (the drafter ranks by
    its own probabilities, which a real tree follows better than the model)."""
    parents = [-1] * children
    level = list(range(children))
    for _ in range(depth - 1):
        reach = tree_reach(parents, alpha)
        chosen = sorted(sorted(level, key=lambda i: (-reach[i], i))[:expand])
        start = len(parents)
        parents += [p for p in chosen for _ in range(children)]
        level = list(range(start, len(parents)))
    return tuple(parents)


def tree_round_seconds(*, target_call_s: float, drafter_root_s: float = 0.0,
                       drafter_level_s=(), catch_up_s: float = 0.0,
                       catch_ups: float = 0.0) -> float:
    """One tree round: the target's call over the pending token and the N
    nodes, the drafter's first call (the pending token), one call per depth
    it scores (``drafter_level_s``: each depth's nodes in one call), and, after
    a round that accepted a whole path to the deepest level (``catch_ups`` per
    round), a wider first call (``catch_up_s``, in place of ``drafter_root_s``:
    the deepest node was never scored)."""
    return round_seconds(target_call_s=target_call_s,
                         drafter_calls=[(1.0 - catch_ups, drafter_root_s),
                                        (catch_ups, catch_up_s),
                                        *((1.0, s) for s in drafter_level_s)])


def tree_parents(tree, alpha: float) -> tuple[int, ...]:
    """The drafted nodes' parents of a tree request: a static shape's own; for
    a dynamic tree, the shape EAGLE-2's expansion grows at acceptance ``alpha``
    (``expected_dynamic_tree``: the same count and widths per depth as every
    tree it drafts)."""
    spec = TreeSpec.parse(tree)
    if spec.dynamic is not None:
        return expected_dynamic_tree(*spec.dynamic, alpha=alpha)
    return spec.shape.parents


def greedy_tree(alpha: float, num_nodes: int, max_depth: int) -> tuple[int, ...]:
    """The parents of the ``num_nodes``-node token tree, at most ``max_depth``
    deep, with the most tokens per round under the positional acceptance model
    (``tree_reach``), the tree Sequoia (Chen et al., 2024) builds for it: grown
    a node at a time, each time the next child of highest reach (a node's child
    of rank ``r`` reaches its parent's reach times ``alpha (1 - alpha)^r``). No
    child out-reaches its parent or its elder sibling, so the greedy nodes are
    the ``num_nodes`` highest reaches of any tree: no tree of that size earns
    more. Returned depth by depth, siblings contiguous in rank order
    (``TreeShape``'s order). At a high ``alpha`` it is a chain until the chain
    reaches ``max_depth``: an elder sibling's alternative is worth ``alpha (1 -
    alpha)`` of its parent, a chain's next node ``alpha``.

    Worked example (alpha 0.5, 4 nodes, depth 2 at most): the root's first
    child (reach 0.5), then its first child and the root's second child (0.25
    each, the shallower first), then the root's third child (0.125) over the
    second child's child (0.125, deeper): parents (-1, -1, -1, 0)."""
    if num_nodes < 1 or max_depth < 1:
        raise ValueError(f"a tree needs at least one node and depth 1; got {num_nodes} "
                         f"nodes, depth {max_depth}.")
    # grown[i] = (parent, depth, reach, rank); the root is parent -1 at depth 0.
    grown: list[tuple[int, int, float, int]] = []
    children = {-1: 0}

    def next_child(node: int) -> tuple[float, int, int]:
        depth = grown[node][1] if node >= 0 else 0
        reach = grown[node][2] if node >= 0 else 1.0
        return reach * alpha * (1.0 - alpha) ** children[node], depth + 1, node

    for _ in range(num_nodes):
        frontier = [next_child(n) for n in children
                    if (grown[n][1] if n >= 0 else 0) < max_depth]
        reach, depth, parent = max(frontier, key=lambda c: (c[0], -c[1], -c[2]))
        grown.append((parent, depth, reach, children[parent]))
        children[parent] += 1
        children[len(grown) - 1] = 0
    # Depth by depth; within a depth, by the parent's new index, then by rank.
    index: dict[int, int] = {-1: -1}
    order = []
    for depth in range(1, max_depth + 1):
        level = sorted((i for i, g in enumerate(grown) if g[1] == depth),
                       key=lambda i: (index[grown[i][0]], grown[i][3]))
        for i in level:
            index[i] = len(order)
            order.append(i)
    return tuple(index[grown[i][0]] for i in order)


def best_tree(*, target_steps: Mapping[int, float], drafter_step_s: float, alpha: float,
              node_counts, max_depth: int, with_next: bool = False) -> tuple[int | None, dict]:
    """The node count whose ``greedy_tree`` is predicted fastest at batch 1 from
    the calls a chain's choice timed (``best_gamma``'s ``target_steps`` and
    drafter step), and the prediction for every count whose tree is not a
    chain (a chain is ``best_gamma``'s to price). ``(None, {})`` when every
    count gives a chain.

    A tree round (``tree_round_seconds``): the target's call over the root
    and N nodes, priced on the line through the timed widths
    (``call_on_line``); the drafter's 1-token step, one call per depth it
    scores (each depth's nodes; the deepest only ``with_next``) and, after a
    round that accepted a path to the deepest level, a ``depth + 1``-token
    catch-up. The drafter's wider calls are untimed here: each is its step
    times the target's cost of that width over its step (the same kernel
    multiplies both). A shape that wins here is worth timing for real
    (``runtime.calibration.predict_tree``) before a run uses it."""
    def grows(width: int) -> float:
        return call_on_line(target_steps, width) / call_on_line(target_steps, 1)

    table = {}
    for count in node_counts:
        parents = greedy_tree(alpha, count, max_depth)
        shape = TreeSpec(parents=parents).shape
        widths = [stop - start for start, stop in shape.levels]
        if max(widths) == 1:
            continue
        scored = widths if with_next else widths[:-1]
        depths = np.asarray(shape.depths)
        full_path = float(tree_reach(parents, alpha)[depths == shape.depth].sum())
        round_s = tree_round_seconds(
            target_call_s=call_on_line(target_steps, count + 1), drafter_root_s=drafter_step_s,
            drafter_level_s=[drafter_step_s * grows(w) for w in scored],
            catch_up_s=drafter_step_s * grows(len(widths) + 1),
            catch_ups=0.0 if with_next else full_path)
        tokens = tree_tokens_per_round(parents, alpha)
        table[count] = {"parents": parents, "depth": len(widths), "level_widths": widths,
                        "tokens_per_round": tokens, "round_s": round_s,
                        "predicted_speedup": predicted_speedup(
                            tokens_per_round=tokens, round_s=round_s,
                            target_step_s=call_on_line(target_steps, 1))}
    if not table:
        return None, {}
    return max(table, key=lambda n: table[n]["predicted_speedup"]), table


def tree_scores_leaves(method: str) -> bool:
    """Whether a tree round of ``method`` scores its deepest nodes too
    (cascades draw the bonus token from pi, which needs the drafter's law at
    the leaves)."""
    return not methods.get_method(method).target_fn.bonus_from_target


def agreement_stats(predicted, measured) -> dict:
    """How well modelled figures match measured ones, pair by pair (same units):
    ``n``, ``pearson`` (None under 3 pairs or when either side is constant),
    ``mean_bias`` (mean of predicted - measured) and ``mean_ratio`` (mean of
    measured / predicted, as ``jobs.studies.report.agreement``); None when ``n`` is 0."""
    predicted, measured = (np.asarray(v, np.float64) for v in (predicted, measured))
    if predicted.shape != measured.shape:
        raise ValueError(f"{predicted.size} predicted values against {measured.size} measured.")
    stats: dict = {"n": int(predicted.size), "pearson": None, "mean_bias": None,
                   "mean_ratio": None}
    if not predicted.size:
        return stats
    stats["mean_bias"] = float(np.mean(predicted - measured))
    stats["mean_ratio"] = float(np.mean(measured / predicted))
    if predicted.size >= 3 and np.std(predicted) > 0 and np.std(measured) > 0:
        stats["pearson"] = float(np.corrcoef(predicted, measured)[0, 1])
    return stats


# --- pricing a generation's counted calls ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CallCost:
    """One model's latency per call, by the number of tokens it scores."""

    single_s: float  # one-token call
    base_s: float  # a: fixed part of a K >= 2 call
    per_token_s: float  # b: per fed token of a K >= 2 call
    prefill_per_token_s: float  # a prefill, per prompt token
    # The measured medians by width (JSON keys are strings); empty in cost models
    # stored before they were kept.
    by_width_s: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_steps(cls, by_width_s: dict, prefill_per_token_s: float = 0.0) -> CallCost:
        """A cost from in-loop step times by width (``timing.in_loop_step``)."""
        by_width_s = {int(k): float(v) for k, v in by_width_s.items()}
        if 1 not in by_width_s:
            raise ValueError(f"a call cost needs the one-token step; got widths "
                             f"{sorted(by_width_s)}.")
        multi = sorted(w for w in by_width_s if w >= 2)
        if len(multi) >= 2:
            base, per_token = np.polyfit(multi, [by_width_s[w] for w in multi], 1)[::-1]
        else:
            base, per_token = (by_width_s[multi[0]] if multi else by_width_s[1]), 0.0
        return cls(single_s=by_width_s[1], base_s=float(max(base, 0.0)),
                   per_token_s=float(max(per_token, 0.0)),
                   prefill_per_token_s=prefill_per_token_s,
                   by_width_s={str(k): v for k, v in sorted(by_width_s.items())})

    def call_s(self, width: int) -> float:
        """Seconds of one call scoring ``width`` tokens: the measured median where
        that width was measured, else the fit ``a + b K`` (K >= 2)."""
        if str(width) in self.by_width_s:
            return float(self.by_width_s[str(width)])
        if width == 1:
            return self.single_s
        return self.base_s + width * self.per_token_s

    def seconds(self, *, calls: float, fed: float, single: float) -> float:
        multi = calls - single
        return single * self.single_s + multi * self.base_s + (fed - single) * self.per_token_s

    def prefill(self, prompt_tokens: int) -> float:
        return prompt_tokens * self.prefill_per_token_s


TARGET = "target"
DRAFTER = "drafter"  # the name ``CostModel.drafter`` prices by default
ROUND_OVERHEAD = "round overhead"  # ``CostModel.itemise``'s entry for the rounds
# The counters of ``decode.stats.GenerationStats`` that price a generation.
PRICED_FIELDS = ("target_calls", "target_fed", "target_single_calls", "drafter_calls_by_model",
                 "drafter_tokens_by_model", "drafter_single_calls_by_model")


@dataclasses.dataclass(frozen=True)
class CostModel:
    target: CallCost
    drafter: CallCost
    # Seconds a speculative round costs beyond its model calls (0: not calibrated).
    round_overhead_s: float = 0.0
    # Drafter models priced apart from ``drafter``, by model name (the names of
    # ``drafter.model_names``); not stored by ``to_json``.
    models: dict = dataclasses.field(default_factory=dict, compare=False)

    def call_cost(self, name: str) -> CallCost:
        """The per-call cost of the model called ``name``: ``target``, one of
        ``models``, else ``drafter``."""
        return self.target if name == TARGET else self.models.get(name, self.drafter)

    def itemise(self, stats, *, drafters=(DRAFTER,), widths=None, prompt_tokens: int = 0,
                rounds=None) -> dict:
        """A generation's counted calls priced at batch 1, in seconds by model
        name (``target`` and each of ``drafters``) plus ``ROUND_OVERHEAD``.

        ``stats``: a ``GenerationStats`` (every row at once: each entry is then
        per row) or a mapping with its field names (``PRICED_FIELDS``: one stored
        row). ``drafters``: the names of its per-model columns
        (``drafter.model_names``), each priced by ``call_cost``; columns past
        them are not priced. A model's calls cost ``CallCost.seconds`` of its
        counts, or, for a model in ``widths`` (name -> K), ``calls x
        call_s(K)`` (every call of that width: a fixed-G target's scoring
        calls), plus its prefill of ``prompt_tokens`` where it ran. ``rounds``
        (default: the target calls where any drafter call was counted) each pay
        ``round_overhead_s``."""
        field = lambda name: np.asarray(  # noqa: E731
            stats[name] if isinstance(stats, Mapping) else getattr(stats, name), np.float64)
        by_model = [field(name) for name in PRICED_FIELDS[3:]]
        counts = [(TARGET, *(field(name) for name in PRICED_FIELDS[:3]))]
        counts += [(name, *(x[..., m] for x in by_model)) for m, name in enumerate(drafters)]
        widths = widths or {}
        seconds: dict = {}
        for name, calls, fed, single in counts:
            call = self.call_cost(name)
            priced = (calls * call.call_s(widths[name]) if name in widths
                      else call.seconds(calls=calls, fed=fed, single=single))
            seconds[name] = seconds.get(name, 0.0) + priced + np.where(
                calls > 0, call.prefill(prompt_tokens), 0.0)
        if rounds is None:
            rounds = np.where(by_model[0].sum(-1) > 0, counts[0][1], 0.0)
        seconds[ROUND_OVERHEAD] = np.asarray(rounds, np.float64) * self.round_overhead_s
        return {name: _scalar(value) for name, value in seconds.items()}

    def price(self, stats, **options):
        """Seconds of a generation's counted calls at batch 1: the sum of
        ``itemise(stats, **options)`` (per row for a ``GenerationStats``)."""
        return _scalar(sum(np.asarray(v) for v in self.itemise(stats, **options).values()))

    def round_seconds(self, *, gamma: int, drafter_calls: float, catch_ups: float = 0.0,
                      catch_up_width: int = 2) -> float:
        """One speculative round: a scoring call of ``G + 1`` tokens, the
        drafter's one-token calls, its catch-up calls (``catch_up_width`` tokens,
        after a round that accepted every draft), and the round overhead."""
        return round_seconds(target_call_s=self.target.call_s(gamma + 1),
                             drafter_calls=[(drafter_calls - catch_ups, self.drafter.call_s(1)),
                                            (catch_ups, self.drafter.call_s(catch_up_width))],
                             overhead_s=self.round_overhead_s)

    def predicted_speedup(self, *, tokens_per_round: float, round_s: float) -> float:
        """``predicted_speedup`` against this model's target step."""
        return predicted_speedup(tokens_per_round=tokens_per_round, round_s=round_s,
                                 target_step_s=self.target.call_s(1))

    def to_json(self) -> dict:
        return {"target": dataclasses.asdict(self.target),
                "drafter": dataclasses.asdict(self.drafter),
                "round_overhead_s": self.round_overhead_s}

    @classmethod
    def from_json(cls, data: dict) -> CostModel:
        return cls(target=CallCost(**data["target"]), drafter=CallCost(**data["drafter"]),
                   round_overhead_s=data.get("round_overhead_s", 0.0))


def _scalar(value):
    """A 0-d array as a float (one stored row); arrays (every row) as they are."""
    value = np.asarray(value)
    return float(value) if value.ndim == 0 else value


def counters_as_stats(row: dict) -> dict:
    """A ``row_counters`` row (drafter models summed, as sweeps store it) as
    ``CostModel.itemise`` reads it: the drafter's calls as one model column."""
    return {"target_calls": row["target_calls"], "target_fed": row["target_fed"],
            "target_single_calls": row["target_single"],
            "drafter_calls_by_model": [row["drafter_calls"]],
            "drafter_tokens_by_model": [row["drafter_fed"]],
            "drafter_single_calls_by_model": [row["drafter_single"]]}


def row_counters(stats, row: int, drafter_as_target: bool = False) -> dict:
    """One row's counters of a generation (``GenerationStats``), as sweeps store
    them (``counters_as_stats`` reads them back for pricing); ``drafter_as_target``:
    the drafter ran alone (its calls are the drafter's)."""
    get = lambda name: np.asarray(getattr(stats, name))[row]  # noqa: E731
    counters = {
        "target_calls": int(get("target_calls")), "target_fed": int(get("target_fed")),
        "target_single": int(get("target_single_calls")),
        "drafter_calls": int(get("drafter_calls")),
        "drafter_fed": int(np.sum(get("drafter_tokens_by_model"))),
        "drafter_single": int(np.sum(get("drafter_single_calls_by_model"))),
        "rejections": int(get("rejections")), "deferred": float(get("deferred_mass")),
        "emitted": int(get("emitted")), "logprob": float(get("sequence_logprob")),
    }
    if drafter_as_target:
        for name in ("calls", "fed", "single"):
            counters[f"drafter_{name}"] = counters.pop(f"target_{name}")
            counters[f"target_{name}"] = 0
    return counters


# --- the acceptance a pair is expected to reach -----------------------------------------

# Tokens per target call measured for a pair at a draft length (greedy, the first
# command's prompts; benchmarks/reports/first_command_cpu.txt): the acceptance the
# draft-length choice expects of it. Other pairs expect DEFAULT_ALPHA per draft.
EXPECTED_TOKENS_PER_CALL = {("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"): (4.70, 5)}
DEFAULT_ALPHA = 0.7
GAMMA_CANDIDATES = tuple(range(1, 9))


def expected_acceptance(target_name: str, drafter_name: str) -> tuple[float, str]:
    """The per-draft acceptance expected of a pair, and where it comes from."""
    known = EXPECTED_TOKENS_PER_CALL.get((target_name, drafter_name))
    if known:
        return acceptance_for_tokens_per_round(*known), "measured for this pair"
    return DEFAULT_ALPHA, f"a default for pairs not measured ({DEFAULT_ALPHA})"
