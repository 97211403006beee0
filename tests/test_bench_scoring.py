"""The scoring benchmark: each K in each kernel layout against the machine's
limits, one fresh process per XLA flag set (``benchmarks.child``)."""

from __future__ import annotations

import json

import pytest

from benchmarks import child, scoring
from benchmarks import main as bench_main
from specdec_jax.jobs import resolver


@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_bench_scoring_times_both_kernel_layouts_in_one_process(cpu_kernel):
    """bench_scoring measures each K in each kernel layout on the same random
    weights, against the limits measured in the same process."""
    report = scoring.measure(model="random:tiny-drafter", ks=[1, 3], flags="",
                             kernel_layouts=["in_out", "out_in"], products=["xla", "kernel"],
                             weight_formats=["f32", "int8"])
    # The kernel and int8 weights exist only in the out_in layout.
    assert list(report["steps"]) == [
        "in_out K=1", "in_out K=3", "out_in K=1", "out_in K=3", "out_in+int8 K=1",
        "out_in+int8 K=3", "out_in+kernel K=1", "out_in+kernel K=3", "out_in+kernel+int8 K=1",
        "out_in+kernel+int8 K=3"]
    for row in report["steps"].values():
        assert row["step_s"] > 0 and row["over_limit"] > 0
    assert report["steps"]["out_in K=1"]["over_k1"] == 1.0 and report["random_weights"]
    text = scoring.markdown({"model": "random:tiny-drafter", "variants": [report]})
    assert "| out_in | 3 |" in text and "random weights" in text


def scoring_args(tmp_path, *bindings):
    args = ["--gin_file", "benchmarks/configs/scoring.gin",
            "--gin_bindings", "MODEL = 'random:tiny-drafter'",
            "--gin_bindings", f"OUT_PATH = '{tmp_path / 'scoring.json'}'",
            "--gin_bindings", f"MARKDOWN_PATH = '{tmp_path / 'scoring.md'}'"]
    for binding in bindings:
        args += ["--gin_bindings", binding]
    return args


@pytest.mark.long
def test_bench_scoring_job_runs_each_flag_set_in_its_own_process(tmp_path):
    """The defaults first, then each variant; a variant's flags are in its
    process's XLA_FLAGS (``measure`` refuses to run otherwise)."""
    flags = "--xla_force_host_platform_device_count=1"
    assert bench_main.main(scoring_args(
        tmp_path, "bench_scoring.ks = [1, 3]", "bench_scoring.kernel_layouts = ['out_in']",
        "bench_scoring.products = ['xla']", f"bench_scoring.variants = ['{flags}']")) == 0
    report = json.loads((tmp_path / "scoring.json").read_text())
    assert report["model"] == "random:tiny-drafter" and report["ks"] == [1, 3]
    assert [v["flags"] for v in report["variants"]] == ["", flags]
    for variant in report["variants"]:
        assert list(variant["steps"]) == ["out_in K=1", "out_in K=3"]
        assert variant["random_weights"]
    text = (tmp_path / "scoring.md").read_text()
    assert "XLA flags `(defaults)`" in text and f"XLA flags `{flags}`" in text


@pytest.mark.parametrize("binding, message", [
    ("bench_scoring.ks = [0, 1]", "ks"),
    ("bench_scoring.ks = []", "ks is empty"),
    ("bench_scoring.kernel_layouts = ['nope']", "kernel_layouts"),
    ("bench_scoring.variants = ['']", "XLA_FLAGS"),
    ("MODEL = 'no-such-model'", "unknown model"),
    ("MODEL = 'random:no-such-architecture'", "registered architecture"),
])
def test_bench_scoring_refuses_bad_arguments_before_loading(tmp_path, monkeypatch, binding,
                                                            message):
    monkeypatch.setattr(child, "run_in_child", lambda *a, **k: pytest.fail("a process started"))
    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=message):
        bench_main.main(scoring_args(tmp_path, binding))


def test_measure_refuses_flags_its_process_was_not_started_with(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    with pytest.raises(ValueError, match="run_bench_scoring"):
        scoring.measure(model="random:tiny-drafter", ks=[1], flags="--xla_foo=1",
                        kernel_layouts=["out_in"])


def test_a_child_runs_only_benchmark_functions_and_reports_its_failure():
    with pytest.raises(ValueError, match="benchmarks"):
        child.run_in_child("os:system", {"command": "true"})
    with pytest.raises(RuntimeError, match="failed in its own process"):
        child.run_in_child("benchmarks.scoring:measure", {"model": "nope"})
