"""The trees benchmark (benchmarks/configs/trees.gin) end to end on the byte-level
toys (``toy-bytes-large`` drafted by ``toy-bytes-small``, HumanEval prompts as
bytes), and its refusals of bad arguments before any model loads. The toys'
figures mean nothing: this pins the pipeline, not the speed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import main as bench_main
from benchmarks import trees
from specdec_jax.checkpoints.tokenizer import ByteTokenizer
from specdec_jax.data import bigram, humaneval
from specdec_jax.jobs import resolver

TOYS = ["TARGET = 'toy-bytes-large'", "DRAFTER = 'toy-bytes-small'"]
CONFIGS = [  # the reference (first T = 0) is a chain; a model tree; verifiers paired at T = 1
    {"drafter": "mag", "tree": "chain:3", "temperature": 0.0, "verifiers": ["token"]},
    {"drafter": "model", "tree": "2,1,1", "temperature": 0.0, "verifiers": ["greedy"]},
    {"name": "paired", "drafter": "model", "tree": "dynamic:3,1,2", "temperature": 1.0,
     "verifiers": ["traversal", "rrs"]},
]
MORE_CONFIGS = [  # the long test: the model's chain, a Max-Gram tree
    {"drafter": "model", "tree": "chain:3", "temperature": 0.0, "verifiers": ["token"]},
    {"drafter": "mag", "tree": "2,1,1", "temperature": 0.0, "verifiers": ["greedy"]},
]


@pytest.fixture(scope="module")
def byte_table(tmp_path_factory):
    unigram = np.zeros(ByteTokenizer.VOCAB_SIZE, np.int64)
    streams = [ByteTokenizer().encode(p) for p in humaneval.load_prompts(10)]
    top_k = np.zeros((ByteTokenizer.VOCAB_SIZE, bigram.TOP_K), np.int32)  # best-first trees
    table, _ = bigram.build_table(streams, ByteTokenizer.VOCAB_SIZE, unigram=unigram, top_k=top_k)
    path = tmp_path_factory.mktemp("table") / "bytes.npz"
    bigram.save_table(table, path, unigram=unigram, top_k=top_k)
    return str(path)


def run_job(tmp_path, *bindings) -> dict:
    out = tmp_path / "trees.json"
    args = ["--gin_file", "benchmarks/configs/trees.gin"]
    for binding in (*TOYS, f"OUT_PATH = '{out}'", f"MARKDOWN_PATH = '{tmp_path / 'trees.md'}'",
                    *bindings):
        args += ["--gin_bindings", binding]
    assert bench_main.main(args) == 0
    return json.loads(out.read_text())


def common_bindings(byte_table, configs) -> list[str]:
    return ["runtime.cpu_kernel = False", f"BIGRAM_TABLE = '{byte_table}'",
            "bench_trees.num_prompts = 2", "bench_trees.max_new_tokens = 12",
            f"bench_trees.configs = {configs!r}"]


def check_report(report: dict, configs: list[dict]) -> list[str]:
    """What every run's report holds; returns the configuration names."""
    names = [c.get("name") or trees.check_configs([c])[0].name for c in configs]
    assert list(report["configs"]) == names and report["reference"] == names[0]
    for name, summary in report["configs"].items():
        rows = report["rows"][name]
        assert [r["prompt"] for r in rows] == [0, 1]
        assert all(len(r["tokens"]) == 12 for r in rows)  # bytes have no EOS
        assert summary["rounds"] == sum(r["target_calls"] for r in rows)
        per_call, low, high = summary["tokens_per_target_call_ci95"]
        assert 1 <= low <= per_call <= high <= summary["depth"] + 1
        assert summary["nan_logits"] == 0
        for label in ("H100", "H200"):
            predicted = summary["predicted"][label]
            assert predicted["speedup_ci95"][0] > 0
            assert predicted["target_width_status"] in ("measured", "fit", "extrapolated")
            assert predicted["drafter_priced"] == (summary["config"]["drafter"] == "model")
        if summary["config"]["temperature"] == 0 and name != names[0]:
            # Greedy: every chain and tree writes the reference's tokens.
            assert summary["identical_to_reference"], name
    return names


