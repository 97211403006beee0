"""Two SpecDec++ heads on the same HumanEval prompts: Figure 4's rates from
each head's phase-1 counts log (``bench_specdecpp.py --counts-only``), with
tokens/s predicted by a fitted CPU latency model and by a device's steps.

The logs may cover different prompt counts; ``--batches`` picks the batches
both cover (same prompts, same keys), and fixed-K rows, which do not depend on
the head, must then agree: a check that the two runs are comparable.

    python eval/specdecpp_head_sources.py \\
        --logs corpus=eval/reports/bench_specdecpp_cpu.counts.jsonl \\
               target=eval/reports/bench_specdecpp_target_head_cpu.counts.jsonl \\
        --batches 0 1 --fit eval/reports/bench_specdecpp_cpu.json \\
        --device-steps eval/reports/bench_accelerator_gpu_h200.json
"""

from __future__ import annotations

import argparse
import json

import bench_specdecpp as bench


def read_log(path: str, batches: set[int]) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """configuration name -> per-prompt rows of the chosen batches, and
    name -> configuration as the benchmark built it from the log's settings."""
    rows: dict[str, list[dict]] = {}
    with open(path) as f:
        settings = json.loads(f.readline())["settings"]
        for line in f:
            entry = json.loads(line)
            if entry["key"][1] in batches:
                rows.setdefault(entry["key"][0], []).extend(entry["value"])
    configs = bench.configurations(argparse.Namespace(thresholds=settings["thresholds"],
                                                      ks=settings["ks"]))
    return rows, {c["name"]: c for c in configs}


def compare(logs: dict[str, str], batches: set[int], fit: dict, steps: dict | None,
            dtype: str = "bfloat16") -> dict:
    by_head = {head: read_log(path, batches) for head, path in logs.items()}
    result: dict = {}
    for head, (rows_by_name, configs) in by_head.items():
        counts = {name: {"config": configs[name], "rows": rows, **bench.rates(rows)}
                  for name, rows in rows_by_name.items()}
        device = bench.device_predictions({"counts": counts}, steps, dtype) if steps else None
        for name, c in counts.items():
            result.setdefault(name, {})[head] = {
                "tokens": c["tokens"], "verification_rate": c["verification_rate"],
                "discard_rate": c["discard_rate"],
                "cpu_predicted_tokens_per_s": bench.predicted_tokens_per_s(fit, c),
                "device_predicted_tokens_per_s": (device["configurations"][name]["tokens_per_s"]
                                                  if device else None)}
    for name, heads in result.items():
        rows, configs = zip(*(by_head[h] for h in heads))
        if configs[0][name]["kind"] == "fixed" and any(r[name] != rows[0][name] for r in rows):
            raise ValueError(f"{name} differs between the logs: they did not run the same "
                             "prompts and seeds in these batches; pick batches both cover.")
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--logs", nargs="+", required=True, help="name=counts.jsonl, one per head")
    p.add_argument("--batches", type=int, nargs="+", required=True)
    p.add_argument("--fit", required=True, help="a bench_specdecpp report with latency_model")
    p.add_argument("--device-steps", default=None, help="a bench_accelerator.py report")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if any("=" not in entry for entry in args.logs):
        p.error("--logs takes name=path pairs, e.g. corpus=eval/reports/x.counts.jsonl")
    logs = dict(entry.split("=", 1) for entry in args.logs)
    with open(args.fit) as f:
        fit = json.load(f)["latency_model"]
    steps = None
    if args.device_steps:
        with open(args.device_steps) as f:
            steps = json.load(f)
    result = compare(logs, set(args.batches), fit, steps)
    print("| configuration | head | tokens N | verification rate (95% CI) | discard rate (95% CI) "
          "| CPU-predicted tokens/s | device-predicted tokens/s |\n|---|---|---|---|---|---|---|")
    for name, heads in result.items():
        for head, r in heads.items():
            device = r["device_predicted_tokens_per_s"]
            rates = (f"{bench.format_ci(r['verification_rate'])} | "
                     f"{bench.format_ci(r['discard_rate'])}")
            print(f"| {name} | {head} | {r['tokens']} | {rates} | "
                  f"{r['cpu_predicted_tokens_per_s']:.2f} | "
                  f"{'-' if device is None else f'{device:.0f}'} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
