"""Cascade Speculative Drafting vs speculative decoding on a real pair, in the
layout of Chen et al.'s Table 2 (Qwen2.5-Coder 1.5B target, 0.5B drafter,
Max-Gram with the stdlib bigram table; HumanEval prompts).

Figures, per configuration:
* counted: target calls, 0.5B calls and tokens fed, tokens emitted, for every
  prompt (efficiency runs are batched: rows are independent, greedy rows are
  deterministic); mean tokens per target call with a 95% normal CI over prompts;
* SWI (standardized walltime improvement, Chen et al. §5): autoregressive cost
  over the counted cost, with each call priced (a) by parameter count and
  (b) by the cost model (``decode.cost``): per-call latency measured on this
  machine at batch 1 inside jit (``CallCost``: the median at each measured
  width, a least-squares fit t(K) = a + b K elsewhere) plus the calibrated
  per-round overhead (``measure_round_overhead``);
* EWIF predicted from the measured acceptance rate and cost ratio (plain
  speculative decoding and Max-Gram; Chen et al.);
* wall clock at batch 1 on a subset, prefill included, every configuration
  timed interleaved prompt by prompt (rotating order), over autoregressive;
  and on that subset the cost model's agreement with the measured seconds
  (Pearson r, mean bias).
Plus the round time of speculative decoding (G = 7) with and without the
drafter's (G+1)-th step (``draft_next_q``), timed the same way.

Every prompt is prefilled once per model (target and 0.5B) and shared by all
configurations. Results go to ``out`` after every configuration; a rerun
skips what the JSON already has (resumable).

    python -m benchmarks.main --gin_file=benchmarks/configs/drafting.gin      # the issue's protocol
    python -m benchmarks.main --gin_file=benchmarks/configs/drafting.gin \\
        --gin_bindings="bench_drafting.phases = ['report']" \\
        --gin_bindings="OUT_PATH = 'benchmarks/reports/bench_drafting_issue12_cpu.json.gz'"
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import shared
from specdec_jax import api, drafting, precision
from specdec_jax.data import bigram
from specdec_jax.decode import cost as cost_lib
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.decode.round import Prefilled, initial_history, required_cache_length
from specdec_jax.drafting.cs_drafting import HorizontalCascade, VerticalCascade, VerticalState
from specdec_jax.drafting.model_drafter import ModelDrafter, ModelDrafterState
from specdec_jax.jobs import tables
from specdec_jax.jobs.resolver import load_pair
from specdec_jax.models.interface import make_prompt, start_token_and_prefill
from specdec_jax.runtime import calibration, timing
from specdec_jax.runtime.progress import tqdm
from specdec_jax.target_functions import get_target

DRAFTER = "qwen2.5-coder-0.5b"
# name -> (draft spec, ``{drafter}`` standing for the drafter model's name;
# K-matrix or None; gamma or None)
CONFIG_SPECS = {
    "sd-g7": ("{drafter}", None, 7),
    "csd-[[2,10],[0,10]]": ("{drafter}+mag", [[2, 10], [0, 10]], None),
    "vertical-[[6,0],[0,10]]": ("{drafter}+mag", [[6, 0], [0, 10]], None),
    "horizontal-[[4,6],[0,0]]": ("{drafter}+mag", [[4, 6], [0, 0]], None),
    "mag-g6": ("mag", None, 6),
    "csd-[[4,4],[0,4]]": ("{drafter}+mag", [[4, 4], [0, 4]], None),
    "sd-g5": ("{drafter}", None, 5),
}
PHASES = ("costs", "greedy", "ar", "wallclock", "t1", "report")
DEFAULT_PHASES = ("costs", "greedy", "wallclock", "t1")
COST_WIDTHS = (1, 2, 3, 4, 6, 8, 13, 16)  # K of the measured calls (G + 1 of most configs)
SLACK = 64  # room beyond prompt + output for any config's gamma and cascade slack
NOT_MODELS = ("fill", "round_overhead")  # entries of report["costs"] that price no model


def configurations(drafter: str = DRAFTER) -> dict:
    """name -> (draft spec, K-matrix or None, gamma or None) with ``drafter`` as
    the neural drafter."""
    return {name: (spec.format(drafter=drafter), k_matrix, gamma)
            for name, (spec, k_matrix, gamma) in CONFIG_SPECS.items()}


CONFIGS = configurations()


# ---------------------------------------------------------------------------
# Shared prefill
# ---------------------------------------------------------------------------

def shared_state(drafter, caches: dict, prompt, named: dict):
    """The drafter's state built from caches prefilled once per model."""
    if isinstance(drafter, ModelDrafter):
        return ModelDrafterState(cache=caches[drafter.name])
    if isinstance(drafter, VerticalCascade):
        return VerticalState(cache=caches[drafter.name],
                             inner=shared_state(drafter.inner, caches, prompt, named))
    if isinstance(drafter, HorizontalCascade):
        return tuple(shared_state(d, caches, prompt, named) for d in drafter.drafters)
    return drafter.init(drafter.select_params(named), prompt, 0, False)  # Max-Gram


