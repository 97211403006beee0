"""The feature-head step benchmark (benchmarks/feature_steps.py): the job on tiny
random shapes through the launcher, its argument checks, a failing step recorded
while the others run, and its predicted speedup against a hand computation."""

from __future__ import annotations

import json

import jax
import pytest

from benchmarks import feature_steps
from benchmarks import main as bench_main
from specdec_jax import precision
from specdec_jax.decode import cost

TINY_CONFIG = "benchmarks/configs/feature_steps_tiny.gin"


def test_the_tiny_job_writes_every_step_and_prediction(tmp_path):
    args = ["--gin_file", TINY_CONFIG, "--gin_bindings", f"OUT_DIR = '{tmp_path}'",
            "--gin_bindings", "bench_feature_steps.steps = 1",
            "--gin_bindings", "bench_feature_steps.repeats = 1",
            "--gin_bindings", "bench_feature_steps.gammas = [3, 5]",
            # one restricted head (the config's two cost two more compilations)
            "--gin_bindings", "bench_feature_steps.head_vocab_sizes = [64]",
            "--gin_bindings", "bench_feature_steps.acceptance = [0.7, [0.9, 0.8, 0.7, 0.6, 0.5]]"]
    assert bench_main.main(args) == 0
    report = json.loads((tmp_path / "feature_steps.json").read_text())
    steps = {s["name"]: s for s in report["steps"]}
    expected = {"target K=1", "target K=6", "drafter model K=1",
                "feature window K=6 mlp=128", "feature window K=6 mlp=32",
                *(f"feature first logits V={v}" for v in (256, 64)),
                *(f"feature draft step V={v} mlp={m}" for v in (256, 64)
                  for m in (128, 32))}
    assert set(steps) == expected
    assert all(s["status"] == "ok" and s["step_ms"] > 0 for s in steps.values())
    assert steps["target K=1"]["of_target_k1"] == pytest.approx(1.0)
    # 'auto': float32 on CPU, bfloat16 on an accelerator (the suite runs on both).
    assert report["dtype"] == precision.resolve_dtype("auto") and report["errors"] == 0
    assert report["environment"]["backend"] == jax.default_backend()
    assert "jaxlib" in report["environment"]
    drafters = {r["drafter"] for r in report["predicted"]}
    assert len(drafters) == 1 + 2 * 2  # the drafter model and every head
    assert "feature head V=64 (restricted) mlp=32" in drafters
    assert len(report["predicted"]) == len(drafters) * 2 * 2  # acceptances x gammas
    per_position = [r for r in report["predicted"] if isinstance(r["acceptance"], list)]
    assert [r["tokens_per_round"] for r in per_position if r["gamma"] == 3] == \
        pytest.approx([1 + 0.9 + 0.72 + 0.504] * len(drafters))
    md = (tmp_path / "feature_steps.md").read_text()
    assert "| feature draft step V=64 mlp=32 | 1 | 64 | 32 |" in md
    assert "Predicted speedup" in md and "a_i = 0.9, 0.8" in md


def _tiny(tmp_path, **overrides):
    arguments = dict(target="random:tiny-target:0", drafter=None, steps=1, repeats=1,
                     fill=4, target_widths=[1], window_widths=[4], head_vocab_sizes=[],
                     intermediate_sizes=[32], gammas=[3], out_dir=str(tmp_path))
    return feature_steps.run_bench_feature_steps(**{**arguments, **overrides})


