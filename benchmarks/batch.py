"""Throughput at large batch: tokens/s at batch 1, 8, 32, 64 with the real pair.

Serving conditions, not a lab setting: HumanEval prompts of mixed lengths
(sorted by length, each batch padded to its own longest prompt rounded up to
``width_bucket``), per-row EOS and the end-of-block stop rule, greedy.
Autoregressive target decoding and ``specdecode`` (G = ``gamma``) at each
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

    python -m benchmarks.main --gin_file=benchmarks/configs/batch.gin \\
        --gin_bindings="bench_batch.batch_sizes = [1, 8]"

Batch B decodes the first max(B, ``min_prompts``) HumanEval prompts, so every
batch size measures at least ``min_prompts`` rows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import jax
import numpy as np

from benchmarks import shared
from specdec_jax import api, precision
from specdec_jax.data import batching, humaneval
from specdec_jax.jobs import tables
from specdec_jax.jobs.resolver import load_pair
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm

METHODS = ("autoregressive", "specdecode")


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


def run_bench_batch(*, target: str = "qwen2.5-coder-1.5b", drafter: str = "qwen2.5-coder-0.5b",
                    batch_sizes: Sequence[int] = (1, 8, 32, 64), min_prompts: int = 8,
                    max_new_tokens: int = 64, gamma: int = 5, width_bucket: int = 128,
                    dtype: str = "auto", out: str = "results/bench_batch.json",
                    markdown_path: str | None = None, no_stops: bool = False,
                    methods: Sequence[str] = METHODS) -> dict:
    """Tokens/s (end to end and decode phase), idle rows and output equality of
    each method at each batch size; writes ``out`` (JSON) and prints the
    Markdown (also to ``markdown_path`` if given).

    ``no_stops``: no EOS or stop rule, every row generates ``max_new_tokens``
    (equal work per row, no idle rows; the machine's batching gain alone)."""
    batch_sizes, methods = list(batch_sizes), list(methods)
    shared.check_choices("methods", methods, METHODS)
    shared.check_at_least(1, batch_sizes=batch_sizes, min_prompts=min_prompts,
                          max_new_tokens=max_new_tokens, gamma=gamma, width_bucket=width_bucket)
    if max(max(batch_sizes), min_prompts) > humaneval.NUM_PROBLEMS:
        raise ValueError(f"HumanEval has {humaneval.NUM_PROBLEMS} prompts; lower batch_sizes "
                         f"{batch_sizes} or min_prompts ({min_prompts}).")
    precision.resolve_dtype(dtype)  # an unknown dtype fails here, before loading
    start = time.perf_counter()
    # The end-of-block rule reads code tokenizers' token texts (checkpoint
    # models); load_pair gives none for the byte-level toys.
    pair = load_pair(target=target, drafter=drafter, dtype=dtype,
                     stop_at_block_end=not no_stops)
    load_s = time.perf_counter() - start
    prompts = shared.humaneval_prompts(pair.encode, max(max(batch_sizes), min_prompts))
    stops = {} if no_stops else dict(eos_ids=pair.eos_ids, stop_rule=pair.stop_rule)
    common = dict(target=pair.target, max_new_tokens=max_new_tokens, **stops)
    sd = f"specdecode G={gamma}"
    makers = {"autoregressive": lambda: api.make_generate_fn(method="autoregressive", **common),
              sd: lambda: api.make_generate_fn(drafter=pair.drafter, method="specdecode",
                                               gamma=gamma, **common)}
    fns = {name: make() for name, make in makers.items() if name.split()[0] in methods}
    prefills = {"autoregressive": [(pair.target, pair.target_params)],
                sd: [(pair.target, pair.target_params), (pair.drafter, pair.drafter_params)]}
    report = {"environment": timing.environment(), "dtype": str(pair.target.config.dtype),
              "target": target, "drafter": drafter, "load_s": load_s,
              "max_new_tokens": max_new_tokens, "width_bucket": width_bucket,
              "stops": not no_stops,
              "prompt_tokens": {"min": min(map(len, prompts)), "max": max(map(len, prompts))},
              "runs": {}}
    reference = {}
    for batch_size in tqdm(batch_sizes, desc="batch sizes"):
        rows = prompts[:max(batch_size, min_prompts)]
        for name, fn in fns.items():
            figures, outputs = decode_all(fn, (pair.target_params, pair.drafter_params), rows,
                                          batch_size, width_bucket, {}, prefills[name])
            # Greedy: every batch size and method must give the same text
            # (padding and batch neighbours change nothing, exactness holds).
            same = [o == reference.setdefault(i, o) for i, o in enumerate(outputs)]
            figures["outputs_equal_to_first_run"] = float(np.mean(same))
            report["runs"][f"B={batch_size} {name}"] = {"batch_size": batch_size,
                                                        "method": name, **figures}
            shared.write_report(report, out)
    runs = report["runs"].values()
    for rate in ("tokens_per_s", "decode_tokens_per_s"):
        base = {r["method"]: r[rate] for r in runs if r["batch_size"] == min(batch_sizes)}
        ar_at = {r["batch_size"]: r[rate] for r in runs if r["method"] == "autoregressive"}
        for run in runs:
            run[f"{rate}_over_smallest_batch"] = run[rate] / base[run["method"]]
            if ar_at:
                run[f"{rate}_over_autoregressive_here"] = run[rate] / ar_at[run["batch_size"]]
    shared.write_report(report, out)
    timing.print_markdown(markdown(report), markdown_path)
    return report


def markdown(report: dict) -> str:
    env = report["environment"]
    stops = ("with EOS and end-of-block stops" if report.get("stops", True)
             else "per row, no stops (equal work)")
    lines = [f"{report['target']} / {report['drafter']}, {report['dtype']}, greedy, "
             f"<= {report['max_new_tokens']} new tokens {stops}, "
             f"HumanEval prompts of {report['prompt_tokens']['min']}-"
             f"{report['prompt_tokens']['max']} tokens in length-sorted batches "
             f"(widths bucketed by {report['width_bucket']}); {env['machine']}, "
             f"jax {env['jax']}.", ""]
    ratio = lambda run, key: f"{run.get(key, float('nan')):.2f}x"  # noqa: E731
    rows = [(run["batch_size"], run["method"], run["rows"], run["tokens"],
             f"{run['seconds']:.1f} ({run['prefill_s']:.1f})", f"{run['tokens_per_s']:.2f}",
             ratio(run, "tokens_per_s_over_smallest_batch"),
             ratio(run, "tokens_per_s_over_autoregressive_here"),
             f"{run['decode_tokens_per_s']:.2f}",
             ratio(run, "decode_tokens_per_s_over_smallest_batch"),
             ratio(run, "decode_tokens_per_s_over_autoregressive_here"),
             f"{run['idle_row_fraction']:.2f}", f"{run['outputs_equal_to_first_run']:.0%}")
            for run in report["runs"].values()]
    return "\n".join(lines + tables.markdown_table(
        ("batch", "method", "rows", "tokens", "seconds (prefill)", "tokens/s",
         "vs smallest batch", "vs AR here", "decode-phase tokens/s", "vs smallest batch",
         "vs AR here", "idle row fraction", "same text"), rows))
