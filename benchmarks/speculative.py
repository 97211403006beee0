"""Speculative decoding benchmark on a real drafter/target pair (issue 4 protocol).

All figures are ratios measured in one run: speculative vs autoregressive target
decoding (tokens/s), the round overhead (the measured round time, prefills
subtracted, over the drafter calls of a round plus one scoring call of G + 1
tokens, every call timed inside a jitted loop as the decoder runs it:
``timing.round_overhead``), and ours vs Hugging Face
``transformers`` assisted generation on the same GGUF weights (greedy; outputs
compared token for token; ``no_peer=True`` skips it). Compile time is excluded
everywhere.

    python -m benchmarks.main --gin_file=benchmarks/configs/speculative.gin \\
        --gin_bindings="bench_speculative.num_prompts = 10"

``configs/runs/benchmark.gin`` (``run_benchmark``) is the task-level wall-clock
comparison of every method; this one adds the round overhead, batched rates
and the transformers peer for plain speculative decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from benchmarks import peers, shared
from specdec_jax import api, precision
from specdec_jax.checkpoints import registry
from specdec_jax.decode.round import required_cache_length
from specdec_jax.jobs import tables
from specdec_jax.jobs.resolver import load_pair
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm


def run_prompts(fn, params, prompts, width, temperature, batch_size=1, seed=0, prefills=()):
    """Times ``fn`` over all prompts in batches; returns totals and outputs.

    ``prefills``: (jitted prefill, params) of each model the method runs,
    timed alone on each batch; ``decode_s`` is the total minus them."""
    sp = api.sampling_params(temperature=temperature)
    batches = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
    batches = [b + [b[-1]] * (batch_size - len(b)) for b in batches]
    compiled = timing.Compiled(fn, *params, make_prompt(batches[0], pad_to=width),
                               jax.random.PRNGKey(0), sp)
    for prefill, prefill_params in prefills:  # compiled before any timing
        jax.block_until_ready(prefill(prefill_params, make_prompt(batches[0], pad_to=width)))
    seconds, prefill_s, tokens, target_calls, drafter_calls, outputs, hist = (
        0.0, 0.0, 0, 0, 0, [], 0)
    for i, batch in enumerate(batches):
        prompt = make_prompt(batch, pad_to=width)
        prefill_s += sum(timing.seconds(prefill, prefill_params, prompt)[0]
                         for prefill, prefill_params in prefills)
        timed = compiled.time(*params, prompt, jax.random.PRNGKey(seed + i), sp)
        out = timed.output
        seconds += timed.median_s
        tokens += int(np.asarray(out.lengths).sum())
        # Rows of a batch run in lockstep: a round costs the same for all of them.
        target_calls += int(np.asarray(out.stats.target_calls).max())
        drafter_calls += int(np.asarray(out.stats.drafter_calls).max())
        hist = hist + np.asarray(out.stats.accepted_histogram).sum(0)
        outputs += [np.asarray(out.tokens[b, : out.lengths[b]]).tolist()
                    for b in range(len(batch))]
    return {"seconds": seconds, "prefill_s": prefill_s, "decode_s": seconds - prefill_s,
            "tokens": tokens, "target_calls": target_calls, "drafter_calls": drafter_calls,
            "tokens_per_s": tokens / seconds, "round_s": (seconds - prefill_s) / target_calls,
            "block_efficiency": tokens / target_calls / batch_size,
            "accepted_histogram": np.asarray(hist).tolist(),
            "compile_s": compiled.compile_s}, outputs[: len(prompts)]


def in_loop_step_s(model, params, k, fill):
    """Median seconds of one ``extend`` of K tokens, timed inside a jitted loop."""
    return timing.in_loop_step(model, params, k, fill=fill, steps=8, repeats=3).median_s


def run_bench_speculative(*, target: str = "qwen2.5-coder-1.5b",
                          drafter: str = "qwen2.5-coder-0.5b", num_prompts: int = 10,
                          max_new_tokens: int = 64, gammas: Sequence[int] = (3, 5, 7),
                          temperatures: Sequence[float] = (0.0, 1.0),
                          batch_sizes: Sequence[int] = (4, 8), no_peer: bool = False,
                          out: str = "results/bench_speculative.json",
                          markdown_path: str | None = None) -> dict:
    """Batch-1 tokens/s, block efficiency and round overhead of speculative
    decoding at each (T, G) against autoregressive target decoding; batched
    rates at ``batch_sizes`` (greedy, best G); the transformers peer unless
    ``no_peer``. Writes ``out`` (JSON), prints the Markdown (and writes it to
    ``markdown_path`` if given)."""
    gammas, temperatures, batch_sizes = list(gammas), list(temperatures), list(batch_sizes)
    shared.check_at_least(1, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                          gammas=gammas)
    if batch_sizes:  # empty: no batched runs
        shared.check_at_least(1, batch_sizes=batch_sizes)
    shared.check_temperatures("temperatures", temperatures)
    shared.check_humaneval_prompts(num_prompts=num_prompts)
    if not no_peer:
        peers.check_assisted_peer(target, drafter, temperatures)

    pair = load_pair(target=target, drafter=drafter)
    tgt, tp, drf, dp = pair.target, pair.target_params, pair.drafter, pair.drafter_params
    prompts = shared.humaneval_prompts(pair.encode, num_prompts)
    width = max(len(p) for p in prompts)
    params = (tp, dp)
    # No EOS: every row generates max_new_tokens, so runs compare equal work.
    common = dict(target=tgt, max_new_tokens=max_new_tokens)
    report = {"environment": timing.environment(), "precision": precision.resolve_dtype("auto"),
              "target": target, "drafter": drafter, "num_prompts": len(prompts),
              "max_new_tokens": max_new_tokens, "batch_1": {}, "batched": {}}

    t_draft = in_loop_step_s(drf, dp, 1, fill=width)
    report["drafter_step_s"] = t_draft
    report["target_step_s"] = in_loop_step_s(tgt, tp, 1, fill=width)
    max_length = required_cache_length(width, max_new_tokens, max(gammas))  # the decoders'
    prefills = {"autoregressive": [(timing.prefill_fn(tgt, max_length), tp)]}
    prefills["specdecode"] = prefills["autoregressive"] + [
        (timing.prefill_fn(drf, max_length), dp)]
    jobs = [(t, g) for t in temperatures for g in [0] + gammas]
    greedy_outputs = {}
    for temperature, gamma in tqdm(jobs, desc="batch-1 runs"):
        method = "autoregressive" if gamma == 0 else "specdecode"
        fn = api.make_generate_fn(drafter=drf, method=method, gamma=max(gamma, 1), **common)
        row, outputs = run_prompts(fn, params, prompts, width, temperature,
                                   prefills=prefills[method])
        t_score = (in_loop_step_s(tgt, tp, gamma + 1, fill=width) if gamma
                   else report["target_step_s"])
        # Autoregressive: no drafter calls, a round is one target step.
        row.update(score_step_s=t_score, round_overhead=timing.round_overhead(
            row["round_s"], row["drafter_calls"] / row["target_calls"], t_draft, t_score))
        if gamma:
            row["mean_accepted"] = float(np.dot(row["accepted_histogram"], np.arange(gamma + 1))
                                         / row["target_calls"])
        if temperature == 0:
            greedy_outputs[gamma] = outputs
        report["batch_1"][f"T={temperature:g},G={gamma}"] = row
    for temperature in temperatures:
        ar = report["batch_1"][f"T={temperature:g},G=0"]["tokens_per_s"]
        for gamma in gammas:
            row = report["batch_1"][f"T={temperature:g},G={gamma}"]
            row["speedup_vs_autoregressive"] = row["tokens_per_s"] / ar
    report["greedy_specdecode_equals_autoregressive"] = all(
        greedy_outputs[g] == greedy_outputs[0] for g in gammas if g in greedy_outputs)

    best_gamma = max(gammas, key=lambda g: report["batch_1"].get(
        f"T=0,G={g}", {"tokens_per_s": 0})["tokens_per_s"])
    for batch_size in tqdm(batch_sizes, desc="batched runs"):
        for gamma in (0, best_gamma):
            fn = api.make_generate_fn(drafter=drf, method="autoregressive" if gamma == 0
                                      else "specdecode", gamma=max(gamma, 1), **common)
            row, _ = run_prompts(fn, params, prompts, width, 0.0, batch_size=batch_size)
            report["batched"][f"B={batch_size},G={gamma}"] = row

    if not no_peer:
        peer = peers.assisted_generation(registry.local_path(target),
                                         registry.local_path(drafter), prompts, best_gamma,
                                         max_new_tokens)
        report["peer"] = peers.compare_assisted(
            peer, ours_autoregressive=report["batch_1"]["T=0,G=0"],
            ours_speculative=report["batch_1"][f"T=0,G={best_gamma}"],
            ours_greedy=greedy_outputs[best_gamma], gamma=best_gamma)
    shared.write_report(report, out)
    timing.print_markdown(markdown(report), markdown_path)
    return report


def markdown(report) -> str:
    env = report["environment"]
    lines = [f"{report['target']} <- {report['drafter']}, {report['num_prompts']} HumanEval "
             f"prompts, {report['max_new_tokens']} new tokens, batch 1, {report['precision']}, "
             f"{env['machine']}, jax {env['jax']}", ""]
    rows = []
    for key, row in report["batch_1"].items():
        t, g = (part.split("=")[1] for part in key.split(","))
        rows.append((t, g if g != "0" else "AR", f"{row['tokens_per_s']:.2f}",
                     f"{row.get('speedup_vs_autoregressive', 1.0):.2f}x",
                     f"{row['block_efficiency']:.2f}", f"{row.get('mean_accepted', 0):.2f}",
                     f"{100 * row['round_overhead']:+.1f}%"))
    lines += tables.markdown_table(("T", "G", "tokens/s", "speedup vs AR", "block eff.",
                                    "mean accepted", "round overhead"), rows)
    if report["batched"]:
        rows = []
        for key, row in report["batched"].items():
            b, g = (part.split("=")[1] for part in key.split(","))
            rows.append((b, g if g != "0" else "AR", f"{row['tokens_per_s']:.2f}"))
        lines += [""] + tables.markdown_table(("batch", "G", "tokens/s"), rows)
    if "peer" in report:
        lines += ["", peers.assisted_line(report["peer"])]
    return "\n".join(lines)
