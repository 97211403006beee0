"""Optimizers and learning-rate schedules (optax), chosen by name from a config.

t5x trains T5 with Adafactor (factored second moments, no momentum, update
clipping) and an inverse-square-root schedule; decoder-only recipes mostly use
AdamW with warmup and cosine decay. Both are here, behind one frozen config so
a run records exactly what it used (and a resumed run can check it)::

    tx = make_optimizer(OptimizerConfig(name="adamw", learning_rate=3e-4,
                                        schedule="cosine", warmup_steps=100,
                                        total_steps=2000, clip_norm=1.0))
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import optax

OPTIMIZERS = ("adafactor", "adamw", "sgd")
SCHEDULES = ("constant", "rsqrt", "cosine", "linear")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: str = "adafactor"
    learning_rate: float = 1e-3
    schedule: str = "rsqrt"  # see make_schedule
    warmup_steps: int = 0
    total_steps: int = 0  # decay horizon of "cosine" and "linear"
    clip_norm: float = 1.0  # global-norm gradient clipping; 0 turns it off
    weight_decay: float = 0.0  # decoupled (AdamW); Adafactor's is relative to the parameter
    b1: float = 0.9  # AdamW / SGD momentum
    b2: float = 0.999  # AdamW

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.name!r}; choose one of "
                             f"{', '.join(OPTIMIZERS)}.")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown learning-rate schedule {self.schedule!r}; choose one "
                             f"of {', '.join(SCHEDULES)}.")
        if self.learning_rate <= 0 or self.clip_norm < 0 or self.warmup_steps < 0:
            raise ValueError("learning_rate must be > 0, clip_norm and warmup_steps >= 0 "
                             f"(got {self.learning_rate}, {self.clip_norm}, "
                             f"{self.warmup_steps}).")
        if self.schedule in ("cosine", "linear") and self.total_steps <= self.warmup_steps:
            raise ValueError(f"schedule {self.schedule!r} decays until total_steps, which must "
                             f"exceed warmup_steps (got {self.total_steps} <= "
                             f"{self.warmup_steps}); set total_steps to the run's length.")


def make_schedule(config: OptimizerConfig) -> optax.Schedule:
    """``constant``: flat after linear warmup. ``rsqrt`` (t5x): ``lr /
    sqrt(max(step, warmup) / max(warmup, 1))``, flat during warmup, then
    decaying as 1/sqrt(step). ``cosine`` / ``linear``: linear warmup to ``lr``,
    then decay to 0 at ``total_steps``."""
    lr, warmup = config.learning_rate, config.warmup_steps
    if config.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(0.0, lr, max(warmup, 1), config.total_steps)
    if config.schedule == "linear":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, lr, max(warmup, 1)),
             optax.linear_schedule(lr, 0.0, config.total_steps - warmup)], [max(warmup, 1)])
    if config.schedule == "rsqrt":
        scale = max(warmup, 1)
        return lambda step: lr * jnp.sqrt(scale / jnp.maximum(step, scale))
    if warmup:
        return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup),
                                     optax.constant_schedule(lr)], [warmup])
    return optax.constant_schedule(lr)


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """The optimizer ``config`` names, after global-norm clipping."""
    schedule = make_schedule(config)
    if config.name == "adafactor":
        core = optax.adafactor(learning_rate=schedule, weight_decay_rate=config.weight_decay
                               or None)
    elif config.name == "adamw":
        core = optax.adamw(schedule, b1=config.b1, b2=config.b2,
                           weight_decay=config.weight_decay)
    else:
        core = optax.sgd(schedule, momentum=config.b1 or None)
    if config.clip_norm:
        return optax.chain(optax.clip_by_global_norm(config.clip_norm), core)
    return core