def test_bench_trees_end_to_end_and_resumes(tmp_path, byte_table, monkeypatch):
    common = common_bindings(byte_table, CONFIGS)
    report = run_job(tmp_path, *common)
    names = check_report(report, CONFIGS)
    configs = report["configs"]
    assert configs[names[1]]["num_nodes"] == 2 + 2 + 2 and configs["paired"]["num_nodes"] == 6
    # The H100 report measured K = 1, 4..8: a 6-node tree's call (K = 7) is measured.
    assert configs[names[1]]["predicted"]["H100"]["target_width_status"] == "measured"
    # T = 1: both verifiers saw every round's tree; the driving one's counts are the loop's.
    paired = configs["paired"]
    assert paired["paired_rounds_match"]
    for row in report["rows"]["paired"]:
        assert row["paired_accepted"]["traversal"] == row["accepted"]
    assert set(paired["paired_verifiers"]) == {"traversal", "rrs"}
    diff = paired["paired_verifiers"]["rrs"]["traversal_minus_this_ci95"]
    assert diff[1] <= diff[0] <= diff[2]
    text = (tmp_path / "trees.md").read_text()
    assert "Verifiers on the same trees" in text and "| paired | rrs |" in text

    # A rerun with the same protocol measures nothing again.
    monkeypatch.setattr(trees, "run_config", lambda *a, **k: pytest.fail("measured again"))
    again = run_job(tmp_path, *common)
    assert again["configs"] == report["configs"]
    # Nor does a report from before replays (no 'counted_by': every row was the loop's).
    stored = json.loads((tmp_path / "trees.json").read_text())
    for summary in stored["configs"].values():
        del summary["counted_by"]
    (tmp_path / "trees.json").write_text(json.dumps(stored))
    assert run_job(tmp_path, *common)["configs"] == report["configs"]

    # TPU prices from compile reports reprice the stored rows; nothing loads.
    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: pytest.fail("a model was loaded"))
    compiled = tmp_path / "compile.json"
    compiled.write_text(json.dumps(synthetic_compile_report()))
    priced = run_job(tmp_path, *common, f"bench_trees.tpu_reports = {{'v5e': ['{compiled}']}}")
    chain = priced["configs"][names[0]]  # Max-Gram, G = 3: 3 lookups and a call of 4 per round
    rows = priced["rows"][names[0]]
    tokens = sum(r["accepted"] + r["rounds"] for r in rows)
    expected = tokens * tpu_call_s(1) / sum(r["rounds"] * (tpu_call_s(4) + 3 * MAG_STEP_S)
                                          for r in rows)
    assert chain["predicted"]["v5e"]["speedup_ci95"][0] == pytest.approx(expected)
    assert chain["predicted"]["v5e"]["max_gram_round_s"] == pytest.approx(3 * MAG_STEP_S)
    assert chain["predicted"]["H100"]["max_gram_round_s"] == 0.0  # free on a GPU
    tree = priced["configs"][names[1]]  # the 0.5B's tree: drafter programs price its calls
    assert tree["predicted"]["v5e"]["drafter_priced"]
    assert tree["predicted"]["v5e"]["speedup_ci95"][0] > 0
    assert {k: v for k, v in priced["configs"][names[1]].items() if k != "predicted"} == \
        {k: v for k, v in report["configs"][names[1]].items() if k != "predicted"}
    assert "TPU compiler estimate" in (tmp_path / "trees.md").read_text()


MAG_STEP_S = 0.002


def tpu_call_s(width: int) -> float:
    return 0.01 + 0.001 * width


