"""The accelerator benchmark's pieces: architectures of the exact shapes, in-loop
timing helpers, and the benchmark end to end on tiny random-weight models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import api
from specdec_jax.checkpoints import load, registry
from specdec_jax.checkpoints.hf_decoder import decoder_config_from_hf
from specdec_jax.models.decoder import DecoderOnlyLM
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "eval"))

# Published parameter counts (the model cards' safetensors totals).
PUBLISHED = {"smollm2-135m": 134_515_008, "qwen2.5-coder-0.5b": 494_032_768,
             "qwen2.5-coder-1.5b": 1_543_714_304, "qwen2.5-coder-7b": 7_615_616_512}

TINY = {
    "tiny-target": dict(model_type="qwen2", vocab_size=256, hidden_size=64,
                        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, tie_word_embeddings=True),
    "tiny-drafter": dict(model_type="llama", vocab_size=256, hidden_size=32,
                         intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, tie_word_embeddings=False),
}


@pytest.fixture
def tiny_architectures(monkeypatch):
    monkeypatch.setattr(registry, "ARCHITECTURES", {**registry.ARCHITECTURES, **TINY})


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_architectures_have_the_published_parameter_counts(name):
    model = DecoderOnlyLM(decoder_config_from_hf(registry.architecture(name)))
    shapes = jax.eval_shape(model.init_params, jax.random.PRNGKey(0))
    assert sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes)) \
        == PUBLISHED[name]


def test_unknown_architecture_names_the_known_ones():
    with pytest.raises(KeyError, match="qwen2.5-coder-7b"):
        registry.architecture("gpt-5")


def test_random_models_take_the_dtype_and_seeds_give_independent_weights(tiny_architectures):
    model, first = load.random_model("tiny-target", "bfloat16", seed=0)
    _, second = load.random_model("tiny-target", "bfloat16", seed=1)
    assert model.config.hidden_size == 64 and model.config.qkv_bias
    leaves = jax.tree_util.tree_leaves(first)
    assert {x.dtype for x in leaves} == {jnp.dtype("bfloat16")}
    kernel = lambda p: np.asarray(p["layers_0"]["mlp"]["wi_0"]["kernel"], np.float32)  # noqa: E731
    assert not np.allclose(kernel(first), kernel(second))


def test_prefill_timer_keeps_the_prefill(tiny_architectures):
    """Returning the pending token alone (the prompt's last token) let XLA drop
    the whole prefill: the timed function computed nothing."""
    model, params = load.random_model("tiny-target", "float32")
    prompt = make_prompt([[1, 2, 3, 4, 5]])
    fn = timing.prefill_fn(model, 16)
    assert "dot(" in fn.lower(params, prompt).compile().as_text()
    cache = fn(params, prompt)
    assert int(cache.lengths[0]) == 4
    from specdec_jax.drafting.base import start_token_and_prefill  # noqa: PLC0415
    token_only = jax.jit(lambda p, pr: start_token_and_prefill(model, p, pr, 16)[1])
    assert "dot(" not in token_only.lower(params, prompt).compile().as_text()


def test_round_overhead_is_zero_when_a_round_costs_its_calls():
    assert timing.round_overhead(0.5 * 3 + 2.0, 3, 0.5, 2.0) == pytest.approx(0.0)
    assert timing.round_overhead(2 * (0.5 * 3 + 2.0), 3, 0.5, 2.0) == pytest.approx(1.0)


def test_bench_accelerator_end_to_end(tiny_architectures, tmp_path):
    import bench_accelerator  # noqa: PLC0415

    out = tmp_path / "accel.json"
    new_tokens = 12  # a multiple of G + 1: every all-accept round is whole
    bench_accelerator.main([
        "--target", "tiny-target", "--drafter", "tiny-drafter", "--random-weights",
        "--dtypes", "float32", "--batch-sizes", "2", "--gammas", "3",
        "--methods", "specdecode", "--prompt-len", "8", "--max-new-tokens", str(new_tokens),
        "--steps", "2", "--repeats", "2", "--peers", "eager", "assisted",
        "--target-step-widths", "2", "4",
        "--out", str(out), "--markdown", str(tmp_path / "accel.md")])
    report = json.loads(out.read_text())
    section = report["by_dtype"]["float32"]
    assert set(section["steps"]) == {"target", "drafter"}
    # --target-step-widths adds widths to the target's table only (4 = G + 1 already there).
    assert set(section["steps"]["target"]["2"]) == {"1", "2", "4"}
    assert set(section["steps"]["drafter"]["2"]) == {"1", "4"}
    rows = {row["name"]: row for row in section["decoding"]}
    assert len(rows) == 3
    for row in rows.values():
        assert row["recompiles_after_first_call"] == 0 and row["jit_cache_entries"] == 1
        assert row["nan_logits"] == 0 and np.isfinite(row["round_overhead"])
    every = rows["specdecode G=3 all-accept"]
    assert every["acceptance"] == 1.0 and every["tokens_per_round"] == 4
    none = rows["specdecode G=3 none-accepted"]
    assert none["acceptance"] < 0.2 and none["drafter_calls_per_round"] >= 3
    assert len(section["predicted"]) == len(bench_accelerator.MEASURED_ACCEPTANCE)
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


def test_bench_speculative_subtracts_prefills_and_counts_drafter_calls(tiny_architectures):
    import bench_speculative  # noqa: PLC0415

    target, target_params = load.random_model("tiny-target", "float32", seed=0)
    drafter, drafter_params = load.random_model("tiny-drafter", "float32", seed=1)
    fn = api.make_generate_fn(target=target, drafter=drafter, gamma=3, max_new_tokens=8)
    prefills = [(timing.prefill_fn(m, 24), p) for m, p in ((target, target_params),
                                                            (drafter, drafter_params))]
    row, outputs = bench_speculative.run_prompts(
        fn, (target_params, drafter_params), [[1, 2, 3], [4, 5, 6, 7]], 4, 0.0,
        prefills=prefills)
    assert 0 < row["prefill_s"] < row["seconds"]
    assert row["decode_s"] == pytest.approx(row["seconds"] - row["prefill_s"])
    assert row["drafter_calls"] >= 3 * row["target_calls"] and len(outputs) == 2


def test_bench_scoring_times_both_kernel_layouts_in_one_process(tiny_architectures):
    """bench_scoring measures each K in each kernel layout on the same random
    weights, against the limits measured in the same process."""
    import bench_scoring  # noqa: PLC0415

    report = bench_scoring.measure("tiny-drafter", [1, 3], "", ["in_out", "out_in"], True)
    assert list(report["steps"]) == ["in_out K=1", "in_out K=3", "out_in K=1", "out_in K=3"]
    for row in report["steps"].values():
        assert row["step_s"] > 0 and row["over_limit"] > 0
    assert report["steps"]["out_in K=1"]["over_k1"] == 1.0 and report["random_weights"]
    text = bench_scoring.markdown({"model": "tiny-drafter", "variants": [report]})
    assert "| out_in | 3 |" in text and "random weights" in text
