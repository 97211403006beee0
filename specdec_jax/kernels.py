"""A Pallas small-M matmul for kernels in the decode layout, with XLA as fallback.

A decode step multiplies M = 1 row per sequence (M = G + 1 in a scoring
call) by every weight matrix; the step is a matrix-vector product, bound by
reading the weights. With the kernel stored ``[N, K]`` (``out_in``, see
``models.decoder.with_kernel_layout``)::

    y[m, n] = sum_k x[m, k] * w[n, k]          x: [M, K], w: [N, K], y: [M, N]

each program of the grid owns ``BLOCK_N`` rows of ``w`` and streams them once,
``BLOCK_K`` contiguous columns at a time, against the whole (tiny) ``x``: a
weight byte is read exactly once per step and every read is contiguous. The
reduction over ``K`` stays inside a program (GPU programs of one grid run in
parallel, so they cannot accumulate into one output block), as a multiply and
a sum rather than ``dot``: Triton's ``dot`` needs 16 rows, a decode step has 1.

Opt-in (``DecoderConfig(matmul_kernel="pallas")``): XLA's own dot is the
default everywhere. The kernel lowers through Triton on GPUs; this project has
not had a GPU to run it on, so it is tested only in Pallas interpret mode on
CPU (``tests/test_kernels.py``), which is also what a CPU runs (slowly).
Shapes it does not cover (more than ``MAX_ROWS`` rows, a dimension no power of
two divides) take the XLA path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

XLA, PALLAS = "xla", "pallas"
MATMUL_KERNELS = (XLA, PALLAS)
MAX_ROWS = 32  # beyond this a product is a matrix-matrix one: XLA's dot is the tool
BLOCK_CHOICES = (256, 128, 64, 32, 16)  # powers of two: Triton tensor sizes


def _block(dim: int) -> int | None:
    """The largest preferred power-of-two block that divides ``dim``."""
    return next((b for b in BLOCK_CHOICES if dim % b == 0), None)


def _rows_padded(m: int) -> int:
    """``m`` rounded up to a power of two (Triton tensors are power-of-two sized)."""
    return 1 << max(m - 1, 0).bit_length()


def supports(rows: int, n: int, k: int) -> bool:
    """Whether ``small_m_matmul`` covers ``[rows, k] x [n, k]^T``."""
    return 1 <= rows <= MAX_ROWS and _block(n) is not None and _block(k) is not None


def _program(x_ref, w_ref, out_ref, *, block_k: int, num_k: int):
    """One grid program: ``out[:, block] = x @ w[block, :]^T``, K in chunks."""
    from jax.experimental import pallas as pl  # noqa: PLC0415

    def body(i, acc_MxN):
        start = pl.multiple_of(i * block_k, block_k)
        x_MxK = x_ref[:, pl.ds(start, block_k)].astype(jnp.float32)
        w_NxK = w_ref[:, pl.ds(start, block_k)].astype(jnp.float32)
        # [M, 1, BK] * [1, BN, BK] -> [M, BN]
        return acc_MxN + jnp.sum(x_MxK[:, None, :] * w_NxK[None, :, :], axis=-1)

    acc = jax.lax.fori_loop(0, num_k, body, jnp.zeros(out_ref.shape, jnp.float32))
    out_ref[...] = acc.astype(out_ref.dtype)


def small_m_matmul(x_MxK: jax.Array, w_NxK: jax.Array, *, interpret: bool | None = None
                   ) -> jax.Array:
    """``x @ w.T`` for few rows (``supports``); float32 accumulation, output in
    ``x``'s dtype. ``interpret`` defaults to True on CPU (Pallas has no CPU
    compiler; interpret mode runs the same program with jax ops) and False on
    GPU (Triton). Other backends must choose: the program has never been
    lowered through Mosaic (TPU), and interpreting there would silently run
    an emulation many times slower than XLA's dot."""
    from jax.experimental import pallas as pl  # noqa: PLC0415

    rows, k = x_MxK.shape
    n = w_NxK.shape[0]
    if w_NxK.shape[1] != k:
        raise ValueError(f"x is [{rows}, {k}] but w is {list(w_NxK.shape)}; w must be "
                         f"[out, {k}] (the out_in layout).")
    if not supports(rows, n, k):
        raise ValueError(f"small_m_matmul covers 1..{MAX_ROWS} rows and dimensions divisible "
                         f"by 16; got [{rows}, {k}] x [{n}, {k}]^T (use the XLA path).")
    if interpret is None:
        backend = jax.default_backend()
        if backend not in ("cpu", "gpu"):
            raise ValueError(f"the Pallas small-M matmul is written for GPUs (Triton) and runs "
                             f"interpreted on CPU; on {backend!r} it is untested. Use "
                             "matmul_kernel='xla' (XLA's dot), or pass interpret=True/False "
                             "explicitly to try it.")
        interpret = backend == "cpu"
    padded = _rows_padded(rows)
    x_pad = jnp.pad(x_MxK, ((0, padded - rows), (0, 0)))
    block_n, block_k = _block(n), _block(k)
    out = pl.pallas_call(
        functools.partial(_program, block_k=block_k, num_k=k // block_k),
        out_shape=jax.ShapeDtypeStruct((padded, n), x_MxK.dtype),
        grid=(n // block_n,),
        in_specs=[pl.BlockSpec((padded, k), lambda j: (0, 0)),
                  pl.BlockSpec((block_n, k), lambda j: (j, 0))],
        out_specs=pl.BlockSpec((padded, block_n), lambda j: (0, j)),
        interpret=interpret)(x_pad, w_NxK)
    return out[:rows]


def matmul_out_in(x: jax.Array, w_NxK: jax.Array, *, kernel: str = XLA,
                  precision: str | None = None) -> jax.Array:
    """``x[..., K] @ w[N, K]^T`` by ``kernel``: the Pallas program where it
    applies (``supports``), else XLA's dot."""
    if kernel not in MATMUL_KERNELS:
        raise ValueError(f"matmul kernel {kernel!r}; choose one of {', '.join(MATMUL_KERNELS)}.")
    rows = 1
    for dim in x.shape[:-1]:
        rows *= dim
    if kernel == PALLAS and supports(rows, w_NxK.shape[0], w_NxK.shape[1]):
        flat = small_m_matmul(x.reshape(rows, x.shape[-1]), w_NxK)  # [..., K] -> [M, K]
        return flat.reshape(*x.shape[:-1], w_NxK.shape[0])
    return jnp.einsum("...i,oi->...o", x, w_NxK, precision=precision)
