"""Token vs block verification on a real pair, in the layout of Sun et al.'s Table 2.

Block efficiency (tokens per target call) is measured per (prompt, seed) unit:
every prompt is prefilled once, and each (G, verifier) configuration decodes
all units from those caches in batches (efficiency does not depend on batching;
every row is an independent sample). Wall clock is measured at batch 1 with
prefill included, per prompt, normalised by autoregressive target decoding of
the same prompt in the same run. 95% confidence intervals are normal intervals
over units; improvements are paired (same prompt and seed) differences, so
prompt difficulty cancels. The verification kernel's share of a round is its
jitted time on [1, G, V] inputs over the measured batch-1 round time.

    python eval/bench_verifiers.py            # 50 HumanEval prompts x 3 seeds, G 4 6 8
"""

from __future__ import annotations

import argparse
import json
import math

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import api
from specdec_jax.checkpoints.load import load_for_decoding
from specdec_jax.data import humaneval
from specdec_jax.decoding import required_cache_length
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm

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
    p.add_argument("--batch-size", type=int, default=30, help="rows per efficiency batch")
    p.add_argument("--wallclock-prompts", type=int, default=5,
                   help="prompts timed at batch 1 (per seed) for wall clock")
    p.add_argument("--phases", nargs="+", choices=("efficiency", "wallclock"),
                   default=["efficiency", "wallclock"],
                   help="'wallclock' alone adds wall clock to the efficiency figures in --out")
    p.add_argument("--out", default="results/bench_verifiers.json")
    return p.parse_args(argv)


def mean_ci(values) -> tuple[float, float]:
    values = np.asarray(values, np.float64)
    half = Z95 * values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else math.nan
    return float(values.mean()), float(half)


def prefill_once(decoder, params, prompts, max_length, group=10):
    """Prefills every distinct prompt once, in length-sorted groups (little
    padding), into caches of one shared ``max_length``; returns the stacked
    ``Prefilled`` (row i = prompt i). Every (seed, gamma, verifier) decode
    gathers its rows from it, so the prompts are fed once per run, not once per
    configuration."""
    prefill = jax.jit(decoder.prefill, static_argnames="max_length")
    width = max(len(p) for p in prompts)
    order = np.argsort([len(p) for p in prompts], kind="stable")
    chunks = []
    for start in tqdm(range(0, len(order), group), desc="prefill"):
        rows = [prompts[i] for i in order[start:start + group]]
        pad_to = -(-max(len(r) for r in rows) // 32) * 32  # few distinct shapes to compile
        chunk = prefill(*params, make_prompt(rows, pad_to=min(pad_to, width)),
                        max_length=max_length)
        chunks.append(chunk.replace(prompt_width=width))
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *chunks)
    inverse = np.argsort(order)
    return jax.tree_util.tree_map(lambda x: x[inverse], stacked)


def efficiency_units(decoder, params, prefilled, units, temperature, batch_size):
    """Block efficiency (tokens / target calls) of every (prompt, seed) unit,
    decoded in batches from the shared prefill."""
    sp = api.sampling_params(temperature=temperature)
    decode = jax.jit(decoder.decode)
    compiled = None
    eff = {}
    for n in tqdm(range(0, len(units), batch_size), desc=f"{decoder.verifier.__class__.__name__}"
                  f" G={decoder.gamma}", leave=False):
        batch = units[n:n + batch_size]
        rows = [i for i, _ in batch]
        rows += [rows[-1]] * (batch_size - len(rows))
        sub = jax.tree_util.tree_map(lambda x, r=np.asarray(rows): x[r], prefilled)
        # One key per batch; rows within a batch draw independent randomness.
        key = jax.random.PRNGKey(1000 * batch[0][1] + n)
        if compiled is None:
            compiled = timing.Compiled(decode, *params, sub, key, sp)
        out = compiled.time(*params, sub, key, sp).output
        lengths = np.asarray(out.lengths)
        calls = np.asarray(out.stats.target_calls)
        for row, unit in enumerate(batch):
            eff[unit] = lengths[row] / calls[row]
    return [eff[u] for u in units]