def prefill_caches(models: dict, params: dict, prompts, max_length, group=8):
    """{name: cache} for every model, each prompt fed once (length-sorted
    groups, stacked back in prompt order), plus the stacked prompts."""
    width = max(len(p) for p in prompts)
    order = np.argsort([len(p) for p in prompts], kind="stable")
    fns = {name: jax.jit(lambda prm, pr, m=model: start_token_and_prefill(m, prm, pr,
                                                                          max_length)[0])
           for name, model in models.items()}
    chunks = []
    for start in tqdm(range(0, len(order), group), desc="prefill"):
        rows = [prompts[i] for i in order[start:start + group]]
        prompt = make_prompt(rows, pad_to=width)
        chunks.append({name: fn(params[name], prompt) for name, fn in fns.items()})
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *chunks)
    inverse = np.argsort(order)
    return jax.tree_util.tree_map(lambda x: x[inverse], stacked)


# ---------------------------------------------------------------------------
# Counted runs
# ---------------------------------------------------------------------------

def run_counted(decoder, named, target_params, caches, prompts, width, max_length,
                temperature, batch_size, seed=0):
    """Per-prompt counts for one configuration (batched decode from the shared
    prefill)."""
    sp = api.sampling_params(temperature=temperature)
    decode = jax.jit(decoder.decode)
    drafter_params = decoder.drafter.select_params(named)
    compiled, rows_out = None, []
    order = np.argsort([len(p) for p in prompts], kind="stable")
    names = decoder.drafter.model_names
    for start in tqdm(range(0, len(prompts), batch_size), leave=False, desc="decode"):
        idx = list(order[start:start + batch_size])
        idx_padded = np.asarray(idx + [idx[-1]] * (batch_size - len(idx)))
        prompt = make_prompt([prompts[i] for i in idx_padded], pad_to=width)
        sub = jax.tree_util.tree_map(lambda x, r=idx_padded: x[r], caches)
        history, length = initial_history(prompt, max_length, False, None)
        prefilled = Prefilled(target_cache=sub["target"],
                              drafter_state=shared_state(decoder.drafter, sub, prompt, named),
                              history=history, length=length, prompt_width=width)
        key = jax.random.PRNGKey(1000 * seed + start)
        if compiled is None:
            compiled = timing.Compiled(decode, target_params, drafter_params, prefilled, key, sp)
        t0 = time.perf_counter()
        out = compiled.time(target_params, drafter_params, prefilled, key, sp).output
        seconds = time.perf_counter() - t0
        s = out.stats
        for row, i in enumerate(idx):
            rows_out.append({
                "prompt": int(i), "tokens": int(out.lengths[row]),
                "target_calls": int(s.target_calls[row]),
                "drafter_calls": {n: int(s.drafter_calls_by_model[row, m])
                                  for m, n in enumerate(names)},
                "drafter_fed": {n: int(s.drafter_tokens_by_model[row, m])
                                for m, n in enumerate(names)},
                "drafter_single": {n: int(s.drafter_single_calls_by_model[row, m])
                                   for m, n in enumerate(names)},
                "accepted_histogram": np.asarray(s.accepted_histogram[row]).tolist(),
                "output": np.asarray(out.tokens[row, : out.lengths[row]]).tolist(),
                "batch_seconds": seconds})
    return sorted(rows_out, key=lambda r: r["prompt"]), compiled.compile_s


