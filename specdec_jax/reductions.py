"""Reductions over the vocabulary that XLA on CPU would otherwise run slowly.

``jnp.argmax`` lowers to a two-operand reduction (value and index together),
which XLA's CPU backend does not vectorise: over the 152k vocabulary of the
Qwen models it took ~1 ms a row, and a decoding round takes several (the
greedy law of every call, Gumbel draws, the verifiers). ``first_argmax``
returns the same index from two one-operand reductions that XLA vectorises.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def first_argmax(x: jax.Array) -> jax.Array:
    """int32 ``[...]``: ``jnp.argmax(x, -1)`` (the first index of the maximum,
    or of the first NaN, as argmax), as a max followed by a min over indices:
    two one-operand reductions that XLA vectorises."""
    top = jnp.max(x, axis=-1, keepdims=True)  # NaN if the row holds one
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    is_top = (x == top) | jnp.isnan(x)
    return jnp.min(jnp.where(is_top, index, x.shape[-1]), axis=-1)
