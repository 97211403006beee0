"""SpecDec++ vs fixed draft lengths on HumanEval (Huang et al., Table 1 and Figure 4).

Two phases, one job (``benchmarks/configs/specdecpp.gin``):

1. **Counts** (batched, every prompt, T = 1): for SpecDec++ at each threshold
   ``h`` and speculative decoding at each fixed ``K``, per prompt: tokens
   ``N``, target calls ``N_target`` and discarded drafts ``N_discarded``
   (drafted - accepted). The verification rate ``N_target / N`` and the
   discard rate ``N_discarded / N`` do not depend on the machine (Figure 4).
2. **Wall clock** (batch 1, the first ``timed_prompts`` prompts): every
   configuration and the autoregressive target, interleaved in a shuffled
   order per prompt so drift in the machine's speed hits all alike; decode
   time excludes the prefill (timed separately and subtracted). Tokens/s with
   95% bootstrap CIs over prompts. Then the one cost model (``decode.cost``) is
   calibrated on this machine at the benchmark's context (each model's
   in-loop call latency by width, and the per-round overhead) and prices every
   configuration's phase-1 counts (``decode_seconds``): predicted tokens/s over
   all prompts. Its agreement with the timed runs (per generated token:
   Pearson r, mean bias, mean ratio) is reported beside them. Greedy runs of
   the best ``h`` and the best ``K`` are timed too and checked token for
   token against the greedy target.

    python -m benchmarks.main --gin_file=benchmarks/configs/specdecpp.gin \\
        --gin.HEAD="'results/specdecpp/head-d3-w6/head'"

Writes a JSON report and a Markdown summary (``markdown_path``) with the plot.
Phase 1 keeps each finished batch in ``<out stem>.counts.jsonl``: a rerun with
the same settings resumes there (phase 2 always runs whole, being
interleaved); a log committed gzipped (``.counts.jsonl.gz``) is unpacked
beside it first.

**Another device** (no models loaded; ``benchmarks/configs/specdecpp_device.gin``,
``run_bench_specdecpp_device``): reads the in-loop step costs that the
accelerator benchmark timed there (random weights of the real shapes, its
``target_step_widths``) and adds to the report at ``out`` every
configuration's predicted batch-1 tokens/s on that device, from the phase-1
counts (``device_predictions``).
"""

from __future__ import annotations

import gzip
import hashlib
import math
import pathlib
import random
import shutil
from collections.abc import Sequence

import jax
import numpy as np

from benchmarks import shared
from specdec_jax import api, precision
from specdec_jax.checkpoints import tree_paths
from specdec_jax.checkpoints.acceptance_head_io import META_FILE, load_head
from specdec_jax.data import humaneval
from specdec_jax.data.metrics import bootstrap_ci, ratio_ci
from specdec_jax.decode import cost as cost_lib
from specdec_jax.decode.round import required_cache_length
from specdec_jax.drafting.adaptive import DEFAULT_MAX_DRAFTS, SMALL_TARGET_WIDTHS, AdaptiveDrafter
from specdec_jax.drafting.adaptive import target_widths as default_target_widths
from specdec_jax.jobs import resolver, tables
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import calibration, jsonio, timing
from specdec_jax.runtime.progress import tqdm
from specdec_jax.runtime.resume import ResumeLog

AUTOREGRESSIVE = {"name": "autoregressive", "kind": "autoregressive"}
# The drafter's calls are one-token steps, and two-token catch-ups after a
# round that accepted every draft (not in the counts: priced as one-token steps).
DRAFTER_WIDTHS = (1, 2)


# --- settings ----------------------------------------------------------------------------------

