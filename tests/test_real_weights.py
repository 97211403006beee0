"""Real pretrained weights (slow: fetched on first use, ~0.1-1.6 GB).

Run with ``python -m pytest -m slow``. A test skips only when the weights
cannot be fetched, and says why.
"""

import dataclasses
import os

import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax.checkpoints import registry
from specdec_jax.checkpoints.load import load_model

pytestmark = pytest.mark.slow
NEW_TOKENS = 48
PROMPTS = {
    "code": "def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n",
    "english": "The history of the printing press begins in",
    "chat": "Explain in two sentences why the sky is blue.",
}
_LOADED = {}


def fetched(name):
    """The model's GGUF path, fetched on first use (or the test skips, saying why)."""
    try:
        return registry.local_path(name)
    except (ConnectionError, PermissionError) as err:
        pytest.skip(f"weights of {name} cannot be fetched here: {err}")


def load(name):
    if name not in _LOADED:
        fetched(name)
        _LOADED[name] = load_model(name)
    return _LOADED[name]


def encode(tok, kind):
    text = PROMPTS[kind]
    if kind == "chat":
        text = tok.apply_chat_template([{"role": "user", "content": text}])
    return tok.encode(text)


def hf_peer(name):
    import torch
    import transformers
    path = registry.local_path(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32)
    return model.eval()


def until_eos(tokens, eos_ids):
    out = []
    for t in tokens:
        out.append(int(t))
        if int(t) in eos_ids:
            break
    return out


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_greedy_continuations_and_logits_match_transformers(name):
    import torch
    model, params, tok = load(name)
    peer = hf_peer(name)
    for kind in PROMPTS:
        ids = encode(tok, kind)
        ours = sj.generate(target=model, target_params=params, prompts=[ids],
                           method="autoregressive", max_new_tokens=NEW_TOKENS,
                           eos_ids=tok.eos_token_ids)
        ours_tokens = until_eos(np.asarray(ours.tokens[0, : ours.lengths[0]]),
                                tok.eos_token_ids)
        with torch.no_grad():
            theirs = peer.generate(torch.tensor([ids]), do_sample=False,
                                   max_new_tokens=NEW_TOKENS,
                                   eos_token_id=list(tok.eos_token_ids),
                                   pad_token_id=tok.eos_token_ids[0])
            ref_logits = peer(torch.tensor([ids])).logits[0, -1].numpy()
        theirs_tokens = until_eos(theirs[0, len(ids):].tolist(), tok.eos_token_ids)
        assert ours_tokens == theirs_tokens, (kind, tok.decode(ours_tokens),
                                              tok.decode(theirs_tokens))
        out = model.prefill(params, sj.make_prompt([ids]), model.init_cache(1, len(ids)))
        np.testing.assert_allclose(np.asarray(out.logits[0, 0]), ref_logits, atol=1e-3, rtol=0)


@pytest.mark.parametrize("target_name, drafter_name", [
    ("smollm2-135m", "smollm2-135m"), ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")])
@pytest.mark.parametrize("verifier", ["token", "block", "block-seed"])
def test_greedy_specdecode_equals_greedy_target(target_name, drafter_name, verifier):
    target, target_params, tok = load(target_name)
    drafter, drafter_params, _ = load(drafter_name)
    prompts = [encode(tok, kind) for kind in PROMPTS]
    common = dict(target=target, target_params=target_params, prompts=prompts,
                  max_new_tokens=NEW_TOKENS, eos_ids=tok.eos_token_ids)
    reference = sj.generate(method="autoregressive", **common)
    spec = sj.generate(method="specdecode", drafter=drafter, drafter_params=drafter_params,
                       gamma=5, verifier=verifier, stop_threshold=0.5, **common)
    np.testing.assert_array_equal(np.asarray(spec.lengths), np.asarray(reference.lengths))
    np.testing.assert_array_equal(np.asarray(spec.tokens), np.asarray(reference.tokens))
    assert int(jnp.sum(spec.stats.target_calls)) < int(jnp.sum(reference.stats.target_calls))


@pytest.mark.parametrize("spec, k_matrix", [
    ("mag", None),
    ("qwen2.5-coder-0.5b+mag", [[2, 10], [0, 10]]),
    ("qwen2.5-coder-0.5b+mag", [[4, 0], [0, 6]]),
    ("qwen2.5-coder-0.5b+mag", [[3, 5], [0, 0]]),
])
def test_greedy_cs_drafting_equals_greedy_target(spec, k_matrix):
    """CS Drafting on the Qwen pair (Max-Gram with the packaged stdlib bigram
    table): token for token the 1.5B target's greedy output, with lenience 3
    between drafters (it never reaches the target's review)."""
    from specdec_jax.data import bigram
    from specdec_jax.drafting import make_drafter
    target, target_params, tok = load("qwen2.5-coder-1.5b")
    drafter_model, drafter_params, _ = load("qwen2.5-coder-0.5b")
    drafter = make_drafter(spec, models={"qwen2.5-coder-0.5b": drafter_model},
                           vocab_size=target.vocab_size, k_matrix=k_matrix)
    named = {"qwen2.5-coder-0.5b": drafter_params,
             "mag": jnp.asarray(bigram.load_table("qwen2.5-coder", target.vocab_size))}
    prompts = [encode(tok, kind) for kind in PROMPTS]
    common = dict(target=target, target_params=target_params, prompts=prompts,
                  max_new_tokens=NEW_TOKENS, eos_ids=tok.eos_token_ids)
    reference = sj.generate(method="autoregressive", **common)
    out = sj.generate(method="specdecode", drafter=drafter,
                      drafter_params=drafter.select_params(named), lenience=3.0,
                      gamma=None if k_matrix else 6, **common)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference.tokens))
    assert int(jnp.sum(out.stats.target_calls)) < int(jnp.sum(reference.stats.target_calls))


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_greedy_specdecpp_equals_greedy_target(verifier):
    """SpecDec++ on the Qwen pair: where each row stops drafting is the head's
    choice (a random D = 1 head with a non-zero output layer, so rows stop at
    different lengths), yet the output is the 1.5B target's greedy output
    token for token, in fewer target calls."""
    import jax

    from specdec_jax.drafting.acceptance_head import AcceptanceHead, HeadConfig
    from specdec_jax.drafting.adaptive import AdaptiveDrafter
    target, target_params, tok = load("qwen2.5-coder-1.5b")
    drafter_model, drafter_params, _ = load("qwen2.5-coder-0.5b")
    head = AcceptanceHead(HeadConfig(hidden_size=drafter_model.config.hidden_size, depth=1))
    head_params = head.init_params(jax.random.PRNGKey(0), prior_acceptance=0.8)
    kernel = head_params["output"]["kernel"]
    head_params["output"]["kernel"] = 0.05 * jax.random.normal(jax.random.PRNGKey(1),
                                                                kernel.shape)
    drafter = AdaptiveDrafter(drafter_model, head, eos_ids=tuple(tok.eos_token_ids))
    params = drafter.select_params({drafter.name: drafter_params,
                                    drafter.head_name: head_params})
    prompts = [encode(tok, kind) for kind in PROMPTS]
    common = dict(target=target, target_params=target_params, prompts=prompts,
                  max_new_tokens=NEW_TOKENS, eos_ids=tok.eos_token_ids)
    reference = sj.generate(method="autoregressive", **common)
    out = sj.generate(method="specdecode", drafter=drafter, drafter_params=params, gamma=8,
                      verifier=verifier, stop_threshold=0.5, **common)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference.tokens))
    calls = np.asarray(out.stats.target_calls)
    assert int(calls.sum()) < int(np.asarray(reference.stats.target_calls).sum())
    drafts_per_call = np.asarray(out.stats.drafted) / calls
    assert 1.0 < drafts_per_call.mean() < 8.0, "the head stops rows before K_max"


