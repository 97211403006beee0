"""TPU prices in the one cost model (benchmarks.tpu_prices): per-call costs from compile
reports (a negative estimate falls back to the no-sliced-prefetch compile),
acceptance from histograms, one round's expected calls, speedups priced through
CostModel.itemise, the job's report labelled as a TPU compiler estimate, and the
reconstruction of the stored GPU prediction from the committed reports. No libtpu,
no model, no timing."""

import json
import pathlib

import numpy as np
import pytest

from benchmarks import tpu_prices
from specdec_jax.decode import cost
from specdec_jax.jobs.tpu import compile_job as tpu_compile

REPORTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "reports"


def record(optimal_s, floor_s=1e-3, status="compiled"):
    return {"status": status, "optimal_s": optimal_s, "floor_s": floor_s}


def test_conditional_rates_and_pooled_rate():
    # 10 rounds: 4 accepted none, 2 one, 4 both drafts (G = 2).
    rates, pooled = tpu_prices.conditional_rates([4, 2, 4])
    assert rates == pytest.approx([6 / 10, 4 / 6])
    assert pooled == pytest.approx((6 + 4) / (10 + 6))
    # A position no round reached takes the pooled rate.
    rates, pooled = tpu_prices.conditional_rates([3, 1, 0, 0])
    assert rates[:2] == pytest.approx([0.25, 0.0]) and rates[2] == pooled
    assert tpu_prices.rates_at([0.5, 0.4], 0.3, 4) == [0.5, 0.4, 0.3, 0.3]
    with pytest.raises(ValueError, match="histogram"):
        tpu_prices.conditional_rates([0, 0])


def test_expected_tokens_match_the_histogram_it_came_from():
    histogram = [13, 13, 17, 8, 6, 124]  # the 0.5B's counted rounds at G = 5
    rates, _ = tpu_prices.conditional_rates(histogram)
    p = tpu_prices.accepted_distribution(rates)
    assert p.sum() == pytest.approx(1.0)
    assert p == pytest.approx(np.asarray(histogram) / sum(histogram))
    mean_accepted = np.arange(6) @ np.asarray(histogram) / sum(histogram)
    assert cost.tokens_per_round(rates, 5) == pytest.approx(1 + mean_accepted)


def test_round_stats_count_each_kind_of_call():
    rates = [0.5, 0.5, 0.5]
    p_all = 0.125
    model = tpu_prices.round_stats("model", 3, rates)
    assert model["target_calls"] == 1 and model["target_fed"] == 4
    assert model["drafter_calls_by_model"] == pytest.approx([3 + p_all])  # + catch-up
    assert tpu_prices.round_stats("mag", 3, rates)["drafter_calls_by_model"] == [3.0]
    feature = tpu_prices.round_stats("feature", 3, rates)
    assert feature["drafter_calls_by_model"] == [3.0]  # a window, then G - 1 steps
    assert feature["drafter_single_calls_by_model"] == [2.0]
    # Cascade at G = 6: the 0.5B drafts 4 (its first call a window over the lag),
    # Max-Gram 2 lookups.
    cascade = tpu_prices.round_stats("cascade", 6, [1.0] * 6)  # every draft accepted
    assert cascade["drafter_calls_by_model"] == [4.0, 2.0]
    assert cascade["drafter_tokens_by_model"][0] == 3 + 8  # lag 4 -> the G + 2 window
    with pytest.raises(ValueError, match="rates for G"):
        tpu_prices.round_stats("model", 4, rates)


def test_negative_estimates_fall_back_to_the_no_sliced_prefetch_report():
    default = {"path": "a.json", "settings": {"compiler_options": {}}, "programs": {
        "target_k1": record(-80.0), "drafter_k1": record(0.5e-3),
        "maxgram_step": record(1e-3, status="error")}}
    no_slice = {"path": "b.json", "settings": {"compiler_options":
                                              tpu_prices.NO_SLICED_PREFETCH}, "programs": {
        "target_k1": record(2e-3), "target_k6": record(3e-3), "drafter_k1": record(9.0)}}
    programs = tpu_prices.chip_programs([default, no_slice])
    assert programs["target_k1"]["estimate_s"] == 2e-3
    assert programs["target_k1"]["source"] == "b.json"
    assert programs["drafter_k1"]["source"] == "a.json"  # positive: the default kept
    assert "maxgram_step" not in programs
    costs = tpu_prices.call_costs(programs)
    assert costs["target"].call_s(6) == 3e-3 and costs["drafter"].call_s(1) == 0.5e-3
    assert tpu_prices.call_costs(programs, "floor_s")["target"].call_s(1) == 1e-3
    with pytest.raises(ValueError, match="target_k1"):
        tpu_prices.chip_programs([default])


