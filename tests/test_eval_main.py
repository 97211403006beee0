"""The gin-configured evaluation job end to end on byte-level toys, and its errors.

The toys have random weights, so their scores mean nothing: these tests pin
the pipeline (tasks, generation of every kind of method, scoring, bootstrap,
cost model, wall clock, resume, reports), not quality.
"""

import glob
import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

from eval import main as eval_main
from specdec_jax.jobs.studies import sweep

TOY = "configs/runs/cascades_toy.gin"


def bindings(tmp_path, task, methods, extra=()):
    return [f"TASK = '{task}'", f"OUT_DIR = '{tmp_path}'",
            f"run_study.methods = {methods!r}", *extra]


def run_main(tmp_path, task, methods, extra=()):
    args = ["--gin_file", TOY]
    for binding in bindings(tmp_path, task, methods, extra):
        args += ["--gin_bindings", binding]
    assert eval_main.main(args) == 0
    return json.loads((tmp_path / "cascades_toy.json").read_text())


@pytest.mark.long
def test_humaneval_pipeline_every_kind_of_method_and_resume(tmp_path):
    methods = {"specdecode": [], "opt": [0.3], "token-cascade": [0.3], "oracle": [0.3],
               "seq-cascade": [0.3, 0.9]}
    data = run_main(tmp_path, "humaneval", methods)
    by_method = {}
    for record in data["records"]:
        by_method.setdefault(record["method"], []).append(record)
        assert record["num_examples"] == 3
        low, score, high = (record["quality"][k] for k in ("low", "score", "high"))
        assert low <= score <= high
        assert record["relative_latency"]["cost_model"] > 0
    assert set(by_method) == {"target", "drafter", *methods}
    assert by_method["target"][0]["relative_latency"]["cost_model"] == pytest.approx(1.0)
    assert by_method["target"][0]["relative_latency"]["wallclock"] == pytest.approx(1.0)
    # Every output went through the sandbox (random bytes never pass).
    assert all(r["item"] == 0.0 for r in by_method["specdecode"][0]["per_example"])
    for stem in ("cascades_toy.md", "cascades_toy_latency.png", "cascades_toy_rejection.png"):
        assert (tmp_path / stem).stat().st_size > 0
    # A second run resumes: nothing is regenerated.
    # (seq-cascade points are derived from the AR runs on every pass: no timing stamp)
    stamps = lambda d: {r["key"]: r["sweep_seconds"] for r in d["records"] if "sweep_seconds" in r}
    again = run_main(tmp_path, "humaneval", methods)
    assert stamps(again) == stamps(data) and len(stamps(data)) == len(data["records"]) - 2
    assert len(again["records"]) == len(data["records"])


@pytest.mark.long
@pytest.mark.parametrize("task", ["translation_en_de", "summarisation_debian"])
def test_text_task_pipelines(tmp_path, task):
    data = run_main(tmp_path, task, {"specdecode": []},
                    extra=["run_study.wallclock_examples = 0"])
    metric = {"translation_en_de": "bleu", "summarisation_debian": "rouge2"}[task]
    assert {r["metric"] for r in data["records"]} == {metric}
    assert len(data["records"]) == 3


def test_resume_with_other_settings_fails(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"settings": {"task": "humaneval", "num_examples": 3},
                                "records": []}))
    with pytest.raises(ValueError, match="num_examples: 3 here, 5 asked"):
        sweep.load_or_start(path, {"task": "humaneval", "num_examples": 5})


def test_alpha_grid_outside_the_range_fails():
    with pytest.raises(ValueError, match=r"alpha grid of 'chow' has \[1.5\]"):
        sweep.plan_points(methods={"chow": [0.2, 1.5]}, gammas=[5], temperatures=[0.0])
    with pytest.raises(ValueError, match=r"'bild' has \[11.0\]"):
        sweep.plan_points(methods={"bild": [11.0]}, gammas=[5], temperatures=[0.0])
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        sweep.plan_points(methods={"nope": [0.1]}, gammas=[5], temperatures=[0.0])


def test_missing_gin_file_names_it():
    with pytest.raises(FileNotFoundError, match="configs/runs/nope.gin"):
        eval_main.main(["--gin_file", "configs/runs/nope.gin"])


def test_missing_required_macro_names_the_file():
    with pytest.raises(ValueError, match=r"configs/runs/sweep.gin.*REQUIRED|TASK"):
        eval_main.main(["--gin_file", "configs/runs/sweep.gin"])


def test_wrong_binding_names_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"cascades_toy.gin.*no_such_argument"):
        eval_main.main(["--gin_file", TOY, "--gin_bindings", "TASK = 'humaneval'",
                        "--gin_bindings", f"OUT_DIR = '{tmp_path}'",
                        "--gin_bindings", "run_study.no_such_argument = 1"])


