"""The one cost model: counted calls times measured per-call latencies, plus
the per-round overhead of the loop around them.

Every job and benchmark that prices latency prices it here (a generation's
counted calls: ``CostModel.price``, each model's calls by its name), and every report
that prints a modelled latency prints, on its wall-clock subset, how well it
agrees with measured time (``jobs.report.agreement``: correlation and mean
ratio).

Full sweeps on a 2-core CPU are too slow to time every point at batch 1, so a
sweep counts what each method did (``GenerationStats``: calls and tokens fed,
per model) on batched runs, and prices the counts with latencies measured on
this machine at batch 1:

    seconds(model) = single_calls * t1 + (calls - single_calls) * a
                     + (fed - single_calls) * b
    relative latency = (seconds(target) + seconds(drafter)) / seconds(AR target)

``t1`` is the median of a one-token call (on CPU it takes a cheaper
matrix-vector path, so it is priced on its own) and ``a + b K`` the
least-squares fit of a K-token call for K >= 2. A prefill is compute-bound,
unlike those memory-bound steps, so it is measured on its own (a prompt of
``context`` tokens) and priced per prompt token; a model is charged its
prefill only for examples where it ran. Each latency is a step inside a jitted
loop, never a single host-dispatched call (a host dispatch adds ~1-2 ms on a GPU).

A speculative round also costs something beyond its model calls: sampling,
verification, cache rollback, the loop's own control flow. ``round_overhead_s``
prices it per round; ``measure_round_overhead`` calibrates it from a timed
generation. ``tokens_per_round`` is the expected tokens per round at a constant
acceptance rate (Leviathan et al.), written once here; ``tree_tokens_per_round``
its token-tree form (Sequoia's positional acceptance model), and
``tree_round_seconds`` a tree round's calls.

One run's pricing (the first command's, ``jobs.generate``): its calls timed
here once (``CallTimer``), the draft length chosen (``choose_gamma``), a token
tree's round predicted before the run (``predict_tree``), and the run's
counters priced after it (``price_chain_run``, ``price_tree_run``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import api, target_functions
from specdec_jax.drafting import model_drafter
from specdec_jax.drafting.tree import TreeShape
from specdec_jax.models.interface import make_prompt, start_token_and_prefill
from specdec_jax.runtime import timing
from specdec_jax.sampling import first_argmax
from specdec_jax.tree_decoding import TreeSpec

CALIBRATION_WIDTHS = (1, 2, 4, 6, 8, 11)
STEPS_PER_TIMING = 4
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
    widths = sorted(int(k) for k in target_steps)
    if widths[0] != 1 or len(widths) < 2:
        raise ValueError(f"best_gamma needs the target's 1-token step and one wider call; "
                         f"got widths {widths}.")

    def call_s(width: int) -> float:
        high = next((w for w in widths if w >= width), widths[-1])
        low = max(w for w in widths if w <= min(width, high))
        if high == low:
            return float(target_steps[low])
        share = (width - low) / (high - low)
        return float(target_steps[low] + share * (target_steps[high] - target_steps[low]))

    table = {}
    for gamma in gammas:
        round_s = call_s(gamma + 1) + (gamma + alpha ** gamma) * drafter_step_s
        tokens = tokens_per_round(alpha, gamma)
        table[gamma] = {"tokens_per_round": tokens, "round_s": round_s,
                        "predicted_speedup": tokens * call_s(1) / round_s}
    best = max(table, key=lambda g: table[g]["predicted_speedup"])
    return best, table


# --- token trees --------------------------------------------------------------------------


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
    return (target_call_s + (1.0 - catch_ups) * drafter_root_s + catch_ups * catch_up_s
            + float(sum(drafter_level_s)))


def in_loop_tree_call(model, params, parents, *, start: int = 0, width: int | None = None,
                      batch: int = 1, fill: int = 64, steps: int = STEPS_PER_TIMING,
                      repeats: int = 3) -> timing.Timed:
    """Seconds of one ``score_tree`` call feeding nodes ``start .. start + width
    - 1`` of a tree with ``parents`` (all of it by default), timed as
    ``timing.in_loop_step`` times ``extend``: inside a jitted fixed-trip loop,
    each call fed the previous one's argmax, at a fixed cache fill. A tree
    call's cost does not depend on the parents' values (they are data), only
    on the node count and the width fed."""
    n = len(parents)
    width = n - start if width is None else width
    cache = model.init_cache(batch, fill + n).replace(
        lengths=jnp.full((batch,), fill, jnp.int32))
    parents_BxN = jnp.broadcast_to(jnp.asarray(parents, jnp.int32), (batch, n))

    def body(params, carry):
        tokens_BxW, cache = carry
        out = model.score_tree(params, tokens_BxW, parents_BxN, cache, start=start)
        chosen_BxW = first_argmax(out.logits)
        return (jnp.broadcast_to(chosen_BxW[:, -1:], (batch, width)),
                out.cache.replace(lengths=cache.lengths))

    return timing.in_loop(body, params, (jnp.ones((batch, width), jnp.int32), cache),
                          steps=steps, repeats=repeats)


def agreement_stats(predicted, measured) -> dict:
    """How well modelled figures match measured ones, pair by pair (same units):
    ``n``, ``pearson`` (None under 3 pairs or when either side is constant),
    ``mean_bias`` (mean of predicted - measured) and ``mean_ratio`` (mean of
    measured / predicted, as ``jobs.report.agreement``); None when ``n`` is 0."""
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


def measure_call_cost(model, params, *, context: int, widths=CALIBRATION_WIDTHS,
                      repeats: int = 3) -> tuple[CallCost, dict[int, float]]:
    """Per-call seconds of ``extend`` at batch 1 with ``context`` tokens cached;
    returns the fitted cost and the measured medians per width."""
    length = context + max(widths) * STEPS_PER_TIMING + 1
    # jitted: an eager prefill compiles every op separately (seconds, even for toys)
    cache, _ = jax.jit(lambda p, prompt: start_token_and_prefill(model, p, prompt, length))(
        params, make_prompt([[1] * context]))
    medians = {}
    for width in widths:

        def body(params, cache, width=width):
            out = model.extend(params, jnp.ones((1, width), jnp.int32), cache)
            return out.cache.replace(lengths=cache.lengths)

        medians[width] = timing.in_loop(body, params, cache, steps=STEPS_PER_TIMING,
                                        repeats=repeats).median_s
    prompt = make_prompt([[1] * context])

    def prefill(params, prompt):
        cache = model.init_cache(1, context + 1)
        return model.prefill(params, prompt, cache).logits

    prefill_s = timing.Compiled(jax.jit(prefill), params, prompt).time(
        params, prompt, repeats=repeats).median_s
    return CallCost.from_steps(medians, prefill_per_token_s=prefill_s / context), medians


TARGET = "target"
DRAFTER = "drafter"  # the name ``CostModel.drafter`` prices by default
ROUND_OVERHEAD = "round overhead"  # ``CostModel.itemise``'s entry for the rounds
# The counters of ``decoding.GenerationStats`` that price a generation.
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
        return (self.target.call_s(gamma + 1)
                + (drafter_calls - catch_ups) * self.drafter.call_s(1)
                + catch_ups * self.drafter.call_s(catch_up_width) + self.round_overhead_s)

    def predicted_speedup(self, *, tokens_per_round: float, round_s: float) -> float:
        """Speculative decoding over the autoregressive target at batch 1: tokens
        per round over the round's seconds, against one target step per token."""
        return tokens_per_round * self.target.call_s(1) / round_s

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