# ---------------------------------------------------------------------------
# Costs: decode.cost, stored in this benchmark's report layout
# ---------------------------------------------------------------------------

def call_latency(model, params, fill, ks=COST_WIDTHS, repeats=5):
    """Seconds of one ``extend`` of K tokens at batch 1 with ``fill`` tokens in
    the cache (``runtime.calibration.measure_call_cost``: steps inside a jitted loop), as
    this benchmark's report stores them: the medians, the fit t(K) = a + b K
    over K >= 2 (K = 1 is priced by its own median) and the prefill per token."""
    cost, medians = calibration.measure_call_cost(model, params, context=fill, widths=ks,
                                               repeats=repeats)
    return {"a_s": cost.base_s, "b_s": cost.per_token_s, "k1_s": cost.single_s,
            "median_s": {str(k): v for k, v in medians.items()},
            "prefill_per_token_s": cost.prefill_per_token_s}


def call_cost(stored: dict) -> cost_lib.CallCost:
    """A stored latency entry (``call_latency``) as the cost model's ``CallCost``
    (reports stored before the prefill was kept price it at 0)."""
    return cost_lib.CallCost(single_s=stored["k1_s"], base_s=stored["a_s"],
                             per_token_s=stored["b_s"],
                             prefill_per_token_s=stored.get("prefill_per_token_s", 0.0),
                             by_width_s=dict(stored["median_s"]))


def drafter_name(costs: dict) -> str:
    """The neural drafter a report's costs price (the one model besides the target)."""
    names = [name for name in costs if name not in (*NOT_MODELS, "target")]
    if len(names) != 1:
        raise ValueError(f"the report's costs price models {names} besides the target; "
                         "expected one drafter.")
    return names[0]


def cost_model(costs: dict) -> tuple[cost_lib.CostModel, dict[str, cost_lib.CallCost]]:
    """The report's costs as a ``CostModel`` (target, drafter, the calibrated
    per-round overhead: 0 in reports stored before it was measured) and every
    model's ``CallCost`` by name."""
    models = {name: call_cost(v) for name, v in costs.items() if name not in NOT_MODELS}
    overhead = costs.get("round_overhead", {}).get("round_overhead_s", 0.0)
    return cost_lib.CostModel(target=models["target"], drafter=models[drafter_name(costs)],
                              round_overhead_s=overhead), models


def itemised(row, model: cost_lib.CostModel, gamma: int) -> dict:
    """A stored row's counted calls priced at batch 1, decode only, by model
    (``CostModel.itemise``; ``model.models`` prices each drafter by name): every
    target call is a round, a scoring call of K = G + 1 tokens plus the
    per-round overhead; the drafters' K = 1 calls by their own median, the rest
    by the fit a + b K on the tokens they fed."""
    names = list(row["drafter_calls"])
    counts = {"target_calls": row["target_calls"],
              "target_fed": (gamma + 1) * row["target_calls"], "target_single_calls": 0,
              **{f"drafter_{key}_by_model": [row[f"drafter_{stored}"][n] for n in names]
                 for key, stored in (("calls", "calls"), ("tokens", "fed"),
                                     ("single_calls", "single"))}}
    return model.itemise(counts, drafters=names, widths={cost_lib.TARGET: gamma + 1},
                         rounds=row["target_calls"])


