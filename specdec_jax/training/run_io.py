"""Run checkpoints (orbax ``CheckpointManager``) and run metrics (JSON lines
plus TensorBoard event files).

Every checkpoint holds the train state and a small JSON record: the run's
*fingerprint* (model config, optimizer config, batch size, seed, vocabulary)
and the data position (the next batch index). Restoring checks the
fingerprint first, so a checkpoint from another configuration fails with a
message that names both, instead of a shape error deep inside orbax.
Checkpoints are finalised atomically by orbax (a step directory is committed
only when complete), so a run killed mid-save resumes from the step before.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any

import jax

META = "meta"
STATE = "state"


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def _differences(stored: Any, current: Any, prefix: str = "") -> list[str]:
    if isinstance(stored, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(stored) | set(current)):
            out += _differences(stored.get(key), current.get(key), f"{prefix}{key}.")
        return out
    return [] if stored == current else [f"{prefix.rstrip('.')}: checkpoint {stored!r}, "
                                         f"this run {current!r}"]


class RunCheckpoints:
    """Periodic saves (every ``every`` steps, keeping the newest ``keep``) and
    the restore of the latest one, checked against ``fingerprint``."""

    def __init__(self, directory: str | os.PathLike, *, fingerprint: dict, every: int,
                 keep: int = 3):
        import orbax.checkpoint as ocp  # noqa: PLC0415

        if every < 1 or keep < 1:
            raise ValueError(f"checkpoint every ({every}) and keep ({keep}) must be >= 1.")
        self.directory = pathlib.Path(directory).absolute()
        self.fingerprint = _jsonable(fingerprint)
        self._ocp = ocp
        self._manager = ocp.CheckpointManager(
            self.directory, item_names=(STATE, META),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every,
                                                 create=True))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, data_position: dict, *, force: bool = False) -> bool:
        """Saves if ``step`` is on the interval (or ``force``); returns whether it did."""
        ocp = self._ocp
        meta = {"fingerprint": self.fingerprint, "data": data_position, "step": step}
        return self._manager.save(step, force=force, args=ocp.args.Composite(
            **{STATE: ocp.args.StandardSave(state), META: ocp.args.JsonSave(meta)}))

    def restore(self, like_state: Any) -> tuple[Any, dict, int] | None:
        """(state, data position, step) of the latest checkpoint, or None if
        there is none. ``like_state`` gives shapes, dtypes and shardings."""
        ocp = self._ocp
        step = self.latest_step()
        if step is None:
            return None
        where = self.directory / str(step)
        try:
            meta = self._manager.restore(step, args=ocp.args.Composite(
                **{META: ocp.args.JsonRestore()}))[META]
        except Exception as error:  # orbax raises several types for a damaged directory
            raise ValueError(f"checkpoint {where} is corrupt or incomplete (its metadata "
                             f"cannot be read: {error}); delete {where} to resume from the "
                             "checkpoint before it, or use a new workdir.") from error
        changed = _differences(meta.get("fingerprint"), self.fingerprint)
        if changed:
            raise ValueError(f"checkpoint {where} was written by another configuration: "
                             f"{'; '.join(changed)}. Resume with the checkpoint's "
                             "configuration, or train this one in a new workdir.")
        abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, like_state)
        try:
            state = self._manager.restore(step, args=ocp.args.Composite(
                **{STATE: ocp.args.StandardRestore(abstract)}))[STATE]
        except Exception as error:
            raise ValueError(f"checkpoint {where} is corrupt or incomplete ({error}); delete "
                             f"{where} to resume from the checkpoint before it, or use a new "
                             "workdir.") from error
        return state, meta["data"], step

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


class MetricsWriter:
    """``metrics.jsonl`` (one JSON object per logged step) and TensorBoard
    scalars under ``tensorboard/`` (when the ``tensorboard`` package, extra
    ``.[train]``, is installed; otherwise a note says so once).

    In a multi-process run only process 0 writes (``enabled=False`` on the
    others): their ``read`` returns the records of this invocation, kept in
    memory, which is all the last record needs."""

    def __init__(self, workdir: str | os.PathLike, *, resume_from_step: int = 0,
                 enabled: bool = True):
        self.path = pathlib.Path(workdir) / "metrics.jsonl"
        self._in_memory: list[dict] | None = None if enabled else []
        self._events = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A run killed after its last checkpoint logged steps it will redo: drop them.
        kept = [r for r in self.read() if r["step"] <= resume_from_step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: PLC0415
            from tensorboard.summary.writer.event_file_writer import EventFileWriter  # noqa: PLC0415
        except ImportError:
            print("note: the tensorboard package is not installed (pip install "
                  "'specdec_jax[train]'); metrics go to metrics.jsonl only.")
            self._events = None
        else:
            self._events = EventFileWriter(str(pathlib.Path(workdir) / "tensorboard"))
            self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2

    def write(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        if self._in_memory is not None:
            self._in_memory.append(record)
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self._events is not None:
            summary = self._summary_pb2.Summary(value=[
                self._summary_pb2.Summary.Value(tag=k, simple_value=float(v))
                for k, v in metrics.items()])
            self._events.add_event(self._event_pb2.Event(wall_time=time.time(), step=step,
                                                         summary=summary))

    def read(self) -> list[dict]:
        """The logged records (a line torn by a kill mid-write is skipped: that
        step is redone after the resume)."""
        if self._in_memory is not None:
            return list(self._in_memory)
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
