"""Whole generations beside llama.cpp: HumanEval prompts, greedy, batch 1.

The step and 9-token call of ``llama_cpp_peer.py`` say what one call costs;
this says what a user gets. On the same GGUF files, thread count, prompts and
token budget, interleaved round by round with nothing else running:

- llama.cpp autoregressive (``llama-completion``, the 1.5B alone) and
  speculative (``llama-speculative-simple``, the 0.5B drafting up to
  ``--draft-max`` tokens), each prompt in its own process, seconds read from
  llama.cpp's own timers (prompt processing plus generation, load excluded);
- ours through the first command (``specdec-jax generate --json``): the
  speculative decoder it picks and the autoregressive target, timed prompt by
  prompt in turn (prefill plus generation, compile excluded).

Per prompt, tokens per second; over prompts, the ratio of total tokens per
second with a 95% bootstrap interval (prompts resampled, fixed seed).

    python benchmarks/scripts/llama_cpp_humaneval.py --prompts 20 --threads 2 \\
        --out benchmarks/reports/llama_cpp_humaneval_cpu.json

Builds llama.cpp as ``llama_cpp_peer.py`` does (cmake and a C++ compiler).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import llama_cpp_peer  # noqa: E402

from specdec_jax.checkpoints import registry  # noqa: E402
from specdec_jax.data import humaneval  # noqa: E402
from specdec_jax.runtime import timing  # noqa: E402

TARGET, DRAFTER = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
PEER_TARGETS = ("llama-bench", "llama-completion", "llama-speculative-simple")
_PERF = re.compile(r"(prompt eval|eval) time =\s+([\d.]+) ms /\s+(\d+) (?:tokens|runs)")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ACCEPT = re.compile(r"accept\s+=\s+([\d.]+)%")


def run_llama(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stderr


def llama_autoregressive(binaries, target, prompt: str, tokens: int, threads: int) -> dict:
    """One greedy generation: generated tokens and seconds (prompt eval + eval)."""
    log = run_llama([str(binaries / "llama-completion"), "-m", str(target), "-t", str(threads),
                     "-n", str(tokens), "--temp", "0", "-no-cnv", "--no-warmup", "-p", prompt])
    found = {kind: (float(ms) / 1e3, int(n)) for kind, ms, n in _PERF.findall(log)}
    if set(found) != {"prompt eval", "eval"}:
        raise RuntimeError(f"llama-completion printed no timings:\n{log[-2000:]}")
    # `eval` counts the generated tokens after the first (which prompt eval yields).
    return {"tokens": found["eval"][1] + 1, "seconds": found["prompt eval"][0] + found["eval"][0]}


def llama_speculative(binaries, target, drafter, prompt: str, tokens: int, threads: int,
                      draft_max: int) -> dict:
    """One greedy speculative generation: tokens, seconds (encode + decode), acceptance."""
    log = run_llama([str(binaries / "llama-speculative-simple"), "-m", str(target), "-md",
                     str(drafter), "--spec-type", "draft-simple", "-t", str(threads), "-td",
                     str(threads), "-n", str(tokens), "--temp", "0", "--spec-draft-n-max",
                     str(draft_max), "--spec-draft-n-min", "0", "-p", prompt])
    encoded, decoded, accept = _ENCODED.search(log), _DECODED.search(log), _ACCEPT.search(log)
    if not (encoded and decoded):
        raise RuntimeError(f"llama-speculative-simple printed no timings:\n{log[-2000:]}")
    return {"tokens": int(decoded.group(1)),
            "seconds": float(encoded.group(2)) + float(decoded.group(2)),
            "accept": float(accept.group(1)) / 100 if accept else None}


def ours(prompts_file: str, tokens: int, target_weights: str, draft_weights: str) -> dict:
    """The first command on every prompt: per prompt tokens and seconds of
    the speculative decoder it chose and of the autoregressive target."""
    out = subprocess.run(
        ["specdec-jax", "generate", "--prompts-file", prompts_file, "--max-new-tokens",
         str(tokens), "--target-weights", target_weights, "--draft-weights", draft_weights,
         "--no-cost-model", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"specdec-jax generate failed:\n{out.stderr[-3000:]}")
    report = json.loads(out.stdout)
    runs = {}
    for name, summary in report["results"].items():
        key = "ours_autoregressive" if name == "autoregressive" else "ours_speculative"
        runs[key] = [{"tokens": t, "seconds": s} for t, s in
                     zip(summary["batch_tokens"], summary["batch_seconds"], strict=True)]
    runs["settings"] = {k: report[k] for k in ("method", "gamma", "tree", "draft_weights",
                                               "target_weights", "precision")}
    runs["completions"] = report["completions"]
    runs["equal_to_autoregressive"] = [a == b for a, b in zip(
        report["completions"], report["autoregressive_completions"], strict=True)]
    return runs


def ratio_interval(num: list[dict], den: list[dict], seed: int = 0, draws: int = 10_000
                   ) -> dict:
    """Total tokens/s of ``num`` over ``den`` (same prompts), with a 95%
    bootstrap interval over prompts."""
    nt, ns = (np.array([r[k] for r in num], float) for k in ("tokens", "seconds"))
    dt, ds = (np.array([r[k] for r in den], float) for k in ("tokens", "seconds"))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(nt), size=(draws, len(nt)))
    boot = (nt[picks].sum(1) / ns[picks].sum(1)) / (dt[picks].sum(1) / ds[picks].sum(1))
    point = (nt.sum() / ns.sum()) / (dt.sum() / ds.sum())
    low, high = np.percentile(boot, [2.5, 97.5])
    return {"ratio": round(float(point), 3), "ci95": [round(float(low), 3), round(float(high), 3)]}


def median_per_prompt(rounds: list[list[dict]]) -> list[dict]:
    """Per prompt, the round with the median seconds."""
    return [sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2] for runs in zip(*rounds)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=20, help="the first N HumanEval prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--draft-max", type=int, default=3, help="llama.cpp's draft length")
    parser.add_argument("--target-weights", default="stored")
    parser.add_argument("--draft-weights", default="stored")
    parser.add_argument("--out", default="benchmarks/reports/llama_cpp_humaneval_cpu.json")
    args = parser.parse_args(argv)
    llama_cpp_peer.TARGETS = PEER_TARGETS
    binaries = llama_cpp_peer.build()
    target, drafter = registry.local_path(TARGET), registry.local_path(DRAFTER)
    prompts = humaneval.load_prompts(args.prompts)
    runs: dict[str, list[list[dict]]] = {}
    settings, completions, equal = None, None, None
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = os.path.join(tmp, "prompts.jsonl")
        with open(prompts_file, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
        for r in range(args.rounds):  # interleaved: a drift hits every contender alike
            print(f"round {r + 1}/{args.rounds}: ours", flush=True)
            found = ours(prompts_file, args.max_new_tokens, args.target_weights,
                         args.draft_weights)
            settings, completions = found.pop("settings"), found.pop("completions")
            equal = found.pop("equal_to_autoregressive")
            for key, value in found.items():
                runs.setdefault(key, []).append(value)
            print(f"round {r + 1}/{args.rounds}: llama.cpp", flush=True)
            ar, spec = [], []
            for prompt in prompts:
                ar.append(llama_autoregressive(binaries, target, prompt, args.max_new_tokens,
                                               args.threads))
                spec.append(llama_speculative(binaries, target, drafter, prompt,
                                              args.max_new_tokens, args.threads,
                                              args.draft_max))
            runs.setdefault("llama.cpp_autoregressive", []).append(ar)
            runs.setdefault("llama.cpp_speculative", []).append(spec)
    per_prompt = {key: median_per_prompt(rounds) for key, rounds in runs.items()}
    tokens_per_s = {key: round(sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows),
                               2) for key, rows in per_prompt.items()}
    base = per_prompt["llama.cpp_autoregressive"]
    report = {
        "target": TARGET, "drafter": DRAFTER, "files": [target.name, drafter.name],
        "prompts": f"HumanEval, first {args.prompts}", "max_new_tokens": args.max_new_tokens,
        "threads": args.threads, "rounds": args.rounds, "draft_max": args.draft_max,
        "ours_settings": settings,
        "llama.cpp": {"sdist": f"{llama_cpp_peer.SDIST}=={llama_cpp_peer.VERSION}"},
        "commit": timing.checkout_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "environment": timing.environment(),
        "tokens_per_s": tokens_per_s,
        "over_llama.cpp_autoregressive": {key: ratio_interval(rows, base)
                                          for key, rows in per_prompt.items()},
        "ours_speculative_over_ours_autoregressive": ratio_interval(
            per_prompt["ours_speculative"], per_prompt["ours_autoregressive"]),
        "llama.cpp_acceptance_median": statistics.median(
            r["accept"] for r in per_prompt["llama.cpp_speculative"] if r["accept"] is not None),
        "ours_speculative_equals_autoregressive": f"{sum(equal)} of {len(equal)} prompts",
        "per_prompt": per_prompt, "runs": runs, "completions": completions}
    timing.write_report(report, args.out)
    print(json.dumps({k: report[k] for k in ("tokens_per_s", "over_llama.cpp_autoregressive",
                                             "ours_speculative_over_ours_autoregressive",
                                             "ours_speculative_equals_autoregressive")},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
