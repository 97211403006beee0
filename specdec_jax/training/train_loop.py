"""The training loop: data-parallel steps over a mesh, periodic checkpoints,
metrics, evaluation, and resume that loses nothing.

Step ``s`` (1-based) applies the update computed on batch ``s - 1`` of the
dataset (a pure function of the seed and the index, see ``training.datasets``)
with the key ``fold_in(rng, s - 1)``; the checkpoint after step ``s`` stores
the state and the data position ``s``. A run killed at any point (``kill
-9`` included) and started again with the same arguments restores the newest
complete checkpoint and reproduces the uninterrupted run's losses bit for bit
(``tests/test_training.py``).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specdec_jax.runtime import distributed, sharding
from specdec_jax.runtime.progress import tqdm
from specdec_jax.training import steps as steps_lib
from specdec_jax.training.datasets import ArrayDataset, MixtureDataset
from specdec_jax.training.forward import Batch, lm_loss
from specdec_jax.training.optimizers import OptimizerConfig, make_optimizer
from specdec_jax.training.run_io import MetricsWriter, RunCheckpoints

Callback = Callable[[int, dict], None]


@dataclasses.dataclass
class TrainResult:
    state: steps_lib.TrainState
    history: list[dict]  # metrics.jsonl, parsed
    resumed_from: int | None  # the checkpoint step this run started from, if any
    seconds: float  # wall clock of this invocation's steps (compilation included)


def fingerprint(model, optimizer: OptimizerConfig, *, batch_size: int, seed: int,
                extra: dict | None = None) -> dict:
    """What must match for a checkpoint to be resumed by this run."""
    config = getattr(model, "config", None)
    model_info = {"class": type(model).__name__,
                  **(dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {})}
    return {"model": model_info, "optimizer": dataclasses.asdict(optimizer),
            "batch_size": batch_size, "seed": seed, **(extra or {})}


def batch_sharding(mesh: Mesh, batch: Batch) -> Any:
    """Every array of a batch sharded along ``data`` on its first axis."""
    return jax.tree_util.tree_map(
        lambda x: NamedSharding(mesh, PartitionSpec(sharding.DATA, *[None] * (x.ndim - 1))),
        batch)


def place_batch(batch: Batch, mesh: Mesh) -> Batch:
    """Every process holds the whole batch (a pure function of the seed and
    the index) and fills only its own devices' rows (``sharding.place``)."""
    return jax.tree_util.tree_map(sharding.place, batch, batch_sharding(mesh, batch))


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
    shards = mesh.shape[sharding.DATA]
    if batch_size < 1 or batch_size % shards:
        raise ValueError(f"batch size {batch_size} is not divisible by the mesh's data axis "
                         f"({shards} devices); use a multiple of {shards} or a smaller mesh.")


def evaluate(eval_step, params, batches: Sequence[Batch], mesh: Mesh,
             extras: Any = None) -> dict[str, float]:
    """Mean loss, accuracy, and (from ``nll_sum``) perplexity over ``batches``,
    plus the mean of every other ``*_sum`` (sums added exactly)."""
    totals: dict[str, float] = {}
    for batch in batches:
        for key, value in eval_step(params, place_batch(batch, mesh), extras).items():
            totals[key] = totals.get(key, 0.0) + float(value)
    weight = max(totals.pop("weight_sum", 0.0), 1.0)
    out = {"eval/loss": totals.pop("loss_sum") / weight,
           "eval/accuracy": totals.pop("correct", 0.0) / weight}
    if "nll_sum" in totals:
        out["eval/perplexity"] = float(np.exp(min(totals["nll_sum"] / weight, 50.0)))
    out.update({f"eval/{k.removesuffix('_sum')}": v / weight for k, v in totals.items()
                if k.endswith("_sum")})
    return out