def measure_round_overhead(cost: CostModel, *, target, target_params, drafter, drafter_params,
                           context: int, gamma: int = 4, new_tokens: int = 32,
                           repeats: int = 3) -> dict:
    """The seconds a speculative round costs beyond its priced calls: one greedy
    speculative generation (``gamma`` drafts a round, ``new_tokens`` tokens after
    a ``context``-token prompt) is timed whole inside one jitted call, its
    counters priced by ``cost`` (with no overhead), and the difference spread
    over its rounds. Returns ``{"round_overhead_s", "raw_s", "rounds",
    "measured_s", "priced_s"}``; ``round_overhead_s`` is ``raw_s`` clipped at 0
    (a negative difference means the calls were priced high, not that the loop
    pays back time)."""
    fn = api.make_generate_fn(target=target, drafter=drafter, method="specdecode",
                              gamma=gamma, max_new_tokens=new_tokens)
    prompt = make_prompt([[1] * context])
    key, params = jax.random.PRNGKey(0), api.sampling_params(temperature=0.0)
    compiled = timing.Compiled(fn, target_params, drafter_params, prompt, key, params)
    measured = compiled.time(target_params, drafter_params, prompt, key, params,
                             repeats=repeats).median_s
    stats = fn(target_params, drafter_params, prompt, key, params).stats
    priced = float(dataclasses.replace(cost, round_overhead_s=0.0).price(
        stats, prompt_tokens=context)[0])
    rounds = max(int(stats.target_calls[0]), 1)
    raw = (measured - priced) / rounds
    return {"round_overhead_s": max(raw, 0.0), "raw_s": raw, "rounds": rounds,
            "measured_s": measured, "priced_s": priced, "gamma": gamma}


