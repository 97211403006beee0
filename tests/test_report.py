"""Sweep reports (specdec_jax.jobs.studies.report) on synthetic records with known answers."""

import copy
import json
import math
import sys

import pytest

from specdec_jax.jobs.studies import report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TARGET_SCORE = 40.0


def record(method, alpha, score, latency, *, wallclock=None, rejection=0.1, ci=5.0,
           task="humaneval", metric="pass@1", temperature=0.0, gamma=5):
    """One sweep point; ``ci`` is the half-width of its quality interval."""
    ar = method in ("drafter", "target")
    return {
        "method": method, "alpha": alpha, "gamma": gamma, "temperature": temperature,
        "task": task, "metric": metric, "num_examples": 30,
        "quality": {"score": score, "low": score - ci, "high": score + ci},
        "relative_latency": {"cost_model": latency, "wallclock": wallclock},
        "rejection_rate": None if ar else rejection,
        "deferral_rate": None if ar else 0.05,
        "calls": {"target": 0 if method == "drafter" else 100,
                  "drafter": 0 if method == "target" else 400},
        "tokens": 480,
    }


def sweep():
    """Target 40 at latency 1; drafter 20 at 0.2.

    opt crosses the target's quality first at latency 0.6 (alpha 0.3) and is best within the
    target's latency at alpha 0.1 (45, latency 0.9; alpha 0.0 scores 46 but costs 1.1).
    chow never reaches 40. token-v3 beats the target with a disjoint CI.
    """
    return [
        record("target", None, TARGET_SCORE, 1.0, wallclock=1.0),
        record("drafter", None, 20.0, 0.2, wallclock=0.25),
        record("opt", 0.0, 46.0, 1.1, rejection=0.05),
        record("opt", 0.1, 45.0, 0.9, rejection=0.1),
        record("opt", 0.3, 40.0, 0.6, rejection=0.2),
        record("opt", 0.5, 39.9, 0.5, rejection=0.3),
        record("opt", 0.9, 25.0, 0.3, rejection=0.5),
        record("chow", 0.2, 35.0, 0.8),
        record("chow", 0.6, 30.0, 0.5),
        record("token-v3", 0.4, 60.0, 0.7, ci=2.0),
    ]


def rows_by_method(rows):
    return {row["method"]: row for row in rows}


def test_table2_matching_the_target_quality():
    rows = rows_by_method(report.table2(sweep()))
    assert set(rows) == {"opt", "chow", "token-v3"}  # the baselines get no row
    opt = rows["opt"]
    assert opt["match_alpha"] == 0.3 and opt["match_latency"] == pytest.approx(0.6)
    assert opt["speedup"] == pytest.approx(1 / 0.6)
    assert opt["reduction"] == pytest.approx(0.4)
    chow = rows["chow"]
    assert chow["speedup"] is None and chow["reduction"] is None and chow["match_alpha"] is None


def test_table2_best_quality_within_the_target_latency():
    rows = rows_by_method(report.table2(sweep()))
    opt = rows["opt"]
    assert opt["best_alpha"] == 0.1  # alpha 0.0 scores more but is slower than the target
    assert (opt["best_score"], opt["best_low"], opt["best_high"]) == (45.0, 40.0, 50.0)
    assert opt["best_beats_target"] and opt["best_ci_overlaps_target"]
    assert rows["chow"]["best_alpha"] == 0.2 and not rows["chow"]["best_beats_target"]
    token = rows["token-v3"]
    assert token["best_beats_target"] and token["best_ci_overlaps_target"] is False


def test_table2_uses_the_requested_latency_source():
    records = sweep()
    for r in records:
        r["relative_latency"]["wallclock"] = r["relative_latency"]["cost_model"] * 2
    records[0]["relative_latency"]["wallclock"] = 1.0
    opt = rows_by_method(report.table2(records, latency="wallclock"))["opt"]
    assert opt["speedup"] == pytest.approx(1 / 1.2)
    # On the doubled wall clock only alphas 0.5 (latency exactly 1.0) and 0.9 stay within 1.
    assert opt["best_alpha"] == 0.5 and opt["best_latency"] == pytest.approx(1.0)


def test_records_without_gamma_join_every_block_size_group():
    records = sweep() + [dict(r, gamma=3) for r in sweep()[2:]]
    for r in records[:2]:
        r["gamma"] = None  # the autoregressive baselines do not depend on gamma
    rows = report.table2(records)
    assert sorted({row["gamma"] for row in rows}) == [3, 5]
    assert all(row["target_score"] == TARGET_SCORE for row in rows)