def check_settings(*, head: str, num_prompts: int, max_new_tokens: int,
                   thresholds: Sequence[float], ks: Sequence[int], k_max: int,
                   target_widths: Sequence[int] | None, batch_size: int,
                   timed_prompts: int) -> None:
    """The benchmark's settings, checked before any model is loaded."""
    if not head:
        raise ValueError("head is required: the directory of an acceptance head trained for "
                         "the drafter (configs/runs/specdecpp_train.gin writes <workdir>/head), "
                         "e.g. --gin.HEAD=\"'results/head-d3-w6/head'\".")
    if not pathlib.Path(head, META_FILE).exists():
        raise FileNotFoundError(f"head={head!r} holds no acceptance head ({META_FILE} missing); "
                                "train one with configs/runs/specdecpp_train.gin.")
    shared.check_at_least(1, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                          batch_size=batch_size, k_max=k_max, ks=ks)
    if not 0 < timed_prompts <= num_prompts:
        raise ValueError(f"timed_prompts must be in [1, num_prompts = {num_prompts}], "
                         f"got {timed_prompts}.")
    if not thresholds or any(not 0 < h < 1 for h in thresholds):
        raise ValueError(f"thresholds must be a non-empty list of h in (0, 1), got "
                         f"{list(thresholds)}.")
    if target_widths is not None and (not target_widths or min(target_widths) < 1
                                      or max(target_widths) != k_max + 1):
        raise ValueError(f"target_widths {list(target_widths)} must be >= 1 and end at "
                         f"K_max + 1 = {k_max + 1} (a row may draft K_max tokens); or None "
                         "for drafting.adaptive.target_widths.")


def configurations(*, thresholds: Sequence[float], ks: Sequence[int]) -> list[dict]:
    return ([{"name": f"SpecDec++ h={h:g}", "kind": "specdecpp", "h": h} for h in thresholds]
            + [{"name": f"SpecDec K={k}", "kind": "fixed", "k": k} for k in ks])


def compiled_widths(settings: dict) -> tuple[int, ...] | None:
    """SpecDec++'s compiled target call widths from a report or a counts-log
    header (``target_widths``, else the default for its ``k_max`` when widths
    were not recorded: then one default, the CPU's, for every backend; None when
    neither is recorded)."""
    if settings.get("target_widths"):
        return tuple(sorted(settings["target_widths"]))
    if "k_max" in settings:
        return default_target_widths(settings["k_max"], SMALL_TARGET_WIDTHS)
    return None


# --- running -----------------------------------------------------------------------------------

class Runner:
    """Jitted generate functions per configuration, over one pair and head."""

    def __init__(self, pair, head, head_params, *, ks: Sequence[int], k_max: int,
                 max_new_tokens: int, target_widths: Sequence[int] | None):
        self.pair = pair
        self.adaptive = AdaptiveDrafter(
            pair.drafter, head, eos_ids=pair.eos_ids,
            widths=tuple(target_widths) if target_widths else None)
        self.adaptive_params = self.adaptive.select_params(
            {self.adaptive.name: pair.drafter_params, self.adaptive.head_name: head_params})
        common = dict(target=pair.target, max_new_tokens=max_new_tokens,
                      eos_ids=tuple(pair.eos_ids))
        self.fns = {"specdecpp": api.make_generate_fn(drafter=self.adaptive, gamma=k_max,
                                                      **common),
                    "autoregressive": api.make_generate_fn(method="autoregressive", **common)}
        for k in ks:
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


def phase_counts(runner, configs, prompts, *, batch_size: int, seed: int,
                 log: ResumeLog | None = None) -> dict:
    """Every configuration on every prompt at T = 1, in batches; each finished
    batch goes to ``log`` (if given), and batches already there are reused."""
    results = {}
    width = max(len(p) for p in prompts)  # one shape: one compilation per configuration
    batches = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
    for config in tqdm(configs, desc="counts (T = 1)", unit="config"):
        rows = []
        for i, chunk in enumerate(batches):
            key = (config["name"], i)
            if log is None or key not in log.done:
                padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
                out = runner(config, make_prompt(padded, pad_to=width),
                             jax.random.PRNGKey(seed + i), 1.0)
                if log is not None:
                    log.add(key, row_counts(out, len(chunk)))
                else:
                    rows += row_counts(out, len(chunk))
            if log is not None:
                rows += log.done[key]
        results[config["name"]] = {"config": config, "rows": rows, **rates(rows)}
    return results


def counts_log_path(out: str) -> pathlib.Path:
    """``<out stem>.counts.jsonl`` beside the report (``x.json`` or ``x.json.gz``)."""
    return pathlib.Path(out).with_name(jsonio.stem_of(out) + ".counts.jsonl")