def calibrate(*, target, target_params, drafter, drafter_params, context: int,
              widths=CALIBRATION_WIDTHS, drafter_widths=None, repeats: int = 3,
              overhead_gamma: int | None = 4) -> tuple[CostModel, dict]:
    """Measures both models' calls (the drafter's at ``drafter_widths``, by
    default ``widths``) and (unless ``overhead_gamma`` is None) the per-round
    overhead at that draft length; returns the model and the raw measurements
    (for the report). Run it on a quiet machine: anything else running
    inflates every latency."""
    if 1 not in widths or not any(w >= 2 for w in widths):
        raise ValueError(f"calibration widths must include 1 and a width >= 2, got {widths}.")
    target_cost, target_medians = measure_call_cost(target, target_params, context=context,
                                                    widths=widths, repeats=repeats)
    drafter_cost, drafter_medians = measure_call_cost(drafter, drafter_params,
                                                      context=context,
                                                      widths=drafter_widths or widths,
                                                      repeats=repeats)
    medians = {"target": {str(k): v for k, v in target_medians.items()},
               "drafter": {str(k): v for k, v in drafter_medians.items()},
               "context": context}
    model = CostModel(target=target_cost, drafter=drafter_cost)
    if overhead_gamma is not None:
        overhead = measure_round_overhead(
            model, target=target, target_params=target_params, drafter=drafter,
            drafter_params=drafter_params, context=context, gamma=overhead_gamma,
            repeats=repeats)
        medians["round_overhead"] = overhead
        model = dataclasses.replace(model, round_overhead_s=overhead["round_overhead_s"])
    return model, medians


# --- one run's calls, timed here and priced (the first command's cost model) -------------

# In-loop calls timed to price a run: few, at a typical cache fill (a call's cost barely
# moves with the fill at these lengths), the median of a few repeats (one sample on a
# shared machine can be off by 50%).
RUN_TIMING_STEPS, RUN_TIMING_REPEATS, RUN_TIMING_FILL = STEPS_PER_TIMING, 3, 64
# Tokens per target call measured for a pair at a draft length (greedy, the first
# command's prompts; benchmarks/reports/first_command_cpu.txt): the acceptance the
# draft-length choice expects of it. Other pairs expect DEFAULT_ALPHA per draft.
EXPECTED_TOKENS_PER_CALL = {("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"): (4.70, 5)}
DEFAULT_ALPHA = 0.7
GAMMA_CANDIDATES = tuple(range(1, 9))


