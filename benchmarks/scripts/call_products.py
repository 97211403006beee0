"""How much of a stored target's step and scoring call is its block products.

For one registry model kept in its GGUF blocks (default: the first command's
1.5B target), interleaved ``--rounds`` times: the in-loop seconds of one
``extend`` of 1 token and of ``--k`` tokens (``timing.in_loop_step``), and the
seconds of every block product that call makes (each stored matrix times a
1- or K-row input in one jitted function, the embedding table left out: a
step gathers its rows), from the same weights. Their ratio says whether the
call is bound by the block kernel (products / extend near 1) or by the rest
of the model (attention, norms, the loop), and so which lever a faster call
needs. Products of a jitted function of all matrices at once run one after
another like the model's, but without its data dependencies, so they can read
slightly faster than inside the model.

    python benchmarks/scripts/call_products.py \\
        --out benchmarks/reports/call_products_1.5b_cpu.json

``--by-kind`` adds, from the same weights, the products of each kind of
matrix (its place in a layer, format, input width and shape; all layers'
matrices of the kind in one call) at 1 and K rows: milliseconds, bytes read
and the bandwidth that makes, so a slow kind (a small matrix's fixed costs, a
format's unpacking) stands out from the ones that stream at the machine's rate.

A few minutes on 2 CPU cores; run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints import load
from specdec_jax.models import layers
from specdec_jax.native import matmul, stored_blocks
from specdec_jax.runtime import cpu_kernels, devices, timing


def stored_matrices(params) -> list[tuple[str, stored_blocks.StoredMatrix]]:
    """Every ``kernel`` kept in blocks (``layers.stored_in``), by its path; the
    embedding table, a gather in the step, is named otherwise and left out."""
    found = []

    def walk(tree, path):
        matrix = layers.stored_in(tree, "kernel")
        if matrix is not None:
            found.append((path, matrix))
        for key, value in tree.items():
            if isinstance(value, dict):
                walk(value, f"{path}/{key}")

    walk(params, "")
    return found


def by_kind(matrices) -> dict[str, list[stored_blocks.StoredMatrix]]:
    """``matrices`` grouped by their place in a layer (the path's last two
    parts), format, input width and blocks' shape."""
    kinds: dict[str, list[stored_blocks.StoredMatrix]] = {}
    for path, w in matrices:
        place = "/".join(path.strip("/").split("/")[-2:])
        key = f"{place} {w.format} K={w.in_features} blocks={tuple(w.blocks.shape)}"
        kinds.setdefault(key, []).append(w)
    return kinds


def kind_rows(matrices, rows: int) -> list[dict]:
    """Per kind (``by_kind``): the median milliseconds of all its matrices times
    a ``rows``-row input in one call, their bytes and that bandwidth."""
    table = []
    for key, ws in by_kind(matrices).items():
        seconds = products_seconds([("", w) for w in ws], rows)
        nbytes = sum(int(w.blocks.nbytes) for w in ws)
        table.append({"kind": key, "matrices": len(ws), "rows": rows, "ms": round(seconds * 1e3, 3),
                      "mb": round(nbytes / 1e6, 1), "gb_per_s": round(nbytes / seconds / 1e9, 1)})
    return sorted(table, key=lambda r: -r["ms"])


def products_seconds(matrices, rows: int, repeats: int = 9) -> float:
    """Median seconds of all ``matrices`` times a ``rows``-row input, one call."""
    inputs = [jnp.full((rows, w.in_features), 0.01, jnp.float32) for _, w in matrices]
    formats = [(w.format, w.in_features) for _, w in matrices]

    @jax.jit
    def products(blocks, xs):
        return [matmul.block_product(x, stored_blocks.StoredMatrix(b, fmt, k))
                for b, x, (fmt, k) in zip(blocks, xs, formats)]

    blocks = [w.blocks for _, w in matrices]
    jax.block_until_ready(products(blocks, inputs))
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(products(blocks, inputs))
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--k", type=int, default=9, help="tokens of the scoring call (G + 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/reports/call_products_cpu.json")
    parser.add_argument("--by-kind", action="store_true",
                        help="also time each kind of matrix alone (see the module's docstring)")
    args = parser.parse_args(argv)
    if args.k < 2 or args.rounds < 1:
        parser.error("--k must be at least 2 and --rounds at least 1")
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise
    if not cpu_kernels.enable():
        print("the CPU kernel could not be built: no block products to time", file=sys.stderr)
        return 1
    model, params = load.load_for_decoding(args.model, "float32", weights="stored")[:2]
    matrices = stored_matrices(params)
    runs: dict[str, list[float]] = {}
    for _ in range(args.rounds):  # interleaved: a drift of the machine hits every figure alike
        for k in (1, args.k):
            step = timing.in_loop_step(model, params, k, steps=16, repeats=3).median_s
            runs.setdefault(f"extend_k{k}", []).append(step)
            runs.setdefault(f"products_k{k}", []).append(products_seconds(matrices, k))
    med = {key: float(np.median(v)) for key, v in runs.items()}
    report = {
        "model": args.model, "k": args.k, "block_kernel_isa": cpu_kernels.block_kernel_isa(),
        "matrices": len(matrices), "environment": timing.environment(),
        "precision": "float32 activations; the kernel quantises them to int8 per block",
        "median_s": med, "runs_s": runs,
        "products_over_extend": {f"k{k}": round(med[f"products_k{k}"] / med[f"extend_k{k}"], 3)
                                 for k in (1, args.k)},
        "call_over_step": round(med[f"extend_k{args.k}"] / med["extend_k1"], 3),
        "products_call_over_step": round(med[f"products_k{args.k}"] / med["products_k1"], 3)}
    if args.by_kind:
        report["by_kind"] = kind_rows(matrices, 1) + kind_rows(matrices, args.k)
        for row in report["by_kind"]:
            print(f"{row['rows']:2d} rows  {row['ms']:7.2f} ms  {row['mb']:6.1f} MB  "
                  f"{row['gb_per_s']:5.1f} GB/s  x{row['matrices']:<3d} {row['kind']}")
    timing.write_report(report, args.out)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
