"""The llama.cpp whole-generation peer (benchmarks/scripts/llama_cpp_humaneval.py):
its reading of llama.cpp's timers and its interval over prompts. The lines
below are llama.cpp's own formats (``llama_perf_context_print`` and
``speculative-simple``'s summary); the binaries are not run here."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks/scripts/llama_cpp_humaneval.py"


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("llama_cpp_humaneval", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_run(stderr: str, returncode: int = 0):
    def run(command, **kwargs):
        return subprocess.CompletedProcess(command, returncode, stdout="", stderr=stderr)
    return run


def test_autoregressive_seconds_are_prompt_eval_plus_eval(peer, monkeypatch):
    monkeypatch.setattr(subprocess, "run", fake_run(
        "llama_perf_context_print: prompt eval time =     250.00 ms /    40 tokens (    6.25 ms "
        "per token,   160.00 tokens per second)\n"
        "llama_perf_context_print:        eval time =    3810.00 ms /   127 runs   (   30.00 ms "
        "per token,    33.33 tokens per second)\n"))
    got = peer.llama_autoregressive(pathlib.Path("bin"), "t.gguf", "def f():", 128, 2)
    assert got == {"tokens": 128, "seconds": pytest.approx(4.06)}


def test_speculative_seconds_are_encode_plus_decode(peer, monkeypatch):
    monkeypatch.setattr(subprocess, "run", fake_run(
        "encoded   40 tokens in    0.300 seconds, speed:  133.333 t/s\n"
        "decoded  128 tokens in    6.100 seconds, speed:   20.984 t/s\n\n"
        "n_draft   = 3\nn_predict = 128\nn_drafted = 150\nn_accept  = 90\n"
        "accept    = 60.000%\n"))
    got = peer.llama_speculative(pathlib.Path("bin"), "t.gguf", "d.gguf", "def f():", 128, 2, 3)
    assert got == {"tokens": 128, "seconds": pytest.approx(6.4), "accept": pytest.approx(0.6)}


def test_a_run_without_timings_or_a_failed_run_is_an_error(peer, monkeypatch):
    monkeypatch.setattr(subprocess, "run", fake_run("nothing timed\n"))
    with pytest.raises(RuntimeError, match="printed no timings"):
        peer.llama_autoregressive(pathlib.Path("bin"), "t.gguf", "p", 8, 2)
    monkeypatch.setattr(subprocess, "run", fake_run("error: no model\n", returncode=1))
    with pytest.raises(RuntimeError, match="failed"):
        peer.llama_speculative(pathlib.Path("bin"), "t.gguf", "d.gguf", "p", 8, 2, 3)


def test_ratio_of_total_rates_with_an_interval_over_prompts(peer):
    den = [{"tokens": 100, "seconds": s} for s in (1.0, 2.0, 4.0)]
    twice = [{"tokens": 100, "seconds": r["seconds"] / 2} for r in den]
    assert peer.ratio_interval(twice, den) == {"ratio": 2.0, "ci95": [2.0, 2.0]}
    mixed = [{"tokens": 100, "seconds": s} for s in (0.5, 2.0, 4.0)]
    found = peer.ratio_interval(mixed, den)
    assert found["ci95"][0] <= 1.0 < found["ratio"] <= found["ci95"][1]
    assert found["ratio"] == pytest.approx((300 / 6.5) / (300 / 7.0), abs=1e-3)