def test_speedup_is_tokens_per_round_over_the_priced_round():
    unit = cost.CallCost.from_steps({1: 1.0, 2: 1.0, 9: 1.0})
    free = cost.CallCost.from_steps({1: 0.0})
    costs = {"target": unit, "drafter": cost.CallCost.from_steps({1: 0.25}), "mag": free}
    # Max-Gram free, the scoring call the price of a step: speedup = tokens per round.
    out = tpu_prices.predicted_speedup(costs, "mag", 4, [0.8] * 4, 0.8)
    assert out["speedup"] == pytest.approx(cost.tokens_per_round(0.8, 4))
    # The 0.5B at ratio 0.25: a round costs 1 + 0.25 (G + P(all accepted)).
    out = tpu_prices.predicted_speedup(costs, "drafter", 3, [0.8] * 3, 0.8)
    round_s = 1 + 0.25 * (3 + 0.8 ** 3)
    assert out["round_s"] == pytest.approx(round_s)
    assert out["speedup"] == pytest.approx(cost.tokens_per_round(0.8, 3) / round_s)
    with pytest.raises(ValueError, match="no call cost"):
        tpu_prices.predicted_speedup(costs, "feature", 3, [0.8] * 3, 0.8)


def test_a_round_program_prices_the_work_between_its_calls():
    calls = {"target_k4": record(4.0), "drafter_k1": record(1.0),
             "drafter_k1_no_head": record(0.5)}
    first = {"path": "a.json", "programs": {**calls, "round_specdecode_g3": record(-2.0)}}
    second = {"path": "b.json", "programs": {**calls, "round_specdecode_g3": record(10.0)}}
    # The first report's round is negative: the second prices all four programs.
    between = tpu_prices.between_calls([first, second], 3)
    assert between["seconds"] == pytest.approx(10.0 - 4.0 - 3 * 1.0 - 0.5)
    assert between["source"] == "b.json"
    # A round whose calls are in another report only is not priced.
    split = {"path": "c.json", "programs": {"round_specdecode_g3": record(10.0)}}
    assert tpu_prices.between_calls([split, {"path": "d.json", "programs": calls}], 3) is None
    assert tpu_prices.between_calls([second], 4) is None  # no round program at G = 4
    # Calls compiled from another commit than the round are not subtracted from it.
    stale = {**second["programs"], "target_k4": {**record(4.0), "commit": "old"}}
    assert tpu_prices.between_calls([{"path": "e.json", "programs": stale}], 3) is None

    costs = {"target": cost.CallCost.from_steps({1: 1.0, 4: 1.0}),
             "drafter": cost.CallCost.from_steps({1: 0.25})}
    plain = tpu_prices.predicted_speedup(costs, "drafter", 3, [0.8] * 3, 0.8)
    again = tpu_prices.predicted_speedup(costs, "drafter", 3, [0.8] * 3, 0.8,
                                         round_overhead_s=0.5)
    assert again["round_s"] == pytest.approx(plain["round_s"] + 0.5)
    assert again["drafting_s"] == pytest.approx(plain["drafting_s"])
    assert again["speedup"] == pytest.approx(cost.tokens_per_round(0.8, 3) /
                                             (plain["round_s"] + 0.5))


def write_chip_reports(root: pathlib.Path):
    for chip, topology in tpu_prices.TOPOLOGIES.items():
        programs = {f"target_k{k}": record(2e-3 if chip == "v5p" else -1.0, 1e-3)
                    for k in range(1, 10)}
        programs.update(drafter_k1=record(0.6e-3, 0.3e-3), maxgram_step=record(1e-4, 1e-8))
        if chip == "v5p":  # one round program: 0.5 ms between its calls
            programs.update(drafter_k1_no_head=record(0.4e-3),
                            round_specdecode_g3=record(2e-3 + 3 * 0.6e-3 + 0.4e-3 + 0.5e-3))
        (root / f"tpu_compile_{topology}.json").write_text(json.dumps(
            {"settings": {"compiler_options": {}}, "programs": programs}))
        if chip != "v5p":
            fixed = {name: record(3e-3, 1e-3) for name in programs if name.startswith("target")}
            (root / f"tpu_compile_{topology}_no_sliced_prefetch.json").write_text(json.dumps(
                {"settings": {"compiler_options": tpu_prices.NO_SLICED_PREFETCH},
                 "programs": fixed}))


