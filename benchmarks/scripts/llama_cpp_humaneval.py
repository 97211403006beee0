"""Whole generations beside llama.cpp: HumanEval prompts, greedy, batch 1.

The step and 9-token call of ``llama_cpp_peer.py`` say what one call costs;
this says what a user gets. On the same GGUF files, thread count, prompts and
token budget, interleaved round by round with nothing else running:

- llama.cpp autoregressive (``llama-completion``, the 1.5B alone) and the
  speculative variants that ``--llama-spec`` names (below), each prompt in its
  own process, seconds from llama.cpp's own timers, prompt processing
  included on every row: autoregressive, the prompt eval + eval + sampling
  times of its perf print; speculative tools, their ``encoded`` (prompt) +
  ``decoded`` (generation) wall times. Model load and warm-up excluded;
- ours through the first command (``specdec-jax generate --json``): the
  speculative decoder it picks and the autoregressive target, timed prompt by
  prompt in turn (prefill plus generation, compile excluded).

Per prompt, tokens per second; over prompts, the ratio of total tokens per
second with a 95% bootstrap interval (prompts resampled, fixed seed). The
fastest speculative variant run (total tokens per second) is llama.cpp's
speculative row (``llama_speculative_best``); picked on the same prompts it
is timed on, so the pick flatters llama.cpp, never us.

llama.cpp's speculative variants (``--llama-spec``: comma-separated names,
``all`` for every one; default ``DEFAULT_SPEC``):

- ``draft-nN`` (N = 2, 3, 4, 5, 6, 8): ``llama-speculative-simple --spec-type
  draft-simple``, the 0.5B drafting up to N tokens (``--spec-draft-n-max N
  --spec-draft-n-min 0``); ``draft-n8-p75`` stops a draft where the drafter's
  top probability falls below 0.75 (``--spec-draft-p-min 0.75``);
- ``ngram-simple``, ``ngram-map-k``, ``ngram-map-k4v``, ``ngram-mod``,
  ``ngram-cache``: ``llama-speculative-simple --spec-type TYPE``, no drafter
  (drafts from n-grams of the context, llama.cpp's defaults);
  ``ngram-simple-n3m8`` with short n-grams (``--spec-ngram-simple-size-n 3
  --spec-ngram-simple-size-m 8``); ``ngram-simple+draft-n3``: both types, the
  n-grams first, the drafter where they find nothing;
- ``lookup-n3``, ``lookup-n5``: ``llama-lookup`` (prompt-lookup decoding from an
  n-gram cache of the context, up to N tokens);
- ``lookahead``: ``llama-lookahead`` (Jacobi decoding; window 15, 5-grams, 15
  verified n-grams, fixed in the tool: 31 sequences, so slow on a CPU that
  ``all`` takes far longer with it);
- ``tree-n5-np2``: ``llama-speculative`` with 2 draft sequences that split
  where the drafter's probability passes 0.1 (``-np 2``), up to 5 tokens.

Every llama.cpp run: ``-t THREADS -n MAX_NEW_TOKENS --temp 0 -c 4096`` (and
``-td THREADS`` for the drafter).

    python benchmarks/scripts/llama_cpp_humaneval.py --prompts 20 --threads 2 --isa avx2 \\
        --out benchmarks/reports/llama_cpp_humaneval_cpu.json

Builds llama.cpp as ``llama_cpp_peer.py`` does (``--peers``, ``--isa``; cmake
and a C++ compiler).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
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
from specdec_jax.runtime import devices  # noqa: E402

TARGET, DRAFTER = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
CONTEXT = 4096  # llama.cpp's -c: prompt + 128 tokens fit; the KV cache it allocates is alike
_PERF = re.compile(r"(prompt eval|eval|sampling) time =\s+([\d.]+) ms"
                   r"(?: /\s+(\d+) (?:tokens|runs))?")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_COUNT = re.compile(r"\b(n_drafted|n_accept)\s*=\s*(\d+)")
_ACCEPT = re.compile(r"\baccept\s*=\s*(-?nan|-?inf|[\d.]+)%")
_SPEC_TYPES = re.compile(r"--spec-type\s+\[?([\w|,-]+)")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way llama.cpp speculates: the tool and the switches it adds."""

    tool: str
    args: tuple[str, ...] = ()
    drafter: bool = False  # loads the 0.5B as its drafter
    spec_types: tuple[str, ...] = ()  # --spec-type values the build must know
    about: str = ""