def drafting_seconds(row, models: dict[str, cost_lib.CallCost]) -> float:
    """The drafters' calls priced at batch 1 (``itemised``)."""
    model = cost_lib.CostModel(target=models["target"], drafter=models["target"], models=models)
    return sum(itemised(row, model, 0)[name] for name in row["drafter_calls"])


def predicted_seconds(row, model: cost_lib.CostModel, models: dict[str, cost_lib.CallCost],
                      gamma: int) -> float:
    """Counted calls priced by the cost model (``itemised``, all of it)."""
    return sum(itemised(row, dataclasses.replace(model, models=models), gamma).values())


def ewif(alpha: float, cost_ratio: float, gamma: int) -> float:
    """Chen et al.'s expected walltime improvement factor under i.i.d. acceptance."""
    return cost_lib.tokens_per_round(alpha, gamma) / (cost_ratio * gamma + 1)


def summarize(name, rows, gamma, costs, param_counts, spec):
    model, models = cost_model(costs)
    eff = [r["tokens"] / r["target_calls"] for r in rows]
    tokens = sum(r["tokens"] for r in rows)
    t_calls = sum(r["target_calls"] for r in rows)
    d_calls = {n: sum(r["drafter_calls"][n] for r in rows) for n in rows[0]["drafter_calls"]}
    p_t = param_counts["target"]
    cost_params = t_calls * p_t + sum(c * param_counts[n] for n, c in d_calls.items())
    ar_latency = model.target.call_s(1)
    per_prompt_swi = [r["tokens"] * ar_latency / predicted_seconds(r, model, models, gamma)
                      for r in rows]
    # EWIF, Chen et al.'s horizontal form sum_i prod_{j<=i} alpha_j / (1 + sum_i c_i):
    # with measured per-position acceptances the numerator is the measured
    # tokens per round, the denominator one target step (K = 1, the paper's
    # assumption) plus the round's drafting cost in target steps.
    drafting_s = sum(drafting_seconds(r, models) for r in rows)
    out = {"name": name, "draft": spec, "gamma": gamma, "prompts": len(rows),
           "tokens": tokens, "target_calls": t_calls, "drafter_calls": d_calls,
           "tokens_per_target_call": tables.mean_ci(eff),
           "swi_params": tokens * p_t / cost_params,
           "swi_latency": tables.mean_ci(per_prompt_swi),
           "drafting_cost_per_round": drafting_s / t_calls / ar_latency,
           "ewif": tokens / t_calls / (1 + drafting_s / t_calls / ar_latency)}
    if not d_calls or name.startswith("sd-"):
        # The closed form under i.i.d. acceptance (Chen et al.); rows cut at EOS
        # can leave the mean a hair outside [1, G + 1].
        per_round = min(max(tokens / t_calls, 1.0), gamma + 1.0)
        alpha = cost_lib.acceptance_for_tokens_per_round(per_round, gamma)
        c = model.drafter.call_s(1) / ar_latency if d_calls else 0.0
        out.update(acceptance_rate=alpha, cost_ratio=c, ewif_iid=ewif(alpha, c, gamma))
    return out


def wallclock_agreement(report: dict) -> dict | None:
    """The cost model against the measured wall clock, at batch 1 on the
    wall-clock prompts, one point per (greedy configuration, prompt): the
    prompt's counted calls priced (``predicted_seconds``) plus every model's
    prefill of the padded prompt, against its measured seconds
    (``cost.agreement_stats``: Pearson r, mean bias). None before both the
    greedy and the wall-clock phases ran."""
    wall, greedy, costs = (report.get(k) for k in ("wallclock", "greedy", "costs"))
    if not (wall and greedy and costs):
        return None
    model, models = cost_model(costs)
    width = report.get("wallclock_width", 0)  # reports stored before it: prefill unpriced
    predicted, measured = [], []
    for name, stored in greedy.items():
        timed = wall.get(name)
        if not timed:
            continue
        rows = {r["prompt"]: r for r in stored["rows"]}
        prefill = model.target.prefill(width) + sum(
            models[n].prefill(width) for n in stored["drafter_calls"])
        for i, per_token in enumerate(timed["seconds_per_token"]):
            row = rows.get(i)
            if row is None:  # a prompt the greedy phase did not count
                continue
            predicted.append(prefill + predicted_seconds(row, model, models, stored["gamma"]))
            # reports stored before the seconds were kept: the counted row's tokens
            measured.append(timed["seconds"][i] if "seconds" in timed
                            else per_token * row["tokens"])
    return cost_lib.agreement_stats(predicted, measured)


