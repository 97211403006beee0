"""What the cost model reads, timed on this machine: per-call latencies of a
model's ``extend`` and ``score_tree`` inside jitted loops (``timing.in_loop``),
fitted into ``decode.cost.CallCost``; the per-round overhead of a whole
generation; and one run's calls timed once and priced (the first command's
cost model: ``choose_gamma`` before a chain run, ``predict_tree`` before a
tree run, ``price_chain_run`` / ``price_tree_run`` after). The formulas are
``decode.cost``'s; only the timing lives here.

Each latency is a step inside a jitted loop, never a single host-dispatched
call (a host dispatch adds ~1-2 ms on a GPU). Run calibrations on a quiet
machine: anything else running inflates every latency.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import api
from specdec_jax.decode.cost import (
    DEFAULT_ALPHA,
    DRAFTER,
    GAMMA_CANDIDATES,
    TARGET,
    CallCost,
    CostModel,
    best_gamma,
    best_tree,
    expected_acceptance,
    predicted_speedup,
    tree_parents,
    tree_reach,
    tree_round_seconds,
    tree_tokens_per_round,
)
from specdec_jax.decode.tree import TreeSpec
from specdec_jax.drafting import model_drafter
from specdec_jax.drafting.tree import TreeShape
from specdec_jax.models.interface import make_prompt, start_token_and_prefill
from specdec_jax.runtime import timing
from specdec_jax.sampling import first_argmax

CALIBRATION_WIDTHS = (1, 2, 4, 6, 8, 11)
STEPS_PER_TIMING = 4


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
# In-loop calls timed to price a run: few, at a typical cache fill (a call's cost barely
# moves with the fill at these lengths), the median of a few repeats (one sample on a
# shared machine can be off by 50%).
RUN_TIMING_STEPS, RUN_TIMING_REPEATS, RUN_TIMING_FILL = STEPS_PER_TIMING, 3, 64


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
            "predicted_speedup": predicted_speedup(tokens_per_round=tokens, round_s=round_s,
                                                   target_step_s=calls["target_step_s"]),
            "best_chain": {"gamma": gamma, **chains[gamma]}}


# Token trees the first command prices beside its chain: the best tree of each
# size up to 16 nodes, at most as deep as the longest chain. A tree must be
# predicted TREE_MARGIN faster than the chain, on the chain's calls and again on
# its own timed ones: its tokens per round rest on a model of acceptance by a
# draft's rank among its siblings, which a chain's do not need.
TREE_NODE_COUNTS = tuple(range(2, 17))
TREE_MARGIN = 0.05


def choose_tree(*, gamma_choice: dict, target_name: str, drafter_name: str, target,
                target_params, drafter, drafter_params, timer: CallTimer,
                with_next: bool = False) -> dict:
    """Whether a token tree should replace the chain ``choose_gamma`` chose.
    The screen times nothing: the best tree of each size (``best_tree``) priced
    on the chain's timed calls. Only where the best of them beats the chain by
    ``TREE_MARGIN`` are its calls timed (``predict_tree``; a compilation per
    model), and the tree is kept only if it still beats the best chain priced
    on those same calls. ``tree``: its spec (``parents:...``), or None for
    the chain."""
    chain = gamma_choice["candidates"][gamma_choice["gamma"]]["predicted_speedup"]
    count, table = best_tree(
        target_steps=gamma_choice["target_steps_s"], drafter_step_s=gamma_choice["drafter_step_s"],
        alpha=gamma_choice["alpha"], node_counts=TREE_NODE_COUNTS,
        max_depth=max(GAMMA_CANDIDATES), with_next=with_next)
    choice = {"tree": None, "chain_gamma": gamma_choice["gamma"], "chain_speedup": chain,
              "margin": TREE_MARGIN, "best_nodes": count, "screen": table, "timed": None}
    if count is None or table[count]["predicted_speedup"] <= chain * (1 + TREE_MARGIN):
        return choice
    spec = "parents:" + ",".join(str(p) for p in table[count]["parents"])
    timed = predict_tree(tree=spec, target_name=target_name, drafter_name=drafter_name,
                         target=target, target_params=target_params, drafter=drafter,
                         drafter_params=drafter_params, timer=timer, with_next=with_next)
    choice["timed"] = timed
    if timed["predicted_speedup"] > timed["best_chain"]["predicted_speedup"] * (1 + TREE_MARGIN):
        choice["tree"] = spec
    return choice


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
            "predicted_speedup": predicted_speedup(
                tokens_per_round=priced["tokens_per_target_call"], round_s=round_s,
                target_step_s=calls["target_step_s"]),
            "break_even_tokens_per_call": round_s / calls["target_step_s"]}
