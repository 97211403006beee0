"""The per-model benchmark (ours vs ``transformers`` on the same GGUF file):
its argument checks and table; end to end on real weights (slow)."""

from __future__ import annotations

import json

import pytest

from benchmarks import child, peers
from benchmarks import main as bench_main
from specdec_jax.checkpoints import registry
from specdec_jax.jobs import resolver


@pytest.mark.parametrize("binding, message", [
    ("bench_models.models = []", "models is empty"),
    ("bench_models.models = ['random:tiny-target']", "random:tiny-target"),
    ("bench_models.models = ['smollm2-135m', 'nope']", "'nope'"),
])
def test_bench_models_refuses_bad_arguments_before_loading(tmp_path, monkeypatch, binding,
                                                           message):
    monkeypatch.setattr(child, "run_in_child", lambda *a, **k: pytest.fail("a process started"))
    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(registry, "local_path", lambda *a, **k: pytest.fail("fetched"))
    with pytest.raises(ValueError, match=message):
        bench_main.main(["--gin_file", "benchmarks/configs/models.gin",
                        "--gin_bindings", f"OUT_PATH = '{tmp_path / 'models.json'}'",
                        "--gin_bindings", binding])


def test_bench_models_table_gives_theirs_over_ours():
    side = lambda s: {"load_s": 1.0, "rss_gb": 0.5, "k1_s": s, "k6_s": 2 * s}  # noqa: E731
    report = {"environment": {"machine": "m", "cpu_count": "2", "jax": "j"}, "torch": "t",
              "transformers": "x", "cache_fill": peers.FILL,
              "models": {"smollm2-135m": {"ours": side(0.01), "transformers": side(0.03)}}}
    text = peers.models_markdown(report)
    assert "| smollm2-135m | 1.0 / 1.0 | 0.50 / 0.50 | 10 / 30, 3.00x | 20 / 60, 3.00x |" in text


@pytest.mark.slow
def test_bench_models_end_to_end(tmp_path):
    """Both sides on the smallest registry model, each in its own process."""
    name = "smollm2-135m"
    try:
        registry.local_path(name)
    except (ConnectionError, PermissionError) as err:
        pytest.skip(f"weights of {name} cannot be fetched here: {err}")
    assert bench_main.main(["--gin_file", "benchmarks/configs/models.gin",
                           "--gin_bindings", f"bench_models.models = ['{name}']",
                           "--gin_bindings", f"OUT_PATH = '{tmp_path / 'models.json'}'",
                           "--gin_bindings", f"MARKDOWN_PATH = '{tmp_path / 'models.md'}'"]) == 0
    row = json.loads((tmp_path / "models.json").read_text())["models"][name]
    for side in ("ours", "transformers"):
        assert row[side]["load_s"] > 0 and row[side]["k1_s"] > 0 and row[side]["k6_s"] > 0
    assert f"| {name} |" in (tmp_path / "models.md").read_text()
