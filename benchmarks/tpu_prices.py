"""The real pair's predicted speedup on TPU chips, priced by the one cost model.

Nothing here runs on a TPU. Per-call costs come from the compiled TPU programs
of the compile job (``jobs.tpu_compile``'s reports): each program's
``optimal_seconds`` (a **TPU compiler estimate**, never a measurement), and
beside it the roofline floor (weights + KV cache read once at the chip's HBM
bandwidth). Where a program's estimate is negative (sliced prefetches on v4,
v5e and v6e), the estimate of the same program compiled with
``xla_tpu_sliced_prefetch_max_slices = 0`` is used (a second report per chip,
``NO_SLICED_PREFETCH``); which report priced each program is recorded.

Calls come from the CPU-counted runs the GPU prediction prices
(``benchmarks.feature_drafter``'s report: greedy, HumanEval, the 0.5B drafter,
Max-Gram, their horizontal cascade and the feature head). That report keeps,
per configuration, the histogram of drafts accepted per round at its counted
draft length; from it come the per-position acceptance rates ``a_i`` (drafts
accepted at position ``i`` given the earlier ones were; positions past the
counted length take the pooled rate of the counted ones), and from those, at
any G, the expected tokens per round (``cost.tokens_per_round``) and one
round's expected calls (``round_stats``), which ``cost.CostModel.price``
prices:

- the target: one scoring call of ``G + 1`` tokens (priced at that width);
- the 0.5B drafter: one call per draft, plus the 1-token catch-up calls the
  CPU runs count for an accepted draft it never fed (after a round that
  accepted ``j`` of its ``G`` drafts: ``max(j - G + 1, 0)``; on an accelerator
  the first call is 2 tokens wide instead, so this prices up to one 0.5B step
  per round more than a TPU run would make);
- the cascade's 0.5B (its first ``CASCADE_NEURAL`` drafts, Max-Gram the
  rest): one call per draft, the first a window wide enough for the accepted
  tokens it lags by (widths 1, 2 or ``G + 2``: ``cs_drafter``'s);
- the feature head: one window call and ``G - 1`` draft steps (the window call
  is priced as a draft step on a TPU: no window program is compiled; both read
  the same weights);
- Max-Gram: one lookup (``maxgram_step``, over a 2,048-token text) per draft.

    speedup(G) = tokens_per_round(G) x t_target(1) / price(one round at G)

Priced calls leave out what a round does between them (sampling and
verification over the vocabulary, the commit, the loop's own work). Where a
chip's report holds the whole round compiled as one program
(``round_specdecode_g<G>``, ``jobs.tpu_programs``), ``between_calls`` is its
estimate less the estimates of the calls it makes (from the same report and
commit), and the 0.5B drafter's speedup is priced again with that per round
(``round_overhead_s``): the "whole round" column.

The same code prices an accelerator's measured in-loop steps
(``benchmarks/configs/feature_steps.gin``'s report) for the GPU column, and
reproduces the GPU prediction the counted report stored (``check``).

    python -m benchmarks.main --gin_file=benchmarks/configs/tpu_prices.gin
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np

from specdec_jax.decode import cost as cost_lib
from specdec_jax.jobs import tables
from specdec_jax.jobs.tpu import aot as tpu_aot
from specdec_jax.jobs.tpu import programs as tpu_programs
from specdec_jax.jobs.tpu.compile_job import program_seconds, read_report
from specdec_jax.runtime import jsonio

ESTIMATE = tpu_aot.ESTIMATE
FLOOR = "roofline floor"
NO_SLICED_PREFETCH = {"xla_tpu_sliced_prefetch_max_slices": 0}
CHIP_ORDER = ("v4", "v5e", "v5p", "v6e")
REPORTS = "benchmarks/reports"
# chip -> its one-chip topology's reports (default compile, then without sliced prefetches).
TOPOLOGIES = {"v4": "v4_2x2x1", "v5e": "v5e_2x2", "v5p": "v5p_2x2x1", "v6e": "v6e_2x2"}
GAMMAS = tuple(range(3, 9))
CASCADE_NEURAL = 4  # the cascade's 0.5B drafts this many, Max-Gram the rest
MAG = "mag"
FEATURE = "feature"
MAX_TARGET_WIDTH = 9
ROUND = tpu_programs.ROUND  # one whole round at G, compiled as one program
WHOLE_ROUND = f"{ESTIMATE}, whole round"
# counted configuration -> (drafting kind, the cost-model columns it prices).
CONFIGS = {"drafter": ("model", (cost_lib.DRAFTER,)), MAG: (MAG, (MAG,)),
           "drafter+mag": ("cascade", (cost_lib.DRAFTER, MAG)),
           FEATURE: (FEATURE, (FEATURE,))}
LABELS = {"drafter": "0.5B", MAG: "Max-Gram", "drafter+mag": "0.5B + Max-Gram (cascade)",
          FEATURE: "feature head"}


def default_reports(chip: str, root: str = REPORTS, weights: str = "bf16") -> list[str]:
    """The compile reports that price ``chip``, in order of preference (with
    ``weights="stored"``, those of the pair kept in its GGUF blocks)."""
    base = f"{root}/tpu_compile_{TOPOLOGIES[chip]}" + ("_stored" if weights == "stored" else "")
    return [f"{base}.json", f"{base}_no_sliced_prefetch.json"]


# --- per-call costs from compiled programs ------------------------------------------------

def chip_programs(reports: Sequence[Mapping]) -> dict:
    """Program name -> ``program_seconds`` for the programs a prediction prices
    (those found; ``target_k1`` and ``drafter_k1`` are required)."""
    names = [f"target_k{k}" for k in range(1, MAX_TARGET_WIDTH + 1)]
    names += ["drafter_k1", "feature_draft_step", "maxgram_step"]
    found = {n: p for n in names if (p := program_seconds(reports, n)) is not None}
    missing = [n for n in ("target_k1", "drafter_k1") if n not in found]
    if missing:
        paths = ", ".join(r.get("path", "?") for r in reports)
        raise ValueError(f"no positive {ESTIMATE} for {', '.join(missing)} in {paths}; "
                         "compile them (configs/runs/tpu_compile.gin), with compiler_options "
                         f"{NO_SLICED_PREFETCH} where the estimate is negative.")
    return found


def call_costs(programs: Mapping, basis: str = "estimate_s") -> dict:
    """``{"target", "drafter", "feature", "mag": CallCost}`` from
    ``chip_programs`` records, by ``basis`` (``"estimate_s"`` or ``"floor_s"``);
    a model with no compiled program is left out."""
    by = lambda prefix: {int(n[len(prefix):]): p[basis] for n, p in programs.items()  # noqa: E731
                         if n.startswith(prefix) and n[len(prefix):].isdigit()}
    costs = {"target": cost_lib.CallCost.from_steps(by("target_k")),
             cost_lib.DRAFTER: cost_lib.CallCost.from_steps(by("drafter_k"))}
    for name, program in ((FEATURE, "feature_draft_step"), (MAG, "maxgram_step")):
        if program in programs:
            costs[name] = cost_lib.CallCost.from_steps({1: programs[program][basis]})
    return costs


def between_calls(reports: Sequence[Mapping], gamma: int) -> dict | None:
    """What a round at ``gamma`` spends outside its priced calls, from the
    first of ``reports`` whose round program (``round_specdecode_g<G>``) and
    every call it makes (``target_k<G+1>``, G x ``drafter_k1``, one
    ``drafter_k1_no_head``) have positive estimates and were compiled from one
    commit: ``{"seconds", "round_s", "calls_s", "source"}`` (seconds negative
    where the compiler overlaps work across calls), or None. One report and
    one commit: one compiler setting and one model code for all four."""
    names = [f"{ROUND}{gamma}", f"target_k{gamma + 1}", "drafter_k1", "drafter_k1_no_head"]
    for report in reports:
        found = [program_seconds([report], n) for n in names]
        commits = {report["programs"][n].get("commit") for n in names if n in report["programs"]}
        if all(found) and len(commits) == 1:
            whole, target, drafter, catch_up = (f["estimate_s"] for f in found)
            calls = target + gamma * drafter + catch_up
            return {"seconds": whole - calls, "round_s": whole, "calls_s": calls,
                    "source": found[0]["source"]}
    return None


def device_step_costs(path: str, variant: str | None = None) -> dict:
    """``{"target", "drafter", "feature", "mag"}`` from an accelerator's measured
    feature-steps report: the feature head with its full output head and the
    target's MLP width (as the TPU program) unless ``variant`` (``"V=<ids>
    mlp=<width>"``) names another, window call = window + first logits;
    Max-Gram was not timed there and costs 0."""
    from benchmarks import feature_drafter  # noqa: PLC0415 - heavy imports

    if variant:
        fields = dict(part.split("=") for part in variant.split())
        vocab, mlp = int(fields["V"]), int(fields["mlp"])
    else:
        vocab, mlp = 0, int(jsonio.read_json(path)["target_config"]["intermediate_size"])
    costs = feature_drafter.gpu_costs(path, head_vocab=vocab, intermediate_size=mlp)
    costs.pop("feature_variant")
    costs[MAG] = cost_lib.CallCost.from_steps({1: 0.0})
    return costs


# --- expected calls from counted acceptance -------------------------------------------------

def conditional_rates(histogram: Sequence[float]) -> tuple[list[float], float]:
    """``([a_1, ..., a_G], pooled)`` from a histogram of drafts accepted per
    round (index ``j``: rounds that accepted ``j`` of ``G = len - 1``): ``a_i``
    = rounds that accepted at least ``i`` / those that accepted at least
    ``i - 1``; ``pooled`` = the same ratio summed over positions. A position no
    round reached takes ``pooled``."""
    counts = np.asarray(histogram, np.float64)
    if counts.ndim != 1 or len(counts) < 2 or counts.sum() <= 0 or (counts < 0).any():
        raise ValueError(f"a histogram of accepted drafts needs >= 2 non-negative bins with "
                         f"rounds in them, got {list(histogram)}.")
    at_least = counts[::-1].cumsum()[::-1]  # at_least[i]: rounds accepting >= i
    pooled = float(at_least[1:].sum() / at_least[:-1].sum())
    rates = [float(at_least[i] / at_least[i - 1]) if at_least[i - 1] > 0 else pooled
             for i in range(1, len(counts))]
    return rates, pooled


def rates_at(rates: Sequence[float], pooled: float, gamma: int) -> list[float]:
    """The first ``gamma`` per-position rates, positions past the counted ones at ``pooled``."""
    return [*rates[:gamma], *[pooled] * max(gamma - len(rates), 0)]


def accepted_distribution(rates: Sequence[float]) -> np.ndarray:
    """P(a round accepts ``j`` drafts), ``j = 0..G``, from per-position rates."""
    reach = np.concatenate([[1.0], np.cumprod(rates)])  # P(accepts >= j)
    return reach - np.concatenate([reach[1:], [0.0]])


def round_stats(kind: str, gamma: int, rates: Sequence[float]) -> dict:
    """One round's expected counts at draft length ``gamma`` (``rates``: its
    ``gamma`` per-position rates), as ``CostModel.itemise`` reads a stored row.
    Columns: ``CONFIGS[config][1]``. See the module docstring."""
    if kind not in ("model", "cascade", MAG, FEATURE):
        raise ValueError(f"unknown drafting kind {kind!r}.")
    if len(rates) != gamma:
        raise ValueError(f"{len(rates)} rates for G = {gamma}.")
    p = accepted_distribution(rates)
    j = np.arange(gamma + 1)
    stats = {"target_calls": 1.0, "target_fed": float(gamma + 1), "target_single_calls": 0.0}
    columns = []  # (calls, fed, single) per priced model
    if kind == "model":  # one-token calls; a lagging row catches up by extra ones
        calls = gamma + float(p @ np.maximum(j - gamma + 1, 0))
        columns.append((calls, calls, calls))
    if kind == "cascade":  # one call per draft, the first a window covering the lag
        neural = min(gamma, CASCADE_NEURAL)
        lag = 1 + np.maximum(j - neural + 1, 0)  # tokens the first call feeds
        width = np.where(lag <= 1, 1, np.where(lag <= 2, 2, gamma + 2))
        columns.append((float(neural), neural - 1 + float(p @ width),
                        neural - 1 + float(p @ (width == 1))))
    if kind == FEATURE:  # a window of G + 1 tokens, then G - 1 one-token draft steps
        columns.append((float(gamma), float(2 * gamma), float(gamma - 1)))
    if kind in (MAG, "cascade"):
        lookups = float(gamma - (min(gamma, CASCADE_NEURAL) if kind == "cascade" else 0))
        columns.append((lookups, lookups, lookups))
    names = ("drafter_calls_by_model", "drafter_tokens_by_model", "drafter_single_calls_by_model")
    for i, name in enumerate(names):
        stats[name] = [c[i] for c in columns]
    return stats


def predicted_speedup(costs: Mapping, config: str, gamma: int, rates: Sequence[float],
                      pooled: float, round_overhead_s: float = 0.0) -> dict:
    """``{"speedup", "tokens_per_round", "round_s", "drafting_s"}`` of ``config``
    at ``gamma`` priced with ``costs`` (``call_costs`` / ``device_step_costs``)
    through ``CostModel.itemise``, plus ``round_overhead_s`` per round
    (``between_calls``)."""
    kind, columns = CONFIGS[config]
    missing = [c for c in columns if c not in costs]
    if missing:
        raise ValueError(f"no call cost for {', '.join(missing)} ({config}).")
    model = cost_lib.CostModel(target=costs["target"], drafter=costs[cost_lib.DRAFTER],
                               models=dict(costs), round_overhead_s=round_overhead_s)
    at = rates_at(rates, pooled, gamma)
    items = model.itemise(round_stats(kind, gamma, at), drafters=columns,
                          widths={"target": gamma + 1}, rounds=1.0)
    round_s = float(sum(items.values()))
    tokens = cost_lib.tokens_per_round(at, gamma)
    return {"speedup": model.predicted_speedup(tokens_per_round=tokens, round_s=round_s),
            "tokens_per_round": tokens,
            "round_s": round_s,
            "drafting_s": round_s - items[cost_lib.TARGET] - items[cost_lib.ROUND_OVERHEAD]}


# --- the job ------------------------------------------------------------------------------

def counted_acceptance(report: Mapping, temperature: str) -> dict:
    """config -> ``{"histogram", "gamma", "rates", "pooled", "tokens_per_target_call",
    "stored_gpu_speedup"}`` from a feature-drafter benchmark report."""
    block = report["counted"][temperature]
    out = {}
    for config in CONFIGS:
        if config not in block:
            continue
        summary = block[config]
        rates, pooled = conditional_rates(summary["histogram"])
        out[config] = {"histogram": summary["histogram"], "gamma": len(summary["histogram"]) - 1,
                       "rates": rates, "pooled": pooled,
                       "tokens_per_target_call": summary["tokens_per_target_call"],
                       "stored_gpu_speedup": summary.get("predicted_gpu_speedup")}
    return out


def run_tpu_prices(*, counted: str = f"{REPORTS}/bench_feature_drafter_cpu.json",
                   temperature: str = "0.0", chips: Sequence[str] = CHIP_ORDER,
                   gpu_steps: str | None = f"{REPORTS}/bench_feature_steps_gpu_h100.json",
                   gpu_name: str = "H100", gammas: Sequence[int] = GAMMAS,
                   reports_dir: str = REPORTS, out: str = f"{REPORTS}/tpu_prices.json",
                   markdown_path: str | None = None, weights: str = "bf16") -> dict:
    """Prices ``counted``'s calls (``temperature``'s block) on each chip's
    compiled programs (``reports_dir``'s compile reports) and, with
    ``gpu_steps``, on that accelerator's measured steps; writes ``out`` and its
    Markdown. ``weights``: the compile reports of the bfloat16 pair or of the
    pair kept in its GGUF blocks (``"stored"``: ``tpu_compile.weights``).
    Returns the report."""
    if weights not in tpu_programs.WEIGHTS:
        raise ValueError(f"weights={weights!r}; choose one of {', '.join(tpu_programs.WEIGHTS)}.")
    counted_report = read_report(counted)
    acceptance = counted_acceptance(counted_report, temperature)
    devices: dict = {}
    for chip in chips:
        if chip not in TOPOLOGIES:
            raise ValueError(f"unknown chip {chip!r}; choose from {', '.join(TOPOLOGIES)}.")
        reports = [read_report(p) for p in default_reports(chip, reports_dir, weights)
                   if os.path.exists(p)]
        programs = chip_programs(reports)
        devices[chip] = {"basis": ESTIMATE, "programs": programs,
                         "between_calls": {g: between_calls(reports, g) for g in gammas},
                         "costs": {ESTIMATE: call_costs(programs, "estimate_s"),
                                   FLOOR: call_costs(programs, "floor_s")}}
    if gpu_steps:
        devices[gpu_name] = {"basis": f"measured in-loop steps ({gpu_steps})",
                             "costs": {"measured steps": device_step_costs(gpu_steps)}}
    predictions = []
    for config, acc in acceptance.items():
        for gamma in gammas:
            row = {"config": config, "gamma": gamma}
            for device, info in devices.items():
                for basis, costs in info["costs"].items():
                    if all(c in costs for c in CONFIGS[config][1]):
                        row[f"{device} {basis}"] = predicted_speedup(
                            costs, config, gamma, acc["rates"], acc["pooled"])
                between = info.get("between_calls", {}).get(gamma)
                if config == "drafter" and between is not None:
                    row[f"{device} {WHOLE_ROUND}"] = {
                        **predicted_speedup(info["costs"][ESTIMATE], config, gamma,
                                            acc["rates"], acc["pooled"], between["seconds"]),
                        "between_calls": between}
            predictions.append(row)
    report = {
        "label": f"{ESTIMATE} (TPU), measured steps ({gpu_name}); speedups modelled",
        "counted": counted, "temperature": temperature, "acceptance": acceptance,
        "weights": weights,
        "cascade_neural_drafts": CASCADE_NEURAL, "devices": {
            d: {"basis": info["basis"], "programs": info.get("programs"),
                "between_calls": info.get("between_calls"),
                "ratios": cost_ratios(info["costs"]),
                "costs": {b: {n: dataclasses.asdict(c) for n, c in costs.items()}
                          for b, costs in info["costs"].items()}}
            for d, info in devices.items()},
        "predictions": predictions, "check": check(acceptance, gpu_steps,
                                                counted_report.get("gpu_feature_variant"))}
    markdown_path = markdown_path or str(pathlib.Path(out).with_suffix(".md"))
    jsonio.write_json(out, report, indent=1)
    pathlib.Path(markdown_path).write_text(markdown(report) + "\n")
    print(markdown(report))
    return report


def cost_ratios(by_basis: Mapping) -> dict:
    """basis -> each drafter's one-token call over the target's one-token step."""
    return {basis: {name: c.call_s(1) / costs["target"].call_s(1)
                    for name, c in costs.items() if name != "target"}
            for basis, costs in by_basis.items()}


def check(acceptance: Mapping, gpu_steps: str | None, variant: str | None) -> dict:
    """At each configuration's counted G: this module's prediction on the GPU
    steps (the feature head's ``variant``, as the counted run priced it)
    against the one the counted report stored (priced from its per-row
    counts); empty without GPU steps."""
    if not gpu_steps:
        return {}
    costs = device_step_costs(gpu_steps, variant)
    out = {}
    for config, acc in acceptance.items():
        if acc["stored_gpu_speedup"] is None:
            continue
        mine = predicted_speedup(costs, config, acc["gamma"], acc["rates"], acc["pooled"])
        out[config] = {"gamma": acc["gamma"], "modelled_here": mine["speedup"],
                       "stored": acc["stored_gpu_speedup"]}
    return out


def _fmt(prediction: Mapping | None) -> str:
    return "-" if prediction is None else f"{prediction['speedup']:.2f}x"


def markdown(report: Mapping) -> str:
    devices = report["devices"]
    tpu = [d for d in devices if d in TOPOLOGIES]
    gpu = [d for d in devices if d not in TOPOLOGIES]
    lines = [f"# Predicted speedup of the real pair on TPU chips ({ESTIMATE}s)", "",
             *(["Weights: the pair kept in its GGUF files' blocks (uint8, dequantised inside "
                "each product; `tpu_compile.weights = 'stored'`).", ""]
               if report.get("weights") == "stored" else []),
             f"Calls: {report['counted']} (T = {report['temperature']}), per-position "
             "acceptance from its accepted-draft histograms; every TPU figure prices "
             f"compiled programs' `optimal_seconds` (**{ESTIMATE}**, nothing ran on a TPU), "
             f"with the {FLOOR} (weights + KV bytes / HBM bandwidth) in parentheses; "
             + (f"{', '.join(gpu)}: its measured in-loop steps. " if gpu else "")
             + "Every speedup is modelled, over the autoregressive target on the same chip.",
             ""]
    headers = ["drafter", "G", *(f"{d} (steps measured)" for d in gpu),
               *(f"{d} {ESTIMATE} ({FLOOR})" for d in tpu)]
    rows = []
    for row in report["predictions"]:
        cells = [LABELS[row["config"]], str(row["gamma"])]
        cells += [_fmt(row.get(f"{d} measured steps")) for d in gpu]
        cells += [f"{_fmt(row.get(f'{d} {ESTIMATE}'))} ({_fmt(row.get(f'{d} {FLOOR}'))})"
                  for d in tpu]
        if any(key.startswith(tuple(devices)) for key in row):  # priced somewhere
            rows.append(cells)
    lines += tables.markdown_table(headers, rows)
    whole = [row for row in report["predictions"]
             if any(f"{d} {WHOLE_ROUND}" in row for d in tpu)]
    if whole:
        lines += ["", f"The 0.5B drafter priced again with each round's work between calls "
                  f"(its round program's {ESTIMATE} less its calls'; ms per round, then the "
                  "speedup, beside the calls-only one):", ""]
        whole_rows = []
        for row in whole:
            cells = [str(row["gamma"])]
            for d in tpu:
                again = row.get(f"{d} {WHOLE_ROUND}")
                cells.append("-" if again is None else
                             f"{1e3 * again['between_calls']['seconds']:+.3f} ms: {_fmt(again)} "
                             f"(calls only {_fmt(row.get(f'{d} {ESTIMATE}'))})")
            whole_rows.append(cells)
        lines += tables.markdown_table(["G", *tpu], whole_rows)
    lines += ["", "One-token call over the target's one-token step:", ""]
    ratio_rows = []
    for d, info in devices.items():
        for basis, ratios in info["ratios"].items():
            ratio_rows.append([d, basis, *(f"{ratios[n]:.3f}" if n in ratios else "-"
                                           for n in (cost_lib.DRAFTER, FEATURE, MAG))])
    lines += tables.markdown_table(["device", "basis", "0.5B step", "feature draft step",
                                    "Max-Gram lookup"], ratio_rows)
    lines += ["", "Programs priced (ms; the report each estimate came from):", ""]
    prog_rows = []
    for d in tpu:
        for name, p in devices[d]["programs"].items():
            options = p["compiler_options"] or "default"
            prog_rows.append([d, f"`{name}`", f"{1e3 * p['estimate_s']:.3f}",
                              f"{1e3 * p['floor_s']:.3f}", f"`{p['source']}` ({options})"])
    lines += tables.markdown_table(["chip", "program", ESTIMATE, FLOOR, "report"], prog_rows)
    if report.get("check"):
        lines += ["", "Check at the counted G (GPU steps): this model against the prediction "
                  "the counted report stored from its per-row counts:", ""]
        lines += tables.markdown_table(
            ["drafter", "G", "modelled here", "stored"],
            [[LABELS[c], str(v["gamma"]), f"{v['modelled_here']:.3f}x", f"{v['stored']:.3f}x"]
             for c, v in report["check"].items()])
    return "\n".join(lines)