def counts_log(*, out: str, settings: dict, prompts, head_meta: dict, head_params) -> ResumeLog:
    """Phase 1's log next to the report: a rerun with the same settings resumes
    (from a gzipped copy too: unpacked beside it first). The head's weights are
    part of the settings (not only its path), so a head retrained in place
    never inherits counts made with its predecessor."""
    settings = dict(settings)
    settings["head_config"] = head_meta["config"]
    settings["head_params"] = tree_paths.params_fingerprint(head_params)
    settings["prompts_sha256"] = hashlib.sha256(repr(prompts).encode()).hexdigest()
    path = counts_log_path(out)
    packed = path.with_name(path.name + jsonio.GZIP_SUFFIX)
    if not path.exists() and packed.exists():
        with gzip.open(packed, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return ResumeLog(path, settings)


def make_prefill_timers(pair, max_length: int):
    """Jitted prefill of each model alone: subtracted from end-to-end times."""
    return {"target": (timing.prefill_fn(pair.target, max_length), pair.target_params),
            "drafter": (timing.prefill_fn(pair.drafter, max_length), pair.drafter_params)}


def phase_wall_clock(runner, configs, prompts, *, max_new_tokens: int, max_drafts: int,
                     seed: int, temperature: float) -> dict:
    """Batch 1, interleaved: per prompt every configuration once, shuffled."""
    pair = runner.pair
    width = max(len(p) for p in prompts)
    # Compile everything once (the first call of each shape) before timing.
    warm = make_prompt([prompts[0]], pad_to=width)
    for config in configs:
        runner(config, warm, jax.random.PRNGKey(0), temperature)
    max_length = required_cache_length(width, max_new_tokens, max_drafts)  # the decoders'
    prefills = make_prefill_timers(pair, max_length)
    for fn, params in prefills.values():
        jax.block_until_ready(fn(params, warm))
    order = random.Random(seed)
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
        # Total tokens over total seconds (not ``ratio_ci``, whose denominator
        # floor of 1 suits counts, not a few prompts' seconds on a fast device).
        score, low, high = bootstrap_ci(rows, lambda items: sum(r["tokens"] for r in items)
                                        / sum(r["decode_s"] for r in items))
        summary[name] = {"tokens_per_s": score, "ci95": [low, high], "runs": rows}
    return summary


# --- pricing (decode.cost) -----------------------------------------------------------------------

def target_width(config: dict, rows: list[dict], *, measured: Sequence[int] = (),
                 compiled: Sequence[int] | None = None) -> int:
    """The width of a configuration's target calls: 1 for the autoregressive
    target, K + 1 for fixed K; for SpecDec++, whose rounds vary and whose
    counts do not keep each round's width, the mean draft per round plus one,
    rounded up to a ``compiled`` width (the call it makes at batch 1). Then
    rounded up to a ``measured`` width where the cost has any (exact where the
    target's cost is flat in width, as on a GPU at batch 1)."""
    if config["kind"] == "autoregressive":
        width = 1
    elif config["kind"] == "fixed":
        width = config["k"] + 1
    else:
        drafted, calls = (sum(r[key] for r in rows) for key in ("drafted", "target_calls"))
        width = math.ceil(drafted / calls) + 1
        if compiled:
            width = min([w for w in compiled if w >= width] or [max(compiled)])
    if not measured:
        return width
    covering = [w for w in measured if w >= width]
    if not covering:
        raise ValueError(f"the widest target call measured is {max(measured)}, narrower than "
                         f"{width}; rerun benchmarks/configs/accelerator.gin with "
                         f"target_step_widths = [..., {width}].")
    return min(covering)


def decode_seconds(cost: cost_lib.CostModel, config: dict, rows: list[dict], *,
                   compiled: Sequence[int] | None = None) -> tuple[float, int]:
    """Batch-1 decode seconds of ``rows`` (phase-1 or timed counts) under the
    cost model, and the target call width priced. A speculative round is one
    target call of that width, the drafter's one-token calls (one per drafted
    token) and the per-round overhead, as ``CostModel.round_seconds`` prices
    it; the autoregressive target is one width-1 call per step."""
    measured = sorted(int(w) for w in cost.target.by_width_s)
    width = target_width(config, rows, measured=measured, compiled=compiled)
    drafted, calls = (sum(r[key] for r in rows) for key in ("drafted", "target_calls"))
    counts = {"target_calls": calls, "target_fed": width * calls,
              "target_single_calls": calls if width == 1 else 0,
              "drafter_calls_by_model": [drafted], "drafter_tokens_by_model": [drafted],
              "drafter_single_calls_by_model": [drafted]}
    speculative = config["kind"] != "autoregressive"
    seconds = cost.price(counts, widths={cost_lib.TARGET: width, cost_lib.DRAFTER: 1},
                         rounds=calls if speculative else 0)
    return seconds, width


def predicted_tokens_per_s(cost: cost_lib.CostModel, counts: dict, *,
                           compiled: Sequence[int] | None = None) -> float:
    """A configuration's batch-1 tokens/s over its counts' rows."""
    seconds, _ = decode_seconds(cost, counts["config"], counts["rows"], compiled=compiled)
    return sum(r["tokens"] for r in counts["rows"]) / seconds


def cost_model_of(report: dict) -> tuple[cost_lib.CostModel, str]:
    """The cost model a benchmark report priced its counts with: its calibrated
    ``cost_model``; in reports made before the calibration, their stored
    ``latency_model`` (a least-squares fit of one t_draft and one t_target
    over the timed runs) read as call costs flat in width."""
    if "cost_model" in report:
        return cost_lib.CostModel.from_json(report["cost_model"]), "calibrated cost model"
    if "latency_model" in report:
        fit = report["latency_model"]
        flat = lambda s: cost_lib.CallCost(single_s=s, base_s=s, per_token_s=0.0,  # noqa: E731
                                           prefill_per_token_s=0.0)
        return (cost_lib.CostModel(target=flat(fit["t_target"]), drafter=flat(fit["t_draft"])),
                "stored latency_model fit (flat in width)")
    raise ValueError("the report has neither a calibrated cost_model nor a latency_model: run "
                     "the benchmark's phase 2 (counts_only=False) to make one.")


def calibrate(pair, *, context: int, target_widths: Sequence[int], repeats: int,
              overhead_gamma: int) -> tuple[cost_lib.CostModel, dict]:
    """The cost model on this machine (``runtime.calibration.calibrate``): the target's
    in-loop calls at every width a configuration calls, the drafter's at 1
    and 2, then the per-round overhead from a timed greedy generation."""
    model, measured = calibration.calibrate(
        target=pair.target, target_params=pair.target_params, drafter=pair.drafter,
        drafter_params=pair.drafter_params, context=context, widths=tuple(target_widths),
        drafter_widths=DRAFTER_WIDTHS, repeats=repeats, overhead_gamma=overhead_gamma)
    return model, {**measured, "repeats": repeats}


def summarise_wall_clock(report: dict, cost: cost_lib.CostModel) -> None:
    """From the timed runs and the calibrated cost model: every configuration's
    predicted tokens/s over the phase-1 counts, the model's tokens/s on the
    timed prompts and its agreement with them (seconds per token, run by run),
    and the best ``h`` and ``K``."""
    compiled = compiled_widths(report)
    report["cost_model"] = cost.to_json()
    for counts in report["counts"].values():
        counts["predicted_tokens_per_s"] = predicted_tokens_per_s(cost, counts,
                                                                  compiled=compiled)
    configs = {name: c["config"] for name, c in report["counts"].items()}
    configs[AUTOREGRESSIVE["name"]] = AUTOREGRESSIVE
    modelled, measured = [], []
    for name, wall in report["wall_clock"].items():
        seconds = []
        for run in wall["runs"]:
            seconds.append(decode_seconds(cost, configs[name], [run], compiled=compiled)[0])
            modelled.append(seconds[-1] / run["tokens"])
            measured.append(run["decode_s"] / run["tokens"])
        wall["modelled_tokens_per_s"] = sum(r["tokens"] for r in wall["runs"]) / sum(seconds)
    report["agreement"] = cost_lib.agreement_stats(modelled, measured)
    report["best"] = best_by_kind(report["counts"],
                                  lambda name: report["wall_clock"][name]["tokens_per_s"])


def best_by_kind(counts: dict, tokens_per_s) -> dict:
    """The fastest fixed-K and the fastest SpecDec++ configuration by ``tokens_per_s(name)``."""
    return {kind: max((name for name, c in counts.items() if c["config"]["kind"] == kind),
                      key=tokens_per_s)
            for kind in ("fixed", "specdecpp")}


def device_predictions(report: dict, steps_report: dict, dtype: str) -> dict:
    """Batch-1 tokens/s of every configuration on the device that timed
    ``steps_report`` (the accelerator benchmark), from the phase-1 counts.

    The cost model is built from that device's in-loop steps
    (``CallCost.from_steps``, ``by_dtype[dtype]["steps"][role]["1"][width]``)
    and prices each configuration as ``decode_seconds`` does, with no
    per-round overhead (that benchmark measures it apart): ``T = t_draft D +
    t_target(w) N_target``. The autoregressive target costs one width-1 step
    per token.
    """
    if dtype not in steps_report["by_dtype"]:
        raise ValueError(f"{dtype} is not in the steps report (it has "
                         f"{sorted(steps_report['by_dtype'])}); set device_dtype to one of them.")
    steps = steps_report["by_dtype"][dtype]["steps"]
    if "1" not in steps["target"] or "1" not in steps["drafter"]:
        raise ValueError("the steps report has no batch-1 steps; rerun "
                         "benchmarks/configs/accelerator.gin with 1 among its batch_sizes.")
    cost = cost_lib.CostModel(
        target=cost_lib.CallCost.from_steps(
            {w: v["step_s"] for w, v in steps["target"]["1"].items()}),
        drafter=cost_lib.CallCost.from_steps(
            {w: v["step_s"] for w, v in steps["drafter"]["1"].items()}))
    compiled = compiled_widths(report)
    autoregressive = 1.0 / cost.target.call_s(1)
    rows = {}
    for name, counts in report["counts"].items():
        seconds, width = decode_seconds(cost, counts["config"], counts["rows"],
                                        compiled=compiled)
        tokens_per_s = sum(r["tokens"] for r in counts["rows"]) / seconds
        rows[name] = {"target_width": width, "tokens_per_s": tokens_per_s,
                      "speedup": tokens_per_s / autoregressive}
    return {"device": steps_report["environment"]["machine"], "dtype": dtype,
            "jax": steps_report["environment"]["jax"], "t_draft": cost.drafter.call_s(1),
            "t_target": dict(cost.target.by_width_s),
            "autoregressive_tokens_per_s": autoregressive, "configurations": rows,
            "best": best_by_kind(report["counts"], lambda n: rows[n]["tokens_per_s"])}


# --- reports -----------------------------------------------------------------------------------

def _run_line(report: dict) -> str:
    """The sentence that says what ran: pair, head, prompts, settings."""
    return (f"Pair: {report['drafter']} -> {report['target']}; head `{report['head']}` "
            f"(D = {report['head_config']['depth']}). {report['num_prompts']} prompts x "
            f"{report['max_new_tokens']} new tokens, T = 1, K_max = {report['k_max']}, "
            f"SpecDec++ target widths {report['target_widths']}")


def rate_cells(counts: dict) -> list[str]:
    """Figure 4's two cells: verification and discard rates with their CIs."""
    return [tables.format_ci(counts[key]["value"], counts[key]["ci95"])
            for key in ("verification_rate", "discard_rate")]


def _cost_line(report: dict) -> str:
    """What priced the predictions and how well it matched the timed runs."""
    if "cost_model" not in report:  # reports made before the calibrated cost model
        fit = report["latency_model"]
        return (f"Latency model fit over {fit['runs']} timed speculative runs: t_draft = "
                f"{fit['t_draft']:.4f} s, t_target = {fit['t_target']:.4f} s, "
                f"R² = {fit['r2']:.3f}.")
    cost = cost_lib.CostModel.from_json(report["cost_model"])
    agree = report["agreement"]
    pearson = "n/a" if agree["pearson"] is None else f"{agree['pearson']:.3f}"
    context = report.get("calibration", {}).get("context", "?")
    return (f"Cost model (`specdec_jax/decode/cost.py`, calibrated here at {context} cached "
            f"tokens): drafter step {1e3 * cost.drafter.call_s(1):.1f} ms; target call "
            + ", ".join(f"{1e3 * float(t):.1f}" for t in cost.target.by_width_s.values())
            + f" ms at widths {', '.join(cost.target.by_width_s)}; round overhead "
            f"{1e3 * cost.round_overhead_s:.1f} ms. Modelled vs measured decode seconds per "
            f"token over {agree['n']} timed runs (speculative and autoregressive): Pearson r = "
            f"{pearson}, mean bias (modelled - measured) = {1e3 * agree['mean_bias']:+.2f} "
            f"ms/token, mean ratio measured / modelled = {agree['mean_ratio']:.3f}.")


def markdown(report: dict) -> str:
    if "wall_clock" not in report:
        return markdown_counts(report)
    env = report["environment"]
    ar = report["wall_clock"]["autoregressive"]["tokens_per_s"]
    measured = {name: tables.format_ci(w["tokens_per_s"], w["ci95"], digits=2)
                for name, w in report["wall_clock"].items()}
    lines = [
        "# SpecDec++ on HumanEval (Huang et al., Table 1 and Figure 4 layout)",
        "",
        f"{_run_line(report)}; wall clock at batch 1 on the first {report['timed_prompts']} "
        f"prompts, interleaved. Machine: {env['machine']}, {env['cpu_count']} CPUs, "
        f"{report.get('precision', 'float32')}, Python {env['python']}, jax {env['jax']}, "
        f"flax {env['flax']}.",
        "",
        f"{_cost_line(report)} Autoregressive target: {ar:.2f} tokens/s.",
        "",
        "## Table 1 layout: best throughput",
        "",
    ]
    rows = []
    for label, name in (("SpecDec (best K)", report["best"]["fixed"]),
                        ("SpecDec++ (best h)", report["best"]["specdecpp"])):
        greedy = report["greedy"].get(name, {})
        speedup = report["wall_clock"][name]["tokens_per_s"] / ar
        rows.append((f"{label}: {name}", measured[name], f"{speedup:.2f}x",
                     f"{report['counts'][name]['predicted_tokens_per_s']:.2f}",
                     f"{greedy.get('tokens_per_s', float('nan')):.2f}",
                     greedy.get("identical_to_target", "n/a")))
    lines += tables.markdown_table(
        ("Method", "measured tokens/s (95% CI)", "speedup",
         "model-predicted tokens/s (all prompts)", "greedy tokens/s", "greedy == target"), rows)
    modelled = "modelled_tokens_per_s" in report["wall_clock"]["autoregressive"]
    rows = []
    for name, c in report["counts"].items():
        timed = ([f"{report['wall_clock'][name]['modelled_tokens_per_s']:.2f}"]
                 if modelled else [])
        rows.append([name, *rate_cells(c), measured[name], *timed,
                     f"{c['predicted_tokens_per_s']:.2f}"])
    lines += ["", "## Figure 4 data: every configuration", ""] + tables.markdown_table(
        ["Configuration", "verification rate N_target/N (95% CI)",
         "discard rate N_discarded/N (95% CI)", "measured tokens/s (95% CI)",
         *(["modelled tokens/s (timed prompts)"] if modelled else []), "predicted tokens/s"],
        rows)
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
             f"real shapes, `{device.get('source', 'the accelerator benchmark')}`): t_draft = "
             f"{1e3 * device['t_draft']:.2f} ms; t_target = "
             + ", ".join(f"{1e3 * t:.2f}" for t in device["t_target"].values())
             + f" ms at widths {', '.join(device['t_target'])}; autoregressive "
             f"{device['autoregressive_tokens_per_s']:.0f} tokens/s. Best h "
             f"({best['specdecpp']}) vs best K ({best['fixed']}): {100 * gain:+.1f}%.",
             ""]
    return lines + tables.markdown_table(
        ("Configuration", "target call width", "predicted tokens/s", "vs autoregressive"),
        [(name, row["target_width"], f"{row['tokens_per_s']:.0f}", f"{row['speedup']:.2f}x")
         for name, row in device["configurations"].items()])


