"""Reductions over the vocabulary that XLA on CPU would otherwise run slowly.

``jnp.argmax`` lowers to a two-operand reduction (value and index together),
which XLA's CPU backend does not vectorise: over the 152k vocabulary of the
Qwen models it took ~1 ms a row, and a decoding round takes several (the
greedy law of every call, Gumbel draws, the verifiers). ``first_argmax``
returns the same index from two one-operand reductions that XLA vectorises,
on CPU only: on TPU the two passes over the row made the compiler keep more
scratch (the 1.5B's autoregressive generate program, v5e: 90 MB of HBM
temporaries with ``jnp.argmax``, 112 MB with the two reductions).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _max_then_min(x: jax.Array) -> jax.Array:
    top = jnp.max(x, axis=-1, keepdims=True)  # NaN if the row holds one
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    is_top = (x == top) | jnp.isnan(x)
    return jnp.min(jnp.where(is_top, index, x.shape[-1]), axis=-1)


def _argmax(x: jax.Array) -> jax.Array:
    return jnp.argmax(x, axis=-1).astype(jnp.int32)


def first_argmax(x: jax.Array) -> jax.Array:
    """int32 ``[...]``: ``jnp.argmax(x, -1)`` (the first index of the maximum,
    or of the first NaN, as argmax); on CPU as a max followed by a min over
    indices, two one-operand reductions that XLA vectorises."""
    return jax.lax.platform_dependent(x, cpu=_max_then_min, default=_argmax)
