"""The pair benchmarks as gin jobs (benchmarks/configs/{drafting,drafter_variants,
verifiers,speculative,batch}.gin), end to end on the byte-level toys
(``toy-bytes-large`` drafted by ``toy-bytes-small``, HumanEval prompts as
bytes), their pieces, and their refusals of bad arguments before any model
loads. The toys' figures mean nothing: these pin the pipelines, not speed."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

from benchmarks import drafting, speculative
from benchmarks import main as bench_main
from specdec_jax import api
from specdec_jax.checkpoints.tokenizer import ByteTokenizer
from specdec_jax.data import bigram, humaneval
from specdec_jax.decode import cost
from specdec_jax.jobs import resolver
from specdec_jax.runtime import timing

TOYS = ["TARGET = 'toy-bytes-large'", "DRAFTER = 'toy-bytes-small'"]


def run_job(name: str, tmp_path, *bindings, out: str = "out.json") -> dict:
    out_path = tmp_path / out
    args = ["--gin_file", f"benchmarks/configs/{name}.gin"]
    for binding in (*TOYS, f"OUT_PATH = '{out_path}'",
                    f"MARKDOWN_PATH = '{tmp_path / (name + '.md')}'", *bindings):
        args += ["--gin_bindings", binding]
    assert bench_main.main(args) == 0
    if out.endswith(".gz"):
        with gzip.open(out_path, "rt") as f:
            return json.load(f)
    return json.loads(out_path.read_text())


@pytest.fixture(scope="module")
def byte_table(tmp_path_factory):
    """A bigram table (and token counts) over the toys' byte vocabulary, from
    the HumanEval prompts themselves."""
    unigram = np.zeros(ByteTokenizer.VOCAB_SIZE, np.int64)
    streams = [ByteTokenizer().encode(p) for p in humaneval.load_prompts(20)]
    top_k = np.zeros((ByteTokenizer.VOCAB_SIZE, bigram.TOP_K), np.int32)  # best-first trees
    table, _ = bigram.build_table(streams, ByteTokenizer.VOCAB_SIZE, unigram=unigram, top_k=top_k)
    path = tmp_path_factory.mktemp("table") / "bytes.npz"
    bigram.save_table(table, path, unigram=unigram, top_k=top_k)
    return str(path)


# --- bench_drafting --------------------------------------------------------------------------

@pytest.mark.long
def test_bench_drafting_end_to_end_resumes_and_reprints(tmp_path, byte_table, monkeypatch,
                                                        capsys):
    configs = ["sd-g7", "csd-[[4,4],[0,4]]"]  # Max-Gram runs inside the cascade
    common = [f"bench_drafting.configs = {configs!r}", f"bench_drafting.bigram_table = "
              f"'{byte_table}'", "bench_drafting.num_prompts = 2",
              "bench_drafting.max_new_tokens = 8", "bench_drafting.batch_size = 2"]
    report = run_job(
        "drafting", tmp_path, *common, "bench_drafting.wallclock_prompts = 2",
        "bench_drafting.t1_configs = 1", "bench_drafting.cost_widths = [1, 2]",
        "bench_drafting.cost_repeats = 1", "bench_drafting.overhead_gamma = 3",
        "bench_drafting.phases = ['costs', 'greedy', 'ar', 'wallclock', 't1']",
        out="drafting.json.gz")
    costs = report["costs"]
    assert set(costs) == {"fill", "target", "toy-bytes-small", "round_overhead"}
    assert set(costs["target"]["median_s"]) == {"1", "2"}
    assert costs["target"]["prefill_per_token_s"] > 0
    overhead = costs["round_overhead"]
    assert overhead["gamma"] == 3 and overhead["round_overhead_s"] >= 0
    assert report["param_counts"]["target"] > report["param_counts"]["toy-bytes-small"]
    assert list(report["greedy"]) == configs
    for name, stored in report["greedy"].items():
        assert [r["prompt"] for r in stored["rows"]] == [0, 1]
        assert stored["swi_latency"][0] > 0 and stored["tokens"] == 16  # no EOS in bytes
        assert stored["draft"] == drafting.configurations("toy-bytes-small")[name][0]
    # Lossless: every greedy configuration writes the autoregressive target's tokens.
    assert report["ar_greedy"]["mismatching_prompts"] == {name: [] for name in configs}
    sd = report["greedy"]["sd-g7"]
    assert 0 <= sd["acceptance_rate"] <= 1 and sd["ewif_iid"] > 0
    assert set(report["wallclock"]) == {"ar", *configs, "sd-g7-with-step-g+1"}
    assert all(len(w["seconds"]) == 2 for w in report["wallclock"].values())
    # The best SD configuration (and t1_configs - 1 = 0 cascades), at T = 1.
    assert set(report["t1"]) == {"sd-g7"}
    agreement = report["cost_model_agreement"]
    assert agreement["n"] == 2 * len(configs)  # (configuration, wall-clock prompt) points
    assert math.isfinite(agreement["mean_bias"]) and agreement["mean_ratio"] > 0
    text = (tmp_path / "drafting.md").read_text()
    assert "| 0 | sd-g7 | toy-bytes-small | 7 |" in text and "Pearson r" in text
    assert "Skipping the drafter's (G+1)-th step" in text

    # A rerun resumes: nothing stored is counted again.
    monkeypatch.setattr(drafting, "run_counted", lambda *a, **k: pytest.fail("counted again"))
    again = run_job("drafting", tmp_path, *common,
                    "bench_drafting.phases = ['greedy']",
                    out="drafting.json.gz")
    assert again["greedy"] == report["greedy"] and again["costs"] == report["costs"]
    # 'report' alone reprints the stored (compressed) report without loading a model.
    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: pytest.fail("a model was loaded"))
    capsys.readouterr()
    run_job("drafting", tmp_path, "bench_drafting.phases = ['report']", out="drafting.json.gz")
    assert drafting.markdown(again) in capsys.readouterr().out


def test_drafting_prices_counted_calls_with_the_cost_model():
    stored = {"k1_s": 1.0, "a_s": 1.5, "b_s": 0.25, "median_s": {"1": 1.0, "2": 2.0, "4": 2.5},
              "prefill_per_token_s": 0.01}
    costs = {"fill": 10, "target": stored,
             "d": {**stored, "k1_s": 0.1, "median_s": {"1": 0.1}, "a_s": 0.2, "b_s": 0.05},
             "round_overhead": {"round_overhead_s": 0.5, "gamma": 3}}
    model, models = drafting.cost_model(costs)
    assert drafting.drafter_name(costs) == "d" and model.round_overhead_s == 0.5
    # Measured widths at their medians, others by the fit a + b K (not interpolated).
    assert model.target.call_s(4) == 2.5 and model.target.call_s(3) == 1.5 + 3 * 0.25
    row = {"target_calls": 2, "drafter_calls": {"d": 5}, "drafter_fed": {"d": 7},
           "drafter_single": {"d": 4}}
    drafting_s = 4 * 0.1 + 1 * 0.2 + 3 * 0.05
    assert drafting.drafting_seconds(row, models) == pytest.approx(drafting_s)
    assert drafting.predicted_seconds(row, model, models, 3) == pytest.approx(
        2 * (2.5 + 0.5) + drafting_s)
    # A report stored before the overhead was calibrated prices none.
    old, _ = drafting.cost_model({k: v for k, v in costs.items() if k != "round_overhead"})
    assert old.round_overhead_s == 0.0
    # EWIF's numerator is the one tokens-per-round formula.
    assert drafting.ewif(0.6, 0.0, 4) == pytest.approx(cost.tokens_per_round(0.6, 4))
    assert drafting.ewif(1.0, 0.5, 3) == pytest.approx(4 / 2.5)


# --- bench_drafter_variants ------------------------------------------------------------------

@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_bench_drafter_variants_end_to_end(tmp_path, byte_table, cpu_kernel):
    variants = ("[{'name': 'full head', 'gamma': 2, 'head_vocab': 0, 'catch_up_widths': [1, 2], "
                "'draft_weights': 'f32', 'kernel': False}, "
                "{'name': 'cut, bf16, kernel', 'gamma': 3, 'head_vocab': 64, "
                "'catch_up_widths': [1], 'draft_weights': 'bf16', 'kernel': True}]")
    report = run_job("drafter_variants", tmp_path, f"bench_drafter_variants.variants = {variants}",
                     "bench_drafter_variants.task = None",
                     f"bench_drafter_variants.bigram_table = '{byte_table}'",
                     "bench_drafter_variants.max_new_tokens = 6",
                     "bench_drafter_variants.repeats = 1")
    names = ["autoregressive target", "full head", "cut, bf16, kernel"]
    assert list(report["seconds"]) == names
    assert report["same_tokens_as_target"] == dict.fromkeys(names, True)
    assert report["settings"]["variants"][1]["draft_weights"] == "bf16"
    # Three prompts, six new tokens each (bytes have no EOS).
    assert all(tokens == 18 for tokens in report["tokens"].values())
    assert all(len(seconds) == 3 for seconds in report["seconds_per_prompt"].values())
    ratio, low, high = report["speedup_ci95"]["full head"]
    assert low <= ratio <= high
    assert "| cut, bf16, kernel |" in (tmp_path / "drafter_variants.md").read_text()


@pytest.mark.long
def test_bench_drafter_variants_times_trees_against_a_chain(tmp_path, byte_table):
    """Tree variants (the drafter's dynamic tree, Max-Gram's best-first tree)
    timed beside a chain, every one writing the target's tokens."""
    variants = ("[{'name': 'chain', 'gamma': 2, 'head_vocab': 0, 'catch_up_widths': [1], "
                "'draft_weights': 'f32', 'kernel': False}, "
                "{'name': 'dynamic', 'gamma': 0, 'head_vocab': 0, 'catch_up_widths': [1], "
                "'draft_weights': 'f32', 'kernel': False, 'tree': 'dynamic:2,1,2'}, "
                "{'name': 'trie', 'gamma': 0, 'head_vocab': 0, 'catch_up_widths': [1], "
                "'draft_weights': 'f32', 'kernel': False, 'tree': 'trie:4,3'}]")
    report = run_job("drafter_variants", tmp_path, f"bench_drafter_variants.variants = {variants}",
                     "bench_drafter_variants.task = None",
                     f"bench_drafter_variants.bigram_table = '{byte_table}'",
                     "bench_drafter_variants.max_new_tokens = 6",
                     "bench_drafter_variants.repeats = 1")
    names = ["autoregressive target", "chain", "dynamic", "trie"]
    assert report["same_tokens_as_target"] == dict.fromkeys(names, True)
    assert report["settings"]["variants"][2]["tree"] == "trie:4,3"
    assert report["settings"]["variants"][0]["tree"] == ""  # a chain
    # Three prompts x 6 tokens; a round emits at most depth + 1 of them (chain and
    # dynamic tree: 3, trie: 4), at least one.
    assert all(report["tokens"][n] == 18 for n in names)
    assert report["target_calls"]["autoregressive target"] == 18
    for name, most in (("chain", 3), ("dynamic", 3), ("trie", 4)):
        assert 18 / most <= report["target_calls"][name] <= 18, name