def train(*, model, params, optimizer: OptimizerConfig, data: ArrayDataset | MixtureDataset,
          num_steps: int, batch_size: int, workdir: str | os.PathLike, seed: int = 0,
          loss_fn: steps_lib.LossFn = lm_loss, eval_data: ArrayDataset | None = None,
          eval_every: int = 0, eval_batch_size: int | None = None,
          checkpoint_every: int = 100, keep: int = 3, log_every: int = 1,
          mesh: Mesh | None = None, rules=None, fingerprint_extra: dict | None = None,
          loss_extras: Any = None,
          callbacks: Sequence[Callback] = (), progress: bool = True) -> TrainResult:
    """Trains ``params`` for ``num_steps`` updates (resuming from ``workdir``).

    ``mesh`` defaults to every device on the ``data`` axis (data parallel);
    parameters are placed by ``rules`` (default: the model family's partition
    rules of ``specdec_jax.runtime.sharding``), batches are split along ``data``.
    Across processes (``specdec_jax.runtime.distributed``) every process calls this
    with the same arguments: each fills its own devices' rows of a batch,
    every process writes its shards of a checkpoint (orbax), and process 0
    alone writes the metrics and shows the progress bar.
    Writes ``workdir/checkpoints``, ``workdir/metrics.jsonl`` and
    ``workdir/tensorboard``. ``callbacks`` run after every step with the step
    and its logged metrics (empty between logging steps). ``loss_extras`` are
    frozen inputs of ``loss_fn`` (e.g. a teacher's parameters, placed by the
    caller), passed to every step.
    """
    if num_steps < 1 or log_every < 1 or eval_every < 0:
        raise ValueError(f"num_steps ({num_steps}) and log_every ({log_every}) must be >= 1, "
                         f"eval_every ({eval_every}) >= 0.")
    mesh = sharding.make_mesh() if mesh is None else mesh
    check_batch_size(batch_size, mesh)
    eval_batch_size = eval_batch_size or batch_size
    if eval_data is not None:
        check_batch_size(eval_batch_size, mesh)
    if rules is None:
        rules = sharding.rules_for(model)
    tx = make_optimizer(optimizer)
    workdir = pathlib.Path(workdir)
    state = steps_lib.init_state(sharding.shard_params(params, mesh, rules), tx,
                                 jax.random.PRNGKey(seed))
    checkpoints = RunCheckpoints(workdir / "checkpoints", every=checkpoint_every, keep=keep,
                                 fingerprint=fingerprint(model, optimizer, batch_size=batch_size,
                                                         seed=seed, extra=fingerprint_extra))
    restored = checkpoints.restore(state)
    start = 0
    if restored is not None:
        state, position, start = restored
        if position["next_batch"] != start:
            raise ValueError(f"checkpoint {start} stores data position {position}, not batch "
                             f"{start}; it was not written by this loop.")
    writer = distributed.is_writer()
    metrics_writer = MetricsWriter(workdir, resume_from_step=start, enabled=writer)
    # in_step: across processes, every new program starts on all of them together.
    train_step = distributed.in_step(
        jax.jit(steps_lib.make_train_step(model, tx, loss_fn), donate_argnums=0))
    eval_step = distributed.in_step(jax.jit(steps_lib.make_eval_step(model, loss_fn)))
    eval_batches = eval_data.batches(eval_batch_size) if eval_data is not None else []
    began = time.perf_counter()
    bar = tqdm(range(start, num_steps), initial=start, total=num_steps, desc="train",
               disable=not (progress and writer), unit="step")
    tokens_seen = 0.0
    try:
        for index in bar:
            host_batch = data.batch(index, batch_size, seed)
            state, step_metrics = train_step(state, place_batch(host_batch, mesh), loss_extras)
            step = index + 1
            tokens_seen += float(host_batch.weights.sum())
            logged: dict[str, float] = {}
            if step % log_every == 0 or step == num_steps:
                logged = {k: float(v) for k, v in step_metrics.items()}
            if eval_batches and (step == num_steps or (eval_every and step % eval_every == 0)):
                logged.update(evaluate(eval_step, state.params, eval_batches, mesh,
                                       loss_extras))
            if logged:
                metrics_writer.write(step, logged)
                elapsed = time.perf_counter() - began
                bar.set_postfix(loss=f"{logged['loss']:.4f}",
                                tok_per_s=f"{tokens_seen / max(elapsed, 1e-9):.0f}")
            checkpoints.save(step, state, {"next_batch": step, "seed": seed},
                             force=step == num_steps)
            for callback in callbacks:
                callback(step, logged)
    finally:
        checkpoints.close()
        metrics_writer.close()
    return TrainResult(state=state, history=metrics_writer.read(),
                       resumed_from=start if restored is not None else None,
                       seconds=time.perf_counter() - began)
