"""The accelerator benchmark's pieces: architectures of the exact shapes, in-loop
timing helpers, and the benchmark job end to end on tiny random-weight models
(``registry.ARCHITECTURES``' tiny-target and tiny-drafter)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import accelerator
from benchmarks import main as bench_main
from specdec_jax.checkpoints import load, registry
from specdec_jax.checkpoints.hf_decoder import decoder_config_from_hf
from specdec_jax.decode import cost
from specdec_jax.jobs import resolver
from specdec_jax.models.decoder_only import DecoderOnlyLM
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing

# Published parameter counts (the model cards' safetensors totals).
PUBLISHED = {"smollm2-135m": 134_515_008, "qwen2.5-coder-0.5b": 494_032_768,
             "qwen2.5-coder-1.5b": 1_543_714_304, "qwen2.5-coder-7b": 7_615_616_512}

TINY_CONFIG = "benchmarks/configs/accelerator_tiny.gin"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_architectures_have_the_published_parameter_counts(name):
    model = DecoderOnlyLM(decoder_config_from_hf(registry.architecture(name)))
    shapes = jax.eval_shape(model.init_params, jax.random.PRNGKey(0))
    assert sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes)) \
        == PUBLISHED[name]


def test_unknown_architecture_names_the_known_ones():
    with pytest.raises(KeyError, match="qwen2.5-coder-7b"):
        registry.architecture("gpt-5")


def test_random_models_take_the_dtype_and_seeds_give_independent_weights():
    model, first = load.random_model("tiny-target", "bfloat16", seed=0)
    _, second = load.random_model("tiny-target", "bfloat16", seed=1)
    assert model.config.hidden_size == 64 and model.config.qkv_bias
    leaves = jax.tree_util.tree_leaves(first)
    assert {x.dtype for x in leaves} == {jnp.dtype("bfloat16")}
    kernel = lambda p: np.asarray(p["layers_0"]["mlp"]["wi_0"]["kernel"], np.float32)  # noqa: E731
    assert not np.allclose(kernel(first), kernel(second))


def test_prefill_timer_keeps_the_prefill():
    """Returning the pending token alone (the prompt's last token) let XLA drop
    the whole prefill: the timed function computed nothing."""
    model, params = load.random_model("tiny-target", "float32")
    prompt = make_prompt([[1, 2, 3, 4, 5]])
    fn = timing.prefill_fn(model, 16)
    assert "dot(" in fn.lower(params, prompt).compile().as_text()
    cache = fn(params, prompt)
    assert int(cache.lengths[0]) == 4
    from specdec_jax.models.interface import start_token_and_prefill  # noqa: PLC0415
    token_only = jax.jit(lambda p, pr: start_token_and_prefill(model, p, pr, 16)[1])
    assert "dot(" not in token_only.lower(params, prompt).compile().as_text()


def test_round_overhead_is_zero_when_a_round_costs_its_calls():
    assert timing.round_overhead(0.5 * 3 + 2.0, 3, 0.5, 2.0) == pytest.approx(0.0)
    assert timing.round_overhead(2 * (0.5 * 3 + 2.0), 3, 0.5, 2.0) == pytest.approx(1.0)


def run_tiny(tmp_path, *bindings):
    """The accelerator job on the tiny shapes through the launcher, float32."""
    args = ["--gin_file", TINY_CONFIG,
            "--gin_bindings", f"OUT_PATH = '{tmp_path / 'accel.json'}'",
            "--gin_bindings", f"MARKDOWN_PATH = '{tmp_path / 'accel.md'}'",
            "--gin_bindings", "bench_accelerator.dtypes = ['float32']"]
    for binding in bindings:
        args += ["--gin_bindings", binding]
    assert bench_main.main(args) == 0
    return json.loads((tmp_path / "accel.json").read_text())


@pytest.mark.long
def test_bench_accelerator_end_to_end(tmp_path):
    # accelerator_tiny.gin: G = 3, 12 new tokens (a multiple of G + 1: every
    # all-accept round is whole), 2 steps and 2 repeats, peers eager and assisted,
    # target step widths 2 and 4; batch 2 here.
    report = run_tiny(tmp_path, "bench_accelerator.batch_sizes = [2]")
    assert report["settings"]["target"] == "random:tiny-target:0"
    assert report["settings"]["random_weights"] is True
    section = report["by_dtype"]["float32"]
    assert set(section["steps"]) == {"target", "drafter"}
    # target_step_widths adds widths to the target's table only (4 = G + 1 already there).
    assert set(section["steps"]["target"]["2"]) == {"1", "2", "4"}
    assert set(section["steps"]["drafter"]["2"]) == {"1", "4"}
    # Max-Gram's drafting, timed over the tiny config's 64 tokens of text.
    max_gram = section["max_gram"]
    assert max_gram["context"] == 64 and max_gram["lookup_s"] > 0
    assert set(max_gram["trie_s"]) == {"trie:16,8"} and max_gram["trie_s"]["trie:16,8"] > 0
    rows = {row["name"]: row for row in section["decoding"]}
    assert len(rows) == 3
    for row in rows.values():
        assert row["recompiles_after_first_call"] == 0 and row["jit_cache_entries"] == 1
        assert row["nan_logits"] == 0 and np.isfinite(row["round_overhead"])
    every = rows["specdecode G=3 all-accept"]
    assert every["acceptance"] == 1.0 and every["tokens_per_round"] == 4
    none = rows["specdecode G=3 none-accepted"]
    assert none["acceptance"] < 0.2 and none["drafter_calls_per_round"] >= 3
    assert len(section["predicted"]) == len(accelerator.MEASURED_ACCEPTANCE)
    # The prediction's model against the one none-accepted run it can be checked on.
    agreement = section["predicted_agreement"]
    assert agreement["n"] == 1 and agreement["pearson"] is None
    assert np.isfinite(agreement["mean_bias"]) and agreement["mean_ratio"] > 0
    peers = section["peers"]
    assert set(peers["variants"]) == {"eager autoregressive", "eager assisted G=3 all-accept",
                                      "eager assisted G=3 none-accepted"}
    # Same weights, float32, greedy: the peer writes exactly our tokens.
    for name, variant in peers["variants"].items():
        assert variant["outputs_identical_to_ours"] == peers["prompts"] == 2
        # Ours of the same kind: autoregressive always; specdecode needs a batch-1 row.
        assert (variant["ours_tokens_per_s"] is None) == ("assisted" in name)
    text = (tmp_path / "accel.md").read_text()
    assert "round overhead" in text and "GPU: not measured" in text
    assert "none-accepted run: mean bias" in text
    assert "Max-Gram drafting, batch 1, 64 tokens of text" in text


def test_predictions_take_tokens_per_round_from_the_cost_model():
    rows = [{"batch": 1, "gamma": 0, "regime": None, "decode_tokens_per_s": 10.0},
            {"batch": 1, "method": "specdecode", "gamma": 5, "regime": "none-accepted",
             "round_s": 0.5, "acceptance": 0.0, "decode_tokens_per_s": 2.0}]
    for p in accelerator.predict(rows, [0.0, 0.87]):
        assert p["tokens_per_round"] == cost.tokens_per_round(p["acceptance"], 5)
        assert p["tokens_per_s"] == pytest.approx(p["tokens_per_round"] / 0.5)
        assert p["speedup_vs_autoregressive"] == pytest.approx(p["tokens_per_s"] / 10.0)
    # At its own acceptance (0: one token a round) the model gives 1 / 0.5 s = 2 tokens/s.
    stats = accelerator.predicted_agreement(rows)
    assert stats["n"] == 1 and stats["mean_bias"] == pytest.approx(0.0)


@pytest.mark.parametrize("binding, message", [
    ("bench_accelerator.gammas = [0]", "gammas"),
    ("bench_accelerator.batch_sizes = []", "batch_sizes is empty"),
    ("bench_accelerator.target_step_widths = [0]", "target_step_widths"),
    ("bench_accelerator.prompt_len = 1", "prompt_len"),
    ("bench_accelerator.max_gram_context = 8", "leaves no text"),
    ("bench_accelerator.max_gram_context = -1", "max_gram_context"),
    ("bench_accelerator.acceptance = [1.0]", r"\[0, 1\)"),
    ("bench_accelerator.methods = ['nope']", "methods"),
    ("bench_accelerator.peers = ['nope']", "peers"),
    ("bench_accelerator.dtypes = ['float64']", "float64"),
    ("bench_accelerator.kernel_layout = 'in_out'", "fused_projections = False"),
    ("bench_accelerator.fused_projections = 'yes'", "True or False"),
    ("DRAFTER = 'random:tiny-target:0'", "independent weights"),
    ("TARGET = 'random:no-such-architecture'", "registered architecture"),
    ("TARGET = 'no-such-model'", "unknown model"),
])
def test_bench_accelerator_refuses_bad_arguments_before_loading(tmp_path, monkeypatch, binding,
                                                                message):
    monkeypatch.setattr(resolver, "resolve", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(timing, "device_limits", lambda *a, **k: pytest.fail("timed"))
    with pytest.raises(ValueError, match=message):
        run_tiny(tmp_path, *binding.split("\n"))
