"""Each query's attention over the cache alone, through the CPU kernel when loaded.

A decoder that is one function of each row (``DecoderConfig.row_independent``:
a GGUF model on CPU) scores each query of a scoring call as a one-token step
scores its one. ``attend_each_query`` does that in one call of the kernel
(``cache_attention.h``: fixed sums per query, positions the mask hides skipped)
on one CPU device with the kernel loaded, and as ``fallback`` everywhere else
(other platforms, several devices, no compiler, ``cpu_kernels.enable(False)``):
XLA's attention one query after another. The two compute the same function up
to float rounding; one traced program computes one of them at every call, so a
step and a scoring call of that program agree bit for bit. Gradients go through
``fallback`` (``custom_jvp``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.native import matmul as native_matmul

Array = jax.Array

SYMBOL = "SpecdecCacheAttention"
_ENABLED = {"kernel": True}


def set_enabled(enabled: bool) -> None:
    """Turns the attention kernel off (or back on) for calls traced from now
    on, the product kernels left as they are (a benchmark's switch: XLA's
    attention beside the kernel's in one process). Drops jax's caches on a
    change, as ``native.matmul.set_enabled`` does."""
    if _ENABLED["kernel"] != bool(enabled):
        _ENABLED["kernel"] = bool(enabled)
        jax.clear_caches()


def uses_kernel(q: Array, keys: Array, values: Array) -> bool:
    """Whether ``attend_each_query`` runs the kernel for these operands when
    traced now (float32 throughout, one device, the library loaded and the
    kernel not turned off)."""
    return (_ENABLED["kernel"] and native_matmul.active() and jax.device_count() == 1
            and all(a.dtype == jnp.float32 for a in (q, keys, values)))


def _kernel(q: Array, keys: Array, values: Array, visible: Array, scale: float) -> Array:
    call = jax.ffi.ffi_call(native_matmul.TARGET_PREFIX + SYMBOL,
                            jax.ShapeDtypeStruct(q.shape, jnp.float32), vmap_method="sequential")
    return call(q, keys, values, visible, scale=np.float32(scale))


def attend_each_query(q_BxKxHxGxD: Array, keys_BxHxSxD: Array, values_BxHxSxD: Array,
                      visible_BxKxS: Array, scale: float,
                      fallback: Callable[[Array, Array, Array, Array], Array]) -> Array:
    """``softmax(scale q . keys^T, over the visible positions) . values`` per
    query, ``[B, K, H, G, D]``: query head ``h * G + g`` reads key/value head
    ``h`` of the heads-major cache. ``fallback(q, keys, values, visible)``
    computes the same with XLA (module docstring)."""
    if not uses_kernel(q_BxKxHxGxD, keys_BxHxSxD, values_BxHxSxD):
        return fallback(q_BxKxHxGxD, keys_BxHxSxD, values_BxHxSxD, visible_BxKxS)

    @jax.custom_jvp
    def attend(q, keys, values, visible):
        return jax.lax.platform_dependent(
            q, keys, values, visible, cpu=lambda *a: _kernel(*a, scale), default=fallback)

    @attend.defjvp
    def _(primals, tangents):  # XLA's formulation
        return jax.jvp(fallback, primals, tangents)

    return attend(q_BxKxHxGxD, keys_BxHxSxD, values_BxHxSxD, visible_BxKxS)
