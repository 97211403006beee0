"""Two local processes, one JAX runtime (4 simulated CPU devices each): sharded
speculative decoding over the 8-device mesh gives the tokens of one device,
and sharded checkpoints move between one process and two in both directions."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from specdec_jax.runtime import distributed
from tests import multiprocess_worker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(num_processes: int, out, *extra, devices: int = 4, timeout: int = 300):
    # Backend optimisation off: compiling the sharded loops is most of this
    # test's time, and the reference and the sharded run compile alike.
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} "
                         "--xla_backend_optimization_level=0")
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-m", "tests.multiprocess_worker", str(i),
                               str(num_processes), port, str(out), *extra], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(max(num_processes, 1))]
    logs = [p.communicate(timeout=timeout) for p in procs]
    return [p.returncode for p in procs], [err[-3000:] for _, err in logs]


def check_exit_codes(codes, errors):
    """All processes exited 0, else the test fails with each one's stderr tail
    verbatim (an assert message would be cut to a line by pytest's repr)."""
    if any(codes):
        pytest.fail("\n".join(f"--- process {i}: exit code {code}\n{err}"
                               for i, (code, err) in enumerate(zip(codes, errors))),
                    pytrace=False)


@pytest.mark.long
@pytest.mark.parametrize("data, model", [(2, 4)])
def test_two_processes_decode_like_one_device(tmp_path, data, model):
    codes, errors = launch(0, tmp_path / "one.npz", devices=1)
    check_exit_codes(codes, errors)
    codes, errors = launch(2, tmp_path / "two.npz", str(data), str(model))
    check_exit_codes(codes, errors)
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert int(two["devices"]) == 8
    for name, *_ in multiprocess_worker.CASES:
        np.testing.assert_array_equal(two[name], one[name], err_msg=name)
    assert sum(int(one[f"{name}/rejections"].sum()) for name, *_ in
               multiprocess_worker.CASES) > 0, "the drafter must be rejected sometimes"
    # Checkpoints: one device -> 2 processes happened above (the two-process
    # tokens came from the restored target); 2 processes -> one process here.
    from specdec_jax.checkpoints import orbax_io  # noqa: PLC0415

    # (Compared with the one-device checkpoint, not with params initialised
    # here: this process compiles with other XLA flags than the workers.)
    one_ckpt, two_ckpt = multiprocess_worker.checkpoints(str(tmp_path / "two.npz"))
    restored, own = orbax_io.restore_params(two_ckpt), orbax_io.restore_params(one_ckpt)
    import jax  # noqa: PLC0415
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(own)
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(own)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.long
def test_the_generate_job_on_two_processes_writes_what_one_process_writes(tmp_path):
    """The gin job itself (``eval.main``, configs/runs/generate.gin) on the
    toy pair, T = 1: 2 processes x 4 devices, models sharded (data=4,
    model=2), each process tokenising only its rows; process 0 alone writes,
    and its record equals the one-process record."""
    import json  # noqa: PLC0415

    def job(out, *flags):
        return ["-m", "eval.main", "--gin_file", "configs/runs/generate.gin",
                "--gin_bindings", "TASK = 'humaneval'", "--gin_bindings", f"OUT_PATH = '{out}'",
                "--gin_bindings", "TARGET = 'toy-bytes-large'",
                "--gin_bindings", "DRAFTER = 'toy-bytes-small'",
                *[f"--gin_bindings=run_generate.{b}" for b in (
                    "num_examples = 6", "batch_size = 4", "max_new_tokens = 10",
                    "temperature = 1.0", "progress = False")], *flags]

    env = dict(os.environ, JAX_PLATFORMS="cpu", SPECDEC_JAX_PROGRESS="0")
    one = subprocess.run([sys.executable, *job(tmp_path / "one.json")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    port = str(free_port())
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    procs = [subprocess.Popen(
        [sys.executable, *job(tmp_path / f"two-{i}.json", "--coordinator_address",
                              f"127.0.0.1:{port}", "--num_processes", "2", "--process_id",
                              str(i), "--gin_bindings=run_generate.model_parallel = 2")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]
    logs = [p.communicate(timeout=300) for p in procs]
    check_exit_codes([p.returncode for p in procs], [err[-3000:] for _, err in logs])
    assert not (tmp_path / "two-1.json").exists()  # process 1 writes nothing
    assert "--- HumanEval/" in logs[0][0] and "--- HumanEval/" not in logs[1][0]
    single, multi = (json.loads((tmp_path / name).read_text())
                     for name in ("one.json", "two-0.json"))
    assert [r["text"] for r in multi["per_example"]] == [r["text"] for r in
                                                          single["per_example"]]
    assert multi["per_example"] == single["per_example"]


@pytest.mark.long  # waits out a join timeout: CI runs it with -m long
def test_a_process_that_cannot_join_fails_with_the_settings_named():
    """Either process alone: no hang past the timeout, and stderr names the
    coordinator, the process id and count, and what to check."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    for process_id, expected in ((1, "could not reach the coordinator"),
                                 (0, "process 0 of 2 joining the coordinator")):
        code = ("from specdec_jax.runtime import distributed\n"
                f"distributed.initialize('127.0.0.1:{free_port()}', 2, {process_id}, "
                "timeout_s=3)\n")
        result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode != 0
        assert expected in result.stderr and "same coordinator address" in result.stderr


def test_incomplete_settings_and_slices():
    with pytest.raises(ValueError, match="incomplete"):
        distributed.initialize("127.0.0.1:1234", None, 0)
    with pytest.raises(ValueError, match="outside 0..1"):
        distributed.initialize("127.0.0.1:1234", 2, 2)
    items = list(range(11))
    shares = [distributed.process_slice(items, index=i, count=3) for i in range(3)]
    assert [len(s) for s in shares] == [4, 4, 3]
    assert sum(shares, []) == items


def test_the_launcher_takes_the_multi_process_flags():
    from specdec_jax.jobs import launch
    launch.check_process_count("run_generate", process_count=2)
    launch.check_process_count("run_training", process_count=2)
    launch.check_process_count("run_study", process_count=1)
    with pytest.raises(ValueError, match="run_study runs on one process.*run_generate"):
        launch.check_process_count("run_study", process_count=2)
    with pytest.raises(ValueError, match="incomplete.*--coordinator_address"):
        launch.main(["--gin_file", "configs/runs/cascades_humaneval.gin", "--num_processes", "2",
                     "--process_id", "1"])


@pytest.mark.long
def test_the_training_job_on_two_processes_trains_like_one_process(tmp_path):
    """``train.main`` (finetune_t5.gin, tiny T5) on 2 processes x 2 devices: the
    batch split over a 4-device data axis across processes logs the losses of
    one process (within float tolerance of a different reduction order),
    process 0 alone writes the metrics, and the checkpoint the two processes
    wrote (each its own shards) resumes in one process, whose next loss is the
    uninterrupted one-process run's."""
    import json  # noqa: PLC0415

    from tests.test_train_main import TINY  # noqa: PLC0415

    def job(workdir, steps, *flags):
        return [sys.executable, "-m", "train.main", *TINY, f"--gin.WORKDIR='{workdir}'",
                f"--gin.run_training.num_steps={steps}", *flags]

    def losses(workdir):
        return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]

    env = dict(os.environ, JAX_PLATFORMS="cpu", SPECDEC_JAX_PROGRESS="0")
    one, two = tmp_path / "one", tmp_path / "two"
    result = subprocess.run(job(one, 4), cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    port = str(free_port())
    multi_env = dict(env, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    procs = [subprocess.Popen(job(two, 3, "--coordinator_address", f"127.0.0.1:{port}",
                                  "--num_processes", "2", "--process_id", str(i)),
                              cwd=ROOT, env=multi_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    logs = [p.communicate(timeout=300) for p in procs]
    check_exit_codes([p.returncode for p in procs], [err[-3000:] for _, err in logs])
    reference, multi = losses(one), losses(two)
    assert [r["step"] for r in multi] == [1, 2, 3]  # one writer: no line twice
    assert multi[0]["loss"] != multi[2]["loss"]  # it trains
    for mine, theirs in zip(multi, reference[:3]):
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-5, abs=1e-5)
    summary = json.loads((two / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["resumed_from"] is None
    # The two-process checkpoint, resumed by one process for one more step.
    result = subprocess.run(job(two, 4), cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((two / "summary.json").read_text())["resumed_from"] == 3
    resumed = losses(two)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for key in ("loss", "eval/loss"):
        assert resumed[3][key] == pytest.approx(reference[3][key], rel=1e-5, abs=1e-5), key