def test_drafter_variants_decode_each_prompt_at_its_own_width():
    from benchmarks.drafter_variants import _prompts
    encoded = [[5] * 40, [6] * 3, [7] * 33]
    bucketed = _prompts(encoded, 32)
    assert [p.tokens.shape for p in bucketed] == [(1, 64), (1, 32), (1, 64)]
    assert [int(p.lengths[0]) for p in bucketed] == [40, 3, 33]
    assert [int(p.tokens[0, 0]) for p in bucketed] == [5, 6, 7]  # the prompts' order
    assert {p.tokens.shape for p in _prompts(encoded, 0)} == {(1, 40)}  # the longest


def test_drafter_variants_refuse_incomplete_or_clashing_variants():
    from benchmarks.drafter_variants import check_variants
    good = {"name": "a", "gamma": 5, "head_vocab": 0, "catch_up_widths": [1],
            "draft_weights": "int8", "kernel": True}
    assert check_variants([good])[0]["catch_up_widths"] == (1,)
    with pytest.raises(ValueError, match="exactly the fields"):
        check_variants([{k: v for k, v in good.items() if k != "kernel"}])
    with pytest.raises(ValueError, match="unique"):
        check_variants([good, good])
    with pytest.raises(ValueError, match="choose one of"):
        check_variants([{**good, "draft_weights": "int4"}])
    with pytest.raises(ValueError, match="empty"):
        check_variants([])
    with pytest.raises(ValueError, match="gamma = 0"):
        check_variants([{**good, "tree": "dynamic:3,1,2"}])
    with pytest.raises(ValueError, match="head_vocab = 0"):
        check_variants([{**good, "gamma": 0, "head_vocab": 64, "tree": "2,1"}])
    with pytest.raises(ValueError, match="trie:NODES,DEPTH"):
        check_variants([{**good, "gamma": 0, "tree": "trie:4"}])


