"""A stored model's step and scoring call by cache fill: the attention kernel against XLA.

A GGUF model on a CPU scores each query's attention alone (``DecoderConfig.
row_independent``): in one call of the CPU kernel (``native/cache_attention.h``)
or, with the kernel off, through XLA one query after another. For one registry
model kept in its blocks (default: the first command's 1.5B target) this times
the in-loop ``extend`` of 1 token and of ``--k`` tokens (``timing.in_loop_step``)
at each ``--fills`` cache fill, both ways, interleaved ``--rounds`` times (the
machine's speed drifts; only ratios within a round count), and prints each
call's median and the XLA / kernel ratio.

    python benchmarks/scripts/attention_by_fill.py \\
        --out benchmarks/reports/attention_by_fill_1.5b_cpu.json

Several minutes on 2 CPU cores; run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from specdec_jax.checkpoints import load
from specdec_jax.native import attention as native_attention
from specdec_jax.runtime import cpu_kernels, devices, timing

WAYS = ("kernel", "xla")


def timed_calls(model, params, ks, fills, rounds: int, steps: int) -> dict:
    """``{(way, k, fill): [seconds per round]}``, every call once per round."""
    seconds: dict = {}
    for round_index in range(rounds):
        for fill in fills:
            for k in ks:
                for way in WAYS:
                    native_attention.set_enabled(way == "kernel")
                    run = timing.in_loop_step(model, params, k, fill=fill, steps=steps,
                                              repeats=3)
                    seconds.setdefault((way, k, fill), []).append(min(run.run_s))
                    print(f"round {round_index + 1}: fill {fill:4d}, {k} token(s), {way:6s} "
                          f"{min(run.run_s) * 1e3:7.1f} ms", flush=True)
    native_attention.set_enabled(True)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--k", type=int, default=9, help="tokens of the scoring call")
    parser.add_argument("--fills", default="32,160,320,640",
                        help="cache fills, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="calls per timed loop")
    parser.add_argument("--out", default="benchmarks/reports/attention_by_fill_cpu.json")
    args = parser.parse_args(argv)
    fills = [int(f) for f in args.fills.split(",")]
    if args.k < 2 or args.rounds < 1 or min(fills) < 0:
        parser.error("--k must be at least 2, --rounds at least 1 and every fill >= 0")
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise
    if not cpu_kernels.enable():
        print("the CPU kernel could not be built here: nothing to compare", file=sys.stderr)
        return 1
    model, params = load.load_for_decoding(args.model, "float32", weights="stored")[:2]
    if not model.config.row_independent:
        print(f"{args.model} is not row independent here: the kernel is not used",
              file=sys.stderr)
        return 1
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    seconds = timed_calls(model, params, (1, args.k), fills, args.rounds, args.steps)
    rows = []
    print(f"\n{'fill':>5} {'tokens':>6} {'kernel ms':>10} {'XLA ms':>8} {'XLA / kernel':>13}")
    for fill in fills:
        for k in (1, args.k):
            kernel, xla = (seconds[(way, k, fill)] for way in WAYS)
            per_round = [x / y for x, y in zip(xla, kernel, strict=True)]
            row = {"fill": fill, "tokens": k, "kernel_s": kernel, "xla_s": xla,
                   "kernel_median_s": statistics.median(kernel),
                   "xla_median_s": statistics.median(xla),
                   "xla_over_kernel_by_round": per_round}
            rows.append(row)
            print(f"{fill:5d} {k:6d} {row['kernel_median_s'] * 1e3:10.1f} "
                  f"{row['xla_median_s'] * 1e3:8.1f} "
                  f"{statistics.median(per_round):8.2f}x ({min(per_round):.2f}-"
                  f"{max(per_round):.2f})")
    report = {"model": args.model, "k": args.k, "started": started,
              "block_kernel_isa": cpu_kernels.block_kernel_isa(),
              "environment": timing.environment(),
              "precision": "float32 activations and cache; products int8 per block",
              "rows": rows}
    timing.write_report(report, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
