"""The two primitives every decoding loop body is built from: a ragged write
into per-row buffers (``write_rows``) and a ``lax.while_loop`` that reads its
condition once every ``every`` iterations (``checked_while_loop``).

Rows of a batch advance by different numbers of tokens each round, so every
buffer a loop carries (history, output, features, a drafter's cache rows) is
written at a per-row offset; ``write_rows`` is that one scatter, dropping
positions past the buffer rather than clamping them onto valid entries.

On a GPU, XLA's while thunk copies an unknown-trip loop's condition to the
host and waits for it at every iteration. ``checked_while_loop(cond, body,
init, every=R)`` runs an outer while loop over chunks of R iterations, each a
fixed-trip loop (no host read), where an iteration after ``cond`` turned false
is skipped (``lax.cond``). The state that comes out is the same as
``lax.while_loop``'s, bit for bit; ``every = 1`` is that loop. E.g. 23
iterations with R = 8: three condition reads instead of 24, one skipped slot.

The skip is itself a conditional, which XLA decides on the device only inside
a command buffer (CONDITIONAL is in its default set) and on the host
otherwise: which R pays, if any, is for a GPU run to measure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import jax
import jax.numpy as jnp

Array = jax.Array
State = TypeVar("State")


def check_every(every: int, name: str = "iterations per check") -> None:
    """Refuses anything but a positive int (it is static: it shapes the program)."""
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {every!r}.")


def checked_while_loop(cond_fn: Callable[[State], jax.Array],
                       body_fn: Callable[[State], State], init: State, every: int = 1) -> State:
    """``lax.while_loop(cond_fn, body_fn, init)``, reading ``cond_fn`` on the
    host once every ``every`` iterations (module docstring)."""
    check_every(every)
    if every == 1:
        return jax.lax.while_loop(cond_fn, body_fn, init)

    def chunk_fn(state: State) -> State:
        step = lambda _, s: jax.lax.cond(cond_fn(s), body_fn, lambda s: s, s)  # noqa: E731
        return jax.lax.fori_loop(0, every, step, state)

    return jax.lax.while_loop(cond_fn, chunk_fn, init)


def write_rows(buffer_BxN: Array, values_BxK: Array, start_B: Array,
               count_B: Array | None = None) -> Array:
    """buffer[b, start[b] + i] = values[b, i] for i < count[b] (all K when None).

    Works for trailing feature axes ([B, N, V] buffers). Positions past the
    buffer's end are dropped, never clamped onto valid entries.
    """
    batch, k = values_BxK.shape[:2]
    offsets_K = jnp.arange(k)
    positions_BxK = start_B[:, None] + offsets_K[None, :]
    if count_B is not None:
        positions_BxK = jnp.where(offsets_K[None, :] < count_B[:, None], positions_BxK,
                                  buffer_BxN.shape[1])
    rows_BxK = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, k))
    return buffer_BxN.at[rows_BxK, positions_BxK].set(values_BxK.astype(buffer_BxN.dtype),
                                                      mode="drop")