# --- bench_verifiers -------------------------------------------------------------------------

@pytest.mark.long
def test_bench_verifiers_efficiency_then_wallclock(tmp_path):
    common = ["bench_verifiers.num_prompts = 2", "bench_verifiers.seeds = [0]",
              "bench_verifiers.gammas = [2]", "bench_verifiers.max_new_tokens = 6",
              "bench_verifiers.batch_size = 2", "bench_verifiers.wallclock_prompts = 1"]
    report = run_job("verifiers", tmp_path, *common, "bench_verifiers.phases = ['efficiency']")
    row = report["rows"]["G=2"]
    assert list(row) == ["token", "block", "block-seed"]
    for figures in row.values():
        assert len(figures["units"]) == 2 and 1 <= figures["block_efficiency"] <= 3
    assert "improvement_pct_ci95" in row["block"] and "wallclock_prompts" not in report
    assert "wall clock: not measured" in (tmp_path / "verifiers.md").read_text()
    # The wall-clock phase alone adds to the stored efficiency figures.
    report = run_job("verifiers", tmp_path, *common, "bench_verifiers.phases = ['wallclock']")
    row = report["rows"]["G=2"]
    assert report["wallclock_prompts"] == 1 and report["autoregressive_tokens_per_s"] > 0
    assert len(row["token"]["units"]) == 2  # the efficiency figures kept
    for figures in row.values():
        assert figures["round_s"] > 0 and figures["verify_kernel_s"] > 0
        assert figures["verify_share_of_round"] > 0 and len(figures["wallclock_units"]) == 1
    assert "wallclock_improvement_pct" in row["block-seed"]