@dataclasses.dataclass
class CallTimer:
    """A run's model calls, each timed once inside a jitted loop at batch
    ``batch_size`` (``timing.in_loop_step``, ``in_loop_steps_in_turn``,
    ``in_loop_tree_call``) and
    memoised by role and width: a prediction before the run and the pricing
    after it read the same figures."""

    batch_size: int = 1
    seconds: dict = dataclasses.field(default_factory=dict)

    def step(self, role: str, model, params, k: int, head_rows: int | None = None) -> float:
        """Seconds of one ``extend`` of ``k`` tokens (``head_rows``: the output
        head at that many last rows only)."""
        key = (role, k, head_rows)
        if key not in self.seconds:
            self.seconds[key] = timing.in_loop_step(
                model, params, k, batch=self.batch_size, fill=RUN_TIMING_FILL,
                steps=RUN_TIMING_STEPS, repeats=RUN_TIMING_REPEATS,
                head_rows=head_rows).median_s
        return self.seconds[key]

    def steps_in_turn(self, requests) -> list[float]:
        """``step`` of several ``(role, model, params, k)`` at once: those not
        yet timed are timed in turn (``timing.in_loop_steps_in_turn``), so that
        a change in this machine's speed meanwhile moves them alike."""
        todo = {}
        for role, model, params, k in requests:
            if (role, k, None) not in self.seconds:
                todo.setdefault((role, k, None), (model, params, k, None))
        if todo:
            timed = timing.in_loop_steps_in_turn(
                list(todo.values()), batch=self.batch_size, fill=RUN_TIMING_FILL,
                steps=RUN_TIMING_STEPS, repeats=RUN_TIMING_REPEATS)
            self.seconds.update({key: t.median_s for key, t in zip(todo, timed, strict=True)})
        return [self.seconds[(role, k, None)] for role, _, _, k in requests]

    def tree_call(self, role: str, model, params, parents, start: int = 0,
                  width: int | None = None) -> float:
        """Seconds of one ``score_tree`` call: by node count and width fed, since
        its cost does not depend on the parents' values or on which depth it
        feeds (the depths of one width are timed once: one compilation)."""
        key = (role, "tree", len(parents), len(parents) - start if width is None else width)
        if key not in self.seconds:
            self.seconds[key] = in_loop_tree_call(
                model, params, parents, start=start, width=width, batch=self.batch_size,
                fill=RUN_TIMING_FILL, steps=RUN_TIMING_STEPS,
                repeats=RUN_TIMING_REPEATS).median_s
        return self.seconds[key]


def expected_acceptance(target_name: str, drafter_name: str) -> tuple[float, str]:
    """The per-draft acceptance expected of a pair, and where it comes from."""
    known = EXPECTED_TOKENS_PER_CALL.get((target_name, drafter_name))
    if known:
        return acceptance_for_tokens_per_round(*known), "measured for this pair"
    return DEFAULT_ALPHA, f"a default for pairs not measured ({DEFAULT_ALPHA})"


def choose_gamma(*, target_name: str, drafter_name: str, target, target_params, drafter,
                 drafter_params, timer: CallTimer) -> dict:
    """The draft length predicted fastest here (``best_gamma``): this machine's
    target step, its widest scoring call and the drafter's step, with the
    acceptance expected of the pair."""
    widest = max(GAMMA_CANDIDATES) + 1
    step_s, widest_s, drafter_s = timer.steps_in_turn(
        [(TARGET, target, target_params, 1), (TARGET, target, target_params, widest),
         (DRAFTER, drafter, drafter_params, 1)])
    steps = {1: step_s, widest: widest_s}
    alpha, source = expected_acceptance(target_name, drafter_name)
    gamma, table = best_gamma(target_steps=steps, drafter_step_s=drafter_s, alpha=alpha,
                              gammas=GAMMA_CANDIDATES)
    return {"gamma": gamma, "alpha": alpha, "alpha_source": source, "target_steps_s": steps,
            "drafter_step_s": drafter_s, "candidates": table}