def test_markdown_contains_every_method_and_point():
    records = sweep()
    text = report.markdown_table(records)
    for method in ("target", "drafter", "opt", "chow", "token-v3"):
        assert f"| {method} |" in text
    assert "45.00 [40.00, 50.00]" in text
    assert text.count("\n| ") == len(records) + 1  # a header and one row per record
    table = report.table2_markdown(report.table2(records))
    assert "SpecCascade [OPT]" in table and "1.67×" in table and "40.0 %" in table
    assert "CIs overlap: not significant" in table and "CIs disjoint" in table


@pytest.mark.parametrize("x", ["relative_latency", "rejection_rate"])
def test_plots_are_png_files(tmp_path, x):
    pytest.importorskip("matplotlib")
    records = sweep() + [record(r["method"], r["alpha"], r["quality"]["score"], 0.9,
                                temperature=1.0) for r in sweep()]
    path = report.plot_tradeoffs(records, tmp_path / f"{x}.png", x=x)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_write_reports(tmp_path):
    pytest.importorskip("matplotlib")
    paths = report.write_reports(sweep(), tmp_path / "out", stem="demo")
    assert {p.name for p in paths.values()} == {"demo.md", "demo_latency.png",
                                                 "demo_rejection.png"}
    assert all(p.read_bytes().startswith(PNG_MAGIC) for k, p in paths.items() if k != "markdown")
    text = paths["markdown"].read_text()
    assert "Table 2" in text and "demo_latency.png" in text and "| token-v3 |" in text


def test_load_sweep_round_trip(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"settings": {"seed": 0}, "records": sweep()}))
    settings, records = report.load_sweep(path)
    assert settings == {"seed": 0} and records == sweep()


@pytest.mark.parametrize("key", ["quality", "relative_latency", "calls", "gamma"])
def test_missing_key_names_the_key_and_the_record(key):
    records = sweep()
    del records[3][key]
    for fn in (report.table2, report.markdown_table, report.agreement):
        with pytest.raises(ValueError, match=rf"method='opt', alpha=0\.1.*'{key}'"):
            fn(records)


def test_missing_nested_key():
    records = sweep()
    del records[3]["quality"]["low"]
    with pytest.raises(ValueError, match=r"alpha=0\.1.*'quality\.low'"):
        report.markdown_table(records)


def test_missing_target_is_an_error():
    records = [r for r in sweep() if r["method"] != "target"]
    with pytest.raises(ValueError, match="Table 2 needs the autoregressive target run"):
        report.table2(records)


def test_latency_of():
    r = record("opt", 0.1, 45.0, 0.9, wallclock=0.95)
    assert report.latency_of(r) == 0.9 and report.latency_of(r, "wallclock") == 0.95
    r["relative_latency"]["wallclock"] = None
    with pytest.raises(ValueError, match="no 'wallclock' relative latency"):
        report.latency_of(r, "wallclock")
    with pytest.raises(ValueError, match="unknown latency source"):
        report.latency_of(r, "flops")
    with pytest.raises(ValueError, match="no 'wallclock'"):
        report.table2(sweep(), latency="wallclock")


def test_agreement_on_a_hand_made_example():
    # (cost model, wall clock): ratios 1.1, 1.0, 0.9; |diff| / wall: 0.1/1.1, 0, 0.1/0.9.
    records = [record("target", None, TARGET_SCORE, 1.0, wallclock=1.0),  # excluded
               record("opt", 0.1, 45.0, 1.0, wallclock=1.1),
               record("opt", 0.3, 40.0, 0.5, wallclock=0.5),
               record("opt", 0.5, 39.0, 1.0, wallclock=0.9),
               record("chow", 0.2, 35.0, 0.8)]  # no wall clock: excluded
    stats = report.agreement(records)
    assert stats["count"] == 3
    assert stats["mean_ratio"] == pytest.approx(1.0)
    assert stats["max_abs_rel_diff"] == pytest.approx(0.1 / 0.9)
    # Deviations from the means (5/6 each): cost (1/6, -1/3, 1/6), wall (4/15, -1/3, 1/15);
    # sums of products 1/6, of squares 1/6 and 14/75, so r = sqrt((1/6) / (14/75)) = sqrt(25/28).
    assert stats["pearson"] == pytest.approx(math.sqrt(25 / 28))
    assert "3 sweep points" in report.agreement_markdown(stats)
    two = report.agreement(records[:3])
    assert two["count"] == 2 and two["pearson"] is None
    none = report.agreement(records[:1])
    assert none == {"count": 0, "mean_ratio": None, "max_abs_rel_diff": None, "pearson": None}


def test_inputs_are_not_modified():
    records = sweep()
    before = copy.deepcopy(records)
    report.table2(records)
    report.markdown_table(records)
    report.agreement(records)
    assert records == before


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    for name in ("matplotlib", "matplotlib.backends.backend_agg", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # import now fails
    with pytest.raises(ImportError, match=r'pip install -e "\.\[eval\]"'):
        report.plot_tradeoffs(sweep(), tmp_path / "x.png")
