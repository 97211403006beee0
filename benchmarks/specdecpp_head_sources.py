"""Two SpecDec++ heads on the same HumanEval prompts: Figure 4's rates from
each head's phase-1 counts log (``benchmarks/configs/specdecpp.gin`` with
``counts_only=True``), with tokens/s priced by the cost model of a benchmark
report (``decode.cost``; its calibrated ``cost_model``, or the ``latency_model``
fit stored by reports made before it) and by a device's in-loop steps.

The logs may cover different prompt counts; ``batches`` picks the batches
both cover (same prompts, same keys), and fixed-K rows, which do not depend on
the head, must then agree: a check that the two runs are comparable. Logs and
reports are read plain or gzipped (by suffix; a missing ``x`` is read from
``x.gz`` where that exists).

    python -m benchmarks.main --gin_file=benchmarks/configs/specdecpp_head_sources.gin
"""

from __future__ import annotations

import gzip
import json
import pathlib
from collections.abc import Sequence

from benchmarks import specdecpp as bench
from specdec_jax.jobs import tables
from specdec_jax.runtime import jsonio, timing


def read_log(path: str, batches: set[int]
             ) -> tuple[dict[str, list[dict]], dict[str, dict], dict]:
    """configuration name -> per-prompt rows of the chosen batches; name ->
    configuration as the benchmark built it from the log's settings; and the
    log's settings (its header)."""
    path = jsonio.existing(path)
    rows: dict[str, list[dict]] = {}
    opener = gzip.open if path.suffix == jsonio.GZIP_SUFFIX else open
    with opener(path, "rt", encoding="utf-8") as f:
        settings = json.loads(f.readline())["settings"]
        for line in f:
            if not line.strip():
                continue
            entry = json.loads(line)
            if entry["key"][1] in batches:
                rows.setdefault(entry["key"][0], []).extend(entry["value"])
    configs = bench.configurations(thresholds=settings["thresholds"], ks=settings["ks"])
    return rows, {c["name"]: c for c in configs}, settings


def compare(logs: dict[str, str], batches: set[int], cost, steps: dict | None,
            dtype: str = "bfloat16") -> dict:
    """Per configuration, per head: tokens, the two rates, tokens/s priced by
    ``cost`` (a ``CostModel``; key ``cpu_predicted_tokens_per_s``) and by the
    device ``steps`` report (None without one)."""
    by_head = {head: read_log(path, batches) for head, path in logs.items()}
    result: dict = {}
    for head, (rows_by_name, configs, settings) in by_head.items():
        compiled = bench.compiled_widths(settings)
        counts = {name: {"config": configs[name], "rows": rows, **bench.rates(rows)}
                  for name, rows in rows_by_name.items()}
        device = (bench.device_predictions({"counts": counts, **settings}, steps, dtype)
                  if steps else None)
        for name, c in counts.items():
            result.setdefault(name, {})[head] = {
                "tokens": c["tokens"], "verification_rate": c["verification_rate"],
                "discard_rate": c["discard_rate"],
                "cpu_predicted_tokens_per_s": bench.predicted_tokens_per_s(cost, c,
                                                                           compiled=compiled),
                "device_predicted_tokens_per_s": (device["configurations"][name]["tokens_per_s"]
                                                  if device else None)}
    for name, heads in result.items():
        rows = [by_head[h][0] for h in heads]
        configs = [by_head[h][1] for h in heads]
        if configs[0][name]["kind"] == "fixed" and any(r[name] != rows[0][name] for r in rows):
            raise ValueError(f"{name} differs between the logs: they did not run the same "
                             "prompts and seeds in these batches; pick batches both cover.")
    return result


def markdown_table(result: dict, cost_source: str) -> str:
    rows = [(name, head, r["tokens"], *bench.rate_cells(r),
             f"{r['cpu_predicted_tokens_per_s']:.2f}",
             "-" if r["device_predicted_tokens_per_s"] is None
             else f"{r['device_predicted_tokens_per_s']:.0f}")
            for name, heads in result.items() for head, r in heads.items()]
    return "\n".join([f"CPU-predicted tokens/s: {cost_source}.", ""] + tables.markdown_table(
        ("configuration", "head", "tokens N", "verification rate (95% CI)",
         "discard rate (95% CI)", "CPU-predicted tokens/s", "device-predicted tokens/s"), rows))


def run_bench_specdecpp_head_sources(
        *, logs: dict[str, str], batches: Sequence[int], cost_report: str,
        device_steps: str | None = None, device_dtype: str = "bfloat16",
        out: str | None = "results/bench_specdecpp_head_sources.json",
        markdown_path: str | None = "results/bench_specdecpp_head_sources.md") -> dict:
    """Compares the heads' counts ``logs`` (head name -> counts log) on
    ``batches``, priced by the cost model of the benchmark report
    ``cost_report`` and, with ``device_steps`` (an accelerator benchmark
    report), on that device at ``device_dtype``. Writes the comparison as JSON
    (``out``) and the table as Markdown (``markdown_path``); returns it."""
    if not isinstance(logs, dict) or not logs:
        raise ValueError(f"logs must map each head's name to its counts log, e.g. "
                         f"{{'corpus': 'benchmarks/reports/x.counts.jsonl'}}; got {logs!r}.")
    batches = {int(b) for b in batches}
    if not batches or min(batches) < 0:
        raise ValueError(f"batches must be a non-empty list of batch indices >= 0, got "
                         f"{sorted(batches)}.")
    named = {f"logs[{head!r}]": path for head, path in logs.items()}
    named["cost_report"] = cost_report
    if device_steps:
        named["device_steps"] = device_steps
    for name, path in named.items():
        if not jsonio.existing(path).exists():
            raise FileNotFoundError(f"{name}={path!r} does not exist (nor {path}.gz).")
    cost, source = bench.cost_model_of(jsonio.read_json(jsonio.existing(cost_report)))
    steps = jsonio.read_json(jsonio.existing(device_steps)) if device_steps else None
    result = compare(logs, batches, cost, steps, device_dtype)
    if markdown_path:
        pathlib.Path(markdown_path).parent.mkdir(parents=True, exist_ok=True)
    timing.print_markdown(markdown_table(result, f"{source} of `{cost_report}`"), markdown_path)
    if out:
        path = pathlib.Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == jsonio.GZIP_SUFFIX:
            jsonio.write_json(path, result)
        else:
            path.write_text(json.dumps(result, indent=1))
    return result
