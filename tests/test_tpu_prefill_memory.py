"""A wide call over a long cache (the prefill of a batch-64 generate function on
one v5e) scores its queries in blocks (``decoder_only.blocked_attention``) once its
float32 attention scores would pass ``ATTENTION_SCORES_LIMIT_BYTES``: the
prefill's logits, hidden states and cache, and the tokens a generation emits,
are those of the unblocked call. No libtpu needed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax.models import decoder_only
from specdec_jax.models.interface import Prompt


@pytest.fixture(autouse=True)
def _fresh_traces():
    """Traces made under a patched limit leave with the test."""
    yield
    jax.clear_caches()


@pytest.mark.parametrize(("k", "scores", "limit", "blocks"), [
    (512, 3.5 * 2 ** 30, 2 ** 30, 4),  # the 0.5B's prefill at batch 64 into 2,048 of room
    (512, 3.0 * 2 ** 30, 2 ** 30, 4),  # the 1.5B's: 3 blocks do not divide 512
    (7, 100, 1000, 1), (7, 2000, 1000, 7), (6, 2500, 1000, 3), (1, 10 ** 12, 1, 1)])
def test_query_blocks_divide_the_call(k, scores, limit, blocks):
    assert decoder_only.query_blocks(k, int(scores), limit) == blocks


def toy():
    config = decoder_only.DecoderConfig(vocab_size=48, hidden_size=32, intermediate_size=64,
                                   num_layers=2, num_heads=4, num_kv_heads=2)
    model = decoder_only.DecoderOnlyLM(config)
    params = jax.tree_util.tree_map(lambda x: 3 * x, model.init_params(jax.random.PRNGKey(0)))
    return model, params


def test_blocked_prefill_equals_the_whole_call(monkeypatch):
    model, params = toy()
    prompt = Prompt(tokens=jnp.asarray(np.random.default_rng(0).integers(0, 48, (3, 8)),
                                       jnp.int32), lengths=jnp.asarray([8, 5, 1], jnp.int32))

    def prefill():
        out = model.prefill(params, prompt, model.init_cache(3, 24), all_hidden=True)
        return jax.device_get((out.logits, out.hidden, out.cache.keys, out.cache.values))

    whole = prefill()
    scores = 4 * 3 * 4 * 8 * 24  # [B, H, G, K, S] float32 of one layer's call
    monkeypatch.setattr(decoder_only, "ATTENTION_SCORES_LIMIT_BYTES", scores // 4)
    assert decoder_only.query_blocks(8, scores, scores // 4) == 4
    blocked = prefill()
    for a, b in zip(jax.tree_util.tree_leaves(whole), jax.tree_util.tree_leaves(blocked)):
        # Blocked queries change how XLA vectorises a row's sums, and so their
        # order: float32 logits of magnitude ~20 then move by a few ulps (4e-6 on
        # an AVX2 machine, where the vectors are half as wide as AVX-512's).
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(whole[0].argmax(-1), blocked[0].argmax(-1))


def test_blocked_prefill_generates_the_same_tokens(monkeypatch):
    model, params = toy()
    prompt = sj.make_prompt([[1, 2, 3, 4, 5, 6, 7], [8, 9], [10, 11, 12]])
    fn = sj.make_generate_fn(target=model, method="autoregressive", max_new_tokens=6)
    sp = sj.sampling_params(temperature=0.0)
    loops = lambda fn: fn.lower(params, None, prompt, jax.random.PRNGKey(0),  # noqa: E731
                                sp).as_text().count("stablehlo.while")
    whole, whole_loops = fn(params, None, prompt, jax.random.PRNGKey(0), sp), loops(fn)
    monkeypatch.setattr(decoder_only, "ATTENTION_SCORES_LIMIT_BYTES", 64)
    jax.clear_caches()  # the decoder's jitted method traced the unblocked model
    fn = sj.make_generate_fn(target=model, method="autoregressive", max_new_tokens=6)
    assert loops(fn) > whole_loops  # the prefill's blocks: a lax.map per layer
    blocked = fn(params, None, prompt, jax.random.PRNGKey(0), sp)
    np.testing.assert_array_equal(np.asarray(whole.tokens), np.asarray(blocked.tokens))