def _draft(n: int, *extra: str, about: str = "") -> Variant:
    return Variant("llama-speculative-simple",
                   ("--spec-type", "draft-simple", "--spec-draft-n-max", str(n),
                    "--spec-draft-n-min", "0", *extra), drafter=True,
                   spec_types=("draft-simple",),
                   about=about or f"the 0.5B drafts up to {n} tokens")


def _ngram(kind: str, *extra: str, about: str = "") -> Variant:
    return Variant("llama-speculative-simple", ("--spec-type", kind, *extra),
                   spec_types=(kind,), about=about or f"{kind}, llama.cpp's defaults, no drafter")


VARIANTS: dict[str, Variant] = {
    **{f"draft-n{n}": _draft(n) for n in (2, 3, 4, 5, 6, 8)},
    "draft-n8-p75": _draft(8, "--spec-draft-p-min", "0.75",
                           about="the 0.5B drafts up to 8 tokens, stops below p = 0.75"),
    **{kind: _ngram(kind) for kind in ("ngram-simple", "ngram-map-k", "ngram-map-k4v",
                                       "ngram-mod", "ngram-cache")},
    "ngram-simple-n3m8": _ngram("ngram-simple", "--spec-ngram-simple-size-n", "3",
                                "--spec-ngram-simple-size-m", "8",
                                about="ngram-simple with 3-token keys and 8-token drafts"),
    "ngram-simple+draft-n3": Variant(
        "llama-speculative-simple",
        ("--spec-type", "ngram-simple,draft-simple", "--spec-draft-n-max", "3",
         "--spec-draft-n-min", "0"), drafter=True, spec_types=("ngram-simple", "draft-simple"),
        about="ngram-simple first, the 0.5B (up to 3) where it finds nothing"),
    "lookup-n3": Variant("llama-lookup", ("--spec-draft-n-max", "3"),
                         about="prompt-lookup decoding, up to 3 tokens"),
    "lookup-n5": Variant("llama-lookup", ("--spec-draft-n-max", "5"),
                         about="prompt-lookup decoding, up to 5 tokens"),
    "lookahead": Variant("llama-lookahead", about="Jacobi decoding, W = 15, N = 5, G = 15"),
    "tree-n5-np2": Variant("llama-speculative", ("--spec-draft-n-max", "5", "-np", "2"),
                           drafter=True, about="2 draft branches (split at p > 0.1), up to 5"),
}
# The default: the fastest variant of a smoke run of every variant (draft-n5;
# 2 prompts, 32 tokens, a loaded machine, so its speeds rank nothing yet), the
# peer's earlier setting (draft-n3), the drafts with the highest acceptance
# (draft-n4: 89%, draft-n8-p75: 96%) and the n-gram tool that drafted most
# (lookup-n3); the n-gram speculative types drafted nothing in that run.
DEFAULT_SPEC = ("draft-n3", "draft-n4", "draft-n5", "draft-n8-p75", "lookup-n3")


def parse_spec(text: str) -> list[str]:
    if text.strip() == "all":
        return list(VARIANTS)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {', '.join(unknown) or text!r}: 'all' or some of "
            f"{', '.join(VARIANTS)}")
    return names


def _failure(returncode: int) -> str:
    if returncode < 0:
        killed = f"killed by signal {-returncode}"
        return killed + (" (out of memory?)" if returncode == -9 else "")
    return f"exit status {returncode}"