def test_a_failing_step_is_recorded_and_the_others_run(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("out of memory (simulated)")

    monkeypatch.setattr(feature_steps, "time_window", broken)
    report = _tiny(tmp_path)
    status = {s["name"]: s["status"] for s in report["steps"]}
    assert status == {"target K=1": "ok", "feature window K=4 mlp=32": "error",
                      "feature first logits V=256": "ok",
                      "feature draft step V=256 mlp=32": "ok"}
    failed = next(s for s in report["steps"] if s["status"] == "error")
    assert failed["error"] == "RuntimeError: out of memory (simulated)"
    assert report["errors"] == 1 and report["predicted"] == []  # no head has a window
    written = json.loads((tmp_path / "feature_steps.json").read_text())
    assert written["errors"] == 1
    assert "1 step(s) failed" in (tmp_path / "feature_steps.md").read_text()


@pytest.mark.parametrize("overrides, message", [
    ({"target_widths": [4, 6]}, "target_widths must include 1"),
    ({"head_vocab_sizes": [300]}, "below the target's vocabulary of 256"),
    ({"head_vocab_sizes": [64, 64]}, "head_vocab_sizes has repeats"),
    ({"intermediate_sizes": [0]}, "intermediate_sizes must be integers >= 1 or None"),
    ({"intermediate_sizes": []}, "intermediate_sizes is empty"),
    ({"window_widths": [1]}, r"window_widths must be integer\(s\) >= 2"),
    ({"steps": 0}, r"steps must be integer\(s\) >= 1"),
    ({"acceptance": 0.7}, "acceptance must be a list"),
    ({"acceptance": [1.5]}, r"rates in \[0, 1\]"),
    ({"acceptance": [[0.8, 0.7]], "gammas": [3, 5]}, "has 2 rates; the largest G is 5"),
    ({"round_overhead_ms": -1.0}, "round_overhead_ms must be a number >= 0"),
    ({"kernel_layout": "rows"}, "kernel_layout has"),
    ({"dtype": "float8"}, "dtype 'float8' is not one of"),
    ({"target": "random:no-such-model"}, "registered architecture"),
])
def test_bad_arguments_fail_before_any_model_loads(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _tiny(tmp_path, **overrides)
    assert not (tmp_path / "feature_steps.json").exists()


def test_tokens_per_round_per_token_and_per_position():
    assert cost.tokens_per_round(0.8, 5) == pytest.approx((1 - 0.8 ** 6) / 0.2)
    assert cost.tokens_per_round([0.8] * 7, 5) == pytest.approx((1 - 0.8 ** 6) / 0.2)
    assert cost.tokens_per_round([0.9, 0.8, 0.5, 0.1], 3) == \
        pytest.approx(1 + 0.9 + 0.72 + 0.36)
    with pytest.raises(ValueError, match="2 per-position rates for G = 3"):
        cost.tokens_per_round([0.9, 0.8], 3)


def test_predicted_speedup_matches_a_hand_computation():
    """Target: 10 ms at K = 1, 12 ms at K = 6; the drafter model 4 ms a step; the
    head 2 ms a draft step, 2 ms a window call of 6, 1 ms its first logits;
    overhead 1 ms a round; G = 5 at a = 0.8: 3.68928 tokens a round.
    Drafter model: 12 + 5 x 4 + 1 = 33 ms. Head: 12 + (2 + 1) + 4 x 2 + 1 = 24 ms."""
    steps = [("target K=1", "target", 1, 10.0), ("target K=6", "target", 6, 12.0),
             ("drafter model K=1", "drafter model", 1, 4.0),
             ("feature window K=6 mlp=64", "feature", 6, 2.0),
             ("feature first logits V=100", "feature", 1, 1.0),
             ("feature draft step V=100 mlp=64", "feature", 1, 2.0)]
    report = {"settings": {"drafter": "random:tiny-drafter:1", "gammas": [5],
                           "acceptance": [0.8], "intermediate_sizes": [None],
                           "head_vocab_sizes": [], "window_widths": [6],
                           "round_overhead_ms": 1.0},
              "target_config": {"vocab_size": 100, "intermediate_size": 64},
              "steps": [{"name": n, "role": r, "k": k, "status": "ok", "step_ms": ms}
                        for n, r, k, ms in steps]}
    feature_steps.finish(report)
    tokens = (1 - 0.8 ** 6) / (1 - 0.8)
    assert tokens == pytest.approx(3.68928)
    rows = {r["kind"]: r for r in report["predicted"]}
    assert rows["model"]["round_ms"] == pytest.approx(33.0)
    assert rows["model"]["speedup"] == pytest.approx(tokens * 10 / 33)
    assert rows["feature"]["round_ms"] == pytest.approx(24.0)
    assert rows["feature"]["drafting_ms"] == pytest.approx(11.0)
    assert rows["feature"]["speedup"] == pytest.approx(tokens * 10 / 24)
    assert rows["feature"]["drafting_of_target_k1"] == pytest.approx(1.1)
    assert report["steps"][5]["of_target_k1"] == pytest.approx(0.2)
    # The same figures through jobs.cost directly.
    model = cost.CostModel(target=cost.CallCost.from_steps({1: 0.010, 6: 0.012}),
                           drafter=cost.CallCost.from_steps({1: 0.002, 6: 0.003}),
                           round_overhead_s=0.001)
    assert feature_steps.predicted_speedup(model, 5, "feature", 0.8)["speedup"] == \
        pytest.approx(tokens * 10 / 24)
    with pytest.raises(ValueError, match="'model' or 'feature'"):
        feature_steps.predicted_speedup(model, 5, "tree", 0.8)
