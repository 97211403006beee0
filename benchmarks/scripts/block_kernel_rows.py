"""The CPU block kernel alone: one product of stored (GGUF-block) weights by row count.

For the 1.5B target's layer shapes (gate and up fused, down in q6_k and q4_k,
q/k/v, o) with random blocks of each format (valid f16 scales; each q4_k
matrix also interleaved by 16 rows, ``q4_k_x16``, as the loader keeps it on
CPU), the 10th
percentile of ``--calls`` timed calls of one jitted ``native.matmul.block_product``
at each row count M, and its ratio to M = 1. What a scoring call of G + 1 tokens
pays per matrix against a step's one row, without the rest of the model; the
weights are re-read from a warm cache, so M = 1 overstates the bandwidth a
whole step gets (``stored_weights.py`` times whole steps).

    python benchmarks/scripts/block_kernel_rows.py --rows 1 2 4 8 9 16
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.jobs import tables
from specdec_jax.native import matmul, stored_blocks
from specdec_jax.runtime import cpu_kernels, devices, timing

# (name, format, out, in): the 1.5B target's matrices.
SHAPES = tuple((name, fmt, out, k)
               for name, q4_k_out, q4_k_in in (("gate+up", 2 * 8960, 1536), ("down", 1536, 8960),
                                                ("q+k+v", 2048, 1536), ("o", 1536, 1536))
               for fmt, out, k in (("q4_k", q4_k_out, q4_k_in), ("q4_k_x16", q4_k_out, q4_k_in))
               ) + (("down", "q6_k", 1536, 8960),)


def random_blocks(fmt: str, out: int, k: int, rng) -> stored_blocks.StoredMatrix:
    """Random codes and scales; only the f16 scales are set to finite values."""
    if fmt == "q4_k_x16":
        file_blocks = random_blocks("q4_k", out, k, rng).blocks
        return stored_blocks.StoredMatrix(
            jnp.asarray(stored_blocks.interleave(np.asarray(file_blocks), "q4_k")), fmt, k)
    spec = stored_blocks.block_format(fmt)
    blocks = rng.integers(0, 256, size=(out, k // spec.block, spec.type_size), dtype=np.uint8)
    scale = rng.uniform(0.001, 0.05, size=blocks.shape[:2]).astype(np.float16)
    scale_bytes = scale.view(np.uint8).reshape(*blocks.shape[:2], 2)
    if fmt == "q4_k":  # d, dmin, then scales and codes
        blocks[..., 0:2] = blocks[..., 2:4] = scale_bytes
    elif fmt == "q6_k":  # codes, int8 scales, then d
        blocks[..., 192:208] = rng.integers(-32, 32, size=(*blocks.shape[:2], 16)).astype(
            np.int8).view(np.uint8)
        blocks[..., 208:210] = scale_bytes
    else:
        raise ValueError(f"no random blocks for {fmt!r}; choose q4_k, q4_k_x16 or q6_k.")
    return stored_blocks.StoredMatrix(jnp.asarray(blocks.reshape(out, -1)), fmt, k)


def time_rows(w: stored_blocks.StoredMatrix, rows: list[int], calls: int, rng) -> dict:
    product = jax.jit(lambda x, b: matmul.block_product(
        x, stored_blocks.StoredMatrix(b, w.format, w.in_features)))
    seconds = {}
    for m in rows:
        x = jnp.asarray(rng.standard_normal((m, w.in_features)).astype(np.float32))
        product(x, w.blocks).block_until_ready()
        runs = []
        for _ in range(calls):
            start = time.perf_counter()
            product(x, w.blocks).block_until_ready()
            runs.append(time.perf_counter() - start)
        seconds[m] = float(np.percentile(runs, 10))
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 9, 16])
    parser.add_argument("--calls", type=int, default=150)
    args = parser.parse_args(argv)
    devices.run_on_cpu_without_chips()  # libtpu installed, no TPU: no runtime noise
    if not cpu_kernels.enable() or not matmul.blocks_active():
        print("the block kernel needs a C++ compiler and a CPU with a SIMD path for it "
              "(AVX2, AVX-VNNI, AVX-512 VNNI or NEON dotprod)",
              file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    rows = []
    for name, fmt, out, k in SHAPES:
        seconds = time_rows(random_blocks(fmt, out, k, rng), args.rows, args.calls, rng)
        rows.append([name, fmt, f"{out} x {k}"]
                    + [f"{seconds[m] * 1e3:.3f} ({seconds[m] / seconds[args.rows[0]]:.2f}x)"
                       for m in args.rows])
    print(timing.environment(), f"block kernel path: {cpu_kernels.block_kernel_isa()}")
    print("\n".join(tables.markdown_table(
        ["matrix", "format", "out x in"] + [f"M = {m}, ms" for m in args.rows], rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
