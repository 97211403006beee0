"""Cascade Speculative Drafting vs speculative decoding on a real pair, in the
layout of Chen et al.'s Table 2 (Qwen2.5-Coder 1.5B target, 0.5B drafter,
Max-Gram with the stdlib bigram table; HumanEval prompts).

Figures, per configuration:
* counted: target calls, 0.5B calls and tokens fed, tokens emitted, for every
  prompt (efficiency runs are batched: rows are independent, greedy rows are
  deterministic); mean tokens per target call with a 95% normal CI over prompts;
* SWI (standardized walltime improvement, Chen et al. §5): autoregressive cost
  over the counted cost, with each call priced (a) by parameter count and
  (b) by per-call latency measured on this machine at batch 1 (a least-squares
  fit t(K) = a + b K over K tokens fed, inside jit);
* EWIF predicted from the measured acceptance rate and cost ratio (plain
  speculative decoding and Max-Gram; Chen et al.);
* wall clock at batch 1 on a subset, prefill included, every configuration
  timed interleaved prompt by prompt (rotating order), over autoregressive.
Plus the round time of speculative decoding (G = 7) with and without the
drafter's (G+1)-th step (``draft_next_q``), timed the same way.

Every prompt is prefilled once per model (target and 0.5B) and shared by all
configurations. Results go to ``--out`` after every configuration; a rerun
skips what the JSON already has (resumable).

    python eval/bench_drafting.py                         # the issue's protocol
    python eval/bench_drafting.py --num-prompts 2 --max-new-tokens 16 --smoke
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from bench_verifiers import mean_ci, wallclock

from specdec_jax import api, drafting
from specdec_jax.checkpoints.load import load_for_decoding
from specdec_jax.data import bigram, humaneval
from specdec_jax.decoding import Prefilled, SpeculativeDecoder, initial_history
from specdec_jax.drafting.base import start_token_and_prefill
from specdec_jax.drafting.cascade import HorizontalCascade, VerticalCascade, VerticalState
from specdec_jax.drafting.model import ModelDrafter, ModelDrafterState
from specdec_jax.jobs.cost import measure_call_cost
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm
from specdec_jax.targets import get_target

DRAFTER = "qwen2.5-coder-0.5b"
# name -> (draft spec, K-matrix or None, gamma or None)
CONFIGS = {
    "sd-g7": (DRAFTER, None, 7),
    "csd-[[2,10],[0,10]]": (f"{DRAFTER}+mag", [[2, 10], [0, 10]], None),
    "vertical-[[6,0],[0,10]]": (f"{DRAFTER}+mag", [[6, 0], [0, 10]], None),
    "horizontal-[[4,6],[0,0]]": (f"{DRAFTER}+mag", [[4, 6], [0, 0]], None),
    "mag-g6": ("mag", None, 6),
    "csd-[[4,4],[0,4]]": (f"{DRAFTER}+mag", [[4, 4], [0, 4]], None),
    "sd-g5": (DRAFTER, None, 5),
}
SLACK = 64  # cache positions beyond prompt + output: any config's gamma and cascade slack


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--num-prompts", type=int, default=40)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--wallclock-prompts", type=int, default=3)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--t1-configs", type=int, default=3,
                   help="T = 1 runs: the best SD config and the best CS configs (this many "
                        "in all), chosen by greedy SWI (latency)")
    p.add_argument("--phases", nargs="+", default=["costs", "greedy", "wallclock", "t1"],
                   choices=["costs", "greedy", "ar", "wallclock", "t1", "report"],
                   help="'report' alone prints the Markdown table of --out")
    p.add_argument("--smoke", action="store_true", help="tiny run: check the pipeline")
    p.add_argument("--out", default="results/bench_drafting.json")
    return p.parse_args(argv)


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
# Costs
# ---------------------------------------------------------------------------

def call_latency(model, params, fill, ks=(1, 2, 3, 4, 6, 8, 13, 16), repeats=5):
    """Seconds of one ``extend`` of K tokens at batch 1 with ``fill`` tokens in
    the cache (``evaluation.cost.measure_call_cost``: steps inside a jitted
    loop), as this benchmark's report stores them: the medians and the fit
    t(K) = a + b K over K >= 2 (K = 1 is priced by its own median)."""
    cost, medians = measure_call_cost(model, params, context=fill, widths=ks, repeats=repeats)
    return {"a_s": cost.base_s, "b_s": cost.per_token_s, "k1_s": cost.single_s,
            "median_s": {str(k): v for k, v in medians.items()}}


def latency_at(cost, k: int) -> float:
    """Measured latency of a K-token call (interpolated between measured K)."""
    ks = sorted(int(x) for x in cost["median_s"])
    return float(np.interp(k, ks, [cost["median_s"][str(x)] for x in ks]))


def drafting_seconds(row, costs):
    """The drafters' calls priced at batch 1: K = 1 calls by their own median,
    the rest by the fit a + b K on the tokens they fed."""
    total = 0.0
    for name, calls in row["drafter_calls"].items():
        c, single = costs[name], row["drafter_single"][name]
        total += single * c["k1_s"] + (calls - single) * c["a_s"] + \
            (row["drafter_fed"][name] - single) * c["b_s"]
    return total


def predicted_seconds(row, costs, gamma):
    """Counted calls priced by the measured latencies (decode only, batch 1);
    target calls at K = G + 1."""
    return row["target_calls"] * latency_at(costs["target"], gamma + 1) + \
        drafting_seconds(row, costs)


def acceptance_rate(tokens_per_round: float, gamma: int) -> float:
    """alpha with (1 - alpha^(G+1)) / (1 - alpha) = tokens per round (bisection)."""
    lo, hi = 0.0, 1.0 - 1e-9
    for _ in range(100):
        mid = (lo + hi) / 2
        value = (1 - mid ** (gamma + 1)) / (1 - mid)
        lo, hi = (mid, hi) if value < tokens_per_round else (lo, mid)
    return (lo + hi) / 2


def ewif(alpha: float, cost_ratio: float, gamma: int) -> float:
    return (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (cost_ratio * gamma + 1))


def summarize(name, rows, gamma, costs, param_counts, spec):
    eff = [r["tokens"] / r["target_calls"] for r in rows]
    tokens = sum(r["tokens"] for r in rows)
    t_calls = sum(r["target_calls"] for r in rows)
    d_calls = {n: sum(r["drafter_calls"][n] for r in rows) for n in rows[0]["drafter_calls"]}
    p_t = param_counts["target"]
    cost_params = t_calls * p_t + sum(c * param_counts[n] for n, c in d_calls.items())
    ar_latency = costs["target"]["k1_s"]
    per_prompt_swi = [r["tokens"] * ar_latency / predicted_seconds(r, costs, gamma)
                      for r in rows]
    # EWIF, Chen et al.'s horizontal form sum_i prod_{j<=i} alpha_j / (1 + sum_i c_i):
    # with measured per-position acceptances the numerator is the measured
    # tokens per round, the denominator one target step (K = 1, the seed's
    # assumption) plus the round's drafting cost in target steps.
    drafting = sum(drafting_seconds(r, costs) for r in rows)
    out = {"name": name, "draft": spec, "gamma": gamma, "prompts": len(rows),
           "tokens": tokens, "target_calls": t_calls, "drafter_calls": d_calls,
           "tokens_per_target_call": mean_ci(eff),
           "swi_params": tokens * p_t / cost_params,
           "swi_latency": mean_ci(per_prompt_swi),
           "drafting_cost_per_round": drafting / t_calls / ar_latency,
           "ewif": tokens / t_calls / (1 + drafting / t_calls / ar_latency)}
    if not d_calls or name.startswith("sd-"):
        # The closed form under i.i.d. acceptance (Chen et al.).
        alpha = acceptance_rate(tokens / t_calls, gamma)
        c = costs[DRAFTER]["k1_s"] / ar_latency if d_calls else 0.0
        out.update(acceptance_rate=alpha, cost_ratio=c, ewif_iid=ewif(alpha, c, gamma))
    return out


def build(config, target, models, vocab, method="specdecode", draft_next_q=None,
          max_new_tokens=128, eos=()):
    spec, k_matrix, gamma = CONFIGS[config]
    drafter = drafting.make_drafter(spec, models=models, vocab_size=vocab, k_matrix=k_matrix)
    gamma = api.resolve_gamma(drafter, gamma)
    decoder = SpeculativeDecoder(target=target, drafter=drafter, target_fn=get_target(method),
                                 gamma=gamma, max_new_tokens=max_new_tokens,
                                 eos_ids=tuple(eos), draft_next_q=draft_next_q)
    return decoder, gamma


def _pm(mean_half, digits=2) -> str:
    mean, half = mean_half
    return f"{mean:.{digits}f}" if not math.isfinite(half) else \
        f"{mean:.{digits}f} ± {half:.{digits}f}"


def markdown(report: dict) -> str:
    """Seed 001 Table 2 layout: one row per (temperature, configuration),
    summaries recomputed from the stored per-prompt rows."""
    wall = report.get("wallclock", {})
    lines = ["| T | configuration | drafters | G | tokens / target call | SWI (params) | "
             "SWI (latency) | EWIF (i.i.d.) | 0.5B calls / token | batch-1 tokens/s | wall-clock "
             "speedup |", "|" + "---|" * 11]
    ar = wall.get("ar")
    if ar:
        lines.append(f"| 0 | autoregressive | – | – | 1 | 1 | 1 | – | – | "
                     f"{ar['tokens_per_s']:.2f} | 1 |")
    for section, temp in (("greedy", 0), ("t1", 1)):
        for name, stored in report.get(section, {}).items():
            r = summarize(name, stored["rows"], stored["gamma"], report["costs"],
                          report["param_counts"], stored["draft"])
            per_token = sum(r["drafter_calls"].values()) / r["tokens"]
            w = wall.get(name) if temp == 0 else None
            speed = (f"{w['tokens_per_s']:.2f} | {1 / w['over_ar'][0]:.2f}x"
                     if w else "– | –")
            ewif_text = f"{r['ewif']:.2f}" + (f" ({r['ewif_iid']:.2f})" if "ewif_iid" in r
                                               else "")
            lines.append(f"| {temp} | {name} | {r['draft']} | {r['gamma']} | "
                         f"{_pm(r['tokens_per_target_call'])} | {r['swi_params']:.2f} | "
                         f"{_pm(r['swi_latency'])} | {ewif_text} | ")
            lines[-1] += f"{per_token:.2f} | {speed} |"
    extra = wall.get("sd-g7-with-step-g+1")
    if extra and "sd-g7" in wall:
        lines.append("")
        lines.append(f"Skipping the drafter's (G+1)-th step (sd-g7, batch 1, interleaved): "
                     f"round {wall['sd-g7']['round_s']:.3f} s vs "
                     f"{extra['round_s']:.3f} s with the step "
                     f"({100 * (wall['sd-g7']['round_s'] / extra['round_s'] - 1):+.1f}%).")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    report = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            report = json.load(f)
    if args.phases == ["report"]:
        print(markdown(report))
        return 0
    report.setdefault("environment", timing.environment())
    report["precision"] = "float32"
    report["protocol"] = {k: getattr(args, k) for k in (
        "num_prompts", "max_new_tokens", "batch_size", "wallclock_prompts")}
    save = lambda: timing.write_report(report, args.out)

    target, target_params, tok = load_for_decoding(args.target)
    drafter_model, drafter_params, _ = load_for_decoding(DRAFTER)
    table = jnp.asarray(bigram.load_table("qwen2.5-coder", target.vocab_size))
    models = {DRAFTER: drafter_model}
    named = {DRAFTER: drafter_params, "mag": table}
    count = lambda tree: int(sum(x.size for x in jax.tree_util.tree_leaves(tree)))
    param_counts = {"target": count(target_params), DRAFTER: count(drafter_params)}
    report["param_counts"] = param_counts
    prompts = [tok.encode(p) for p in humaneval.load_prompts(args.num_prompts)]
    width = max(len(p) for p in prompts)
    max_length = width + args.max_new_tokens + SLACK
    eos = tok.eos_token_ids

    if "costs" in args.phases and "costs" not in report:
        fill = int(np.median([len(p) for p in prompts])) + args.max_new_tokens // 2
        report["costs"] = {"fill": fill,
                           "target": call_latency(target, target_params, fill),
                           DRAFTER: call_latency(drafter_model, drafter_params, fill)}
        save()
    costs = report.get("costs")

    caches = None
    if {"greedy", "t1"} & set(args.phases):
        caches = prefill_caches({"target": target, DRAFTER: drafter_model},
                                {"target": target_params, DRAFTER: drafter_params},
                                prompts, max_length)

    def counted(section, config, temperature, seed=0):
        results = report.setdefault(section, {})
        if config in results:
            return
        decoder, gamma = build(config, target, models, target.vocab_size,
                               max_new_tokens=args.max_new_tokens, eos=eos)
        start = time.perf_counter()
        rows, compile_s = run_counted(decoder, named, target_params, caches, prompts, width,
                                      max_length, temperature, args.batch_size, seed)
        summary = summarize(config, rows, gamma, costs, param_counts, CONFIGS[config][0])
        summary.update(compile_s=compile_s, run_s=time.perf_counter() - start,
                       temperature=temperature, rows=rows)
        results[config] = summary
        print(json.dumps({k: v for k, v in summary.items() if k != "rows"}), flush=True)
        save()

    if "greedy" in args.phases:
        for config in tqdm(args.configs, desc="greedy configs"):
            counted("greedy", config, 0.0)

    if "ar" in args.phases and "ar_greedy" not in report:
        # Greedy autoregressive target decoding of the same prompts: every greedy
        # configuration must reproduce it token for token (lossless drafting).
        fn = api.make_generate_fn(target=target, method="autoregressive",
                                  max_new_tokens=args.max_new_tokens, eos_ids=tuple(eos))
        sp = api.sampling_params(temperature=0.0)
        outputs = {}
        order = np.argsort([len(p) for p in prompts], kind="stable")
        for start in tqdm(range(0, len(prompts), args.batch_size), desc="autoregressive"):
            idx = list(order[start:start + args.batch_size])
            idx += [idx[-1]] * (args.batch_size - len(idx))
            out = fn(target_params, None, make_prompt([prompts[i] for i in idx], pad_to=width),
                     jax.random.PRNGKey(0), sp)
            for row, i in enumerate(idx):
                outputs[int(i)] = np.asarray(out.tokens[row, : out.lengths[row]]).tolist()
        report["ar_greedy"] = {"outputs": [outputs[i] for i in range(len(prompts))]}
        report["ar_greedy"]["mismatching_prompts"] = {
            name: [r["prompt"] for r in v["rows"] if r["output"] != outputs[r["prompt"]]]
            for name, v in report.get("greedy", {}).items()}
        print(json.dumps(report["ar_greedy"]["mismatching_prompts"]), flush=True)
        save()

    if "wallclock" in args.phases and "wallclock" not in report:
        subset = prompts[: args.wallclock_prompts]
        sub_width = max(len(p) for p in subset)
        decoders = {"ar": api.make_decoder(target=target, method="autoregressive",
                                           max_new_tokens=args.max_new_tokens,
                                           eos_ids=tuple(eos))}
        for config in args.configs:
            decoders[config] = build(config, target, models, target.vocab_size,
                                     max_new_tokens=args.max_new_tokens, eos=eos)[0]
        decoders["sd-g7-with-step-g+1"] = build(
            "sd-g7", target, models, target.vocab_size, draft_next_q=True,
            max_new_tokens=args.max_new_tokens, eos=eos)[0]

        def generate_fn(decoder):
            # Every function takes the same (target params, named params): each
            # picks its own drafter params inside, so nothing is baked in.
            select = getattr(getattr(decoder, "drafter", None), "select_params",
                             lambda named: None)
            return jax.jit(lambda tp, nm, pr, key, sp: decoder.generate(tp, select(nm), pr,
                                                                        key, sp))

        fns = {label: generate_fn(decoder) for label, decoder in decoders.items()}
        timed = wallclock(fns, (target_params, named), subset, sub_width, 0, 0.0)
        ar = np.asarray(timed["ar"]["seconds_per_token"])
        report["wallclock"] = {label: {
            "seconds_per_token": v["seconds_per_token"], "round_s": v["round_s"],
            "over_ar": mean_ci(np.asarray(v["seconds_per_token"]) / ar),
            "tokens_per_s": float(1 / np.mean(v["seconds_per_token"]))}
            for label, v in timed.items()}
        save()

    if "t1" in args.phases and "greedy" in report:
        greedy = report["greedy"]
        sd = sorted((c for c in greedy if c.startswith("sd-")),
                    key=lambda c: -greedy[c]["swi_latency"][0])[:1]
        cs = sorted((c for c in greedy if not c.startswith(("sd-", "mag"))),
                    key=lambda c: -greedy[c]["swi_latency"][0])[: args.t1_configs - 1]
        for config in tqdm(sd + cs, desc="T=1 configs"):
            counted("t1", config, 1.0)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