def build(config, target, models, vocab, configs, method="specdecode", draft_next_q=None,
          max_new_tokens=128, eos=()):
    spec, k_matrix, gamma = configs[config]
    drafter = drafting.make_drafter(spec, models=models, vocab_size=vocab, k_matrix=k_matrix)
    gamma = api.resolve_gamma(drafter, gamma)
    decoder = SpeculativeDecoder(target=target, drafter=drafter, target_fn=get_target(method),
                                 gamma=gamma, max_new_tokens=max_new_tokens,
                                 eos_ids=tuple(eos), draft_next_q=draft_next_q)
    return decoder, gamma




def agreement_line(report: dict) -> str | None:
    stats = wallclock_agreement(report)
    if stats is None or not stats["n"]:
        return None
    overhead = report["costs"].get("round_overhead")
    overhead_text = (f"per-round overhead {1e3 * overhead['round_overhead_s']:.2f} ms "
                     f"(calibrated at G = {overhead['gamma']})" if overhead
                     else "no per-round overhead: the report predates its calibration")
    prefill = ("prefill priced" if "wallclock_width" in report
               and "prefill_per_token_s" in report["costs"]["target"]
               else "prefill unpriced: the report predates it")
    pearson = "–" if stats["pearson"] is None else f"{stats['pearson']:.3f}"
    return (f"Cost model (per-call latency by width, {overhead_text}, {prefill}) vs "
            f"measured wall clock at batch 1 over {stats['n']} (configuration, prompt) points: "
            f"Pearson r = {pearson}, mean bias (predicted - measured) = "
            f"{stats['mean_bias']:+.3f} s, mean ratio measured / predicted = "
            f"{stats['mean_ratio']:.3f}.")


def markdown(report: dict) -> str:
    """Chen et al.'s Table 2 layout: one row per (temperature, configuration),
    summaries recomputed from the stored per-prompt rows; then the cost
    model's agreement with the wall clock."""
    wall = report.get("wallclock", {})
    ar = wall.get("ar")
    rows = [(0, "autoregressive", "–", "–", 1, 1, 1, "–", "–", f"{ar['tokens_per_s']:.2f}", 1)
            ] if ar else []
    for section, temp in (("greedy", 0), ("t1", 1)):
        for name, stored in report.get(section, {}).items():
            r = summarize(name, stored["rows"], stored["gamma"], report["costs"],
                          report["param_counts"], stored["draft"])
            per_token = sum(r["drafter_calls"].values()) / r["tokens"]
            w = wall.get(name) if temp == 0 else None
            speed = ((f"{w['tokens_per_s']:.2f}", f"{1 / w['over_ar'][0]:.2f}x")
                     if w else ("–", "–"))
            ewif_text = f"{r['ewif']:.2f}" + (f" ({r['ewif_iid']:.2f})" if "ewif_iid" in r
                                               else "")
            rows.append((temp, name, r["draft"], r["gamma"],
                         tables.format_ci(*r["tokens_per_target_call"], digits=2),
                         f"{r['swi_params']:.2f}", tables.format_ci(*r["swi_latency"], digits=2),
                         ewif_text, f"{per_token:.2f}", *speed))
    lines = tables.markdown_table(
        ("T", "configuration", "drafters", "G", "tokens / target call", "SWI (params)",
         "SWI (latency)", "EWIF (i.i.d.)", "0.5B calls / token", "batch-1 tokens/s",
         "wall-clock speedup"), rows)
    extra = wall.get("sd-g7-with-step-g+1")
    if extra and "sd-g7" in wall:
        lines.append("")
        lines.append(f"Skipping the drafter's (G+1)-th step (sd-g7, batch 1, interleaved): "
                     f"round {wall['sd-g7']['round_s']:.3f} s vs "
                     f"{extra['round_s']:.3f} s with the step "
                     f"({100 * (wall['sd-g7']['round_s'] / extra['round_s'] - 1):+.1f}%).")
    agreement = agreement_line(report)
    if agreement:
        lines += ["", agreement]
    return "\n".join(lines)