def price_chain_run(*, target, target_params, drafter, drafter_params, gamma: int,
                    run: dict, timer: CallTimer) -> dict | None:
    """Why a chain run's speedup is what it is: the target's step (K = 1) and
    scoring call (K = G + 1), the drafter's step and its 2-token catch-up call
    (``timer``), with the run's counters (``run``: tokens, target and drafter
    calls, the accepted histogram) priced by ``CostModel.round_seconds``:
    predicted speedup ``tokens per target call x t_target(1) / round``. A round
    after one that accepted all G drafts must first feed the last draft (never
    fed; ``drafting.ModelDrafter``). On accelerators that rides in a 2-token
    call (its head at one row), priced here; the run's full-accept rounds count
    them (a prompt's last round has no successor, one too many; at batch > 1
    the window runs whenever any row lags). On CPU, where a 2-token call costs
    two to three steps, it is one more 1-token call, already among the
    drafter's calls and priced as a step. No per-round overhead: the measured
    speedup beside it shows what the loop around the calls costs. None when
    the drafter is not a single model (a cascade's calls have several prices)."""
    drafter_calls = run.get("drafter_calls", 0)
    if drafter_calls and not hasattr(drafter, "extend"):
        return None
    two_token_catch_up = max(model_drafter.default_catch_up_widths()) >= 2
    rounds = max(run["target_calls"], 1)
    full_accepts = run["accepted_histogram"][gamma] if drafter_calls and two_token_catch_up \
        else 0
    calls = [(TARGET, target, target_params, 1), (TARGET, target, target_params, gamma + 1)]
    calls += [(DRAFTER, drafter, drafter_params, 1)] if drafter_calls else []
    step_s, scoring_s, *drafter_s = timer.steps_in_turn(calls)
    priced = {"target_step_s": step_s, "scoring_call_s": scoring_s,
              "drafter_step_s": drafter_s[0] if drafter_calls else 0.0,
              # The catch-up runs the output head at its last position only.
              "drafter_catch_up_s": (timer.step(DRAFTER, drafter, drafter_params, 2,
                                                head_rows=1) if full_accepts else 0.0),
              "tokens_per_target_call": run["tokens"] / rounds,
              "drafter_calls_per_round": drafter_calls / rounds,
              "catch_ups_per_round": full_accepts / rounds,
              "catch_up": "2-token call" if two_token_catch_up else "1-token call"}
    costs = CostModel(
        target=CallCost.from_steps({1: priced["target_step_s"],
                                    gamma + 1: priced["scoring_call_s"]}),
        drafter=CallCost.from_steps({1: priced["drafter_step_s"],
                                     2: priced["drafter_catch_up_s"]}))
    round_s = costs.round_seconds(gamma=gamma, drafter_calls=priced["drafter_calls_per_round"],
                                  catch_ups=priced["catch_ups_per_round"])
    return {**priced, "round_s": round_s,
            "predicted_speedup": costs.predicted_speedup(
                tokens_per_round=priced["tokens_per_target_call"], round_s=round_s),
            # Tokens per target call at which a round would just pay for itself.
            "break_even_tokens_per_call": round_s / priced["target_step_s"]}


def tree_parents(tree, alpha: float) -> tuple[int, ...]:
    """The drafted nodes' parents of a tree request: a static shape's own; for
    a dynamic tree, the shape EAGLE-2's expansion grows at acceptance ``alpha``
    (``expected_dynamic_tree``: the same count and widths per depth as every
    tree it drafts)."""
    spec = TreeSpec.parse(tree)
    if spec.dynamic is not None:
        return expected_dynamic_tree(*spec.dynamic, alpha=alpha)
    return spec.shape.parents


def tree_scores_leaves(method: str) -> bool:
    """Whether a tree round of ``method`` scores its deepest nodes too
    (cascades draw the bonus token from pi, which needs the drafter's law at
    the leaves)."""
    return not target_functions.get_target(method).bonus_from_target


def tree_round_calls(*, tree, alpha: float, target, target_params, drafter, drafter_params,
                     timer: CallTimer, with_next: bool = False, catch_up: bool = True) -> dict:
    """The calls of one tree round, timed: the target's 1-token step and its
    call over the root and the N nodes (width N + 1), the drafter's step, its
    call per scored depth (each depth's nodes in one ``score_tree``; the
    deepest only ``with_next``) and its catch-up call (``depth + 1`` tokens,
    the head at one row: the first call after a round that accepted a whole
    path, whose deepest node the drafter never scored). A drafter without
    ``extend`` (Max-Gram) costs nothing."""
    parents = tree_parents(tree, alpha)
    shape = TreeShape(parents)
    rooted = (-1, *(p + 1 for p in parents))  # tree_with_root: node 0 is the pending token
    calls = {"parents": list(parents), "num_nodes": len(parents), "depth": shape.depth,
             "target_step_s": timer.step(TARGET, target, target_params, 1),
             "tree_call_s": timer.tree_call(TARGET, target, target_params, rooted)}
    levels = shape.levels if with_next else shape.levels[:-1]
    calls["level_widths"] = [stop - start for start, stop in levels]
    if not hasattr(drafter, "extend"):
        return {**calls, "drafter_step_s": 0.0, "drafter_level_s": [0.0] * len(levels),
                "drafter_catch_up_s": 0.0, "level_widths": []}
    return {**calls, "drafter_step_s": timer.step(DRAFTER, drafter, drafter_params, 1),
            "drafter_level_s": [timer.tree_call(DRAFTER, drafter, drafter_params, parents,
                                                start=start, width=stop - start)
                                for start, stop in levels],
            "drafter_catch_up_s": (timer.step(DRAFTER, drafter, drafter_params,
                                              shape.depth + 1, head_rows=1)
                                   if catch_up else 0.0)}


