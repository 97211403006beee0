"""``x[..., K] @ w[N, K]^T`` for few rows, through the CPU kernel when loaded.

A decode step multiplies M = batch rows by every weight matrix, a scoring call
M = batch x (G + 1). Both are bound by reading ``w`` once; XLA's CPU dot runs
them as general products and a scoring call of 6 rows costs 2-3x a step. The
kernel (``small_m_matmul.cc``) uses every weight it loads for all M rows and
widens bfloat16 or int8 weights (``scale[N]`` per output row) to float32 in
registers, so narrow storage reads fewer bytes without changing ``x`` or the
float32 accumulation.

The kernel serves one CPU device. Everything else keeps XLA's dot: another
platform (``lax.platform_dependent`` lowers only the branch of the platform
compiled for, so TPU and GPU programs never see the custom call), float32
weights at more than ``MAX_ROWS`` rows (a prefill is compute-bound, where XLA's
blocked product is the right tool), narrow weights at more than
``MAX_ROWS_NARROW`` rows, several devices (no partitioning rule for the call),
and float32 weights at one row, where XLA's matrix-vector product already reads
at the memory's speed. Narrow weights take the kernel up to a longer prefill
because XLA's dot needs them widened to a float32 copy first, written and read
back on every call: a 0.5B drafter's int8 prefill of 96 / 166 / 512 rows took
470 / 706 / 2,609 ms through the kernel against 1,071 / 1,107 / 2,709 ms
widened (2-core x86_64, docs/results.md); past 512 rows it was not measured.
Gradients go through XLA's formulation (``custom_jvp``).

Weights kept in their GGUF file's blocks (``native.stored_blocks.StoredMatrix``)
take the block kernel on a CPU with a SIMD path for it (AVX-512 VNNI, AVX-VNNI,
AVX2, NEON dotprod; ``runtime.cpu_kernels.block_kernel_isa``), at every row count: each row
of ``x`` is quantised to int8 per 32, 64 or 256 values (by format) and
multiplied with the blocks' integer codes, a fixed function of that row and
the file (the same bits for a row alone or among 16, and on every path: each
equals the scalar reference of ``block_dot.h`` bit for bit; what keeps
speculative decoding exact with respect to it). Everywhere else (other
platforms, no SIMD path, kernel off) they are dequantised (bit for bit
``gguf``'s values) and multiplied by XLA: the float model of the file.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.native import stored_blocks

Array = jax.Array

# The handlers' names in the compiled library, by weight dtype.
SYMBOLS = {np.dtype(np.float32): "SmallMMatmulF32",
           np.dtype(jnp.bfloat16): "SmallMMatmulBF16",
           np.dtype(np.int8): "SmallMMatmulI8"}
TARGET_PREFIX = "specdec_jax_"
# The products the kernel takes: rows of x (batch x positions). A scoring
# call at batch 1 has G + 1 <= 17 rows; larger products are prefills, which
# keep XLA's dot for float32 weights and take the kernel for bfloat16 / int8
# weights up to the longest prefill measured faster that way (module docstring).
MAX_ROWS = 32
MAX_ROWS_NARROW = 512
# The block kernel (int8 activations against a GGUF file's blocks), by format.
BLOCK_SYMBOL = "SmallMBlockMatmulI8"
BLOCK_CODES = {"q8_0": 0, "q4_1": 1, "q5_0": 2, "q4_k": 3, "q6_k": 4, "q4_k_x16": 5,
               "q6_k_x16": 6, "q5_0_x16": 7}
BLOCK_CHUNK = 64  # activations are quantised per this many values


@dataclasses.dataclass
class _State:
    registered: bool = False
    enabled: bool = True
    blocks: bool = False  # the loaded library has the block kernel (a SIMD path)


_STATE = _State()


def mark_registered(blocks: bool = False) -> None:
    """Called once the library's handlers are registered with ``jax.ffi``
    (``runtime.cpu_kernels``); products traced from now on may use them.
    ``blocks``: the block kernel is among them."""
    _change(registered=True, blocks=bool(blocks))


def set_enabled(enabled: bool) -> None:
    """Turns the kernel off (or back on) for products traced from now on."""
    _change(enabled=bool(enabled))


def _change(**fields) -> None:
    # The choice is made while tracing and is not part of jax's cache keys: a
    # jitted function traced before the change would keep its old program
    # (a benchmark timing "kernel" and "XLA" through one function would time
    # XLA twice). Dropping jax's caches makes the next call trace again.
    was = (active(), blocks_active())
    for name, value in fields.items():
        setattr(_STATE, name, value)
    if (active(), blocks_active()) != was:
        jax.clear_caches()


def active() -> bool:
    """Whether products traced now may take the kernel."""
    return _STATE.registered and _STATE.enabled


def blocks_active() -> bool:
    """Whether products with stored blocks traced now take the block kernel."""
    return active() and _STATE.blocks


def _uses_kernel(rows: int, x: Array, w: Array) -> bool:
    if not active() or x.dtype != jnp.float32 or w.ndim < 2:
        return False
    if np.dtype(w.dtype) not in SYMBOLS:
        return False
    if not 1 <= rows <= (MAX_ROWS if w.dtype == jnp.float32 else MAX_ROWS_NARROW):
        return False
    if w.dtype == jnp.float32 and rows == 1:
        return False
    return jax.device_count() == 1


def _xla_product(x: Array, w: Array, scale: Array | None, precision) -> Array:
    """XLA's dot of ``x[..., K]`` with the widened ``w[*N, K]``, times ``scale[*N]``.

    A kernel with several output axes is read as stored on accelerators and as
    the ``[prod(N), K]`` matrix it is in memory on one CPU: XLA's CPU dot of a
    3-D kernel transposes a copy of it first, every call (measured: the 1.5B
    float32 step, 836 vs 213 ms on 2 cores)."""

    def as_stored(x, w):
        out = "nmopqrst"[:w.ndim - 1]  # one letter per output axis
        return jnp.einsum(f"...k,{out}k->...{out}", x, w.astype(x.dtype), precision=precision)

    def flat(x, w):
        y = as_stored(x, w.reshape(-1, w.shape[-1]))
        return y.reshape(y.shape[:-1] + w.shape[:-1])

    # Several devices: a kernel sharded along an inner output axis cannot be
    # flattened without gathering it, so it is read as stored there too.
    y = as_stored(x, w) if w.ndim == 2 or jax.device_count() > 1 else (
        jax.lax.platform_dependent(x, w, cpu=flat, default=as_stored))
    return y if scale is None else y * scale.astype(y.dtype)


def _kernel_product(x2: Array, w: Array, scale: Array | None) -> Array:
    out = jax.ShapeDtypeStruct((x2.shape[0], w.shape[0]), jnp.float32)
    call = jax.ffi.ffi_call(TARGET_PREFIX + SYMBOLS[np.dtype(w.dtype)], out,
                            vmap_method="sequential")
    if w.dtype == jnp.int8:
        return call(x2, w, jnp.ones((w.shape[0],), jnp.float32) if scale is None
                    else scale.astype(jnp.float32))
    y = call(x2, w)
    return y if scale is None else y * scale.astype(jnp.float32)


def _dispatch(x2: Array, w: Array, scale: Array | None, precision) -> Array:
    @jax.custom_jvp
    def product(x2, w, scale):
        return jax.lax.platform_dependent(
            x2, w, scale, cpu=_kernel_product,
            default=lambda x2, w, scale: _xla_product(x2, w, scale, precision))

    @product.defjvp
    def _(primals, tangents):  # the same product in XLA's formulation
        return jax.jvp(lambda *a: _xla_product(*a, precision), primals, tangents)

    return product(x2, w, scale)


def matmul_out_in(x: Array, w_NxK: Array, precision: str | None = None, *,
                  scale_N: Array | None = None) -> Array:
    """``x[..., K] @ (w[N, K] * scale[N, None])^T`` in ``x``'s dtype.

    ``w`` may be stored narrower than ``x`` (bfloat16, or int8 with
    ``scale_N``): the product is that of the dequantised weights, computed
    with float32 accumulation by the kernel or by XLA after widening ``w``.
    A fused kernel may have several output axes, ``w[*N, K]`` (``scale[*N]``),
    giving ``[..., *N]``: XLA's product reads it as stored, never reshaped (a
    reshaped kernel can be a copy: on a TPU, whose tiles span the two minor
    axes, or sharded along an inner output axis); the CPU kernel takes it as
    the ``[prod(N), K]`` matrix it is in memory.
    """
    if isinstance(w_NxK, stored_blocks.StoredMatrix):
        if scale_N is not None:
            raise ValueError("a stored block matrix carries its own scales; scale_N must be None.")
        return block_product(x, w_NxK, precision)
    rows = math.prod(x.shape[:-1])
    out_shape = w_NxK.shape[:-1]
    if _uses_kernel(rows, x, w_NxK):
        x2 = x.reshape(rows, x.shape[-1])
        w2 = w_NxK.reshape(math.prod(out_shape), w_NxK.shape[-1])  # [*N, K] -> [N, K]
        scale2 = None if scale_N is None else scale_N.reshape(w2.shape[0])
        y = _dispatch(x2, w2, scale2, precision)
        return y.reshape(x.shape[:-1] + out_shape)
    return _xla_product(x, w_NxK, scale_N, precision)


def _block_kernel(x2: Array, blocks: Array, fmt: str) -> Array:
    out = jax.ShapeDtypeStruct((x2.shape[0], blocks.shape[0]), jnp.float32)
    call = jax.ffi.ffi_call(TARGET_PREFIX + BLOCK_SYMBOL, out, vmap_method="sequential")
    return call(x2, blocks, format=np.int32(BLOCK_CODES[fmt]))


def _dequantized_product(x: Array, w: stored_blocks.StoredMatrix, precision) -> Array:
    return _xla_product(x, stored_blocks.dequantize(w), None, precision)


def block_product(x: Array, w: stored_blocks.StoredMatrix, precision=None) -> Array:
    """``x[..., K] @ dequantize(w)^T``: the block kernel on one CPU device with
    its SIMD path and float32 ``x`` (int8 activations, module docstring), else XLA's
    product with the dequantised matrix. The choice is made while tracing, so
    one traced function computes one of the two at every row count."""
    k = w.in_features
    if not (blocks_active() and x.dtype == jnp.float32 and k % BLOCK_CHUNK == 0
            and jax.device_count() == 1):
        return _dequantized_product(x, w, precision)
    x2 = x.reshape(-1, k)
    y = jax.lax.platform_dependent(
        x2, w.blocks, cpu=lambda x2, b: _block_kernel(x2, b, w.format),
        default=lambda x2, b: _dequantized_product(
            x2, stored_blocks.StoredMatrix(b, w.format, k), precision))
    return y.reshape(x.shape[:-1] + (w.shape[0],))
