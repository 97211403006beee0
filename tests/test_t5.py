"""T5 v1.1 encoder-decoder: parity with transformers, cache/rollback semantics,
ragged batches, bad input, and the t5x parameter tree."""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import specdec_jax
from specdec_jax.checkpoints.hf_t5 import (
    t5_config_from_hf,
    t5_config_to_hf,
    t5_params_from_hf,
    t5_params_to_hf,
)
from specdec_jax.models import make_prompt
from specdec_jax.models.t5 import T5Config, T5EncoderDecoderLM, relative_position_bucket
from tests.t5x_format import write_t5x_checkpoint

TOL = 1e-4
VOCAB = 64
START = 0  # HF T5 starts the decoder from the pad token
HF_CONFIG = dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=48, num_heads=4, num_layers=2,
                 num_decoder_layers=2, feed_forward_proj="gated-gelu",
                 tie_word_embeddings=False, dropout_rate=0.0)
INPUT = [5, 9, 33, 2, 17, 60, 4]
# One cache shape for every test: each distinct shape compiles once, so sharing
# shapes keeps the suite fast.
MAX_LENGTH, MAX_INPUT_LENGTH = 16, 8


def small_hf_t5(seed: int = 0):
    """A random small T5 v1.1 (torch, float32, eval) with every weight distinct."""
    torch.manual_seed(seed)
    config = transformers.T5Config(**HF_CONFIG)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        # transformers >= 5 ties lm_head to the shared embedding; v1.1 checkpoints
        # are untied, so give the head its own weights to exercise that path.
        model.lm_head.weight = torch.nn.Parameter(
            0.2 * torch.randn_like(model.lm_head.weight))
        # Norm scales start at one; perturb them so a swapped norm shows up.
        for name, tensor in model.named_parameters():
            if "layer_norm" in name:
                tensor.add_(0.1 * torch.randn_like(tensor))
    return model, config.to_dict()


def hf_logits(model, inputs: list[int], decoder_inputs: list[int]) -> np.ndarray:
    """Teacher-forced next-token logits [len(decoder_inputs), V] from the peer."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([inputs]),
                    decoder_input_ids=torch.tensor([decoder_inputs]))
    return out.logits[0].numpy()


@dataclasses.dataclass(frozen=True)
class Pair:
    """The peer, our model with its weights, and jitted methods shared by the
    module's tests (each distinct shape compiles once)."""

    hf_model: Any
    model: T5EncoderDecoderLM
    params: dict
    prefill: Callable
    extend: Callable


@pytest.fixture(scope="module")
def pair() -> Pair:
    hf_model, config = small_hf_t5()
    cfg = t5_config_from_hf(config)
    state = {k: v.detach().numpy() for k, v in hf_model.state_dict().items()}
    model = T5EncoderDecoderLM(cfg)
    return Pair(hf_model, model, t5_params_from_hf(state, cfg), jax.jit(model.prefill),
                jax.jit(model.extend))


def test_relative_position_buckets_match_transformers():
    """Both bucketings over distances well past max_distance (log branch included)."""
    relative = np.arange(-300, 301)
    for bidirectional in (True, False):
        theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
            torch.tensor(relative), bidirectional=bidirectional, num_buckets=32,
            max_distance=128).numpy()
        bucket = jax.jit(functools.partial(relative_position_bucket,
                                           bidirectional=bidirectional, num_buckets=32,
                                           max_distance=128))
        ours = bucket(jnp.asarray(relative))
        np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_teacher_forced_logits_match_transformers(pair):
    """A whole decoder sequence in one extend. (Tests run the methods jitted:
    eager JAX compiles every op per shape, which costs more than it checks.)"""
    decoder_inputs = [START, 7, 12, 40, 3, 3, 55, 21, 8, 1]
    reference = hf_logits(pair.hf_model, INPUT, decoder_inputs)
    cache = pair.model.init_cache(1, MAX_LENGTH, MAX_INPUT_LENGTH)
    out = pair.prefill(pair.params, make_prompt([INPUT]), cache)
    assert out.logits.shape == (1, 1, VOCAB) and out.logits.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out.cache.lengths), [0])
    # prefill's logits preview the start token's step.
    np.testing.assert_allclose(np.asarray(out.logits[0, 0]), reference[0], atol=TOL, rtol=0)
    full = pair.extend(pair.params, jnp.asarray([decoder_inputs]), out.cache)
    assert full.hidden.shape == (1, len(decoder_inputs), pair.model.config.d_model)
    np.testing.assert_array_equal(np.asarray(full.cache.lengths), [len(decoder_inputs)])
    np.testing.assert_allclose(np.asarray(full.logits[0]), reference, atol=TOL, rtol=0)


