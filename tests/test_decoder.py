"""Decoder-only model: parity with transformers, cache/rollback semantics, bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.checkpoints.hf_decoder import decoder_params_to_hf
from specdec_jax.models import DecoderOnlyLM, make_prompt
from tests.hf_peer import hf_logits, ours_from_hf, small_hf_decoder

TOL = 1e-4


@pytest.fixture(scope="module", params=["llama", "qwen2", "llama-tied"])
def pair(request):
    family = request.param.split("-")[0]
    hf_model, config = small_hf_decoder(family, tie=request.param.endswith("tied"))
    cfg, params = ours_from_hf(hf_model, config)
    return hf_model, DecoderOnlyLM(cfg), params


def test_prefill_matches_transformers(pair):
    hf_model, model, params = pair
    tokens = [3, 17, 42, 5, 9, 60, 1, 33]
    out = model.extend(params, jnp.asarray([tokens]), model.init_cache(1, 16))
    np.testing.assert_allclose(np.asarray(out.logits[0]), hf_logits(hf_model, tokens),
                               atol=TOL, rtol=0)
    last = model.prefill(params, make_prompt([tokens]), model.init_cache(1, 16))
    np.testing.assert_allclose(np.asarray(last.logits[0, 0]), hf_logits(hf_model, tokens)[-1],
                               atol=TOL, rtol=0)


def test_accelerator_precision_reaches_every_matmul_and_keeps_parity(pair):
    """What load_model applies to float32 models on a GPU/TPU
    (precision.matmul_precision: "highest", not TF32) reaches every dot of the
    forward pass, and the logits still match transformers (on CPU both
    settings are exact float32; on a GPU only this one is)."""
    import dataclasses

    from specdec_jax import precision
    assert precision.matmul_precision("float32", backend="gpu") == "highest"
    hf_model, model, params = pair
    strict = DecoderOnlyLM(dataclasses.replace(model.config, matmul_precision="highest"))
    tokens = [3, 17, 42, 5, 9, 60, 1, 33]

    def logits(m, p, t):
        return m.extend(p, t, m.init_cache(1, 16)).logits

    # The default config resolves where it runs: exact float32 on CPU, HIGHEST elsewhere.
    default = None if jax.default_backend() == "cpu" else "Precision.HIGHEST"
    for m, expected in ((strict, "Precision.HIGHEST"), (model, default)):
        text = str(jax.make_jaxpr(lambda p, t, m=m: logits(m, p, t))(params,
                                                                   jnp.asarray([tokens])))
        dots = text.count("dot_general[")
        assert dots >= 7 * model.config.num_layers
        assert text.count("Precision.HIGHEST") == (2 * dots if expected else 0)
    np.testing.assert_allclose(np.asarray(logits(strict, params, jnp.asarray([tokens]))[0]),
                               hf_logits(hf_model, tokens), atol=TOL, rtol=0)


def test_incremental_extends_with_rollbacks_match_transformers(pair):
    """Mixed K=1 / K=5 extends with rollbacks; each step checked against the
    peer run on the full correct prefix."""
    hf_model, model, params = pair
    rng = np.random.default_rng(0)
    history = [int(t) for t in rng.integers(0, 64, size=4)]
    out = model.prefill(params, make_prompt([history]), model.init_cache(1, 40))
    cache = out.cache
    schedule = [(1, 0), (5, 3), (1, 1), (5, 0), (5, 5), (1, 0), (5, 2)]  # (K, tokens kept)
    for k, keep in schedule:
        new = [int(t) for t in rng.integers(0, 64, size=k)]
        out = model.extend(params, jnp.asarray([new]), cache)
        reference = hf_logits(hf_model, history + new)[-k:]
        np.testing.assert_allclose(np.asarray(out.logits[0]), reference, atol=TOL, rtol=0)
        history = history + new[:keep]
        cache = out.cache.replace(lengths=jnp.asarray([len(history)], jnp.int32))


def test_ragged_batch_equals_rows_alone(pair):
    """Different prompt lengths and rollbacks per row: each row as if run alone."""
    _, model, params = pair
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]
    feeds = [[[1, 2, 3], [4]], [[20, 21, 22], [23]], [[30, 31, 32], [33]]]
    keeps = [1, 3, 0]  # tokens of the first feed each row keeps before the second
    batch_cache = model.prefill(params, make_prompt(prompts), model.init_cache(3, 16)).cache
    out = model.extend(params, jnp.asarray([f[0] for f in feeds]), batch_cache)
    rolled = out.cache.replace(lengths=jnp.asarray([len(p) + k for p, k in zip(prompts, keeps)]))
    batch_logits = model.extend(params, jnp.asarray([f[1] for f in feeds]), rolled).logits
    for row, (prompt, feed, keep) in enumerate(zip(prompts, feeds, keeps)):
        cache = model.prefill(params, make_prompt([prompt]), model.init_cache(1, 16)).cache
        cache = model.extend(params, jnp.asarray([feed[0]]), cache).cache
        cache = cache.replace(lengths=jnp.asarray([len(prompt) + keep]))
        alone = model.extend(params, jnp.asarray([feed[1]]), cache).logits
        np.testing.assert_allclose(np.asarray(batch_logits[row]), np.asarray(alone[0]),
                                   atol=1e-5, rtol=0)


@pytest.mark.parametrize("fused", [False, True])
def test_decode_layout_keeps_transformers_parity_and_converts_back(pair, fused):
    """Kernels stored [out, in] (``with_kernel_layout``; ``sj.decode_layout``
    also fuses q/k/v and gate/up): the logits of prefill and mixed extends with
    a rollback are still those of transformers, and converting back restores
    the tree bit for bit. Unfused: same names, every kernel transposed. A
    config that claims the layout without transposing the kernels is wrong
    (caught: the logits move)."""
    import dataclasses

    import specdec_jax as sj
    from specdec_jax.models.decoder_only import split_projections, with_kernel_layout
    hf_model, model, params = pair
    laid_model, laid = (sj.decode_layout(model, params) if fused else
                        with_kernel_layout(model, params, "out_in", fused=False))
    assert laid_model.config.kernel_layout == "out_in"
    assert laid_model.config.fused_projections == fused
    tokens = [3, 17, 42, 5, 9, 60, 1, 33]
    cache = laid_model.init_cache(1, 16)
    first = laid_model.extend(laid, jnp.asarray([tokens[:5]]), cache)
    rolled = first.cache.replace(lengths=first.cache.lengths - 2)  # reject two
    second = laid_model.extend(laid, jnp.asarray([tokens[3:]]), rolled)
    reference = hf_logits(hf_model, tokens)
    np.testing.assert_allclose(np.asarray(first.logits[0, :3]), reference[:3], atol=TOL, rtol=0)
    np.testing.assert_allclose(np.asarray(second.logits[0]), reference[3:], atol=TOL, rtol=0)
    back_model, back = with_kernel_layout(laid_model, laid, "in_out")
    assert back_model == model
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)
    if fused:  # the names of the module docstring, holding exactly the separate kernels
        attention = laid["layers_0"]["attention"]
        assert set(attention) == {"qkv", "out"} and "wi" in laid["layers_0"]["mlp"]
        cfg = model.config
        assert attention["qkv"]["kernel"].shape == (
            cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads + 2, cfg.dims_per_head,
            cfg.hidden_size)
        _, separate = with_kernel_layout(model, params, "out_in", fused=False)
        jax.tree_util.tree_map(np.testing.assert_array_equal, split_projections(laid), separate)
        return
    flat, laid_flat = (dict(jax.tree_util.tree_flatten_with_path(t)[0]) for t in (params, laid))
    assert flat.keys() == laid_flat.keys()
    kernels = [k for k in flat if k[-1].key == "kernel"]
    assert len(kernels) >= 7 * model.config.num_layers
    for key, value in flat.items():
        expected = value.T if key in kernels else value
        np.testing.assert_array_equal(np.asarray(laid_flat[key]), np.asarray(expected))
    claimed = DecoderOnlyLM(dataclasses.replace(model.config, kernel_layout="out_in"))
    square = {k: v for k, v in flat.items() if k in kernels and v.shape[0] == v.shape[1]}
    if square:  # untransposed square kernels run, and give other logits
        only_square = jax.tree_util.tree_map_with_path(
            lambda k, v: v if k in square else laid_flat[k], params)
        wrong = claimed.extend(only_square, jnp.asarray([tokens]), claimed.init_cache(1, 16))
        assert np.abs(np.asarray(wrong.logits[0]) - reference).max() > 1e-2
    with pytest.raises(ValueError, match="kernel_layout='sideways'"):
        dataclasses.replace(model.config, kernel_layout="sideways")


def test_extend_under_jit_matches_eager(pair):
    _, model, params = pair
    cache = model.init_cache(2, 8)
    tokens = jnp.asarray([[1, 2], [3, 4]])
    eager = model.extend(params, tokens, cache).logits
    jitted = jax.jit(model.extend)(params, tokens, cache).logits
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), atol=1e-5)


def test_hf_export_round_trip(pair):
    _, model, params = pair
    state = decoder_params_to_hf(params, model.config)
    hf_model, _ = small_hf_decoder("llama")  # any module; we only compare dicts
    del hf_model
    from specdec_jax.checkpoints.hf_decoder import decoder_params_from_hf
    back = decoder_params_from_hf(state, model.config)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)


@pytest.mark.parametrize("bad, message", [
    ("long_prompt", "does not fit a cache"),
    ("past_end", "passes the cache's end"),
    ("oov", "outside the vocabulary"),
    ("batch", "batch size"),
])
def test_bad_input_is_named(pair, bad, message):
    _, model, params = pair
    cache = model.init_cache(1, 6)
    with pytest.raises(ValueError, match=message):
        if bad == "long_prompt":
            model.prefill(params, make_prompt([list(range(7))]), cache)
        elif bad == "past_end":
            cache = model.extend(params, jnp.asarray([[1, 2, 3, 4]]), cache).cache
            model.extend(params, jnp.asarray([[1, 2, 3]]), cache)
        elif bad == "oov":
            model.extend(params, jnp.asarray([[1, 64]]), cache)
        else:
            model.extend(params, jnp.asarray([[1], [2]]), cache)


def test_logits_at_runs_the_head_on_the_chosen_positions_only(pair):
    """``extend(..., logits_at)`` equals the full extend's rows at those
    offsets, per row, with the same cache; N = 0 only fills the cache."""
    _, model, params = pair
    cache = model.prefill(params, make_prompt([[3, 17, 42], [5]]), model.init_cache(2, 16)).cache
    tokens = jnp.asarray([[9, 60, 1, 33], [2, 8, 11, 4]])
    full = model.extend(params, tokens, cache)
    at = jnp.asarray([[3, 1], [0, 2]])
    chosen = jax.jit(model.extend)(params, tokens, cache, logits_at=at)
    for row in range(2):
        np.testing.assert_allclose(np.asarray(chosen.logits[row]),
                                   np.asarray(full.logits[row, at[row]]), atol=TOL, rtol=0)
        np.testing.assert_allclose(np.asarray(chosen.hidden[row]),
                                   np.asarray(full.hidden[row, at[row]]), atol=TOL, rtol=0)
    none = model.extend(params, tokens, cache, logits_at=jnp.zeros((2, 0), jnp.int32))
    assert none.logits.shape == (2, 0, model.vocab_size)
    for new, old in zip(jax.tree.leaves(none.cache), jax.tree.leaves(full.cache)):
        np.testing.assert_allclose(np.asarray(new), np.asarray(old), atol=TOL, rtol=0)


@pytest.mark.parametrize("width", [256, 896, 1536, 4864])
def test_row_sum_is_one_function_of_each_row(width):
    """``layers.row_sum`` (the norms of a ``row_independent`` decoder) gives a
    row the same bits alone or among 9 rows, and the row's sum to float32
    rounding."""
    from specdec_jax.models.layers import row_sum

    x = jax.random.normal(jax.random.PRNGKey(width), (1, 9, width), jnp.float32) ** 2
    together = np.asarray(jax.jit(row_sum)(x))
    alone = np.concatenate([np.asarray(jax.jit(row_sum)(x[:, i:i + 1])) for i in range(9)], 1)
    np.testing.assert_array_equal(together, alone)
    np.testing.assert_allclose(together[..., 0], np.asarray(x, np.float64).sum(-1), rtol=1e-5)


@pytest.mark.parametrize("row_independent", [False, True])
def test_a_chunked_prefill_is_the_one_call_prefill_and_stops_at_the_longest_prompt(
        pair, row_independent):
    """``prefill_chunk``: a prompt fed in chunks gives the logits, hidden state
    and cache of one call (to float32 rounding), and the loop stops after the
    chunk holding the longest row's last token: with rows of 3, 13 and 9 tokens
    padded to 24 and chunks of 4, cache positions 16.. are never written (a
    loop over every padded chunk fails this)."""
    import dataclasses  # noqa: PLC0415

    _, model, params = pair
    cfg = dataclasses.replace(model.config, row_independent=row_independent)
    whole, chunked = (DecoderOnlyLM(dataclasses.replace(cfg, prefill_chunk=c)) for c in (0, 4))
    rng = np.random.default_rng(0)
    rows = [rng.integers(1, model.vocab_size, n).tolist() for n in (3, 13, 9)]
    prompt = make_prompt(rows, pad_to=24)
    want = jax.jit(whole.prefill)(params, prompt, whole.init_cache(3, 32))
    got = jax.jit(chunked.prefill)(params, prompt, chunked.init_cache(3, 32))
    np.testing.assert_allclose(np.asarray(got.logits), np.asarray(want.logits), atol=TOL, rtol=0)
    np.testing.assert_allclose(np.asarray(got.hidden), np.asarray(want.hidden), atol=TOL, rtol=0)
    np.testing.assert_array_equal(np.asarray(got.cache.lengths), [3, 13, 9])
    for got_k, want_k in zip(got.cache.keys + got.cache.values,
                             want.cache.keys + want.cache.values, strict=True):
        for row, n in enumerate((3, 13, 9)):
            np.testing.assert_allclose(np.asarray(got_k[row, :, :n]),
                                       np.asarray(want_k[row, :, :n]), atol=TOL, rtol=0)
        assert not np.asarray(got_k[:, :, 16:]).any()  # [B, H, S, D]
    # The next step sees the same context.
    step = [jax.jit(m.extend)(params, jnp.asarray([[5], [6], [7]]), out.cache).logits
            for m, out in ((whole, want), (chunked, got))]
    np.testing.assert_allclose(np.asarray(step[1]), np.asarray(step[0]), atol=TOL, rtol=0)


def test_a_negative_prefill_chunk_is_named(pair):
    import dataclasses  # noqa: PLC0415

    with pytest.raises(ValueError, match="prefill_chunk=-1"):
        dataclasses.replace(pair[1].config, prefill_chunk=-1)
