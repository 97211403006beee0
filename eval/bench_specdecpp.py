"""SpecDec++ vs fixed draft lengths on HumanEval (Huang et al., Table 1 and Figure 4).

Two phases, one process:

1. **Counts** (batched, every prompt, T = 1): for SpecDec++ at each threshold
   ``h`` and speculative decoding at each fixed ``K``, per prompt: tokens
   ``N``, target calls ``N_target`` and discarded drafts ``N_discarded``
   (drafted - accepted). The verification rate ``N_target / N`` and the
   discard rate ``N_discarded / N`` do not depend on the machine (Figure 4).
2. **Wall clock** (batch 1, the first ``--timed-prompts`` prompts): every
   configuration and the autoregressive target, interleaved in a shuffled
   order per prompt so drift in the machine's speed hits all alike; decode
   time excludes the prefill (timed separately and subtracted). Tokens/s with
   95% bootstrap CIs over prompts, and the seed's latency model

       T / N = t_draft + t_draft N_discarded / N + (t_target - t_draft) N_target / N

   fitted by least squares over the timed speculative runs (R² reported),
   which then predicts every configuration's tokens/s from the phase-1
   counts. Greedy runs of the best ``h`` and the best ``K`` are timed too and
   checked token for token against the greedy target.

    python eval/bench_specdecpp.py --head /tmp/specdecpp/head-d3-w6/head \\
        --num-prompts 40 --max-new-tokens 128 --timed-prompts 5

Writes a JSON report and a Markdown summary (``--markdown``) with the plot.
Phase 1 keeps each finished batch in ``<out>.counts.jsonl``: a rerun with the
same settings resumes there (phase 2 always runs whole, being interleaved).

**Another device** (no models loaded): ``--device-steps`` reads the in-loop
step costs that ``eval/bench_accelerator.py --target-step-widths ...`` timed
there (random weights of the real shapes) and adds to the report at ``--out``
every configuration's predicted batch-1 tokens/s on that device, from the
phase-1 counts (``device_predictions``):

    python eval/bench_specdecpp.py --out eval/reports/bench_specdecpp_cpu.json \\
        --markdown eval/reports/bench_specdecpp_cpu.md \\
        --device-steps eval/reports/bench_accelerator_gpu_h200.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random

import jax
import numpy as np

from specdec_jax import api
from specdec_jax.checkpoints import tree_paths
from specdec_jax.checkpoints.heads import load_head
from specdec_jax.data import humaneval
from specdec_jax.data.metrics import ratio_ci
from specdec_jax.drafting.adaptive import DEFAULT_MAX_DRAFTS, AdaptiveDrafter
from specdec_jax.jobs import study
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm
from specdec_jax.runtime.resume import ResumeLog


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--drafter", default="qwen2.5-coder-0.5b")
    p.add_argument("--head", help="a head trained for the drafter (its dir); required "
                   "unless --device-steps")
    p.add_argument("--num-prompts", type=int, default=40)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.1, 0.3, 0.5, 0.7, 0.9])
    p.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8, 10])
    p.add_argument("--k-max", type=int, default=DEFAULT_MAX_DRAFTS)
    p.add_argument("--target-widths", type=int, nargs="+", default=None,
                   help="SpecDec++ target call widths to compile (must end at K_max + 1); "
                        "default: drafting.adaptive.target_widths. Finer widths waste less "
                        "where a call's cost grows with its width (CPUs), at more compile time")
    p.add_argument("--batch-size", type=int, default=8, help="phase 1 (counts) batch")
    p.add_argument("--timed-prompts", type=int, default=5, help="phase 2 (wall clock)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/bench_specdecpp.json")
    p.add_argument("--markdown", default=None, help="also write a Markdown summary here")
    p.add_argument("--counts-only", action="store_true",
                   help="stop after phase 1 (the rates; batched, any machine, resumable); "
                        "phase 2 needs a quiet machine and can follow in a later run")
    p.add_argument("--device-steps", default=None,
                   help="a bench_accelerator.py report: add predictions for its device to "
                        "the report at --out (no models loaded)")
    p.add_argument("--device-dtype", default="bfloat16",
                   help="which of that report's dtypes (--device-steps)")
    args = p.parse_args(argv)
    if args.head is None and args.device_steps is None:
        p.error("--head is required (unless --device-steps).")
    if not 0 < args.timed_prompts <= args.num_prompts:
        p.error("--timed-prompts must be in [1, --num-prompts].")
    if any(not 0 < h < 1 for h in args.thresholds):
        p.error("every threshold h must be in (0, 1).")
    if args.k_max < 1 or any(k < 1 for k in args.ks):
        p.error("--k-max and every K must be >= 1.")
    return args


def configurations(args) -> list[dict]:
    return ([{"name": f"SpecDec++ h={h:g}", "kind": "specdecpp", "h": h} for h in args.thresholds]
            + [{"name": f"SpecDec K={k}", "kind": "fixed", "k": k} for k in args.ks])


class Runner:
    """Jitted generate functions per configuration, over one pair and head."""

    def __init__(self, pair, head, head_params, args):
        self.pair, self.args = pair, args
        self.adaptive = AdaptiveDrafter(
            pair.drafter, head, eos_ids=pair.eos_ids,
            widths=tuple(args.target_widths) if args.target_widths else None)
        self.adaptive_params = self.adaptive.select_params(
            {self.adaptive.name: pair.drafter_params, self.adaptive.head_name: head_params})
        common = dict(target=pair.target, max_new_tokens=args.max_new_tokens,
                      eos_ids=tuple(pair.eos_ids))
        self.fns = {"specdecpp": api.make_generate_fn(drafter=self.adaptive, gamma=args.k_max,
                                                      **common),
                    "autoregressive": api.make_generate_fn(method="autoregressive", **common)}
        for k in args.ks:
            self.fns[("fixed", k)] = api.make_generate_fn(drafter=pair.drafter, gamma=k, **common)

    def __call__(self, config: dict, prompts, key, temperature: float):
        kind = config["kind"]
        fn = self.fns[kind if kind != "fixed" else ("fixed", config["k"])]
        drafter_params = (self.adaptive_params if kind == "specdecpp" else self.pair.drafter_params)
        sp = api.sampling_params(temperature=temperature, stop_threshold=config.get("h", 0.5))
        return fn(self.pair.target_params, drafter_params, prompts, key, sp)


def row_counts(out, rows: int) -> list[dict]:
    """Per row: N, N_target, drafted, accepted, discarded."""
    stats = out.stats
    accepted = np.asarray(stats.accepted())[:rows]
    drafted = np.asarray(stats.drafted)[:rows]
    return [{"tokens": int(n), "target_calls": int(c), "drafted": int(d), "accepted": int(a),
             "discarded": int(d - a)}
            for n, c, d, a in zip(np.asarray(out.lengths)[:rows],
                                  np.asarray(stats.target_calls)[:rows], drafted, accepted)]


def rates(rows: list[dict]) -> dict:
    """Verification and discard rates with 95% bootstrap CIs over prompts."""
    out = {}
    for name, key in (("verification_rate", "target_calls"), ("discard_rate", "discarded")):
        score, low, high = ratio_ci(rows, key, "tokens")
        out[name] = {"value": score, "ci95": [low, high]}
    out["tokens"] = sum(r["tokens"] for r in rows)
    return out


def phase_counts(runner, configs, prompts, args, log: ResumeLog | None = None) -> dict:
    """Every configuration on every prompt at T = 1, in batches; each finished
    batch goes to ``log`` (if given), and batches already there are reused."""
    results = {}
    width = max(len(p) for p in prompts)  # one shape: one compilation per configuration
    batches = [prompts[i:i + args.batch_size] for i in range(0, len(prompts), args.batch_size)]
    for config in tqdm(configs, desc="counts (T = 1)", unit="config"):
        rows = []
        for i, chunk in enumerate(batches):
            key = (config["name"], i)
            if log is None or key not in log.done:
                padded = chunk + [chunk[-1]] * (args.batch_size - len(chunk))
                out = runner(config, make_prompt(padded, pad_to=width),
                             jax.random.PRNGKey(args.seed + i), 1.0)
                if log is not None:
                    log.add(key, row_counts(out, len(chunk)))
                else:
                    rows += row_counts(out, len(chunk))
            if log is not None:
                rows += log.done[key]
        results[config["name"]] = {"config": config, "rows": rows, **rates(rows)}
    return results


def counts_log(args, prompts, head_meta: dict, head_params) -> ResumeLog:
    """Phase 1's log next to the report: a rerun with the same settings resumes.
    The head's weights are part of the settings (not only its path), so a head
    retrained in place never inherits counts made with its predecessor."""
    names = ("target", "drafter", "head", "max_new_tokens", "thresholds", "ks", "k_max",
             "target_widths", "batch_size", "seed")
    settings = {k: getattr(args, k) for k in names}
    settings["head_config"] = head_meta["config"]
    settings["head_params"] = tree_paths.params_fingerprint(head_params)
    settings["prompts_sha256"] = hashlib.sha256(repr(prompts).encode()).hexdigest()
    return ResumeLog(args.out.rsplit(".", 1)[0] + ".counts.jsonl", settings)


def make_prefill_timers(pair, max_length: int):
    """Jitted prefill of each model alone: subtracted from end-to-end times."""
    return {"target": (timing.prefill_fn(pair.target, max_length), pair.target_params),
            "drafter": (timing.prefill_fn(pair.drafter, max_length), pair.drafter_params)}


def phase_wall_clock(runner, configs, prompts, args, temperature: float) -> dict:
    """Batch 1, interleaved: per prompt every configuration once, shuffled."""
    pair = runner.pair
    width = max(len(p) for p in prompts)
    # Compile everything once (the first call of each shape) before timing.
    warm = make_prompt([prompts[0]], pad_to=width)
    for config in configs:
        runner(config, warm, jax.random.PRNGKey(0), temperature)
    max_length = width + args.max_new_tokens + max(args.k_max, max(args.ks)) + 2
    prefills = make_prefill_timers(pair, max_length)
    for fn, params in prefills.values():
        jax.block_until_ready(fn(params, warm))
    order = random.Random(args.seed)
    runs = {c["name"]: [] for c in configs}
    for i, tokens in enumerate(tqdm(prompts, desc=f"wall clock (T = {temperature:g})",
                                    unit="prompt")):
        prompt = make_prompt([tokens], pad_to=width)
        prefill_s = {}
        for name, (fn, params) in prefills.items():
            prefill_s[name] = timing.seconds(fn, params, prompt)[0]
        shuffled = list(configs)
        order.shuffle(shuffled)
        for config in shuffled:
            seconds, out = timing.seconds(runner, config, prompt, jax.random.PRNGKey(1000 + i),
                                 temperature)
            counts = row_counts(out, 1)[0]
            models = ("target",) if config["kind"] == "autoregressive" else ("target", "drafter")
            decode_s = seconds - sum(prefill_s[m] for m in models)
            runs[config["name"]].append({**counts, "seconds": seconds, "decode_s": decode_s,
                                         "output": np.asarray(out.tokens[0, :counts["tokens"]])
                                         .tolist()})
    summary = {}
    for name, rows in runs.items():
        score, low, high = ratio_ci(rows, "tokens", "decode_s")
        summary[name] = {"tokens_per_s": score, "ci95": [low, high], "runs": rows}
    return summary


def fit_latency_model(runs: list[dict]) -> dict:
    """Least squares for (t_draft, t_target) in the seed's model (no intercept):
    T/N = t_draft (1 + D/N - Nt/N) + t_target Nt/N, over speculative runs.

    The model has one ``t_target`` for every target call. The autoregressive
    baseline's calls score 1 token, a verification call K + 1; where a call's
    cost grows with its width (CPUs) the two differ severalfold, and the
    baseline's runs would pull the fit off the speculative ones it is meant to
    describe (on the README's CPU run: R² -0.12 with them, 0.92 without). So
    callers pass speculative runs only; the baseline is measured, not modelled.
    """
    if any(r["target_calls"] == r["tokens"] and not r["drafted"] for r in runs):
        raise ValueError("fit_latency_model takes speculative runs only: an autoregressive "
                         "run's width-1 target calls are not the model's t_target.")
    a = np.array([[1 + r["discarded"] / r["tokens"] - r["target_calls"] / r["tokens"],
                   r["target_calls"] / r["tokens"]] for r in runs])
    y = np.array([r["decode_s"] / r["tokens"] for r in runs])
    (t_draft, t_target), *_ = np.linalg.lstsq(a, y, rcond=None)
    residual = y - a @ np.array([t_draft, t_target])
    r2 = 1.0 - float(residual @ residual) / float(((y - y.mean()) ** 2).sum())
    return {"t_draft": float(t_draft), "t_target": float(t_target), "r2": r2, "runs": len(runs)}


def summarise_wall_clock(report: dict) -> None:
    """From the timed runs: the latency model's fit, every configuration's
    predicted tokens/s over the phase-1 counts, and the best ``h`` and ``K``."""
    speculative = [r for name, rows in report["wall_clock"].items()
                   if name != "autoregressive" for r in rows["runs"]]
    report["latency_model"] = fit_latency_model(speculative)
    for counts in report["counts"].values():
        counts["predicted_tokens_per_s"] = predicted_tokens_per_s(report["latency_model"],
                                                                  counts)
    report["best"] = best_by_kind(report["counts"],
                                  lambda name: report["wall_clock"][name]["tokens_per_s"])


def best_by_kind(counts: dict, tokens_per_s) -> dict:
    """The fastest fixed-K and the fastest SpecDec++ configuration by ``tokens_per_s(name)``."""
    return {kind: max((name for name, c in counts.items() if c["config"]["kind"] == kind),
                      key=tokens_per_s)
            for kind in ("fixed", "specdecpp")}


def device_predictions(report: dict, steps_report: dict, dtype: str) -> dict:
    """Batch-1 tokens/s of every configuration on the device that timed
    ``steps_report`` (``eval/bench_accelerator.py``), from the phase-1 counts.

    A speculative run costs one drafter step per drafted token and one target
    call per round: ``T = t_draft D + t_target(w) N_target``, each term an
    in-loop step (no per-round overhead; that benchmark measures it apart). The
    width ``w`` is K + 1 for fixed K; for SpecDec++, whose rounds vary, the
    mean draft per round plus one, rounded up to a measured width (exact where
    ``t_target`` is flat in the width, as on a GPU at batch 1). The
    autoregressive target costs one width-1 step per token.
    """
    if dtype not in steps_report["by_dtype"]:
        raise ValueError(f"{dtype} is not in the steps report (it has "
                         f"{sorted(steps_report['by_dtype'])}); pass --device-dtype.")
    steps = steps_report["by_dtype"][dtype]["steps"]
    if "1" not in steps["target"] or "1" not in steps["drafter"]:
        raise ValueError("the steps report has no batch-1 steps; rerun bench_accelerator.py "
                         "with --batch-sizes 1.")
    target = {int(k): v["step_s"] for k, v in steps["target"]["1"].items()}
    t_draft = steps["drafter"]["1"]["1"]["step_s"]

    def t_target(width: int) -> tuple[int, float]:
        covering = [w for w in target if w >= width]
        if not covering:
            raise ValueError(f"the steps report's widest target step is {max(target)}, "
                             f"narrower than {width}; rerun bench_accelerator.py with "
                             f"--target-step-widths ... {width}.")
        return min(covering), target[min(covering)]

    autoregressive = 1.0 / target[1]
    rows = {}
    for name, counts in report["counts"].items():
        n, calls, drafted = (sum(r[key] for r in counts["rows"])
                             for key in ("tokens", "target_calls", "drafted"))
        config = counts["config"]
        width, t = t_target(config["k"] + 1 if config["kind"] == "fixed"
                            else math.ceil(drafted / calls) + 1)
        tokens_per_s = n / (t_draft * drafted + t * calls)
        rows[name] = {"target_width": width, "tokens_per_s": tokens_per_s,
                      "speedup": tokens_per_s / autoregressive}
    return {"device": steps_report["environment"]["machine"], "dtype": dtype,
            "jax": steps_report["environment"]["jax"], "t_draft": t_draft,
            "t_target": {str(w): t for w, t in sorted(target.items())},
            "autoregressive_tokens_per_s": autoregressive, "configurations": rows,
            "best": best_by_kind(report["counts"], lambda n: rows[n]["tokens_per_s"])}


def predicted_tokens_per_s(fit: dict, counts: dict) -> float:
    n = sum(r["tokens"] for r in counts["rows"])
    seconds = sum(fit["t_draft"] * (r["tokens"] - r["target_calls"] + r["discarded"])
                  + fit["t_target"] * r["target_calls"] for r in counts["rows"])
    return n / seconds


def _run_line(report: dict) -> str:
    """The sentence that says what ran: pair, head, prompts, settings."""
    return (f"Pair: {report['drafter']} -> {report['target']}; head `{report['head']}` "
            f"(D = {report['head_config']['depth']}). {report['num_prompts']} prompts x "
            f"{report['max_new_tokens']} new tokens, T = 1, K_max = {report['k_max']}, "
            f"SpecDec++ target widths {report['target_widths']}")


def format_ci(stat: dict, digits: int = 3) -> str:
    low, high = stat["ci95"]
    return f"{stat['value']:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def _rates(counts: dict) -> str:
    """Figure 4's two cells: verification and discard rates with their CIs."""
    return f"{format_ci(counts['verification_rate'])} | {format_ci(counts['discard_rate'])}"


def markdown(report: dict) -> str:
    if "wall_clock" not in report:
        return markdown_counts(report)
    env, fit = report["environment"], report["latency_model"]
    ar = report["wall_clock"]["autoregressive"]["tokens_per_s"]
    measured = {name: {"value": w["tokens_per_s"], "ci95": w["ci95"]}
                for name, w in report["wall_clock"].items()}
    lines = [
        "# SpecDec++ on HumanEval (Huang et al., Table 1 and Figure 4 layout)",
        "",
        f"{_run_line(report)}; wall clock at batch 1 on the first {report['timed_prompts']} "
        f"prompts, interleaved. Machine: {env['machine']}, {env['cpu_count']} CPUs, float32, "
        f"Python {env['python']}, jax {env['jax']}, flax {env['flax']}.",
        "",
        f"Latency model fit over {fit['runs']} timed speculative runs: t_draft = "
        f"{fit['t_draft']:.4f} s, t_target = {fit['t_target']:.4f} s, R² = {fit['r2']:.3f}. "
        f"Autoregressive target: {ar:.2f} tokens/s.",
        "",
        "## Table 1 layout: best throughput",
        "",
        "| Method | measured tokens/s (95% CI) | speedup | model-predicted tokens/s (all "
        "prompts) | greedy tokens/s | greedy == target |",
        "|---|---|---|---|---|---|",
    ]
    for label, name in (("SpecDec (best K)", report["best"]["fixed"]),
                        ("SpecDec++ (best h)", report["best"]["specdecpp"])):
        greedy = report["greedy"].get(name, {})
        lines.append(
            f"| {label}: {name} | {format_ci(measured[name], 2)} | "
            f"{measured[name]['value'] / ar:.2f}x | "
            f"{report['counts'][name]['predicted_tokens_per_s']:.2f} | "
            f"{greedy.get('tokens_per_s', float('nan')):.2f} | "
            f"{greedy.get('identical_to_target', 'n/a')} |")
    lines += ["", "## Figure 4 data: every configuration", "",
              "| Configuration | verification rate N_target/N (95% CI) | discard rate "
              "N_discarded/N (95% CI) | measured tokens/s (95% CI) | predicted tokens/s |",
              "|---|---|---|---|---|"]
    for name, c in report["counts"].items():
        lines.append(f"| {name} | {_rates(c)} | {format_ci(measured[name], 2)} | "
                     f"{c['predicted_tokens_per_s']:.2f} |")
    for device in report.get("device_predictions", []):
        lines += ["", *markdown_device(report, device)]
    if report.get("plot"):
        lines += ["", f"![verification vs discard rate]({report['plot']})"]
    return "\n".join(lines) + "\n"


def markdown_device(report: dict, device: dict) -> list[str]:
    """Predicted batch-1 throughput on another device (``device_predictions``)."""
    best = device["best"]
    gain = (device["configurations"][best["specdecpp"]]["tokens_per_s"]
            / device["configurations"][best["fixed"]]["tokens_per_s"] - 1)
    lines = [f"## Predicted on {device['device']} ({device['dtype']}, jax {device['jax']})",
             "",
             f"From the counts above and that device's in-loop steps (random weights of the "
             f"real shapes, `{device.get('source', 'eval/bench_accelerator.py')}`): t_draft = "
             f"{1e3 * device['t_draft']:.2f} ms; t_target = "
             + ", ".join(f"{1e3 * t:.2f}" for t in device["t_target"].values())
             + f" ms at widths {', '.join(device['t_target'])}; autoregressive "
             f"{device['autoregressive_tokens_per_s']:.0f} tokens/s. Best h "
             f"({best['specdecpp']}) vs best K ({best['fixed']}): {100 * gain:+.1f}%.",
             "",
             "| Configuration | target call width | predicted tokens/s | vs autoregressive |",
             "|---|---|---|---|"]
    for name, row in device["configurations"].items():
        lines.append(f"| {name} | {row['target_width']} | {row['tokens_per_s']:.0f} | "
                     f"{row['speedup']:.2f}x |")
    return lines


def markdown_counts(report: dict) -> str:
    """Phase 1 alone (``--counts-only``): Figure 4's two rates per configuration."""
    env = report["environment"]
    lines = [
        "# SpecDec++ on HumanEval: phase 1 (counts; Figure 4 data)",
        "",
        f"{_run_line(report)}, batch {report['batch_size']}. Rates per generated token with "
        f"95% bootstrap CIs over prompts; they do not depend on the machine. Wall clock "
        f"(phase 2) not run yet. Machine: {env['machine']}, float32, jax {env['jax']}.",
        "",
        "| Configuration | tokens N | verification rate N_target/N (95% CI) | discard rate "
        "N_discarded/N (95% CI) |",
        "|---|---|---|---|"]
    for name, c in report["counts"].items():
        lines.append(f"| {name} | {c['tokens']} | {_rates(c)} |")
    if report.get("plot"):
        lines += ["", f"![verification vs discard rate]({report['plot']})"]
    return "\n".join(lines) + "\n"


def write_markdown(report: dict, path: str) -> None:
    """The Markdown summary and, beside it, Figure 4's plot."""
    report["plot"] = path.rsplit(".", 1)[0] + ".png"
    plot(report, report["plot"])
    report["plot"] = report["plot"].rsplit("/", 1)[-1]
    with open(path, "w") as f:
        f.write(markdown(report))


def plot(report: dict, path: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(5, 4))
    for kind, marker, label in (("fixed", "o-", "SpecDec (fixed K)"),
                                ("specdecpp", "s-", "SpecDec++ (threshold h)")):
        points = [(c["verification_rate"]["value"], c["discard_rate"]["value"],
                   c["config"].get("k", c["config"].get("h")))
                  for c in report["counts"].values() if c["config"]["kind"] == kind]
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker, label=label)
        for x, y, tag in points:
            ax.annotate(f"{tag:g}", (x, y), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("verification rate N_target / N")
    ax.set_ylabel("discard rate N_discarded / N")
    ax.set_title("HumanEval, T = 1")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def add_device_predictions(args) -> None:
    """``--device-steps``: the report at ``--out`` gains (or replaces) that
    device's predictions; its Markdown is rewritten. No models are loaded."""
    with open(args.out) as f:
        report = json.load(f)
    with open(args.device_steps) as f:
        device = device_predictions(report, json.load(f), args.device_dtype)
    device["source"] = args.device_steps
    report["device_predictions"] = [d for d in report.get("device_predictions", [])
                                    if (d["device"], d["dtype"]) != (device["device"],
                                                                     device["dtype"])]
    report["device_predictions"].append(device)
    if args.markdown:
        write_markdown(report, args.markdown)
    timing.write_report(report, args.out)
    best = device["best"]
    for name in (best["fixed"], best["specdecpp"]):
        row = device["configurations"][name]
        print(f"{device['device']} ({device['dtype']}): {name} {row['tokens_per_s']:.0f} "
              f"tokens/s predicted ({row['speedup']:.2f}x the autoregressive target)")


def main(argv=None):
    args = parse_args(argv)
    if args.device_steps:
        add_device_predictions(args)
        return
    pair = study.load_pair(target=args.target, drafter=args.drafter)
    head, head_params, meta = load_head(args.head, drafter_name=args.drafter,
                                        drafter_params=pair.drafter_params,
                                        drafter=pair.drafter)
    prompts = [pair.encode(p) for p in humaneval.load_prompts(args.num_prompts)]
    runner = Runner(pair, head, head_params, args)
    configs = configurations(args)
    report = {"environment": timing.environment(), "precision": "float32",
              "target": args.target, "drafter": args.drafter, "head": args.head,
              "head_config": meta["config"], "num_prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "k_max": args.k_max,
              "target_widths": list(runner.adaptive.target_widths(args.k_max)),
              "timed_prompts": args.timed_prompts, "batch_size": args.batch_size}

    report["counts"] = phase_counts(runner, configs, prompts, args,
                                    log=counts_log(args, prompts, meta, head_params))
    timing.write_report(report, args.out)
    if args.counts_only:
        if args.markdown:
            write_markdown(report, args.markdown)
            timing.write_report(report, args.out)
        print(f"phase 1 done: {args.out}; rerun without --counts-only for the wall clock")
        return
    ar_config = {"name": "autoregressive", "kind": "autoregressive"}
    timed_prompts = prompts[:args.timed_prompts]
    report["wall_clock"] = phase_wall_clock(runner, configs + [ar_config], timed_prompts, args,
                                            temperature=1.0)
    summarise_wall_clock(report)
    timing.write_report(report, args.out)

    by_name = {c["name"]: c for c in configs}
    greedy_configs = [by_name[report["best"]["fixed"]], by_name[report["best"]["specdecpp"]],
                      ar_config]
    greedy = phase_wall_clock(runner, greedy_configs, timed_prompts, args, temperature=0.0)
    reference = [r["output"] for r in greedy["autoregressive"]["runs"]]
    for result in greedy.values():
        result["identical_to_target"] = [r["output"] for r in result["runs"]] == reference
    report["greedy"] = greedy
    timing.write_report(report, args.out)
    if args.markdown:
        write_markdown(report, args.markdown)
        timing.write_report(report, args.out)
    ar = report["wall_clock"]["autoregressive"]["tokens_per_s"]
    for name in (report["best"]["fixed"], report["best"]["specdecpp"]):
        wall = report["wall_clock"][name]
        print(f"{name}: {wall['tokens_per_s']:.2f} tokens/s ({wall['tokens_per_s'] / ar:.2f}x "
              f"the autoregressive target), greedy identical to the target: "
              f"{greedy[name]['identical_to_target']}")
    fit = report["latency_model"]
    print(f"latency model: t_draft {fit['t_draft']:.4f} s, t_target {fit['t_target']:.4f} s, "
          f"R^2 {fit['r2']:.3f}")


if __name__ == "__main__":
    main()
