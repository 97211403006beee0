"""The one cost model: tokens per round, call costs by width, round pricing and
the calibrated per-round overhead."""

import jax
import pytest

from specdec_jax.jobs import cost
from specdec_jax.models.toy import TableLM


@pytest.mark.parametrize("alpha, gamma, expected", [
    (0.0, 5, 1.0), (1.0, 5, 6.0), (0.5, 1, 1.5), (0.5, 2, 1.75)])
def test_tokens_per_round_is_the_geometric_sum(alpha, gamma, expected):
    assert cost.tokens_per_round(alpha, gamma) == pytest.approx(expected)
    # The series itself: 1 + alpha + ... + alpha^G.
    assert cost.tokens_per_round(alpha, gamma) == pytest.approx(
        sum(alpha ** i for i in range(gamma + 1)))


def test_acceptance_inverts_tokens_per_round_and_refuses_impossible_counts():
    for alpha in (0.1, 0.42, 0.9):
        tokens = cost.tokens_per_round(alpha, 4)
        assert cost.acceptance_for_tokens_per_round(tokens, 4) == pytest.approx(alpha, abs=1e-6)
    with pytest.raises(ValueError, match=r"tokens per round must be in \[1, 5\]"):
        cost.acceptance_for_tokens_per_round(5.5, 4)
    with pytest.raises(ValueError, match="acceptance rate"):
        cost.tokens_per_round(1.5, 3)


def test_call_cost_uses_measured_widths_and_the_fit_between():
    call = cost.CallCost.from_steps({1: 0.010, 2: 0.030, 4: 0.050})
    assert call.call_s(1) == 0.010 and call.call_s(4) == 0.050
    assert call.call_s(3) == pytest.approx(0.040)  # a + b K through (2, .03), (4, .05)
    assert call.call_s(6) == pytest.approx(0.070)
    with pytest.raises(ValueError, match="one-token step"):
        cost.CallCost.from_steps({2: 0.1})
    # Stored cost models (JSON) round-trip, and ones stored before the overhead load.
    model = cost.CostModel(target=call, drafter=call, round_overhead_s=0.002)
    assert cost.CostModel.from_json(model.to_json()) == model
    old = model.to_json()
    del old["round_overhead_s"]
    assert cost.CostModel.from_json(old).round_overhead_s == 0.0


def test_a_round_is_its_calls_plus_the_overhead():
    target = cost.CallCost.from_steps({1: 0.10, 4: 0.16, 6: 0.20})
    drafter = cost.CallCost.from_steps({1: 0.02, 2: 0.03, 3: 0.035})
    model = cost.CostModel(target=target, drafter=drafter, round_overhead_s=0.01)
    round_s = model.round_seconds(gamma=3, drafter_calls=4, catch_ups=1)
    assert round_s == pytest.approx(0.16 + 3 * 0.02 + 1 * 0.03 + 0.01)
    assert model.predicted_speedup(tokens_per_round=2.5, round_s=round_s) == pytest.approx(
        2.5 * 0.10 / round_s)
    row = {"target_calls": 10, "target_fed": 40, "target_single": 0, "drafter_calls": 40,
           "drafter_fed": 40, "drafter_single": 40}
    without = cost.CostModel(target=target, drafter=drafter).row_seconds(row, prompt_tokens=0)
    assert model.row_seconds(row, prompt_tokens=0) == pytest.approx(without + 10 * 0.01)
    autoregressive = {**row, "drafter_calls": 0, "drafter_fed": 0, "drafter_single": 0}
    assert model.row_seconds(autoregressive, prompt_tokens=0) == pytest.approx(
        target.seconds(calls=10, fed=40, single=0))  # no rounds, no overhead


def test_round_overhead_is_measured_from_a_timed_generation():
    model = TableLM(vocab_size=16, order=1)
    params = model.init_params(jax.random.PRNGKey(0))
    costs, measured = cost.calibrate(target=model, target_params=params, drafter=model,
                                     drafter_params=params, context=8, widths=(1, 2, 5),
                                     repeats=1, overhead_gamma=4)
    overhead = measured["round_overhead"]
    assert overhead["gamma"] == 4 and overhead["rounds"] >= 1
    assert overhead["raw_s"] == pytest.approx(
        (overhead["measured_s"] - overhead["priced_s"]) / overhead["rounds"])
    assert costs.round_overhead_s == max(overhead["raw_s"], 0.0)
    uncalibrated, measured = cost.calibrate(
        target=model, target_params=params, drafter=model, drafter_params=params, context=8,
        widths=(1, 2), repeats=1, overhead_gamma=None)
    assert uncalibrated.round_overhead_s == 0.0 and "round_overhead" not in measured
