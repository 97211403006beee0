"""Token vs block verification on a real pair, in the layout of seed 002's Table 2.

Block efficiency (tokens per target call) is measured per (prompt, seed) unit
over many prompts and seeds, with batched generation (efficiency does not
depend on batching; every row is an independent sample). Wall clock is
measured at batch 1, normalised by autoregressive target decoding in the same
run. 95% confidence intervals are normal intervals over units; improvements
are paired (same prompt and seed) differences. The verification kernel's
share of a round is its jitted time on [1, G, V] inputs over the measured
round time.

    python eval/bench_verifiers.py --num-prompts 50 --seeds 0 1 2 --gammas 4 6 8
"""

from __future__ import annotations

import argparse
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from specdec_jax import api, timing
from specdec_jax.checkpoints.load import load_model
from specdec_jax.data import humaneval
from specdec_jax.models.interface import make_prompt

VERIFIERS = ("token", "block", "block-seed")
Z95 = 1.959964


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--drafter", default="qwen2.5-coder-0.5b")
    p.add_argument("--num-prompts", type=int, default=50)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--gammas", type=int, nargs="+", default=[4, 6, 8])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=10, help="rows per efficiency batch")
    p.add_argument("--wallclock-prompts", type=int, default=5,
                   help="prompts timed at batch 1 (per seed) for wall clock")
    p.add_argument("--out", default="results/bench_verifiers.json")
    return p.parse_args(argv)


def mean_ci(values) -> tuple[float, float]:
    values = np.asarray(values, np.float64)
    half = Z95 * values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return float(values.mean()), float(half)


def efficiency_units(fn, params, prompts, width, seeds, temperature, batch_size):
    """Block efficiency of every (prompt, seed) unit, in batched runs."""
    sp = api.sampling_params(temperature=temperature)
    units = [(i, s) for s in seeds for i in range(len(prompts))]
    batches = [units[i:i + batch_size] for i in range(0, len(units), batch_size)]
    compiled = None
    eff = {}
    for n, batch in enumerate(batches):
        rows = [prompts[i] for i, _ in batch]
        rows += [rows[-1]] * (batch_size - len(rows))
        prompt = make_prompt(rows, pad_to=width)
        # One key per batch; rows within a batch draw independent randomness.
        key = jax.random.PRNGKey(1000 * batch[0][1] + n)
        if compiled is None:
            compiled = timing.Compiled(fn, *params, prompt, key, sp)
        out = compiled.time(*params, prompt, key, sp).output
        lengths = np.asarray(out.lengths)
        calls = np.asarray(out.stats.target_calls)
        for row, unit in enumerate(batch):
            eff[unit] = lengths[row] / calls[row]
    return [eff[u] for u in units]


def wallclock(fn, params, prompts, width, seeds, temperature):
    sp = api.sampling_params(temperature=temperature)
    compiled = timing.Compiled(fn, *params, make_prompt([prompts[0]], pad_to=width),
                               jax.random.PRNGKey(0), sp)
    seconds, tokens, calls = 0.0, 0, 0
    for seed in seeds:
        for i, p in enumerate(prompts):
            timed = compiled.time(*params, make_prompt([p], pad_to=width),
                                  jax.random.PRNGKey(1000 * seed + i), sp)
            seconds += timed.median_s
            tokens += int(timed.output.lengths[0])
            calls += int(timed.output.stats.target_calls[0])
    return {"seconds": seconds, "tokens": tokens, "round_s": seconds / max(calls, 1)}


def verifier_kernel_seconds(name, gamma, vocab, repeats=50):
    verifier = api.get_verifier(name)
    key = jax.random.PRNGKey(0)
    q = jax.nn.softmax(jax.random.normal(key, (1, gamma, vocab)), -1)
    pi = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(1), (1, gamma, vocab)), -1)
    drafts = jnp.argmax(q, -1).astype(jnp.int32)
    state = verifier.init_state(1)
    fn = jax.jit(verifier.__call__)
    compiled = timing.Compiled(fn, key, drafts, q, pi, pi[:, 0], state)
    return compiled.time(key, drafts, q, pi, pi[:, 0], state, repeats=repeats).median_s


def main(argv=None):
    args = parse_args(argv)
    target, target_params, tok = load_model(args.target)
    drafter, drafter_params, _ = load_model(args.drafter)
    prompts = [tok.encode(p) for p in humaneval.load_prompts(args.num_prompts)]
    width = max(len(p) for p in prompts)
    params = (target_params, drafter_params)
    timed_prompts = prompts[: args.wallclock_prompts]
    common = dict(target=target, max_new_tokens=args.max_new_tokens)
    report = {"environment": timing.environment(), "precision": "float32",
              "target": args.target, "drafter": args.drafter, "temperature": args.temperature,
              "num_prompts": len(prompts), "seeds": args.seeds,
              "max_new_tokens": args.max_new_tokens, "rows": {}}
    ar_fn = api.make_generate_fn(method="autoregressive", **common)
    baseline = wallclock(ar_fn, params, timed_prompts, width, args.seeds[:1], args.temperature)
    report["autoregressive_wallclock"] = baseline
    for gamma in args.gammas:
        row, units = {}, {}
        for name in tqdm(VERIFIERS, desc=f"G={gamma}"):
            fn = api.make_generate_fn(drafter=drafter, method="specdecode", gamma=gamma,
                                      verifier=name, **common)
            units[name] = efficiency_units(fn, params, prompts, width, args.seeds,
                                           args.temperature, args.batch_size)
            clock = wallclock(fn, params, timed_prompts, width, args.seeds[:1],
                              args.temperature)
            kernel_s = verifier_kernel_seconds(name, gamma, target.vocab_size)
            eff, eff_ci = mean_ci(units[name])
            row[name] = {"block_efficiency": eff, "ci95": eff_ci,
                         "wallclock_normalized": (clock["seconds"] / clock["tokens"]) /
                         (baseline["seconds"] / baseline["tokens"]),
                         "round_s": clock["round_s"], "verify_kernel_s": kernel_s,
                         "verify_share_of_round": kernel_s / clock["round_s"]}
        for name in VERIFIERS[1:]:
            diff = np.asarray(units[name]) - np.asarray(units["token"])
            d, d_ci = mean_ci(diff)
            base = row["token"]["block_efficiency"]
            row[name]["improvement_pct"] = 100 * d / base
            row[name]["improvement_pct_ci95"] = 100 * d_ci / base
        report["rows"][f"G={gamma}"] = row
        print(markdown(report), flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(markdown(report))


def markdown(report) -> str:
    env = report["environment"]
    lines = [f"{report['target']} <- {report['drafter']}, HumanEval x{report['num_prompts']} "
             f"prompts x {len(report['seeds'])} seeds, T={report['temperature']}, "
             f"{report['max_new_tokens']} new tokens, {report['precision']}, {env['machine']}, "
             f"jax {env['jax']}", "",
             "| G | verifier | block efficiency (95% CI) | impr. vs token % (95% CI) | "
             "wall clock / AR | verify kernel share of round |",
             "|---|---|---|---|---|---|"]
    for key, row in report["rows"].items():
        for name, r in row.items():
            impr = (f"{r['improvement_pct']:+.2f} ± {r['improvement_pct_ci95']:.2f}"
                    if "improvement_pct" in r else "—")
            lines.append(
                f"| {key[2:]} | {name} | {r['block_efficiency']:.3f} ± {r['ci95']:.3f} | "
                f"{impr} | {r['wallclock_normalized']:.3f} | "
                f"{100 * r['verify_share_of_round']:.2f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