def test_unknown_task_fails(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        eval_main.main(["--gin_file", TOY, "--gin_bindings", "TASK = 'nope'",
                        "--gin_bindings", f"OUT_DIR = '{tmp_path}'"])


@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_generate_job(tmp_path, capsys):
    out = tmp_path / "gen.json"
    assert eval_main.main([
        "--gin_file", "configs/runs/generate.gin", "--gin_file", "configs/models/toy_bytes.gin",
        "--gin_bindings", "TASK = 'humaneval'", "--gin_bindings", f"OUT_PATH = '{out}'",
        "--gin_bindings", "run_generate.method = 'token-v3'",
        "--gin_bindings", "run_generate.alpha = 0.1",
        "--gin_bindings", "run_generate.max_new_tokens = 4"]) == 0
    record = json.loads(out.read_text())
    assert record["method"] == "token-v3" and record["num_examples"] == 3
    assert "--- HumanEval/0" in capsys.readouterr().out


def test_generate_job_lists_its_missing_macros():
    with pytest.raises(ValueError, match="TASK, TARGET, DRAFTER, OUT_PATH unset"):
        eval_main.main(["--gin_file", "configs/runs/generate.gin"])


@pytest.mark.long
def test_benchmark_job_through_the_cli(tmp_path, capsys):
    """``specdec-jax eval`` is the same launcher; the benchmark job times every
    method against the target at batch 1 and prints the ratios."""
    from specdec_jax.jobs import cli  # noqa: PLC0415

    out = tmp_path / "bench.json"
    assert cli.main([
        "eval", "--gin_file", "configs/runs/benchmark.gin",
        "--gin_file", "configs/models/toy_bytes.gin",
        "--gin_bindings", "TASK = 'humaneval'", "--gin_bindings", f"OUT_PATH = '{out}'",
        "--gin_bindings", "run_benchmark.gammas = [3]",
        "--gin_bindings", "run_benchmark.num_examples = 2",
        "--gin_bindings", "run_benchmark.max_new_tokens = 4",
        "--gin_bindings", "run_benchmark.progress = False"]) == 0
    data = json.loads(out.read_text())
    speedups = {r["key"]: r["speedup"] for r in data["records"]}
    assert set(speedups) == {"target|alpha=None|gamma=None|T=0.0",
                             "drafter|alpha=None|gamma=None|T=0.0",
                             "specdecode|alpha=None|gamma=3|T=0.0",
                             "token-v3|alpha=0.1|gamma=3|T=0.0"}
    assert speedups["target|alpha=None|gamma=None|T=0.0"] == pytest.approx(1.0)
    assert all(s > 0 for s in speedups.values())
    for r in data["records"]:  # a bootstrap interval over the examples, around the ratio
        low, high = r["speedup_ci95"]
        assert low <= r["speedup"] * (1 + 1e-9) and r["speedup"] <= high * (1 + 1e-9)
    assert "speedup vs target (95% CI)" in capsys.readouterr().out


def test_benchmark_rejects_derived_methods(tmp_path):
    with pytest.raises(ValueError, match="derived from the autoregressive runs"):
        eval_main.main(["--gin_file", "configs/runs/benchmark.gin",
                        "--gin_file", "configs/models/toy_bytes.gin",
                        "--gin_bindings", "TASK = 'humaneval'",
                        "--gin_bindings", f"OUT_PATH = '{tmp_path / 'b.json'}'",
                        "--gin_bindings", "run_benchmark.methods = {'seq-cascade': [0.5]}"])


def test_unknown_job_names_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"cascades_toy.gin.*No configurable matching "
                                         r"reference '@run_nothing'"):
        eval_main.main(["--gin_file", TOY, "--gin_bindings", "TASK = 'humaneval'",
                        "--gin_bindings", f"OUT_DIR = '{tmp_path}'",
                        "--gin_bindings", "run.job = @run_nothing"])


@pytest.mark.parametrize("path", sorted(
    p for p in glob.glob(str(pathlib.Path(__file__).parents[1] / "configs/runs/*.gin"))
    if "Required macros: none" in pathlib.Path(p).read_text()), ids=lambda p: pathlib.Path(p).name)
def test_complete_run_configs_parse_and_set_every_required_macro(path):
    """A config that says it needs no macros parses and leaves none unset
    (nothing runs: the studies take hours)."""
    from specdec_jax.jobs import launch  # noqa: PLC0415

    launch.parse_config([path], [], [])
    launch.check_required([path], launch.selected_job("run_study"))


@pytest.mark.long  # builds a wheel, installs it, runs a toy job (~1 min)
def test_an_installed_wheel_finds_its_configs_by_name_from_any_directory(tmp_path):
    """A regular (non-editable) install: the wheel ships configs/ as
    specdec_jax/configs, without the lab (benchmarks/), and ``specdec-jax
    eval --gin_file=<name>`` runs a shipped job from a directory that holds no
    checkout. The install goes to its own folder put first on the path, so the
    package imported is the installed one (checked), not this checkout."""
    root = pathlib.Path(__file__).resolve().parents[1]
    wheels, site, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(root)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("specdec_jax-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "specdec_jax/configs/runs/cascades_toy.gin" in names
    assert "specdec_jax/data/packaged/debian_pins.json" in names  # the corpora's pins
    assert not any(n.startswith("benchmarks/") for n in names)
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
    probe = subprocess.run([sys.executable, "-c", "import specdec_jax.jobs.launch as l; "
                            "print(l.__file__); print(l.CONFIGS_PARENT)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == [str(site / "specdec_jax/jobs/launch.py"),
                                    str(site / "specdec_jax")]
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "specdec_jax.jobs.cli.main", "eval", "--gin_file=cascades_toy",
         "--gin_bindings=TASK = 'humaneval'", f"--gin_bindings=OUT_DIR = '{out}'",
         "--gin_bindings=run_study.methods = {'specdecode': []}"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    records = json.loads((out / "cascades_toy.json").read_text())["records"]
    assert {r["method"] for r in records} >= {"specdecode", "target"}
    missing = subprocess.run([sys.executable, "-m", "specdec_jax.jobs.cli.main", "eval",
                              "--gin_file=nope"], cwd=elsewhere, env=env, capture_output=True,
                             text=True, timeout=300)
    assert missing.returncode != 0 and "the shipped jobs, by name:" in missing.stderr
    assert "cascades_toy" in missing.stderr