def test_ragged_incremental_extends_with_rollbacks_match_rows_alone(pair):
    """Mixed K=1 / K=5 extends with per-row rollbacks on a ragged batch.

    The rows have different input lengths (so the encoder sees padding) and
    keep different numbers of each step's tokens; after every step each row's
    logits must equal the peer run on that row alone: unpadded input, full
    correct decoder prefix.
    """
    rng = np.random.default_rng(0)
    inputs = [INPUT, [11, 12], [13, 14, 15, 16]]
    ks = [1, 5, 1, 5, 5, 1, 5]  # tokens fed per step (the batch shares K)
    keeps = [[1, 3, 1, 0, 5, 0, 2],  # tokens of each step row b keeps (then rolls back)
             [1, 5, 0, 2, 1, 1, 0],
             [1, 0, 1, 5, 3, 0, 5]]
    cache = pair.model.init_cache(len(inputs), MAX_LENGTH, MAX_INPUT_LENGTH)
    cache = pair.prefill(pair.params, make_prompt(inputs), cache).cache
    histories: list[list[int]] = [[] for _ in inputs]
    for step, k in enumerate(ks):
        if step == 0:
            new = [[START] for _ in inputs]
        else:
            new = [[int(t) for t in rng.integers(0, VOCAB, size=k)] for _ in inputs]
        out = pair.extend(pair.params, jnp.asarray(new), cache)
        for row, tokens in enumerate(inputs):
            alone = hf_logits(pair.hf_model, tokens, histories[row] + new[row])[-k:]
            np.testing.assert_allclose(np.asarray(out.logits[row]), alone, atol=TOL, rtol=0)
            histories[row] += new[row][:keeps[row][step]]
        lengths = jnp.asarray([len(h) for h in histories], jnp.int32)
        cache = out.cache.replace(lengths=lengths)


def test_greedy_generation_matches_transformers(pair):
    """The decoding loop drives T5 from its start token (the pending token
    after prefill) and emits the peer's greedy tokens."""
    steps = 6
    expected = [START]
    for _ in range(steps):
        expected.append(int(hf_logits(pair.hf_model, INPUT, expected)[-1].argmax()))
    out = specdec_jax.generate(target=pair.model, target_params=pair.params, prompts=[INPUT],
                               method="autoregressive", max_new_tokens=steps)
    assert np.asarray(out.tokens[0]).tolist() == expected[1:]


def test_param_tree_has_t5x_names(pair):
    model, params = pair.model, pair.params
    cfg = model.config
    inner, buckets = cfg.num_heads * cfg.d_kv, cfg.relative_attention_num_buckets
    attention = {f"{n}/kernel": (cfg.d_model, inner) for n in ("query", "key", "value")}
    attention["out/kernel"] = (inner, cfg.d_model)
    mlp = {"mlp/wi_0/kernel": (cfg.d_model, cfg.d_ff), "mlp/wi_1/kernel": (cfg.d_model, cfg.d_ff),
           "mlp/wo/kernel": (cfg.d_ff, cfg.d_model)}
    expected = {"token_embedder/embedding": (VOCAB, cfg.d_model),
                "encoder/relpos_bias/rel_embedding": (cfg.num_heads, buckets),
                "encoder/encoder_norm/scale": (cfg.d_model,),
                "decoder/relpos_bias/rel_embedding": (cfg.num_heads, buckets),
                "decoder/decoder_norm/scale": (cfg.d_model,),
                "decoder/logits_dense/kernel": (cfg.d_model, VOCAB)}
    for i in range(cfg.num_encoder_layers):
        layer = f"encoder/layers_{i}"
        for norm in ("pre_attention_layer_norm", "pre_mlp_layer_norm"):
            expected[f"{layer}/{norm}/scale"] = (cfg.d_model,)
        expected.update({f"{layer}/attention/{k}": v for k, v in attention.items()})
        expected.update({f"{layer}/{k}": v for k, v in mlp.items()})
    for i in range(cfg.num_decoder_layers):
        layer = f"decoder/layers_{i}"
        for norm in ("pre_self_attention_layer_norm", "pre_cross_attention_layer_norm",
                     "pre_mlp_layer_norm"):
            expected[f"{layer}/{norm}/scale"] = (cfg.d_model,)
        for block in ("self_attention", "encoder_decoder_attention"):
            expected.update({f"{layer}/{block}/{k}": v for k, v in attention.items()})
        expected.update({f"{layer}/{k}": v for k, v in mlp.items()})

    def shapes(tree):
        return {"/".join(k.key for k in path): tuple(np.shape(leaf))
                for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}

    assert shapes(params) == expected
    assert shapes(jax.eval_shape(model.init_params, jax.random.key(0))) == expected