def wallclock(fns, params, prompts, width, seed, temperature):
    """Per-prompt seconds per token at batch 1, prefill included (what a user
    waits), for every labelled generate function. The functions are timed
    interleaved, prompt by prompt in a rotating order, so a machine that
    drifts in speed over the run biases no configuration against another."""
    sp = api.sampling_params(temperature=temperature)
    example = make_prompt([prompts[0]], pad_to=width)
    compiled = {label: timing.Compiled(fn, *params, example, jax.random.PRNGKey(0), sp)
                for label, fn in tqdm(fns.items(), desc="compile (batch 1)")}
    labels = list(fns)
    per_token = {label: [] for label in labels}
    seconds = dict.fromkeys(labels, 0.0)
    calls = dict.fromkeys(labels, 0)
    for i, p in enumerate(tqdm(prompts, desc="wall clock")):
        prompt, key = make_prompt([p], pad_to=width), jax.random.PRNGKey(1000 * seed + i)
        shift = i % len(labels)
        for label in labels[shift:] + labels[:shift]:
            timed = compiled[label].time(*params, prompt, key, sp)
            per_token[label].append(timed.median_s / int(timed.output.lengths[0]))
            seconds[label] += timed.median_s
            calls[label] += int(timed.output.stats.target_calls[0])
    return {label: {"seconds_per_token": per_token[label],
                    "round_s": seconds[label] / max(calls[label], 1)} for label in labels}


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
    target, target_params, tok = load_for_decoding(args.target)
    drafter, drafter_params, _ = load_for_decoding(args.drafter)
    prompts = [tok.encode(p) for p in humaneval.load_prompts(args.num_prompts)]
    width = max(len(p) for p in prompts)
    params = (target_params, drafter_params)
    common = dict(target=target, max_new_tokens=args.max_new_tokens)
    static = {(g, name): dict(drafter=drafter, method="specdecode", gamma=g, verifier=name,
                              **common) for g in args.gammas for name in VERIFIERS}
    if "efficiency" in args.phases:
        report = {"environment": timing.environment(), "precision": "float32",
                  "target": args.target, "drafter": args.drafter,
                  "temperature": args.temperature, "num_prompts": len(prompts),
                  "seeds": args.seeds, "max_new_tokens": args.max_new_tokens,
                  "batch_size": args.batch_size, "rows": {}}
        largest = api.make_decoder(drafter=drafter, gamma=max(args.gammas), **common)
        prefilled = prefill_once(largest, params, prompts, required_cache_length(
            width, args.max_new_tokens, max(args.gammas)))
        units = [(i, s) for s in args.seeds for i in range(len(prompts))]
        for gamma in args.gammas:
            row = report["rows"].setdefault(f"G={gamma}", {})
            for name in tqdm(VERIFIERS, desc=f"G={gamma}"):
                values = efficiency_units(api.make_decoder(**static[gamma, name]), params,
                                          prefilled, units, args.temperature, args.batch_size)
                eff, eff_ci = mean_ci(values)
                row[name] = {"block_efficiency": eff, "ci95": eff_ci, "units": list(values)}
            paired_improvements(row, "units", "improvement_pct")
            timing.write_report(report, args.out)
    else:  # wall clock only: add it to the efficiency figures of an earlier run
        with open(args.out) as f:
            report = json.load(f)
    if "wallclock" in args.phases:
        timed_prompts = prompts[: args.wallclock_prompts]
        fns = {"AR": api.make_generate_fn(method="autoregressive", **common)}
        fns.update({f"G={g} {name}": api.make_generate_fn(**static[g, name])
                    for g in args.gammas for name in VERIFIERS})
        clock = wallclock(fns, params, timed_prompts, width, args.seeds[0], args.temperature)
        ar_per_token = np.asarray(clock["AR"]["seconds_per_token"])
        report["wallclock_prompts"] = len(timed_prompts)
        report["wallclock_environment"] = timing.environment()
        report["autoregressive_tokens_per_s"] = float(1 / ar_per_token.mean())
        for gamma in args.gammas:
            row = report["rows"][f"G={gamma}"]
            for name in VERIFIERS:
                c = clock[f"G={gamma} {name}"]
                normalized = np.asarray(c["seconds_per_token"]) / ar_per_token
                kernel_s = verifier_kernel_seconds(name, gamma, target.vocab_size)
                mean, ci = mean_ci(normalized)
                row[name].update({
                    "wallclock_normalized": mean, "wallclock_ci95": ci,
                    "wallclock_units": normalized.tolist(),
                    "tokens_per_s": float(1 / np.mean(c["seconds_per_token"])),
                    "round_s": c["round_s"], "verify_kernel_s": kernel_s,
                    "verify_share_of_round": kernel_s / c["round_s"]})
            paired_improvements(row, "wallclock_units", "wallclock_improvement_pct")
        timing.write_report(report, args.out)
    print(markdown(report))


