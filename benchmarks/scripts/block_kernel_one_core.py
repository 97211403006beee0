"""Ours against llama.cpp on one core, in CPU time: a step and a 9-token call of a GGUF target.

For a machine that others are using (a shared 2-core VM): each side gets one
thread on one core (run it under ``taskset -c 1``), and is measured in CPU
time, which does not count the time another process holds the core:

- llama.cpp's ``llama-bench -t 1``: CPU seconds per generated token (tg) and
  per 9-token batch (pp9), each the difference of two runs (16 and 80 tokens;
  1 and 6 repetitions), so loading and warm-up cancel;
- ours, the file kept in its blocks (``weights="stored"``, the block kernel on
  its widest path): process CPU seconds of a 1-token step and of a 9-token call
  (in-loop, cache filled with 128 tokens, as ``timing.in_loop_step``).

    taskset -c 1 python benchmarks/scripts/block_kernel_one_core.py \\
        --llama-bench ~/.cache/specdec_jax/llama.cpp/<build>/bin/llama-bench

Without ``--llama-bench`` it builds llama.cpp as ``llama_cpp_peer.py`` does.
Measured 2026-12-06 (2-core AMD EPYC Zen 3 VM, AVX2, g++ 12.2, the 1.5B
Q4_K_M, float32 activations, block kernel avx2, load average ~4.5 from other
work on the other core): ours 89.0 ms a step, 225 ms a 9-token call (2.53x);
llama.cpp (GGML_NATIVE, its AVX2 path) 78.9 ms a token, 471 ms a pp9 (5.97x):
our step 1.13x llama.cpp's, our 9-token call 0.48x its pp9. A second run
(load ~7.5): 93.8 / 235.0 ms against 85.8 / 438.0 ms (1.09x, 2.51x, 0.54x).
On two threads the same machine, that loaded, gave no usable figures:
llama.cpp's spinning threads took 0.4-1.3 s a token.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from specdec_jax.checkpoints import load, registry
from specdec_jax.runtime import cpu_kernels, devices, timing

STEPS = 16


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--llama-bench",
                        help="llama-bench binary (default: llama_cpp_peer's build)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise
    if args.llama_bench is None:
        import llama_cpp_peer  # noqa: PLC0415 - the sibling script (run as a file)
        args.llama_bench = str(llama_cpp_peer.build() / "llama-bench")
    if not cpu_kernels.enable():
        print("the CPU kernel could not be built", file=sys.stderr)
        return 1
    path = str(registry.local_path(args.model))
    model, params, _ = load.load_for_decoding(args.model, "float32", weights="stored")
    programs = {}
    for k in (1, 9):
        body, carry = timing._step_loop(model, k, 1, 128, None)
        programs[k] = (timing._warm_loop(body, params, carry, steps=STEPS, warmup=1), carry)

    def ours(k: int) -> float:
        compiled, carry = programs[k]
        start = time.process_time()
        compiled.time(params, carry)
        return (time.process_time() - start) / STEPS

    def llama(*flags: str) -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        before = usage.ru_utime + usage.ru_stime
        subprocess.run([args.llama_bench, "-m", path, "-t", "1", *flags, "-o", "json"],
                       capture_output=True, check=True)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime - before

    runs: dict[str, list[float]] = {"llama.cpp_step": [], "llama.cpp_call9": [],
                                    "ours_step": [], "ours_call9": []}
    for _ in range(args.rounds):  # interleaved: a drift hits both alike
        runs["llama.cpp_step"].append((llama("-p", "0", "-n", "80", "-r", "1")
                                       - llama("-p", "0", "-n", "16", "-r", "1")) / 64)
        runs["llama.cpp_call9"].append((llama("-p", "9", "-n", "0", "-r", "6")
                                        - llama("-p", "9", "-n", "0", "-r", "1")) / 5)
        runs["ours_step"].append(ours(1))
        runs["ours_call9"].append(ours(9))
    med = {key: statistics.median(values) for key, values in runs.items()}
    print(json.dumps({
        "environment": timing.environment(), "block_kernel": cpu_kernels.block_kernel_isa(),
        "affinity": sorted(os.sched_getaffinity(0)), "load_average": os.getloadavg()[0],
        "cpu_ms": {key: round(value * 1e3, 1) for key, value in med.items()},
        "ours_step_over_llama.cpp_step": round(med["ours_step"] / med["llama.cpp_step"], 3),
        "call9_over_step": {who: round(med[f"{who}_call9"] / med[f"{who}_step"], 3)
                            for who in ("ours", "llama.cpp")},
        "ours_call9_over_llama.cpp_call9": round(med["ours_call9"] / med["llama.cpp_call9"], 3),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