def test_hf_export_round_trip_loads_strictly(pair):
    hf_model, model, params = pair.hf_model, pair.model, pair.params
    state = t5_params_to_hf(params, model.config)
    back = t5_params_from_hf(state, model.config)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)
    fresh = transformers.T5ForConditionalGeneration(
        transformers.T5Config(**t5_config_to_hf(model.config))).eval()
    fresh.lm_head.weight = torch.nn.Parameter(torch.empty_like(fresh.lm_head.weight))
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    decoder_inputs = [START, 7, 12]
    np.testing.assert_allclose(hf_logits(fresh, INPUT, decoder_inputs),
                               hf_logits(hf_model, INPUT, decoder_inputs), atol=1e-6, rtol=0)


@pytest.mark.parametrize("bad, message", [
    ("long_prompt", "does not fit a cache of max_input_length"),
    ("prompt_oov", "outside the vocabulary"),
    ("prompt_batch", "batch size"),
    ("lengths_past_width", "exceed the token array's width"),
    ("past_end", "passes the cache's end"),
    ("oov", "outside the vocabulary"),
    ("batch", "batch size"),
    ("rank", r"tokens must be int \[B, K\]"),
])
def test_bad_input_is_named(pair, bad, message):
    model, params = pair.model, pair.params
    cache = model.init_cache(1, MAX_LENGTH, MAX_INPUT_LENGTH)
    with pytest.raises(ValueError, match=message):
        if bad == "long_prompt":
            model.prefill(params, make_prompt([list(range(MAX_INPUT_LENGTH + 1))]), cache)
        elif bad == "prompt_oov":
            model.prefill(params, make_prompt([[1, VOCAB]]), cache)
        elif bad == "prompt_batch":
            model.prefill(params, make_prompt([[1], [2]]), cache)
        elif bad == "lengths_past_width":
            prompt = make_prompt([[1, 2]])
            model.prefill(params, prompt.replace(lengths=jnp.asarray([3], jnp.int32)), cache)
        elif bad == "past_end":
            cache = cache.replace(lengths=jnp.asarray([MAX_LENGTH - 2], jnp.int32))
            model.extend(params, jnp.asarray([[1, 2, 3]]), cache)
        elif bad == "oov":
            model.extend(params, jnp.asarray([[START, VOCAB]]), cache)
        elif bad == "batch":
            model.extend(params, jnp.asarray([[START], [START]]), cache)
        else:
            model.extend(params, jnp.asarray([START]), cache)


def test_bad_configs_and_checkpoints_are_named(pair):
    model, params = pair.model, pair.params
    _, config = small_hf_t5()
    with pytest.raises(ValueError, match="only T5 v1.1"):
        t5_config_from_hf({**config, "feed_forward_proj": "relu"})
    with pytest.raises(ValueError, match="rescales decoder outputs"):
        t5_config_from_hf({**config, "scale_decoder_outputs": True})
    with pytest.raises(ValueError, match="unknown architecture"):
        t5_config_from_hf({**config, "model_type": "bart"})
    with pytest.raises(ValueError, match="must be positive"):
        T5Config(vocab_size=VOCAB, d_model=0, d_kv=8, d_ff=48, num_heads=4,
                 num_encoder_layers=1, num_decoder_layers=1)
    state = t5_params_to_hf(params, model.config)
    missing = {k: v for k, v in state.items() if k != "decoder.final_layer_norm.weight"}
    with pytest.raises(ValueError, match="missing tensor 'decoder.final_layer_norm.weight'"):
        t5_params_from_hf(missing, model.config)
    name = "encoder.block.1.layer.1.DenseReluDense.wi_1.weight"
    wrong = {**state, name: state[name][:-1]}
    with pytest.raises(ValueError, match="encoder/layers_1/mlp/wi_1/kernel has shape"):
        t5_params_from_hf(wrong, model.config)