def markdown_counts(report: dict) -> str:
    """Phase 1 alone (``counts_only``): Figure 4's two rates per configuration."""
    env = report["environment"]
    lines = [
        "# SpecDec++ on HumanEval: phase 1 (counts; Figure 4 data)",
        "",
        f"{_run_line(report)}, batch {report['batch_size']}. Rates per generated token with "
        f"95% bootstrap CIs over prompts; they do not depend on the machine. Wall clock "
        f"(phase 2) not run yet. Machine: {env['machine']}, {report.get('precision', 'float32')}, "
        f"jax {env['jax']}.",
        ""] + tables.markdown_table(
        ("Configuration", "tokens N", "verification rate N_target/N (95% CI)",
         "discard rate N_discarded/N (95% CI)"),
        [(name, c["tokens"], *rate_cells(c)) for name, c in report["counts"].items()])
    if report.get("plot"):
        lines += ["", f"![verification vs discard rate]({report['plot']})"]
    return "\n".join(lines) + "\n"


def write_markdown(report: dict, path: str) -> None:
    """The Markdown summary and, beside it, Figure 4's plot."""
    report["plot"] = path.rsplit(".", 1)[0] + ".png"
    plot(report, report["plot"])
    report["plot"] = report["plot"].rsplit("/", 1)[-1]
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
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
    plt.close(fig)