# --- bench_speculative -----------------------------------------------------------------------

@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_bench_speculative_end_to_end(tmp_path):
    report = run_job("speculative", tmp_path, "bench_speculative.num_prompts = 2",
                     "bench_speculative.max_new_tokens = 6", "bench_speculative.gammas = [2]",
                     "bench_speculative.temperatures = [0.0]",
                     "bench_speculative.batch_sizes = [2]", "bench_speculative.no_peer = True")
    assert list(report["batch_1"]) == ["T=0,G=0", "T=0,G=2"]
    assert list(report["batched"]) == ["B=2,G=0", "B=2,G=2"]
    assert report["greedy_specdecode_equals_autoregressive"] is True and "peer" not in report
    sd = report["batch_1"]["T=0,G=2"]
    assert math.isfinite(sd["round_overhead"]) and sd["speedup_vs_autoregressive"] > 0
    assert 0 <= sd["mean_accepted"] <= 2 and sd["drafter_calls"] >= 2 * sd["target_calls"]
    assert report["drafter_step_s"] > 0 and report["target_step_s"] > 0
    assert "| 0 | 2 |" in (tmp_path / "speculative.md").read_text()


def test_bench_speculative_subtracts_prefills_and_counts_drafter_calls():
    target, target_params, _ = resolver.resolve("random:tiny-target:0", dtype="float32")
    drafter, drafter_params, _ = resolver.resolve("random:tiny-drafter:1", dtype="float32")
    fn = api.make_generate_fn(target=target, drafter=drafter, gamma=3, max_new_tokens=8)
    prefills = [(timing.prefill_fn(m, 24), p) for m, p in ((target, target_params),
                                                            (drafter, drafter_params))]
    row, outputs = speculative.run_prompts(
        fn, (target_params, drafter_params), [[1, 2, 3], [4, 5, 6, 7]], 4, 0.0,
        prefills=prefills)
    assert 0 < row["prefill_s"] < row["seconds"]
    assert row["decode_s"] == pytest.approx(row["seconds"] - row["prefill_s"])
    assert row["drafter_calls"] >= 3 * row["target_calls"] and len(outputs) == 2


