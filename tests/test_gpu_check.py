"""The one-call GPU check (tools/gpu_check.sh) runs its flow and writes summaries that parse."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_data_packer_knows_every_pinned_package():
    from specdec_jax.data import corpora  # noqa: PLC0415

    packer = _tool("gpu_check_data")
    ui = {pin.package for pin in corpora.UI_MESSAGE_DEBS}
    assert set(corpora.DEBS) <= set(packer.READ_BY_PACKAGE) | ui
    assert set(packer.HASHED_DEBS) <= set(corpora.DEBS)


def test_a_cut_run_is_summarised_per_file(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "bench").mkdir(parents=True)
    out.mkdir()
    lines = [{"collected": ["tests/test_a.py::one", "tests/test_a.py::two", "tests/test_b.py::x",
                            "tests/test_b.py::y"]},
             {"nodeid": "tests/test_a.py::one", "when": "call", "outcome": "passed",
              "duration": 1.0, "message": ""},
             {"nodeid": "tests/test_a.py::two", "when": "call", "outcome": "failed",
              "duration": 2.0, "message": "E   assert 1 == 2\ntests/test_a.py:9: AssertionError"},
             {"nodeid": "tests/test_a.py::two", "when": "teardown", "outcome": "error",
              "duration": 0.5, "message": "E   boom"},
             {"nodeid": "tests/test_b.py::x", "when": "setup", "outcome": "skipped",
              "duration": 0.0, "message": "no GPU"}]
    (out / "tests.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n{\"cut")
    (work / "stages.jsonl").write_text(json.dumps(
        {"stage": "suite", "rc": 124, "seconds": 30, "limit_s": 30, "timed_out": True}) + "\n")
    steps = {"target": {"1": {"1": {"step_s": 0.002, "weight_gb_s": 1500.0}}}}
    (work / "bench" / "paths.json").write_text(json.dumps(
        {"dtype": "bfloat16", "paths": {"in_out": {"status": "ok", "steps": steps},
                                        "out_in:separate": {"status": "error",
                                                          "error": "ValueError: no"}}}))
    summary = _tool("gpu_check_summary").summarise(work, out, "full", ROOT)
    files = summary["suite"]["per_file"]
    assert files["tests/test_a.py"]["passed"] == 1 and files["tests/test_a.py"]["failed"] == 1
    assert files["tests/test_b.py"]["skipped"] == 1 and files["tests/test_b.py"]["not run"] == 1
    assert summary["suite"]["pytest_exit_status"] is None  # no "finished" line: cut
    assert summary["bench"]["steps"][0]["in_out bfloat16"]["step_ms"] == 2.0
    md = (out / "gpu_check.md").read_text()
    assert "suite: TIMED OUT" in md and "assert 1 == 2" in md
    assert "out_in:separate: error ValueError: no" in md
    assert json.loads((out / "gpu_check.json").read_text())["mode"] == "full"


def test_the_tiny_flow_runs_the_suite_stage_and_writes_summaries(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    env = {**env, "OUT": str(out), "PYTHON": sys.executable, "JAX_PLATFORMS": "cpu",
           "GPU_CHECK_DIR": str(tmp_path / "nothing-carried"), "GPU_CHECK_STAGES": "suite",
           "GPU_CHECK_TESTS": "tests/test_precision.py::test_auto_dtype_per_backend_and_bad_names",
           "TMPDIR": str(tmp_path)}
    result = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), "--tiny"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=300)
    summary = json.loads((out / "gpu_check.json").read_text())
    assert result.returncode == 1, result.stdout + result.stderr  # nothing was carried
    stages = {s["stage"]: s for s in summary["stages"]}
    assert stages["install"]["rc"] == 1 and stages["data"]["rc"] == 1
    assert stages["suite"]["rc"] == 0, result.stdout
    assert summary["suite"]["per_file"]["tests/test_precision.py"]["passed"] == 1
    assert "| tests/test_precision.py | 1 | 0 |" in (out / "gpu_check.md").read_text()
    assert (out / "junit.xml").is_file() and "GPU check summary (tiny)" in result.stdout
    assert not list(tmp_path.glob("gpu_check_work.*")), "the work folder is removed"


def test_the_other_kernel_paths_are_timed_on_tiny_models(tmp_path):
    """The check's second benchmark stage (tools/gpu_check_bench.py), on CPU with
    tiny random models: every kernel path gives in-loop step times (it once
    stopped at a setting the job gained, max_gram_context, and timed nothing)."""
    out = tmp_path / "paths.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gpu_check_bench.py"), "--out", str(out),
         "--paths", "out_in:separate", "in_out", "--dtype", "float32", "--batch", "1",
         "--gamma", "5", "--target", "random:tiny-target:0", "--drafter",
         "random:tiny-drafter:1", "--prompt-len", "8", "--steps", "2", "--repeats", "2"],
        cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    for path in ("out_in:separate", "in_out"):
        entry = report["paths"][path]
        assert not entry.get("error"), entry
        assert entry["steps"], entry
