"""A ``lax.while_loop`` that reads its condition once every ``every`` iterations.

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