# --- bench_batch -----------------------------------------------------------------------------

@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_bench_batch_end_to_end(tmp_path):
    report = run_job("batch", tmp_path, "bench_batch.batch_sizes = [1, 2]",
                     "bench_batch.min_prompts = 2", "bench_batch.max_new_tokens = 6",
                     "bench_batch.gamma = 2", "bench_batch.width_bucket = 512")
    assert list(report["runs"]) == ["B=1 autoregressive", "B=1 specdecode G=2",
                                    "B=2 autoregressive", "B=2 specdecode G=2"]
    assert report["stops"] is True and report["dtype"] == "float32"
    for run in report["runs"].values():
        assert run["rows"] == 2 and run["tokens"] == 12  # bytes: no EOS, no block stop
        assert run["outputs_equal_to_first_run"] == 1.0 and run["idle_row_fraction"] >= 0
        assert run["tokens_per_s_over_smallest_batch"] > 0
        assert run["decode_tokens_per_s_over_autoregressive_here"] > 0
    assert report["runs"]["B=1 autoregressive"]["tokens_per_s_over_smallest_batch"] == 1.0
    assert "| 2 | specdecode G=2 | 2 | 12 |" in (tmp_path / "batch.md").read_text()


# --- refusals before loading -----------------------------------------------------------------

@pytest.mark.parametrize(("name", "bindings", "message"), [
    ("drafting", ["bench_drafting.configs = ['sd-g9']"], "configs has"),
    ("drafting", ["bench_drafting.phases = ['report', 'greedy']"], "give it alone"),
    ("drafting", ["bench_drafting.phases = ['report']"], "does not exist"),
    ("drafting", ["bench_drafting.phases = ['greedy']"], "holds no costs"),
    ("drafting", ["bench_drafting.cost_widths = [2, 4]"], "must include 1"),
    ("drafting", ["bench_drafting.num_prompts = 0"], "num_prompts must be"),
    ("drafter_variants", ["bench_drafter_variants.variants = [{'name': 'a', 'gamma': 0, "
                          "'head_vocab': 0, 'catch_up_widths': [1], 'draft_weights': 'f32', "
                          "'kernel': False}]"], "gamma must be"),
    ("drafter_variants", ["bench_drafter_variants.repeats = 0"], "repeats must be"),
    ("verifiers", ["bench_verifiers.phases = ['wallclock']"], "efficiency' phase first"),
    ("verifiers", ["bench_verifiers.phases = ['timing']"], "phases has"),
    ("verifiers", ["bench_verifiers.gammas = [0, 4]"], "gammas must be"),
    ("verifiers", ["bench_verifiers.num_prompts = 165"], "HumanEval has 164"),
    ("speculative", [], "not registry models"),
    ("speculative", ["bench_speculative.no_peer = True",
                     "bench_speculative.temperatures = [-1.0]"], "numbers >= 0"),
    ("batch", ["bench_batch.methods = ['beam']"], "methods has"),
    ("batch", ["bench_batch.batch_sizes = [1, 200]"], "HumanEval has 164"),
    ("batch", ["bench_batch.dtype = 'float8'"], "dtype 'float8'"),
])
def test_bench_jobs_refuse_bad_arguments_before_loading(tmp_path, monkeypatch, name, bindings,
                                                        message):
    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=message):
        run_job(name, tmp_path, *bindings)
