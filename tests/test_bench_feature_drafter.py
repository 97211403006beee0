"""The feature-drafter benchmark (benchmarks/configs/feature_drafter.gin) end to
end on the byte-level toys (``toy-bytes-large`` as target, a random feature
head saved for it, ``toy-bytes-small`` as the model drafter), its pricing of
counted calls with GPU step costs, and its refusals before any model loads.
The toys' figures mean nothing: these pin the pipeline, not speed."""

from __future__ import annotations

import jax
import pytest

from benchmarks import feature_drafter
from specdec_jax.checkpoints.feature_head_io import save_feature_head, target_fingerprint
from specdec_jax.decode import cost
from specdec_jax.jobs import resolver
from specdec_jax.models import feature_head
from tests.test_bench_pair_jobs import byte_table, run_job  # noqa: F401 (fixture)

H100_STEPS = "benchmarks/reports/bench_feature_steps_gpu_h100.json"


@pytest.fixture(scope="module")
def toy_head(tmp_path_factory):
    target, params, _ = resolver.resolve("toy-bytes-large")
    head = feature_head.FeatureHead(
        feature_head.FeatureHeadConfig.for_target(target, intermediate_size=2048))
    # (an MLP width the committed H100 step report measured, so it can price it)
    path = tmp_path_factory.mktemp("head") / "head"
    save_feature_head(path, head, head.init_net(jax.random.PRNGKey(0)),
                      target_name="toy-bytes-large",
                      fingerprint=target_fingerprint(params, target), token_ids=list(range(128)))
    return str(path)


@pytest.mark.long
def test_end_to_end_on_the_toys(tmp_path, toy_head, byte_table):  # noqa: F811
    report = run_job("feature_drafter", tmp_path, f"HEAD = '{toy_head}'",
                     f"bench_feature_drafter.bigram_table = '{byte_table}'",
                     "bench_feature_drafter.num_prompts = 2",
                     "bench_feature_drafter.max_new_tokens = 8",
                     "bench_feature_drafter.batch_size = 2",
                     "bench_feature_drafter.wallclock_prompts = 1",
                     "bench_feature_drafter.temperatures = [0.0]",
                     f"bench_feature_drafter.gpu_steps = '{H100_STEPS}'")
    counted = report["counted"]["0.0"]
    assert set(counted) == {"autoregressive", *feature_drafter.CONFIGS}
    for label in feature_drafter.CONFIGS:
        assert counted[label]["identical_to_target"], label  # greedy = the target's output
        assert counted[label]["tokens_per_target_call"] >= 1
        assert counted[label]["predicted_gpu_speedup"] > 0
    assert set(report["wallclock"]["0.0"]) == {*feature_drafter.CONFIGS, "raw"}
    assert report["gpu_feature_variant"] == "V=16384 mlp=2048"
    text = (tmp_path / "feature_drafter.md").read_text()
    assert "| 0.0 | feature |" in text and "predicted" in text


def test_gpu_costs_pick_the_measured_variant_and_price_counts():
    costs = feature_drafter.gpu_costs(H100_STEPS, head_vocab=8192, intermediate_size=2048)
    assert costs["feature_variant"] == "V=16384 mlp=2048"
    target, head = costs["target"], costs["feature"]
    # One round: a target call of 6 (priced by the a + b K fit over the measured
    # widths), a window call and 4 draft steps; AR: 3 one-token steps.
    rows = [{"tokens": [0, 0, 0], "target_calls": 1, "target_fed": 6,
             "target_single_calls": 0, "drafter_calls_by_model": [5],
             "drafter_tokens_by_model": [10], "drafter_single_calls_by_model": [4]}]
    scoring = target.base_s + 6 * target.per_token_s
    want = 3 * target.call_s(1) / (scoring + head.call_s(6) + 4 * head.call_s(1))
    got = feature_drafter.predicted_speedup(rows, costs, ["feature"])
    assert got == pytest.approx(want, rel=1e-9)
    with pytest.raises(ValueError, match="MLP width 4096"):
        feature_drafter.gpu_costs(H100_STEPS, head_vocab=8192, intermediate_size=4096)
    assert isinstance(target, cost.CallCost)


@pytest.mark.parametrize("bindings, message", [
    (["bench_feature_drafter.configs = ['eagle']"], "configs has"),
    (["bench_feature_drafter.num_prompts = 0"], "num_prompts must be"),
    (["bench_feature_drafter.wallclock_prompts = 50"], "exceeds num_prompts"),
    (["bench_feature_drafter.cascade_split = [4]"], "cascade_split"),
    (["bench_feature_drafter.temperatures = [-1.0]"], "numbers >= 0"),
])
def test_bad_arguments_are_refused_before_loading(tmp_path, monkeypatch, bindings, message):
    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=message):
        run_job("feature_drafter", tmp_path, "HEAD = 'unused'", *bindings)