# --- jobs --------------------------------------------------------------------------------------

def run_bench_specdecpp(*, head: str, target: str = "qwen2.5-coder-1.5b",
                        drafter: str = "qwen2.5-coder-0.5b", num_prompts: int = 40,
                        max_new_tokens: int = 128,
                        thresholds: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
                        ks: Sequence[int] = (2, 4, 6, 8, 10), k_max: int = DEFAULT_MAX_DRAFTS,
                        target_widths: Sequence[int] | None = None, batch_size: int = 8,
                        timed_prompts: int = 5, seed: int = 0,
                        out: str = "results/bench_specdecpp.json",
                        markdown_path: str | None = None, counts_only: bool = False,
                        calibration_repeats: int = 3, overhead_gamma: int = 4) -> dict:
    """The benchmark (module docstring) with ``head`` (a head directory trained
    for ``drafter``). ``target_widths``: SpecDec++ target call widths to
    compile (must end at K_max + 1; default ``drafting.adaptive.target_widths``;
    finer widths waste less where a call's cost grows with its width, CPUs, at
    more compile time). ``counts_only`` stops after phase 1 (the rates;
    batched, any machine, resumable); phase 2 needs a quiet machine and can
    follow in a later run. ``calibration_repeats``/``overhead_gamma``: the cost
    model's calibration (repeats per width; the draft length of the timed
    generation that measures the per-round overhead). Returns the report."""
    check_settings(head=head, num_prompts=num_prompts, max_new_tokens=max_new_tokens,
                   thresholds=thresholds, ks=ks, k_max=k_max, target_widths=target_widths,
                   batch_size=batch_size, timed_prompts=timed_prompts)
    shared.check_at_least(1, calibration_repeats=calibration_repeats,
                          overhead_gamma=overhead_gamma)
    # As the counts log's header records them (a rerun of a stored log must match).
    thresholds, ks = [float(h) for h in thresholds], list(ks)
    target_widths = None if target_widths is None else list(target_widths)
    pair = resolver.load_pair(target=target, drafter=drafter)
    head_model, head_params, meta = load_head(head, drafter_name=drafter,
                                              drafter_params=pair.drafter_params,
                                              drafter=pair.drafter)
    prompts = [pair.encode(p) for p in humaneval.load_prompts(num_prompts)]
    runner = Runner(pair, head_model, head_params, ks=ks, k_max=k_max,
                    max_new_tokens=max_new_tokens, target_widths=target_widths)
    configs = configurations(thresholds=thresholds, ks=ks)
    report = {"environment": timing.environment(), "precision": precision.resolve_dtype("auto"),
              "target": target, "drafter": drafter, "head": head,
              "head_config": meta["config"], "num_prompts": len(prompts),
              "max_new_tokens": max_new_tokens, "k_max": k_max,
              "target_widths": list(runner.adaptive.target_widths(k_max)),
              "timed_prompts": timed_prompts, "batch_size": batch_size}

    settings = {"target": target, "drafter": drafter, "head": head,
                "max_new_tokens": max_new_tokens, "thresholds": thresholds, "ks": ks,
                "k_max": k_max, "target_widths": target_widths, "batch_size": batch_size,
                "seed": seed}
    report["counts"] = phase_counts(
        runner, configs, prompts, batch_size=batch_size, seed=seed,
        log=counts_log(out=out, settings=settings, prompts=prompts, head_meta=meta,
                       head_params=head_params))
    shared.write_report(report, out)
    if counts_only:
        if markdown_path:
            write_markdown(report, markdown_path)
            shared.write_report(report, out)
        print(f"phase 1 done: {out}; rerun with counts_only=False for the wall clock")
        return report
    timed = prompts[:timed_prompts]
    wall = dict(max_new_tokens=max_new_tokens, max_drafts=max(k_max, max(ks)), seed=seed)
    report["wall_clock"] = phase_wall_clock(runner, configs + [AUTOREGRESSIVE], timed,
                                            temperature=1.0, **wall)
    context = max(len(p) for p in prompts) + max_new_tokens // 2
    widths = sorted({1, 2, *report["target_widths"], *(k + 1 for k in ks)})
    cost, report["calibration"] = calibrate(pair, context=context, target_widths=widths,
                                            repeats=calibration_repeats,
                                            overhead_gamma=overhead_gamma)
    summarise_wall_clock(report, cost)
    shared.write_report(report, out)

    by_name = {c["name"]: c for c in configs}
    greedy_configs = [by_name[report["best"]["fixed"]], by_name[report["best"]["specdecpp"]],
                      AUTOREGRESSIVE]
    greedy = phase_wall_clock(runner, greedy_configs, timed, temperature=0.0, **wall)
    reference = [r["output"] for r in greedy["autoregressive"]["runs"]]
    for result in greedy.values():
        result["identical_to_target"] = [r["output"] for r in result["runs"]] == reference
    report["greedy"] = greedy
    shared.write_report(report, out)
    if markdown_path:
        write_markdown(report, markdown_path)
        shared.write_report(report, out)
    ar = report["wall_clock"]["autoregressive"]["tokens_per_s"]
    for name in (report["best"]["fixed"], report["best"]["specdecpp"]):
        wall_clock = report["wall_clock"][name]
        print(f"{name}: {wall_clock['tokens_per_s']:.2f} tokens/s "
              f"({wall_clock['tokens_per_s'] / ar:.2f}x the autoregressive target), predicted "
              f"{wall_clock['modelled_tokens_per_s']:.2f} on the timed prompts; greedy "
              f"identical to the target: {greedy[name]['identical_to_target']}")
    print(_cost_line(report))
    return report