def test_job_prices_every_chip_and_labels_estimates(tmp_path):
    write_chip_reports(tmp_path)
    counted = tmp_path / "counted.json"
    counted.write_text(json.dumps({"counted": {"0.0": {
        "drafter": {"histogram": [1, 1, 2, 4, 0, 12], "tokens_per_target_call": 4.0},
        "mag": {"histogram": [6, 2, 1, 0, 0, 0, 1], "tokens_per_target_call": 1.6}}}}))
    out = tmp_path / "prices.json"
    report = tpu_prices.run_tpu_prices(counted=str(counted), gpu_steps=None, gammas=[3, 8],
                                       reports_dir=str(tmp_path), out=str(out))
    assert [(r["config"], r["gamma"]) for r in report["predictions"]] == [
        ("drafter", 3), ("drafter", 8), ("mag", 3), ("mag", 8)]
    row = report["predictions"][0]
    assert set(row) >= {f"{chip} {basis}" for chip in tpu_prices.CHIP_ORDER
                        for basis in (tpu_prices.ESTIMATE, tpu_prices.FLOOR)}
    assert report["devices"]["v5e"]["programs"]["target_k1"]["source"].endswith(
        "_no_sliced_prefetch.json")
    assert report["devices"]["v5p"]["ratios"][tpu_prices.ESTIMATE]["drafter"] == \
        pytest.approx(0.3)
    whole = row[f"v5p {tpu_prices.WHOLE_ROUND}"]
    assert whole["between_calls"]["seconds"] == pytest.approx(0.5e-3)
    assert whole["round_s"] == pytest.approx(row[f"v5p {tpu_prices.ESTIMATE}"]["round_s"] + 0.5e-3)
    assert f"v5e {tpu_prices.WHOLE_ROUND}" not in row  # no round program compiled there
    text = (tmp_path / "prices.md").read_text()
    assert tpu_prices.ESTIMATE in text and "measured" not in text
    assert json.loads(out.read_text())["label"].startswith(tpu_prices.ESTIMATE)


def test_stored_weights_are_priced_from_their_own_reports(tmp_path):
    """``weights="stored"`` prices a chip from the compile reports of the pair
    kept in its GGUF blocks (``tpu_compile_<topology>_stored*.json``), never the
    bfloat16 ones beside them, and says so."""
    write_chip_reports(tmp_path)
    stored = {f"target_k{k}": record(1e-3, 0.5e-3) for k in range(1, 10)}
    stored["drafter_k1"] = record(0.2e-3, 0.1e-3)
    (tmp_path / "tpu_compile_v5e_2x2_stored_no_sliced_prefetch.json").write_text(json.dumps(
        {"settings": {"compiler_options": tpu_prices.NO_SLICED_PREFETCH, "weights": "stored"},
         "programs": stored}))
    counted = tmp_path / "counted.json"
    counted.write_text(json.dumps({"counted": {"0.0": {
        "drafter": {"histogram": [1, 1, 2, 4, 0, 12], "tokens_per_target_call": 4.0}}}}))
    report = tpu_prices.run_tpu_prices(counted=str(counted), gpu_steps=None, gammas=[5],
                                       chips=["v5e"], reports_dir=str(tmp_path),
                                       out=str(tmp_path / "prices.json"), weights="stored")
    programs = report["devices"]["v5e"]["programs"]
    assert programs["target_k1"]["source"].endswith("_stored_no_sliced_prefetch.json")
    assert programs["drafter_k1"]["estimate_s"] == pytest.approx(0.2e-3)  # not the bf16 0.6
    assert "GGUF files' blocks" in (tmp_path / "prices.md").read_text()
    with pytest.raises(ValueError, match="weights='int4'"):
        tpu_prices.run_tpu_prices(counted=str(counted), gpu_steps=None, chips=["v5e"],
                                  reports_dir=str(tmp_path), weights="int4")


@pytest.mark.skipif(not (REPORTS / "bench_feature_steps_gpu_h100.json").exists(),
                    reason="the committed GPU steps report is absent")
def test_round_model_reproduces_the_stored_gpu_prediction():
    """From histograms alone, the counted G's GPU prediction lands within 5% of
    the one the benchmark priced from its per-row counts (the difference: the
    last, cut round of each prompt)."""
    counted = tpu_compile.read_report(str(REPORTS / "bench_feature_drafter_cpu.json"))
    acceptance = tpu_prices.counted_acceptance(counted, "0.0")
    checked = tpu_prices.check(acceptance, str(REPORTS / "bench_feature_steps_gpu_h100.json"),
                               counted["gpu_feature_variant"])
    assert set(checked) == set(tpu_prices.CONFIGS)
    for config, values in checked.items():
        assert values["modelled_here"] == pytest.approx(values["stored"], rel=0.05), config