def test_t5x_checkpoint_loads_with_inferred_config(pair, tmp_path):
    import ml_dtypes

    from specdec_jax.checkpoints import t5x_io

    bf16 = "decoder/layers_0/mlp/wo/kernel"
    write_t5x_checkpoint(tmp_path / "model" / "checkpoint_100", pair.params,
                         inline=("encoder/encoder_norm/scale",), bfloat16=(bf16,))
    shifted = jax.tree_util.tree_map(lambda x: np.asarray(x) + 1, pair.params)
    write_t5x_checkpoint(tmp_path / "model" / "checkpoint_20", shifted)

    model, params = t5x_io.load_t5x(tmp_path / "model")  # latest step: 100
    assert model.config == pair.model.config
    for path, value in jax.tree_util.tree_flatten_with_path(pair.params)[0]:
        name = "/".join(k.key for k in path)
        got = params
        for k in path:
            got = got[k.key]
        expected = np.asarray(value)
        if name == bf16:
            expected = expected.astype(ml_dtypes.bfloat16).astype(np.float32)
            assert np.abs(expected - np.asarray(value)).max() > 0  # really rounded
        np.testing.assert_array_equal(got, expected, err_msg=name)
    _, older = t5x_io.load_t5x(tmp_path / "model", step=20)
    np.testing.assert_array_equal(older["token_embedder"]["embedding"],
                                  np.asarray(pair.params["token_embedder"]["embedding"]) + 1)


def test_t5x_checkpoint_errors_are_named(pair, tmp_path):
    import shutil

    from specdec_jax.checkpoints import t5x_io

    step_dir = tmp_path / "checkpoint_7"
    write_t5x_checkpoint(step_dir, pair.params)
    with pytest.raises(FileNotFoundError, match="step 8 is not in .* it has steps \\[7\\]"):
        t5x_io.load_t5x(tmp_path, step=8)
    with pytest.raises(FileNotFoundError, match="no t5x checkpoint"):
        t5x_io.load_t5x(tmp_path / "checkpoint_7" / "target.token_embedder.embedding")
    shutil.rmtree(step_dir / "target.decoder.decoder_norm.scale")
    with pytest.raises(FileNotFoundError, match="decoder/decoder_norm/scale: its array"):
        t5x_io.load_t5x(step_dir)
    extra = {**pair.params, "decoder": {**pair.params["decoder"],
                                        "extra": {"kernel": np.zeros((2, 2), np.float32)}}}
    write_t5x_checkpoint(tmp_path / "extra", extra)
    with pytest.raises(ValueError, match="does not use: \\['decoder/extra/kernel'\\]"):
        t5x_io.load_t5x(tmp_path / "extra")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "checkpoint").write_bytes(b"\x93not msgpack")
    with pytest.raises(ValueError, match="not a t5x msgpack checkpoint|no optimizer target"):
        t5x_io.load_t5x(tmp_path / "bad")


def test_accelerator_precision_reaches_every_t5_matmul(pair):
    """matmul_precision="highest" (float32 on a GPU/TPU, specdec_jax.precision)
    reaches every dot of encoder and decoder; the default leaves them alone on CPU."""
    import dataclasses

    strict = T5EncoderDecoderLM(dataclasses.replace(pair.model.config,
                                                    matmul_precision="highest"))
    # The default config resolves where it runs: exact float32 on CPU, HIGHEST elsewhere.
    for model, highest in ((strict, True), (pair.model, jax.default_backend() != "cpu")):
        cache = model.init_cache(1, MAX_LENGTH, MAX_INPUT_LENGTH)
        text = str(jax.make_jaxpr(model.prefill)(pair.params, make_prompt([INPUT]), cache))
        dots = text.count("dot_general[")
        assert dots >= 4 * pair.model.config.num_encoder_layers
        assert text.count("Precision.HIGHEST") == (2 * dots if highest else 0)


def test_logits_at_runs_the_head_on_the_chosen_positions_only(pair):
    cache = pair.model.init_cache(2, MAX_LENGTH, MAX_INPUT_LENGTH)
    cache = pair.prefill(pair.params, make_prompt([INPUT, [11, 12]]), cache).cache
    tokens = jnp.asarray([[START, 9, 60, 1], [START, 8, 11, 4]])
    full = pair.extend(pair.params, tokens, cache)
    at = jnp.asarray([[3, 1], [0, 2]])
    chosen = pair.extend(pair.params, tokens, cache, logits_at=at)
    for row in range(2):
        np.testing.assert_allclose(np.asarray(chosen.logits[row]),
                                   np.asarray(full.logits[row, at[row]]), atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(chosen.hidden[row]),
                                   np.asarray(full.hidden[row, at[row]]), atol=TOL, rtol=0)
    np.testing.assert_array_equal(np.asarray(chosen.cache.lengths), [4, 4])