def paired_improvements(row, units_key, metric):
    """Each block verifier vs token, paired by unit (same prompt and seed), so
    prompt difficulty cancels; in % of token's mean, with a 95% CI."""
    token = np.asarray(row["token"][units_key])
    for name in VERIFIERS[1:]:
        d, d_ci = mean_ci(np.asarray(row[name][units_key]) - token)
        row[name][metric] = 100 * d / token.mean()
        row[name][metric + "_ci95"] = 100 * d_ci / token.mean()


def markdown(report) -> str:
    """Seed 002's Table 2 layout, one row per G, with the seed form added
    (wall-clock columns show "–" until the wall-clock phase has run)."""
    env = report["environment"]
    clock = ("wall clock: not measured" if "wallclock_prompts" not in report else
             f"wall clock: batch 1, {report['wallclock_prompts']} prompts, AR "
             f"{report['autoregressive_tokens_per_s']:.2f} tokens/s")
    lines = [f"{report['target']} <- {report['drafter']}, HumanEval x{report['num_prompts']} "
             f"prompts x {len(report['seeds'])} seeds, T={report['temperature']}, "
             f"{report['max_new_tokens']} new tokens, {report['precision']}, {env['machine']}, "
             f"{env['cpu_count']} cores, jax {env['jax']}; {clock}", "",
             "| G | block eff. token | block | impr. % | block-seed | impr. % | "
             "wall clock / AR token | block | Δ % | block-seed | Δ % | "
             "tokens/s token / block / seed | verify kernel share token / block / seed |",
             "|---" * 13 + "|"]

    def cell(r, key, ci_key, fmt):
        if key not in r:
            return "–"
        return f"{r[key]:{fmt}} ± {r[ci_key]:{'.3f' if fmt == '.3f' else '.2f'}}"

    for key, row in report["rows"].items():
        tok, blk, seed = (row[n] for n in VERIFIERS)
        parts = [key[2:], cell(tok, "block_efficiency", "ci95", ".3f")]
        for r in (blk, seed):
            parts += [cell(r, "block_efficiency", "ci95", ".3f"),
                      cell(r, "improvement_pct", "improvement_pct_ci95", "+.2f")]
        parts.append(cell(tok, "wallclock_normalized", "wallclock_ci95", ".3f"))
        for r in (blk, seed):
            parts += [cell(r, "wallclock_normalized", "wallclock_ci95", ".3f"),
                      cell(r, "wallclock_improvement_pct", "wallclock_improvement_pct_ci95",
                           "+.2f")]
        if "tokens_per_s" in tok:
            parts.append(" / ".join(f"{r['tokens_per_s']:.2f}" for r in (tok, blk, seed)))
            parts.append(" / ".join(f"{100 * r['verify_share_of_round']:.2f}%"
                                    for r in (tok, blk, seed)))
        else:
            parts += ["–", "–"]
        lines.append("| " + " | ".join(parts) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
