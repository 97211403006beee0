"""A drafter with a restricted output head (FR-Spec; ``drafting.head_vocab``):
its law is the full model's renormalised over the kept tokens, zero elsewhere;
verification keeps the target's law exact with those zeros (chi-square, every
verifier) and greedy output equal to the target's; bad input is named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax import target_functions
from specdec_jax.api import sampling_params
from specdec_jax.data import bigram
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.drafting import ModelDrafter, head_vocab
from specdec_jax.models.decoder_only import with_head_vocab, with_kernel_layout
from specdec_jax.models.interface import make_prompt
from specdec_jax.verify import get_verifier
from tests.exactness import (
    LENGTH,
    P_MIN,
    PROMPT,
    ROWS,
    TARGET,
    TARGET_PARAMS,
    V,
    chi_square_pvalue,
    exact_sequence_probs,
)


def tiny_decoder(vocab: int, tie: bool, seed: int = 0):
    model = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=vocab, hidden_size=16,
                                              intermediate_size=32, num_layers=1, num_heads=2,
                                              num_kv_heads=1, tie_embeddings=tie))
    # Scaled weights: peaked laws, so drafts are both accepted and rejected.
    params = jax.tree_util.tree_map(lambda x: 3 * x, model.init_params(jax.random.PRNGKey(seed)))
    return model, params


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_restricted_head_is_the_full_law_renormalised_over_the_kept_tokens(tie, layout):
    model, params = with_kernel_layout(*tiny_decoder(32, tie), layout)
    kept = np.array([30, 2, 7, 11, 19])  # unsorted on purpose: rows must follow the ids
    small, small_params = with_head_vocab(model, params, kept)
    assert small.config.head_vocab == 5
    tokens = jnp.asarray([[3, 9, 27, 4]])
    full = jax.nn.softmax(model.extend(params, tokens, model.init_cache(1, 8)).logits, -1)
    out = small.extend(small_params, tokens, small.init_cache(1, 8))
    law = jax.nn.softmax(out.logits, -1)
    want = np.zeros_like(np.asarray(full))
    want[..., kept] = np.asarray(full)[..., kept]
    want /= want.sum(-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(law), want, atol=1e-6, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.logits)[..., np.setdiff1d(np.arange(32), kept)],
                                  -np.inf)


@pytest.mark.long
@pytest.mark.parametrize("verifier", ["token", "block"])
def test_restricted_drafter_keeps_the_target_law(verifier):
    """Drafts only ever come from {0, 2}; the target still emits 1 and 3
    through the residual, and the sequences follow the target (64 cells).
    It guards the zeros (-inf logits, q = 0 entries) through every verifier.
    Known-wrong, run once (2026-11-25): drafts drawn from the cut law while
    the full model's law is reported as q (``drafting.model.sample_from_weights``
    patched to mask {1, 3}, the drafter unrestricted): p = 0.0 (below 1e-300)
    with both verifiers, same seeds and sizes."""
    model, params = tiny_decoder(V, tie=True, seed=5)
    drafter, drafter_params = with_head_vocab(model, params, [0, 2])
    decoder = SpeculativeDecoder(target=TARGET, drafter=ModelDrafter(drafter),
                                 target_fn=target_functions.SpecDecode(), gamma=2,
                                 verifier=get_verifier(verifier), max_new_tokens=LENGTH)
    out = jax.jit(decoder.generate)(TARGET_PARAMS, drafter_params,
                                    make_prompt([list(PROMPT)] * ROWS), jax.random.PRNGKey(0),
                                    sampling_params(temperature=1.0))
    tokens = np.asarray(out.tokens)[:, :LENGTH]
    assert np.isin([1, 3], tokens).all(), "tokens outside the subset must still be emitted"
    expected = exact_sequence_probs(lambda c: TARGET.next_probs(TARGET_PARAMS, c))
    assert chi_square_pvalue(tokens, expected) > P_MIN
    hist = np.asarray(out.stats.accepted_histogram).sum(0)
    assert hist[0] > 0 and hist[1:].sum() > 0, "rejections and acceptances both occur"


def test_greedy_with_a_restricted_drafter_equals_greedy_target():
    target, target_params = tiny_decoder(48, tie=False, seed=1)
    model, params = tiny_decoder(48, tie=True, seed=2)
    counts = np.arange(48)[::-1].astype(np.int64)  # a made-up corpus: low ids frequent
    drafter, drafter_params = head_vocab.restrict(model, params, 0, counts_V=counts)
    assert drafter is model, "size 0 keeps the full head"
    drafter, drafter_params = with_head_vocab(model, params, head_vocab.head_token_ids(
        counts, 24, always=[47]))
    prompts = [[5, 9, 2], [40, 41]]
    reference = sj.generate(target=target, target_params=target_params, prompts=prompts,
                            method="autoregressive", max_new_tokens=16)
    decoder = SpeculativeDecoder(target=target, drafter=ModelDrafter(drafter),
                                 target_fn=target_functions.SpecDecode(), gamma=4,
                                 max_new_tokens=16)
    out = jax.jit(decoder.generate)(target_params, drafter_params, make_prompt(prompts),
                                    jax.random.PRNGKey(0), sampling_params(temperature=0.0))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference.tokens))


def test_ranking_keeps_end_of_sequence_ids_and_orders_by_count_then_id():
    counts = np.array([5, 0, 9, 5, 0, 1])
    np.testing.assert_array_equal(head_vocab.ranked_token_ids(counts, always=[4]),
                                  [4, 2, 0, 3, 5, 1])
    np.testing.assert_array_equal(head_vocab.head_token_ids(counts, 3, always=[4]), [0, 2, 4])
    assert head_vocab.coverage(counts, np.array([0, 2])) == pytest.approx(14 / 20)


def test_packaged_ranking_covers_the_stdlib_and_keeps_eos():
    counts = bigram.load_unigram("qwen2.5-coder", 151936)
    ids = head_vocab.head_token_ids(counts, 32768, always=[151643, 151645])
    assert {151643, 151645} <= set(ids.tolist()) and ids.size == 32768
    assert head_vocab.coverage(counts, ids) > 0.99


@pytest.mark.parametrize("ids, message", [
    ([], "non-empty"), ([1, 1], "unique"), ([0, 32], "unique ids in"), ([-1], "unique ids in"),
])
def test_bad_subsets_are_named(ids, message):
    model, params = tiny_decoder(32, tie=True)
    with pytest.raises(ValueError, match=message):
        with_head_vocab(model, params, np.asarray(ids, np.int64))


def test_mismatched_config_and_params_are_named():
    model, params = tiny_decoder(32, tie=True)
    small, small_params = with_head_vocab(model, params, [1, 2, 3])
    with pytest.raises(ValueError, match="already restricted"):
        with_head_vocab(small, small_params, [1])
    with pytest.raises(ValueError, match="lack a 'head_vocab' entry"):
        small.extend(params, jnp.ones((1, 1), jnp.int32), small.init_cache(1, 4))
    with pytest.raises(ValueError, match="carry a 'head_vocab' entry"):
        model.extend(small_params, jnp.ones((1, 1), jnp.int32), model.init_cache(1, 4))
    with pytest.raises(ValueError, match="decoder-only"):
        head_vocab.restrict(object(), {}, 4, counts_V=np.ones(8))
    with pytest.raises(ValueError, match="head vocabulary size 0"):
        head_vocab.head_token_ids(np.ones(8), 0)
    with pytest.raises(ValueError, match="end-of-sequence"):
        head_vocab.head_token_ids(np.ones(8), 1, always=[3, 4])


def test_fingerprint_names_the_weights_not_the_restricted_view():
    """A SpecDec++ head or a stored sweep made with the full drafter stays
    valid for its restricted view (same weights, same hidden states)."""
    from specdec_jax.checkpoints.tree_paths import params_fingerprint

    model, params = tiny_decoder(32, tie=True)
    _, small_params = with_head_vocab(model, params, [1, 2, 3])
    assert params_fingerprint(small_params) == params_fingerprint(params)
    other = jax.tree_util.tree_map(lambda x: x + 1, params)
    assert params_fingerprint(other) != params_fingerprint(params)


def test_jobs_name_a_bad_head_vocabulary_and_rank_any_vocabulary(tmp_path, monkeypatch):
    from specdec_jax.jobs import resolver  # noqa: PLC0415

    pair = dict(target="toy-bytes-large", drafter="toy-bytes-small")
    with pytest.raises(ValueError, match="drafter_head_vocab=-1"):
        resolver.load_pair(**pair, drafter_head_vocab=-1)
    with pytest.raises(ValueError, match="no sharding rule"):
        resolver.load_pair(**pair, drafter_head_vocab=8, mesh=object())
    # The packaged ranking is for the Qwen vocabulary; the toys' 256 bytes get their
    # own, counted on first use (here over a one-file corpus) and cached.
    monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.py"
    corpus.write_text("abcabcab")
    monkeypatch.setattr(bigram, "stdlib_sources", lambda: [corpus])
    loaded = resolver.load_pair(**pair, drafter_head_vocab=8)
    kept = np.asarray(loaded.drafter_params["head_vocab"]["token_ids"])
    assert loaded.drafter.config.head_vocab == 8 and set(b"abc") <= set(kept.tolist())