def _check(*, phases, configs, num_prompts, max_new_tokens, batch_size, wallclock_prompts,
           t1_configs, overhead_gamma, cost_widths, cost_repeats, out) -> dict:
    """Every argument checked before a model loads; returns the stored report."""
    shared.check_choices("phases", phases, PHASES)
    if "report" in phases and phases != ["report"]:
        raise ValueError(f"phases={phases}: 'report' prints the stored report's table and runs "
                         "nothing; give it alone, phases = ['report'].")
    shared.check_choices("configs", configs, tuple(CONFIG_SPECS))
    shared.check_at_least(1, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                          batch_size=batch_size, wallclock_prompts=wallclock_prompts,
                          t1_configs=t1_configs, overhead_gamma=overhead_gamma,
                          cost_widths=cost_widths, cost_repeats=cost_repeats)
    if 1 not in cost_widths or not any(w >= 2 for w in cost_widths):
        raise ValueError(f"cost_widths must include 1 and a width >= 2, got {cost_widths}.")
    shared.check_humaneval_prompts(num_prompts=num_prompts)
    report = shared.read_report(out) if os.path.exists(out) else {}
    if phases == ["report"] and not report:
        raise ValueError(f"phases = ['report'] prints the table of {out}, which does not exist; "
                         "run the benchmark first or set OUT_PATH to a stored report.")
    if {"greedy", "t1"} & set(phases) and "costs" not in phases and "costs" not in report:
        raise ValueError(f"phases {phases} price the counted calls, but {out} holds no costs; "
                         "add the 'costs' phase.")
    return report


