"""The feature-head training job survives ``kill -9`` in the middle of a checkpoint write.

On the toy target: an uninterrupted run of 40 steps (checkpoints every 5), and a
second run SIGKILLed while it writes its step-15 checkpoint, then started again.
The second run resumes from the last complete checkpoint (step 10; orbax never
committed step 15), and every step's loss equals the uninterrupted run's. Each
run is its own process, as a real job would be.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = "toy-bytes-large"
NUM_STEPS, CHECKPOINT_EVERY, KILL_AT = 40, 5, 15
RUN_TIMEOUT_S = 900
RESUMED = "resumed_from"  # the line a run prints when it restores (or not)


def _make_data(out_dir: pathlib.Path) -> None:
    from specdec_jax.jobs.head_training import run_feature_head_data  # noqa: PLC0415

    run_feature_head_data(target=TARGET, out_dir=str(out_dir), max_positions=1536, length=64,
                          num_prompts=4, max_new_tokens=16, generation_batch_size=4,
                          batch_size=4, shard_sequences=8, progress=False)


def train_in_this_process(workdir: str, data_dir: str, kill_at: int) -> None:
    """The training job, run by ``_run`` in a child process. It prints the step it
    resumed from; with ``kill_at`` > 0 it SIGKILLs itself as soon as the save of
    that step has started (orbax writes asynchronously: the write is in flight)."""
    from specdec_jax.jobs import resolver  # noqa: PLC0415
    from specdec_jax.training import run_io  # noqa: PLC0415
    from specdec_jax.training.feature_training import train_feature_head  # noqa: PLC0415

    save, restore = run_io.RunCheckpoints.save, run_io.RunCheckpoints.restore

    def save_then_die(self, step, *args, **kwargs):
        saved = save(self, step, *args, **kwargs)
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return saved

    def restore_and_say(self, like_state):
        restored = restore(self, like_state)
        print(json.dumps({RESUMED: None if restored is None else restored[2]}), flush=True)
        return restored

    run_io.RunCheckpoints.save = save_then_die
    run_io.RunCheckpoints.restore = restore_and_say
    model, params, _ = resolver.resolve(TARGET)
    train_feature_head(workdir=workdir, data_dir=data_dir, target_name=TARGET, target=model,
                       target_params=params, learning_rate=3e-3, warmup_steps=2,
                       num_steps=NUM_STEPS, batch_size=4, checkpoint_every=CHECKPOINT_EVERY,
                       eval_every=1000, progress=False)


def _run(workdir: pathlib.Path, data_dir: pathlib.Path, kill_at: int = 0
         ) -> tuple[int, int | None]:
    """(exit status, step resumed from) of one training process."""
    code = (f"from tests.test_feature_head_kill9 import train_in_this_process as t; "
            f"t({str(workdir)!r}, {str(data_dir)!r}, {kill_at})")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=RUN_TIMEOUT_S)
    said = [json.loads(line) for line in result.stdout.splitlines() if RESUMED in line]
    assert len(said) == 1, result.stdout + result.stderr
    return result.returncode, said[0][RESUMED]


def _committed_steps(workdir: pathlib.Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _losses(workdir: pathlib.Path) -> dict[int, float]:
    rows = (json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines())
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


@pytest.mark.long  # three training runs of the toy head: a few minutes on 2 cores
def test_a_run_killed_while_checkpointing_resumes_with_identical_losses(tmp_path):
    data, whole, cut = tmp_path / "data", tmp_path / "whole", tmp_path / "cut"
    _make_data(data)
    assert _run(whole, data) == (0, None)

    status, _ = _run(cut, data, kill_at=KILL_AT)
    assert status == -signal.SIGKILL
    assert _committed_steps(cut)[-1] == KILL_AT - CHECKPOINT_EVERY  # 15 was never committed
    unfinished = [p.name for p in (cut / "checkpoints").iterdir() if not p.name.isdigit()]
    assert [name.startswith(f"{KILL_AT}.") for name in unfinished] == [True]  # half-written
    assert len(_losses(cut)) == KILL_AT  # it logged step 15 before the save began

    assert _run(cut, data) == (0, KILL_AT - CHECKPOINT_EVERY)
    expected = _losses(whole)
    assert sorted(expected) == list(range(1, NUM_STEPS + 1))
    assert _losses(cut) == expected  # bit for bit