@pytest.mark.parametrize("name", sorted(registry.MODELS))
def test_recorded_architecture_is_the_gguf_architecture(name):
    """The shapes random-weight benchmarks build are the real model's."""
    from specdec_jax.checkpoints import gguf
    from specdec_jax.checkpoints.hf_decoder import decoder_config_from_hf

    reader = gguf._reader(fetched(name))
    has_output = "output.weight" in {t.name for t in reader.tensors}
    from_file = gguf.config_from_metadata(gguf.read_metadata(reader), has_output)
    recorded = decoder_config_from_hf(registry.architecture(name))
    assert recorded.rms_norm_eps == pytest.approx(from_file.rms_norm_eps, rel=1e-6)  # f32 in GGUF
    # The Qwen GGUFs store the output matrix apart from the embedding (each
    # quantised its own way), so the loaded model is untied; a step does the
    # same V x D logits product either way.
    assert recorded.tie_embeddings and from_file.tie_embeddings == (name == "smollm2-135m")
    same = dict(rms_norm_eps=from_file.rms_norm_eps, tie_embeddings=from_file.tie_embeddings)
    assert dataclasses.replace(recorded, **same) == from_file


@pytest.mark.parametrize("name", sorted(registry.MODELS))
def test_the_header_reads_as_the_gguf_package_reads_it(name):
    """``file_header``'s one pass over a real file (tokenizer arrays of ~150,000
    strings, every block type kept) gives ``gguf.GGUFReader``'s values."""
    from tests.test_file_header import assert_same_as_reader  # noqa: PLC0415

    path = fetched(name)
    if path.suffix != ".gguf":
        pytest.skip(f"{name} is not a GGUF file")
    assert_same_as_reader(path)


@pytest.mark.parametrize("verifier", ["token", "block-seed"])
def test_greedy_feature_head_equals_greedy_target(verifier):
    """A feature head (random weights: its drafts are mostly rejected) on the
    1.5B target's real hidden states, its output head cut to 8 192 ids: the
    output is still the target's greedy output token for token."""
    import jax

    from specdec_jax.drafting import feature
    from specdec_jax.models import feature_head
    target, target_params, tok = load("qwen2.5-coder-1.5b")
    head = feature_head.FeatureHead(feature_head.FeatureHeadConfig.for_target(
        target, intermediate_size=512))
    drafter = feature.FeatureDrafter(head)
    params = feature_head.drafter_params(target, target_params,
                                         head.init_net(jax.random.PRNGKey(0)),
                                         token_ids=np.arange(8192))
    prompts = [encode(tok, kind) for kind in PROMPTS]
    common = dict(target=target, target_params=target_params, prompts=prompts,
                  max_new_tokens=NEW_TOKENS, eos_ids=tok.eos_token_ids)
    reference = sj.generate(method="autoregressive", **common)
    out = sj.generate(method="specdecode", drafter=drafter, drafter_params=params, gamma=4,
                      verifier=verifier, **common)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference.tokens))
    assert int(np.asarray(out.stats.drafted).sum()) > 0