def run_llama(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        name = pathlib.Path(command[0]).name
        raise RuntimeError(f"{name} failed ({_failure(done.returncode)}):\n"
                           f"{done.stderr[-2000:]}")
    return done.stderr


def _common(binaries, tool: str, model, prompt: str, tokens: int, threads: int) -> list[str]:
    return [str(pathlib.Path(binaries) / tool), "-m", str(model), "-t", str(threads), "-n",
            str(tokens), "--temp", "0", "-c", str(CONTEXT), "-p", prompt]


def parse_autoregressive(log: str) -> dict:
    """Generated tokens and seconds (prompt eval + eval + sampling) of
    ``llama-completion``'s perf print."""
    found = {kind: (float(ms) / 1e3, int(n) if n else None) for kind, ms, n in _PERF.findall(log)}
    if not {"prompt eval", "eval"} <= set(found):
        raise RuntimeError(f"llama-completion printed no timings:\n{log[-2000:]}")
    # `eval` counts the generated tokens after the first (which prompt eval yields).
    return {"tokens": found["eval"][1] + 1,
            "seconds": sum(found[k][0] for k in ("prompt eval", "eval", "sampling")
                           if k in found),
            "prompt_tokens": found["prompt eval"][1]}


def llama_autoregressive(binaries, target, prompt: str, tokens: int, threads: int) -> dict:
    """One greedy generation of ``llama-completion``, warmed up, no chat template."""
    return parse_autoregressive(run_llama(
        [*_common(binaries, "llama-completion", target, prompt, tokens, threads), "-no-cnv"]))


def parse_speculative(log: str, tool: str = "llama-speculative-simple") -> dict:
    """Tokens, seconds (encode + decode) and drafts accepted of a speculative
    tool's summary. ``accept`` is accepted over drafted tokens (None where
    nothing was drafted or the tool counts no drafts); ``accepted`` the tokens
    that came from accepted drafts."""
    encoded, decoded = _ENCODED.search(log), _DECODED.search(log)
    if not (encoded and decoded):
        raise RuntimeError(f"{tool} printed no timings:\n{log[-2000:]}")
    counts = {key: int(value) for key, value in _COUNT.findall(log)}
    drafted, accepted = counts.get("n_drafted"), counts.get("n_accept")
    if drafted:
        accept = accepted / drafted
    else:
        printed = _ACCEPT.search(log)
        accept = float(printed.group(1)) / 100 if printed else None
        accept = None if accept is None or not math.isfinite(accept) else accept
    return {"tokens": int(decoded.group(1)),
            "seconds": float(encoded.group(2)) + float(decoded.group(2)),
            "prompt_tokens": int(encoded.group(1)),
            "drafted": drafted, "accepted": accepted,
            "accept": None if accept is None else round(accept, 5)}


def llama_speculative(binaries, variant: Variant, target, drafter, prompt: str, tokens: int,
                      threads: int) -> dict:
    """One greedy generation of ``variant``."""
    command = _common(binaries, variant.tool, target, prompt, tokens, threads)
    if variant.drafter:
        command += ["-md", str(drafter), "-td", str(threads)]
    return parse_speculative(run_llama([*command, *variant.args]), variant.tool)


def supported(binaries, variant: Variant, help_cache: dict) -> bool:
    """Whether this build has the variant's tool and speculative types."""
    tool = pathlib.Path(binaries) / variant.tool
    if not tool.exists():
        return False
    if not variant.spec_types:
        return True
    if tool not in help_cache:
        done = subprocess.run([str(tool), "--help"], capture_output=True, text=True)
        found = _SPEC_TYPES.search(done.stdout + done.stderr)
        help_cache[tool] = set(re.split(r"[|,]", found.group(1))) if found else set()
    return set(variant.spec_types) <= help_cache[tool]


def ours(prompts_file: str, tokens: int, target_weights: str, draft_weights: str) -> dict:
    """The first command on every prompt: per prompt tokens and seconds of
    the speculative decoder it chose and of the autoregressive target. Runs in
    this interpreter (``-m specdec_jax.jobs.cli``) with this process's
    environment (``SPECDEC_JAX_CPU_MARCH`` included)."""
    out = subprocess.run(
        [sys.executable, "-m", "specdec_jax.jobs.cli", "generate", "--prompts-file",
         prompts_file, "--max-new-tokens", str(tokens), "--target-weights", target_weights,
         "--draft-weights", draft_weights, "--no-cost-model", "--json"],
        capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"specdec-jax generate failed ({_failure(out.returncode)}):\n"
                           f"{out.stderr[-3000:]}")
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


def rate(rows: list[dict]) -> float:
    return round(sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows), 2)