def synthetic_compile_report() -> dict:
    """A compile report of the programs TPU prices read (``load_tpu_steps``)."""
    record = lambda s: {"status": "compiled", "optimal_s": s, "floor_s": s / 2}  # noqa: E731
    programs = {f"target_k{k}": record(tpu_call_s(k)) for k in range(1, 10)}
    programs.update(drafter_k1=record(0.004), drafter_tree_w8=record(0.005),
                    maxgram_step=record(MAG_STEP_S))
    return {"settings": {"topology": "v5e:2x2"}, "programs": programs}


def test_tpu_steps_refuse_a_report_without_the_one_token_steps(tmp_path):
    compiled = tmp_path / "compile.json"
    report = synthetic_compile_report()
    report["programs"]["target_k1"]["optimal_s"] = -80.0  # sliced prefetches: unusable
    compiled.write_text(json.dumps(report))
    with pytest.raises(ValueError, match="one-token step"):
        trees.load_tpu_steps([str(compiled)])
    steps = trees.load_tpu_steps([str(compiled), str(write(tmp_path / "b.json",
                                                            synthetic_compile_report()))])
    assert steps["target"][1] == tpu_call_s(1) and steps["mag_trie_s"] == {}
    trie = trees.check_configs([{"drafter": "mag", "tree": "trie:16,8", "temperature": 0.0,
                                 "verifiers": ["greedy"]}])[0]
    assert trees.max_gram_round_s(trie, steps) is None  # no compiled tree of that budget


def write(path, data):
    path.write_text(json.dumps(data))
    return path


@pytest.mark.long
def test_bench_trees_model_chain_and_maxgram_tree(tmp_path, byte_table):
    configs = MORE_CONFIGS + CONFIGS[1:2]
    report = run_job(tmp_path, *common_bindings(byte_table, configs))
    check_report(report, configs)


def test_bench_trees_replays_max_gram_trees(tmp_path, byte_table):
    """T = 0 Max-Gram configurations counted by replay (no target call) from
    a greedy reference the job computes and stores once; ``replay_check``
    decodes them in the real loop too, and every prompt's accepted histogram
    and tokens equal the replay's."""
    configs = [{"drafter": "mag", "tree": "chain:3", "temperature": 0.0, "verifiers": ["token"]},
               {"drafter": "mag", "tree": "trie:6,3", "temperature": 0.0,
                "verifiers": ["greedy"]}]
    replay = tmp_path / "greedy.json"
    bindings = common_bindings(byte_table, configs) + [f"bench_trees.replay = '{replay}'",
                                                       "bench_trees.replay_length = 4"]
    report = run_job(tmp_path, *bindings)
    names = check_report(report, configs)
    stored = json.loads(replay.read_text())
    assert len(stored["continuations"]) == 2 and len(stored["continuations"][0]) == 12 + 4
    assert report["configs"][names[1]]["num_nodes"] == 6
    assert report["configs"][names[1]]["config"]["bigram_columns"] == bigram.TOP_K
    assert all(report["configs"][n]["counted_by"] == "replay" for n in names)
    (tmp_path / "check").mkdir()
    checked = run_job(tmp_path / "check", *bindings, "bench_trees.replay_check = True")
    for name in names:
        assert checked["configs"][name]["replay_equal_per_prompt"] == [True, True]
        assert checked["configs"][name]["tokens_per_target_call_ci95"] == \
            report["configs"][name]["tokens_per_target_call_ci95"]