def run_bench_specdecpp_device(*, out: str, device_steps: str, device_dtype: str = "bfloat16",
                               markdown_path: str | None = None) -> dict:
    """The report at ``out`` (a ``run_bench_specdecpp`` report, plain or
    gzipped) gains (or replaces) the predictions for the device that timed
    ``device_steps`` (an accelerator benchmark report, ``device_dtype`` of its
    dtypes); its Markdown (``markdown_path``) is rewritten. No models are loaded."""
    report_path, steps_path = jsonio.existing(out), jsonio.existing(device_steps)
    for name, path in (("out", report_path), ("device_steps", steps_path)):
        if not path.exists():
            raise FileNotFoundError(f"{name}={str(path)!r} does not exist; "
                                    + ("run benchmarks/configs/specdecpp.gin first."
                                       if name == "out" else
                                       "pass an accelerator benchmark report."))
    report = jsonio.read_json(report_path)
    device = device_predictions(report, jsonio.read_json(steps_path), device_dtype)
    device["source"] = device_steps
    report["device_predictions"] = [d for d in report.get("device_predictions", [])
                                    if (d["device"], d["dtype"]) != (device["device"],
                                                                     device["dtype"])]
    report["device_predictions"].append(device)
    if markdown_path:
        write_markdown(report, markdown_path)
    shared.write_report(report, str(report_path))
    best = device["best"]
    for name in (best["fixed"], best["specdecpp"]):
        row = device["configurations"][name]
        print(f"{device['device']} ({device['dtype']}): {name} {row['tokens_per_s']:.0f} "
              f"tokens/s predicted ({row['speedup']:.2f}x the autoregressive target)")
    return device