def spec_summary(rows: list[dict], base: list[dict]) -> dict:
    """A speculative variant over prompts: tokens/s, acceptance (pooled over
    prompts, and the median prompt's) and the ratio to ``base``."""
    drafted = sum(r["drafted"] or 0 for r in rows)
    accepted = [r["accepted"] for r in rows if r.get("accepted") is not None]
    per_prompt = [r["accept"] for r in rows if r.get("accept") is not None]
    return {"tokens_per_s": rate(rows),
            "accept": round(sum(accepted) / drafted, 4) if drafted else None,
            "accept_median": statistics.median(per_prompt) if per_prompt else None,
            "drafted": drafted if any(r.get("drafted") is not None for r in rows) else None,
            "accepted_share": (round(sum(accepted) / sum(r["tokens"] for r in rows), 4)
                               if accepted else None),
            "over_autoregressive": ratio_interval(rows, base)}


TIMING = ("Both sides include prompt processing. llama.cpp autoregressive: prompt eval + eval + "
          "sampling times of llama-completion's perf print; llama.cpp speculative: the "
          "tool's 'encoded' (prompt through target and drafter) + 'decoded' (generation) wall "
          "times. Model load and llama.cpp's warm-up excluded. Ours: prefill plus generation "
          "per prompt, compile excluded. Tokens are those each run made: llama.cpp's "
          "speculative tools can stop up to a draft's length past -n, and every rate counts "
          "what was made in the seconds it took.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=20, help="the first N HumanEval prompts")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--llama-spec", type=parse_spec, default=list(DEFAULT_SPEC),
                        help="llama.cpp's speculative variants: 'all' or comma-separated of "
                             f"{', '.join(VARIANTS)} (default {','.join(DEFAULT_SPEC)})")
    parser.add_argument("--peers", "--peer", type=llama_cpp_peer.parse_peers,
                        default=[llama_cpp_peer.NEWEST],
                        help="llama.cpp builds, comma-separated: newest, vendored "
                             "(default newest)")
    parser.add_argument("--isa", choices=tuple(llama_cpp_peer.ISA_FLAGS), default="native",
                        help="instruction set of both sides (default native: -march=native)")
    parser.add_argument("--ours", action=argparse.BooleanOptionalAction, default=True,
                        help="run ours too (--no-ours: llama.cpp's rows alone, e.g. to "
                             "compare its variants)")
    parser.add_argument("--target-weights", default="stored")
    parser.add_argument("--draft-weights", default="stored")
    parser.add_argument("--out", default="benchmarks/reports/llama_cpp_humaneval_cpu.json")
    args = parser.parse_args(argv)
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise
    llama_cpp_peer.check_isa(args.isa)
    builds = {peer.label: llama_cpp_peer.build(peer, args.isa) for peer in args.peers}
    # before anything of ours compiles
    ours_record = llama_cpp_peer.ours_isa(args.isa) if args.ours else None
    from specdec_jax.runtime import timing
    target, drafter = registry.local_path(TARGET), registry.local_path(DRAFTER)
    prompts = humaneval.load_prompts(args.prompts)
    help_cache: dict = {}
    variants = {label: [v for v in args.llama_spec if supported(binaries, VARIANTS[v],
                                                                 help_cache)]
                for label, (binaries, _) in builds.items()}
    skipped = {label: [v for v in args.llama_spec if v not in variants[label]]
               for label in builds}
    runs: dict[str, list[list[dict]]] = {}
    settings, completions, equal = None, None, None
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = os.path.join(tmp, "prompts.jsonl")
        with open(prompts_file, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
        for r in range(args.rounds):  # interleaved: a drift hits every contender alike
            if args.ours:
                print(f"round {r + 1}/{args.rounds}: ours", flush=True)
                found = ours(prompts_file, args.max_new_tokens, args.target_weights,
                             args.draft_weights)
                settings, completions = found.pop("settings"), found.pop("completions")
                equal = found.pop("equal_to_autoregressive")
                for key, value in found.items():
                    runs.setdefault(key, []).append(value)
            this_round: dict[str, list[dict]] = {}
            for i, prompt in enumerate(prompts):
                print(f"round {r + 1}/{args.rounds}: llama.cpp, prompt {i + 1}/{len(prompts)}",
                      flush=True)
                for label, (binaries, _) in builds.items():
                    this_round.setdefault(f"{label}_autoregressive", []).append(
                        llama_autoregressive(binaries, target, prompt, args.max_new_tokens,
                                             args.threads))
                    for name in variants[label]:
                        this_round.setdefault(f"{label}_spec/{name}", []).append(
                            llama_speculative(binaries, VARIANTS[name], target, drafter, prompt,
                                              args.max_new_tokens, args.threads))
            for key, value in this_round.items():
                runs.setdefault(key, []).append(value)
    per_prompt = {key: median_per_prompt(rounds) for key, rounds in runs.items()}
    first = next(iter(builds))
    base = per_prompt[f"{first}_autoregressive"]
    spec = {label: {name: spec_summary(per_prompt[f"{label}_spec/{name}"],
                                       per_prompt[f"{label}_autoregressive"])
                    for name in variants[label]} for label in builds}
    best = {label: max(found, key=lambda n: found[n]["tokens_per_s"])
            for label, found in spec.items() if found}
    rows = {key: per_prompt[key] for key in ("ours_speculative", "ours_autoregressive")
            if key in per_prompt}
    for label in builds:
        rows[f"{label}_autoregressive"] = per_prompt[f"{label}_autoregressive"]
        if label in best:
            rows[f"{label}_speculative"] = per_prompt[f"{label}_spec/{best[label]}"]
    report = {
        "target": TARGET, "drafter": DRAFTER, "files": [target.name, drafter.name],
        "prompts": f"HumanEval, first {args.prompts}", "max_new_tokens": args.max_new_tokens,
        "threads": args.threads, "rounds": args.rounds, "llama_cpp_context": CONTEXT,
        "timing": TIMING,
        "isa": {"llama.cpp": args.isa, "ours": ours_record},
        "llama_cpp": builds[first][1],
        "llama_cpp_peers": {label: record for label, (_, record) in builds.items()},
        "machine": llama_cpp_peer.machine(),
        "ours_settings": settings,
        "llama_spec_variants": {name: {"tool": VARIANTS[name].tool,
                                       "args": " ".join(VARIANTS[name].args),
                                       "drafter": DRAFTER if VARIANTS[name].drafter else None,
                                       "about": VARIANTS[name].about}
                                for name in args.llama_spec},
        "llama_spec_skipped": {label: names for label, names in skipped.items() if names},
        "llama_speculative_best": ({"variant": best[first], **spec[first][best[first]]}
                                   if first in best else None),
        "llama_speculative_best_by_peer": best,
        "llama_speculative": spec,
        "commit": timing.checkout_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "environment": timing.environment(),
        "tokens_per_s": {key: rate(value) for key, value in rows.items()},
        f"over_{first}_autoregressive": {key: ratio_interval(value, base)
                                         for key, value in rows.items()},
        "ours_speculative_over_ours_autoregressive": ratio_interval(
            per_prompt["ours_speculative"], per_prompt["ours_autoregressive"])
        if args.ours else None,
        "ours_speculative_equals_autoregressive": (f"{sum(equal)} of {len(equal)} prompts"
                                                   if args.ours else None),
        "per_prompt": per_prompt, "runs": runs, "completions": completions}
    timing.write_report(report, args.out)
    print(json.dumps({k: report[k] for k in (
        "tokens_per_s", f"over_{first}_autoregressive",
        "ours_speculative_over_ours_autoregressive", "ours_speculative_equals_autoregressive")},
        indent=1))
    print(json.dumps({label: {name: {k: s[k] for k in ("tokens_per_s", "accept")}
                              for name, s in found.items()} for label, found in spec.items()},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