def run_bench_drafting(*, target: str = "qwen2.5-coder-1.5b", drafter: str = DRAFTER,
                       num_prompts: int = 40, max_new_tokens: int = 128, batch_size: int = 10,
                       wallclock_prompts: int = 3, configs: Sequence[str] = tuple(CONFIG_SPECS),
                       t1_configs: int = 3, phases: Sequence[str] = DEFAULT_PHASES,
                       out: str = "results/bench_drafting.json",
                       markdown_path: str | None = None,
                       bigram_table: str = "qwen2.5-coder", overhead_gamma: int = 7,
                       cost_widths: Sequence[int] = COST_WIDTHS, cost_repeats: int = 5) -> dict:
    """Runs (or resumes) the phases into ``out`` and prints the Markdown table
    (also written to ``markdown_path`` if given).

    ``phases``: ``costs`` (per-call latencies of both models and the per-round
    overhead, calibrated at G = ``overhead_gamma``), ``greedy`` (counted runs
    of ``configs``), ``ar`` (greedy autoregressive outputs: every greedy
    configuration must reproduce them), ``wallclock`` (batch 1 on the first
    ``wallclock_prompts`` prompts), ``t1`` (T = 1 runs of the best SD config
    and the best ``t1_configs - 1`` cascades by greedy SWI (latency)), or
    ``report`` alone: the table of the stored ``out`` (plain or ``.gz``).
    ``bigram_table``: Max-Gram's table (a ``bigram.TABLES`` name or a file).
    """
    phases, configs, cost_widths = list(phases), list(configs), tuple(cost_widths)
    report = _check(phases=phases, configs=configs, num_prompts=num_prompts,
                    max_new_tokens=max_new_tokens, batch_size=batch_size,
                    wallclock_prompts=wallclock_prompts, t1_configs=t1_configs,
                    overhead_gamma=overhead_gamma, cost_widths=cost_widths,
                    cost_repeats=cost_repeats, out=out)
    if phases == ["report"]:
        timing.print_markdown(markdown(report), markdown_path)
        return report
    report.setdefault("environment", timing.environment())
    report["precision"] = precision.resolve_dtype("auto")
    report["protocol"] = {"num_prompts": num_prompts, "max_new_tokens": max_new_tokens,
                          "batch_size": batch_size, "wallclock_prompts": wallclock_prompts}
    save = lambda: shared.write_report(report, out)  # noqa: E731
    all_configs = configurations(drafter)

    pair = load_pair(target=target, drafter=drafter)
    target_model, target_params = pair.target, pair.target_params
    drafter_model, drafter_params = pair.drafter, pair.drafter_params
    table = jnp.asarray(bigram.load_table(bigram_table, target_model.vocab_size))
    models = {drafter: drafter_model}
    named = {drafter: drafter_params, "mag": table}
    count = lambda tree: int(sum(x.size for x in jax.tree_util.tree_leaves(tree)))  # noqa: E731
    param_counts = {"target": count(target_params), drafter: count(drafter_params)}
    report["param_counts"] = param_counts
    prompts = shared.humaneval_prompts(pair.encode, num_prompts)
    width = max(len(p) for p in prompts)
    # The length every decoder of the library makes for this room, so one prefill
    # serves them all.
    max_length = required_cache_length(width, max_new_tokens, SLACK)
    eos = pair.eos_ids

    if "costs" in phases:
        if "costs" not in report:
            fill = int(np.median([len(p) for p in prompts])) + max_new_tokens // 2
            report["costs"] = {
                "fill": fill,
                "target": call_latency(target_model, target_params, fill, cost_widths,
                                       cost_repeats),
                drafter: call_latency(drafter_model, drafter_params, fill, cost_widths,
                                      cost_repeats)}
            save()
        if "round_overhead" not in report["costs"]:  # reports stored before it get it too
            uncalibrated, _ = cost_model(report["costs"])
            report["costs"]["round_overhead"] = calibration.measure_round_overhead(
                dataclasses.replace(uncalibrated, round_overhead_s=0.0), target=target_model,
                target_params=target_params, drafter=drafter_model,
                drafter_params=drafter_params, context=report["costs"]["fill"],
                gamma=overhead_gamma, repeats=cost_repeats)
            save()
    costs = report.get("costs")

    caches = None
    if {"greedy", "t1"} & set(phases):
        caches = prefill_caches({"target": target_model, drafter: drafter_model},
                                {"target": target_params, drafter: drafter_params},
                                prompts, max_length)

    def counted(section, config, temperature, seed=0):
        results = report.setdefault(section, {})
        if config in results:
            return
        decoder, gamma = build(config, target_model, models, target_model.vocab_size,
                               all_configs, max_new_tokens=max_new_tokens, eos=eos)
        start = time.perf_counter()
        rows, compile_s = run_counted(decoder, named, target_params, caches, prompts, width,
                                      max_length, temperature, batch_size, seed)
        summary = summarize(config, rows, gamma, costs, param_counts, all_configs[config][0])
        summary.update(compile_s=compile_s, run_s=time.perf_counter() - start,
                       temperature=temperature, rows=rows)
        results[config] = summary
        print(json.dumps({k: v for k, v in summary.items() if k != "rows"}), flush=True)
        save()

    if "greedy" in phases:
        for config in tqdm(configs, desc="greedy configs"):
            counted("greedy", config, 0.0)

    if "ar" in phases and "ar_greedy" not in report:
        # Greedy autoregressive target decoding of the same prompts: every greedy
        # configuration must reproduce it token for token (lossless drafting).
        fn = api.make_generate_fn(target=target_model, method="autoregressive",
                                  max_new_tokens=max_new_tokens, eos_ids=tuple(eos))
        sp = api.sampling_params(temperature=0.0)
        outputs = {}
        order = np.argsort([len(p) for p in prompts], kind="stable")
        for start in tqdm(range(0, len(prompts), batch_size), desc="autoregressive"):
            idx = list(order[start:start + batch_size])
            idx += [idx[-1]] * (batch_size - len(idx))
            out_ = fn(target_params, None, make_prompt([prompts[i] for i in idx], pad_to=width),
                      jax.random.PRNGKey(0), sp)
            for row, i in enumerate(idx):
                outputs[int(i)] = np.asarray(out_.tokens[row, : out_.lengths[row]]).tolist()
        report["ar_greedy"] = {"outputs": [outputs[i] for i in range(len(prompts))]}
        report["ar_greedy"]["mismatching_prompts"] = {
            name: [r["prompt"] for r in v["rows"] if r["output"] != outputs[r["prompt"]]]
            for name, v in report.get("greedy", {}).items()}
        print(json.dumps(report["ar_greedy"]["mismatching_prompts"]), flush=True)
        save()

    if "wallclock" in phases and "wallclock" not in report:
        subset = prompts[:wallclock_prompts]
        sub_width = max(len(p) for p in subset)
        decoders = {"ar": api.make_decoder(target=target_model, method="autoregressive",
                                           max_new_tokens=max_new_tokens, eos_ids=tuple(eos))}
        for config in configs:
            decoders[config] = build(config, target_model, models, target_model.vocab_size,
                                     all_configs, max_new_tokens=max_new_tokens, eos=eos)[0]
        decoders["sd-g7-with-step-g+1"] = build(
            "sd-g7", target_model, models, target_model.vocab_size, all_configs,
            draft_next_q=True, max_new_tokens=max_new_tokens, eos=eos)[0]

        def generate_fn(decoder):
            # Every function takes the same (target params, named params): each
            # picks its own drafter params inside, so nothing is baked in.
            select = getattr(getattr(decoder, "drafter", None), "select_params",
                             lambda named: None)
            return jax.jit(lambda tp, nm, pr, key, sp: decoder.generate(tp, select(nm), pr,
                                                                        key, sp))

        fns = {label: generate_fn(decoder) for label, decoder in decoders.items()}
        timed = shared.wallclock(fns, (target_params, named), subset, sub_width, 0, 0.0)
        ar = np.asarray(timed["ar"]["seconds_per_token"])
        report["wallclock_width"] = sub_width  # the padded prompt every timed call prefilled
        report["wallclock"] = {label: {
            "seconds_per_token": v["seconds_per_token"], "seconds": v["seconds"],
            "round_s": v["round_s"],
            "over_ar": tables.mean_ci(np.asarray(v["seconds_per_token"]) / ar),
            "tokens_per_s": float(1 / np.mean(v["seconds_per_token"]))}
            for label, v in timed.items()}
        save()

    if "t1" in phases and "greedy" in report:
        greedy = report["greedy"]
        sd = sorted((c for c in greedy if c.startswith("sd-")),
                    key=lambda c: -greedy[c]["swi_latency"][0])[:1]
        cs = sorted((c for c in greedy if not c.startswith(("sd-", "mag"))),
                    key=lambda c: -greedy[c]["swi_latency"][0])[: t1_configs - 1]
        for config in tqdm(sd + cs, desc="T=1 configs"):
            counted("t1", config, 1.0)
    agreement = wallclock_agreement(report)
    if agreement is not None:
        report["cost_model_agreement"] = agreement
        save()
    print(f"wrote {out}")
    if "costs" in report and "param_counts" in report:
        timing.print_markdown(markdown(report), markdown_path)
    return report