def _tree_round_s(calls: dict, catch_ups: float) -> float:
    return tree_round_seconds(
        target_call_s=calls["tree_call_s"], drafter_root_s=calls["drafter_step_s"],
        drafter_level_s=calls["drafter_level_s"], catch_up_s=calls["drafter_catch_up_s"],
        catch_ups=catch_ups)


def predict_tree(*, tree: str, target_name: str, drafter_name: str, target, target_params,
                 drafter, drafter_params, timer: CallTimer, with_next: bool = False) -> dict:
    """What a tree round should earn here, before a run: its calls
    (``tree_round_calls``), the tokens per round its shape gives at the
    acceptance expected of the pair (``tree_tokens_per_round``) and the
    predicted speedup; beside it the best chain priced on the same target
    calls (widths between 1 and N + 1 on the line through them,
    ``best_gamma``), so a tree that cannot beat a chain here says so."""
    alpha, source = expected_acceptance(target_name, drafter_name)
    calls = tree_round_calls(tree=tree, alpha=alpha, target=target, target_params=target_params,
                             drafter=drafter, drafter_params=drafter_params, timer=timer,
                             with_next=with_next)
    parents = calls["parents"]
    reach = tree_reach(parents, alpha)
    depths = np.asarray(TreeShape(tuple(parents)).depths)
    full_path = float(reach[depths == calls["depth"]].sum())  # the deepest level reached
    round_s = _tree_round_s(calls, 0.0 if with_next else full_path)
    tokens = tree_tokens_per_round(parents, alpha)
    gamma, chains = best_gamma(
        target_steps={1: calls["target_step_s"], len(parents) + 1: calls["tree_call_s"]},
        drafter_step_s=calls["drafter_step_s"], alpha=alpha, gammas=GAMMA_CANDIDATES)
    return {**calls, "tree": tree, "alpha": alpha, "alpha_source": source,
            "tokens_per_round": tokens, "full_path_per_round": full_path, "round_s": round_s,
            "predicted_speedup": tokens * calls["target_step_s"] / round_s,
            "best_chain": {"gamma": gamma, **chains[gamma]}}


def price_tree_run(*, tree: str, target, target_params, drafter, drafter_params, run: dict,
                   timer: CallTimer, with_next: bool = False,
                   alpha: float = DEFAULT_ALPHA) -> dict:
    """Why a tree run's speedup is what it is: the round's calls
    (``tree_round_calls``; a dynamic tree's shape at ``alpha``, the same widths
    as every tree it drafted) priced with the run's counters: tokens per target
    call, and the rounds after one that accepted a whole path (their first
    drafter call is the ``depth + 1``-token catch-up); ``tree_round_seconds``
    per round, predicted speedup ``tokens per target call x t_target(1) /
    round``, beside the measured one."""
    rounds = max(run["target_calls"], 1)
    depth = TreeSpec.parse(tree).depth
    drafted = bool(run.get("drafter_calls", 0)) and hasattr(drafter, "extend")
    full_paths = run["accepted_histogram"][depth] if drafted and not with_next else 0
    calls = tree_round_calls(tree=tree, alpha=alpha, target=target, target_params=target_params,
                             drafter=drafter if drafted else None,
                             drafter_params=drafter_params, timer=timer, with_next=with_next,
                             catch_up=bool(full_paths))
    priced = {**calls, "tree": tree, "tokens_per_target_call": run["tokens"] / rounds,
              "drafter_calls_per_round": run.get("drafter_calls", 0) / rounds,
              "catch_ups_per_round": full_paths / rounds}
    round_s = _tree_round_s(calls, priced["catch_ups_per_round"])
    return {**priced, "round_s": round_s,
            "predicted_speedup": (priced["tokens_per_target_call"] * calls["target_step_s"]
                                  / round_s),
            "break_even_tokens_per_call": round_s / calls["target_step_s"]}
