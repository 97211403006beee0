"""The CPU kernel for each query's attention over the cache
(native/cache_attention.h via jax.ffi) against XLA's formulation, and its
row independence: a query's output is the same bits alone or among K."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models import decoder_only
from specdec_jax.native import attention as native_attention
from specdec_jax.native import matmul as native_matmul


def _operands(seed, batch, k, heads, groups, dims, positions):
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    q = normal(batch, k, heads, groups, dims)
    keys, values = normal(batch, heads, positions, dims), normal(batch, heads, positions, dims)
    # Causal rows at different lengths, then a random mask (a token tree's).
    lengths = rng.integers(0, positions - k + 1, batch)
    causal = (np.arange(positions)[None, None, :]
              <= (lengths[:, None] + np.arange(k)[None, :])[:, :, None])
    return q, keys, values, jnp.asarray(causal & (rng.random(causal.shape) < 0.8))


def _xla(q, keys, values, visible):
    return decoder_only._attention_in_blocks(q, keys, values, visible, q.shape[-1] ** -0.5,
                                             precision=None, limit=None, by_query=True)


def _kernel_call(q, keys, values, visible):
    return native_attention.attend_each_query(q, keys, values, visible, q.shape[-1] ** -0.5,
                                              fallback=_xla)


@pytest.mark.parametrize("batch,k,heads,groups,dims,positions",
                         [(1, 1, 2, 6, 128, 300), (1, 9, 2, 7, 64, 131), (3, 5, 1, 1, 24, 17),
                          (2, 17, 4, 2, 130, 64), (1, 3, 2, 64, 16, 8)])
def test_the_kernel_is_xlas_attention(cpu_kernel, batch, k, heads, groups, dims, positions):
    operands = _operands(k * 100 + dims, batch, k, heads, groups, dims, positions)
    text = jax.jit(_kernel_call).lower(*operands).as_text()
    assert native_attention.SYMBOL in text
    got = np.asarray(jax.jit(_kernel_call)(*operands))
    np.testing.assert_allclose(got, np.asarray(jax.jit(_xla)(*operands)), rtol=0, atol=3e-6)


def test_a_call_of_no_query_gives_an_empty_output(cpu_kernel):
    q, keys, values, visible = _operands(6, 2, 3, 2, 2, 16, 8)
    for fn in (_kernel_call, _xla, functools.partial(
            decoder_only.blocked_attention, scale=0.25)):  # queries together, XLA
        got = jax.jit(fn)(q[:, :0], keys, values, visible[:, :0])
        assert got.shape == (2, 0, 2, 2, 16)


def test_a_query_that_sees_nothing_gets_the_mean_of_the_values(cpu_kernel):
    # XLA's formulation gives such a query (a padding row) equal scores everywhere.
    q, keys, values, visible = _operands(1, 2, 3, 2, 3, 32, 10)
    visible = visible.at[1, 2].set(False)
    got = np.asarray(jax.jit(_kernel_call)(q, keys, values, visible))
    mean = np.asarray(values[1]).mean(axis=1)  # [H, D]
    np.testing.assert_allclose(got[1, 2], np.broadcast_to(mean[:, None], got[1, 2].shape),
                               rtol=0, atol=1e-6)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("k", [2, 9, 17])
def test_each_query_is_the_same_bits_alone(cpu_kernel, k):
    q, keys, values, visible = _operands(k, 2, k, 2, 6, 128, 96)
    together = np.asarray(jax.jit(_kernel_call)(q, keys, values, visible))
    for i in range(k):
        alone = np.asarray(jax.jit(_kernel_call)(q[:, i:i + 1], keys, values,
                                                 visible[:, i:i + 1]))
        np.testing.assert_array_equal(alone[:, 0], together[:, i])


def test_positions_the_mask_hides_reach_no_output(cpu_kernel):
    # Garbage (NaN) where no query looks must not reach any output, also where
    # the kernel scores it beside visible positions (four keys at a time).
    q, keys, values, visible = _operands(3, 1, 4, 2, 2, 16, 150)
    hidden = ~np.asarray(visible).any(axis=1)[:, None, :, None]  # [B, 1, S, 1]
    keys, values = (jnp.where(hidden, jnp.nan, a) for a in (keys, values))
    got = np.asarray(jax.jit(_kernel_call)(q, keys, values, visible))
    assert np.isfinite(got).all()


def test_gradients_go_through_xla(cpu_kernel):
    q, keys, values, visible = _operands(4, 1, 2, 2, 3, 16, 12)

    def loss(fn, q, keys, values):
        return jnp.sum(fn(q, keys, values, visible) ** 2)

    got = jax.grad(functools.partial(loss, _kernel_call), argnums=(0, 1, 2))(q, keys, values)
    want = jax.grad(functools.partial(loss, _xla), argnums=(0, 1, 2))(q, keys, values)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("switch", [native_matmul.set_enabled, native_attention.set_enabled])
def test_without_the_kernel_xla_runs(cpu_kernel, switch):
    operands = _operands(5, 1, 2, 2, 2, 16, 8)
    fn = jax.jit(_kernel_call)
    assert native_attention.SYMBOL in fn.lower(*operands).as_text()
    switch(False)
    try:
        text = fn.lower(*operands).as_text()  # the same jitted function, traced again
    finally:
        switch(True)
    assert native_attention.SYMBOL not in text


def test_a_row_independent_decoder_takes_the_kernel_outside_its_prefill(cpu_kernel):
    """A step and a scoring call of a ``row_independent`` decoder run the
    kernel; its prefill (queries scored together) and a decoder that is not
    row independent keep XLA's attention."""
    import dataclasses  # noqa: PLC0415

    from specdec_jax.models.interface import make_prompt  # noqa: PLC0415

    cfg = decoder_only.DecoderConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
                                     num_layers=1, num_heads=4, num_kv_heads=2,
                                     row_independent=True)
    for row_independent in (True, False):
        model = decoder_only.DecoderOnlyLM(dataclasses.replace(
            cfg, row_independent=row_independent))
        params = model.init_params(jax.random.key(0))
        cache = model.init_cache(1, 16)
        extend = jax.jit(model.extend).lower(params, jnp.ones((1, 3), jnp.int32), cache)
        assert (native_attention.SYMBOL in extend.as_text()) == row_independent
        prefill = jax.jit(model.prefill).lower(params, make_prompt([[1, 2, 3]], pad_to=4), cache)
        assert native_attention.SYMBOL not in prefill.as_text()
