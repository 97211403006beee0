"""Throughput at large batch: tokens/s at batch 1, 8, 32, 64 with the real pair.

Serving conditions, not a lab setting: HumanEval prompts of mixed lengths
(sorted by length, each batch padded to its own longest prompt rounded up to
``--width-bucket``), per-row EOS and the end-of-block stop rule, greedy.
Autoregressive target decoding and ``specdecode`` (G = ``--gamma``) at each
batch size, timed in one run (compilation excluded; one timed call per
batch). Throughput counts the tokens each row produced up to its own stop.

What a finished row costs: the decoding loop runs until the batch's last row
stops, and a finished row keeps its slot in every drafter and target call
(one static-shape program; nothing is compacted). ``idle_row_fraction`` is
that waste: 1 - (rounds rows were live) / (rows x rounds the batch ran).
Prefill is compute-bound at every batch size, so the end-to-end rate gains
less from batching than the decode phase does: each batch's prefill is also
timed alone (every model of the method), and ``decode_tokens_per_s`` is the
rate over the rest.

    python eval/bench_batch.py --batch-sizes 1 8 32 64 --max-new-tokens 64 \\
        --out results/bench_batch.json --markdown results/bench_batch.md

Batch B decodes the first max(B, --min-prompts) HumanEval prompts, so every
batch size measures at least ``--min-prompts`` rows.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from specdec_jax import api, batching
from specdec_jax.checkpoints.load import load_for_decoding
from specdec_jax.data import humaneval
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--drafter", default="qwen2.5-coder-0.5b")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=5)
    p.add_argument("--width-bucket", type=int, default=128)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", default="results/bench_batch.json")
    p.add_argument("--markdown", default=None)
    p.add_argument("--no-stops", action="store_true",
                   help="no EOS or stop rule: every row generates --max-new-tokens (equal "
                        "work per row, no idle rows; the machine's batching gain alone)")
    p.add_argument("--methods", nargs="+", default=["autoregressive", "specdecode"],
                   choices=["autoregressive", "specdecode"])
    args = p.parse_args(argv)
    if min(args.batch_sizes) < 1 or args.min_prompts < 1 or args.max_new_tokens < 1:
        p.error("--batch-sizes, --min-prompts and --max-new-tokens must all be >= 1.")
    if max(max(args.batch_sizes), args.min_prompts) > humaneval.NUM_PROBLEMS:
        p.error(f"HumanEval has {humaneval.NUM_PROBLEMS} prompts; lower --batch-sizes or "
                "--min-prompts.")
    return args


def prefill_seconds(models, prompt, compiled):
    """Seconds the prompt's prefill takes, every model of the method in turn
    (timed alone, so the decode-phase rate can be separated from it)."""
    total = 0.0
    for model, params in models:
        key = (id(model), prompt.tokens.shape)
        if key not in compiled:
            compiled[key] = timing.Compiled(jax.jit(
                lambda p, pr, m=model: m.prefill(p, pr, m.init_cache(*pr.tokens.shape)).logits),
                params, prompt)
        total += compiled[key].time(params, prompt).median_s
    return total


def decode_all(fn, params, prompts, batch_size, width_bucket, compiled_by_width,
               prefill_models):
    """Decodes every prompt in length-sorted batches; returns the figures."""
    sp = api.sampling_params(temperature=0.0)
    seconds = compile_s = prefill_s = 0.0
    tokens = live_rounds = slot_rounds = finished_early = 0
    outputs = [None] * len(prompts)
    for _, prompt, chunk, rows in batching.length_sorted_batches(prompts, batch_size,
                                                                 width_bucket):
        width = prompt.tokens.shape[1]
        if width not in compiled_by_width:
            compiled_by_width[width] = timing.Compiled(fn, *params, prompt,
                                                       jax.random.PRNGKey(0), sp)
            compile_s += compiled_by_width[width].compile_s
        timed = compiled_by_width[width].time(*params, prompt, jax.random.PRNGKey(0), sp)
        seconds += timed.median_s
        prefill_s += prefill_seconds(prefill_models, prompt, compiled_by_width)
        out = timed.output
        lengths = np.asarray(out.lengths)[:len(chunk)]
        calls = np.asarray(out.stats.target_calls)
        tokens += int(lengths.sum())
        finished_early += int((lengths < np.max(lengths)).sum())
        # Rounds = target calls per row (one per round, live rows only); the
        # batch runs as many rounds as its busiest row, padding rows included.
        live_rounds += int(calls[:len(chunk)].sum())
        slot_rounds += int(calls.max()) * len(calls)
        tok = np.asarray(out.tokens)
        for row, index in enumerate(rows):
            outputs[index] = tok[row, :lengths[row]].tolist()
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "prefill_s": prefill_s, "decode_tokens_per_s": tokens / max(seconds - prefill_s,
                                                                        1e-9),
            "compile_s": compile_s, "rows": len(prompts), "rows_finished_early": finished_early,
            "idle_row_fraction": 1.0 - live_rounds / max(slot_rounds, 1)}, outputs


def main(argv=None):
    args = parse_args(argv)
    start = time.perf_counter()
    target, target_params, tok = load_for_decoding(args.target, dtype=args.dtype)
    drafter, drafter_params, _ = load_for_decoding(args.drafter, dtype=args.dtype)
    load_s = time.perf_counter() - start
    texts = humaneval.load_prompts(max(max(args.batch_sizes), args.min_prompts))
    prompts = [tok.encode(t) for t in texts]
    stops = {} if args.no_stops else dict(eos_ids=tuple(tok.eos_token_ids),
                                          stop_rule=humaneval.end_of_block_stop(tok))
    common = dict(target=target, max_new_tokens=args.max_new_tokens, **stops)
    sd = f"specdecode G={args.gamma}"
    methods = {"autoregressive": lambda: api.make_generate_fn(method="autoregressive", **common),
               sd: lambda: api.make_generate_fn(drafter=drafter, method="specdecode",
                                                gamma=args.gamma, **common)}
    methods = {name: make() for name, make in methods.items()
               if name.split()[0] in args.methods}
    prefills = {"autoregressive": [(target, target_params)],
                sd: [(target, target_params), (drafter, drafter_params)]}
    report = {"environment": timing.environment(), "dtype": str(target.config.dtype),
              "target": args.target, "drafter": args.drafter, "load_s": load_s,
              "max_new_tokens": args.max_new_tokens, "width_bucket": args.width_bucket,
              "stops": not args.no_stops,
              "prompt_tokens": {"min": min(map(len, prompts)), "max": max(map(len, prompts))},
              "runs": {}}
    reference = {}
    for batch_size in tqdm(args.batch_sizes, desc="batch sizes"):
        rows = prompts[:max(batch_size, args.min_prompts)]
        for name, fn in methods.items():
            figures, outputs = decode_all(fn, (target_params, drafter_params), rows,
                                          batch_size, args.width_bucket, {}, prefills[name])
            # Greedy: every batch size and method must give the same text
            # (padding and batch neighbours change nothing, exactness holds).
            same = [o == reference.setdefault(i, o) for i, o in enumerate(outputs)]
            figures["outputs_equal_to_first_run"] = float(np.mean(same))
            report["runs"][f"B={batch_size} {name}"] = {"batch_size": batch_size,
                                                        "method": name, **figures}
            timing.write_report(report, args.out)
    runs = report["runs"].values()
    for rate in ("tokens_per_s", "decode_tokens_per_s"):
        base = {r["method"]: r[rate] for r in runs if r["batch_size"] == min(args.batch_sizes)}
        ar_at = {r["batch_size"]: r[rate] for r in runs if r["method"] == "autoregressive"}
        for run in runs:
            run[f"{rate}_over_smallest_batch"] = run[rate] / base[run["method"]]
            if ar_at:
                run[f"{rate}_over_autoregressive_here"] = run[rate] / ar_at[run["batch_size"]]
    timing.write_report(report, args.out)
    timing.print_markdown(markdown(report), args.markdown)


def markdown(report: dict) -> str:
    env = report["environment"]
    stops = ("with EOS and end-of-block stops" if report.get("stops", True)
             else "per row, no stops (equal work)")
    lines = [f"{report['target']} / {report['drafter']}, {report['dtype']}, greedy, "
             f"<= {report['max_new_tokens']} new tokens {stops}, "
             f"HumanEval prompts of {report['prompt_tokens']['min']}-"
             f"{report['prompt_tokens']['max']} tokens in length-sorted batches "
             f"(widths bucketed by {report['width_bucket']}); {env['machine']}, "
             f"jax {env['jax']}.", "",
             "| batch | method | rows | tokens | seconds (prefill) | tokens/s | vs smallest "
             "batch | vs AR here | decode-phase tokens/s | vs smallest batch | vs AR here | "
             "idle row fraction | same text |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratio = lambda run, key: f"{run.get(key, float('nan')):.2f}x"  # noqa: E731
    for run in report["runs"].values():
        lines.append(
            f"| {run['batch_size']} | {run['method']} | {run['rows']} | {run['tokens']} | "
            f"{run['seconds']:.1f} ({run['prefill_s']:.1f}) | {run['tokens_per_s']:.2f} | "
            f"{ratio(run, 'tokens_per_s_over_smallest_batch')} | "
            f"{ratio(run, 'tokens_per_s_over_autoregressive_here')} | "
            f"{run['decode_tokens_per_s']:.2f} | "
            f"{ratio(run, 'decode_tokens_per_s_over_smallest_batch')} | "
            f"{ratio(run, 'decode_tokens_per_s_over_autoregressive_here')} | "
            f"{run['idle_row_fraction']:.2f} | {run['outputs_equal_to_first_run']:.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