@pytest.mark.parametrize(("binding", "message"), [
    ("bench_trees.configs = []", "configs is empty"),
    ("bench_trees.configs = [{'drafter': 'model', 'tree': 'chain:3'}]", "exactly the fields"),
    ("bench_trees.configs = [{'drafter': 'big', 'tree': 'chain:3', 'temperature': 0.0, "
     "'verifiers': ['token']}]", "drafter"),
    ("bench_trees.configs = [{'drafter': 'model', 'tree': 'chain:0', 'temperature': 0.0, "
     "'verifiers': ['token']}]", "chain:G"),
    ("bench_trees.configs = [{'drafter': 'model', 'tree': 'chain:3', 'temperature': 0.0, "
     "'verifiers': ['rrs']}]", "one chain verifier"),
    ("bench_trees.configs = [{'drafter': 'model', 'tree': '2,0', 'temperature': 0.0, "
     "'verifiers': ['greedy']}]", "positive integers"),
    ("bench_trees.configs = [{'drafter': 'mag', 'tree': 'dynamic:3,1,2', 'temperature': 0.0, "
     "'verifiers': ['greedy']}]", "Max-Gram trees are static"),
    ("bench_trees.configs = [{'drafter': 'model', 'tree': 'trie:8,3', 'temperature': 0.0, "
     "'verifiers': ['greedy']}]", "Max-Gram's"),
    ("bench_trees.configs = [{'drafter': 'mag', 'tree': 'trie:8', 'temperature': 0.0, "
     "'verifiers': ['greedy']}]", "trie:NODES,DEPTH"),
    ("bench_trees.replay_length = 0", "replay_length"),
    ("bench_trees.configs = [{'drafter': 'model', 'tree': '2,1', 'temperature': 1.0, "
     "'verifiers': ['traversal', 'nope']}]", "nope"),
    ("bench_trees.configs = [{'drafter': 'model', 'tree': '2,1', 'temperature': 0.0, "
     "'verifiers': ['traversal', 'rrs']}]", "at T = 0"),
    ("bench_trees.configs = [{'drafter': 'model', 'tree': '2,1', 'temperature': -1.0, "
     "'verifiers': ['rrs']}]", "temperature"),
    ("bench_trees.num_prompts = 0", "num_prompts"),
    ("bench_trees.draft_weights = 'int4'", "int4"),
    ("bench_trees.task = 'nope'", "unknown task"),
    ("bench_trees.gpu_steps = {'X': 'benchmarks/reports/bench_scoring_cpu.json'}", "one-token"),
])
def test_bench_trees_refuses_bad_arguments_before_loading(tmp_path, monkeypatch, binding,
                                                          message):
    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=message):
        run_job(tmp_path, binding)


def test_gpu_reports_with_timed_max_gram_price_it(tmp_path):
    """A bench_accelerator report that timed Max-Gram's drafting prices it (G
    lookups per chain round, the timed best-first tree per trie round, other
    Max-Gram trees not priced); one without it leaves Max-Gram free."""
    steps_1 = {"1": {"step_s": 0.002}, "6": {"step_s": 0.0021}}
    section = {"steps": {"target": {"1": steps_1}, "drafter": {"1": {"1": {"step_s": 0.001}}}},
               "max_gram": {"context": 2048, "lookup_s": 0.0003, "trie_s": {"trie:16,8": 0.0007}}}
    report = {"environment": {"device_kind": "test GPU"}, "by_dtype": {"bfloat16": section}}
    timed = trees.load_gpu_steps(str(write(tmp_path / "timed.json", report)))
    untimed = trees.load_gpu_steps(str(write(tmp_path / "untimed.json", {
        **report, "by_dtype": {"bfloat16": {"steps": section["steps"]}}})))
    config = lambda tree, drafter="mag": trees.check_configs([  # noqa: E731
        {"drafter": drafter, "tree": tree, "temperature": 0.0,
         "verifiers": ["token" if tree.startswith("chain") else "greedy"]}])[0]
    assert trees.max_gram_round_s(config("chain:3"), timed) == pytest.approx(3 * 0.0003)
    assert trees.max_gram_round_s(config("trie:16,8"), timed) == 0.0007
    assert trees.max_gram_round_s(config("trie:32,8"), timed) is None
    assert trees.max_gram_round_s(config("4,1,1"), timed) is None
    assert trees.max_gram_round_s(config("2,1", "model"), timed) == 0.0
    assert trees.max_gram_round_s(config("chain:3"), untimed) == 0.0

