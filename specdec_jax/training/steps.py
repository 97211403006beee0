"""The train state and the pure train / eval steps (jitted once by the loop).

A loss function has the signature ``loss_fn(model, params, batch, rng,
extras) -> (loss, sums)`` where ``rng`` is the step's key in training and
None in evaluation (so dropout, say, is off), ``sums`` are per-step sums (``loss_sum``,
``weight_sum``, ...) that add up exactly across steps and devices, and
``extras`` is a pytree of frozen inputs passed to every step as an argument
(a distillation teacher's parameters: an argument, not a closure, so large
arrays are never baked into the compiled program as constants).
``forward.lm_loss`` is the language-modelling loss; distillation and the
acceptance head bring their own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from jax import Array

from specdec_jax.training.forward import Batch, lm_loss

LossFn = Callable[[Any, Any, Batch, Array, Any], tuple[Array, dict[str, Array]]]


@flax.struct.dataclass
class TrainState:
    step: Array  # int32 []: optimizer updates applied so far
    params: Any
    opt_state: Any
    rng: Array  # the run's key; step s uses fold_in(rng, s), so a resumed run draws the same


def init_state(params, optimizer: optax.GradientTransformation, rng: Array) -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=optimizer.init(params), rng=rng)


def make_train_step(model, optimizer: optax.GradientTransformation,
                    loss_fn: LossFn = lm_loss) -> Callable[..., tuple[TrainState, dict]]:
    """``train_step(state, batch, extras=None) -> (state, metrics)``: one update."""

    def train_step(state: TrainState, batch: Batch, extras: Any = None
                   ) -> tuple[TrainState, dict]:
        rng = jax.random.fold_in(state.rng, state.step)
        grad_fn = jax.value_and_grad(lambda p: loss_fn(model, p, batch, rng, extras),
                                     has_aux=True)
        (loss, sums), grads = grad_fn(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": loss, "grad_norm": optax.global_norm(grads), **sums}
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return train_step


def make_eval_step(model, loss_fn: LossFn = lm_loss) -> Callable[..., dict]:
    """``eval_step(params, batch, extras=None) -> sums`` (add them up over the eval set)."""

    def eval_step(params, batch: Batch, extras: Any = None) -> dict:
        _, sums = loss_fn(model, params, batch, None, extras)
        return sums

    return eval_step
