"""The Pallas small-M matmul (interpret mode on CPU) against XLA's dot, alone
and inside the decoder, and its fallbacks and errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax import kernels


@pytest.mark.parametrize("rows", [1, 3, 6, 8])
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_small_m_matmul_equals_the_dot(rows, dtype, tol):
    # K = 96 and N = 48 are no powers of two: blocks of 32 and 16, K looped.
    x = jax.random.normal(jax.random.PRNGKey(0), (rows, 96)).astype(dtype)
    w = jax.random.normal(jax.random.PRNGKey(1), (48, 96)).astype(dtype)
    out = kernels.small_m_matmul(x, w, interpret=True)
    assert out.shape == (rows, 48) and out.dtype == dtype
    expected = np.asarray(x, np.float32) @ np.asarray(w, np.float32).T
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, rtol=tol, atol=tol)
    # A kernel that forgets every K block but the first is caught by this check.
    first_block_only = np.asarray(x, np.float32)[:, :32] @ np.asarray(w, np.float32)[:, :32].T
    assert np.abs(first_block_only - expected).max() > 10 * tol


def test_decoder_with_the_pallas_kernel_gives_the_xla_logits():
    model = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=64, hidden_size=32,
                                              intermediate_size=64, num_layers=2, num_heads=4,
                                              num_kv_heads=2, qkv_bias=True))
    model, params = sj.decode_layout(model, model.init_params(jax.random.PRNGKey(0)))
    pallas = sj.DecoderOnlyLM(dataclasses.replace(model.config, matmul_kernel="pallas"))
    tokens = jnp.asarray([[3, 17, 42, 5, 9, 60], [1, 2, 3, 4, 5, 6]])
    for m in (model, pallas):  # prefill-like call, then a one-token step
        cache = m.init_cache(2, 16)
        first = m.extend(params, tokens, cache)
        second = m.extend(params, tokens[:, :1], first.cache)
        if m is model:
            reference = (first.logits, second.logits)
    np.testing.assert_allclose(np.asarray(first.logits), np.asarray(reference[0]), atol=1e-5)
    np.testing.assert_allclose(np.asarray(second.logits), np.asarray(reference[1]), atol=1e-5)
    text = str(jax.make_jaxpr(lambda p: pallas.extend(p, tokens[:, :1],
                                                      pallas.init_cache(2, 16)).logits)(params))
    assert text.count("pallas_call") >= 7 * 2  # every dense layer of both layers
    # Converting back to the checkpoint layout returns to XLA's dot.
    back, _ = sj.models.decoder.with_kernel_layout(pallas, params, "in_out")
    assert back.config.matmul_kernel == "xla"


def test_shapes_it_does_not_cover_take_the_xla_path_and_bad_input_is_named():
    assert not kernels.supports(kernels.MAX_ROWS + 1, 64, 64)
    assert not kernels.supports(1, 64, 70)  # no power of two >= 16 divides 70
    x, w = jnp.ones((kernels.MAX_ROWS + 1, 64)), jnp.ones((16, 64))
    text = str(jax.make_jaxpr(lambda x, w: kernels.matmul_out_in(x, w, kernel="pallas"))(x, w))
    assert "pallas_call" not in text and "dot_general" in text
    with pytest.raises(ValueError, match="out_in layout"):
        kernels.small_m_matmul(jnp.ones((1, 64)), jnp.ones((64, 32)))
    with pytest.raises(ValueError, match="choose one of xla, pallas"):
        kernels.matmul_out_in(x, w, kernel="triton")
    config = sj.DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                              num_layers=1, num_heads=4, num_kv_heads=2)
    with pytest.raises(ValueError, match="convert the model first"):
        dataclasses.replace(config, matmul_kernel="pallas")


def test_backends_other_than_cpu_and_gpu_must_choose_interpret_explicitly(monkeypatch):
    """On a TPU the default would otherwise emulate the program silently."""
    x, w = jnp.ones((2, 64)), jnp.ones((32, 64))
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with pytest.raises(ValueError, match="on 'tpu' it is untested. Use matmul_kernel='xla'"):
        kernels.small_m_matmul(x, w)
    out = kernels.small_m_matmul(x, w, interpret=True)  # an explicit choice is honoured
    np.testing.assert_allclose(np.asarray(out), np.full((2, 32), 64.0))
