"""Hugging Face <-> specdec_jax conversion for T5 v1.1 (T5ForConditionalGeneration).

Both directions are renames plus transposes (torch ``Linear`` stores
``[out, in]``, Flax ``Dense`` stores ``[in, out]``; HF's relative-attention
table is ``[num_buckets, H]``, t5x's is ``[H, num_buckets]``), so a round trip
is exact. Every tensor is checked against the shape the config implies, so a
checkpoint that does not match its config fails with the tensor's name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from specdec_jax.checkpoints.tree_paths import check_shapes, get_path, set_path
from specdec_jax.models.t5 import T5Config, T5EncoderDecoderLM

SUPPORTED_ARCHITECTURES = ("t5", "mt5")
SUPPORTED_FEED_FORWARD = "gated-gelu"  # T5 v1.1, Flan-T5, mT5

_ATTENTION = (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))
_MLP = ("wi_0", "wi_1", "wo")
# The sublayers of a block, in HF's order (``{stack}.block.{i}.layer.{j}``):
# (our pre-norm, our attention module or None for the MLP, HF's attention module).
_ENCODER_SUBLAYERS = (("pre_attention_layer_norm", "attention", "SelfAttention"),
                      ("pre_mlp_layer_norm", None, None))
_DECODER_SUBLAYERS = (
    ("pre_self_attention_layer_norm", "self_attention", "SelfAttention"),
    ("pre_cross_attention_layer_norm", "encoder_decoder_attention", "EncDecAttention"),
    ("pre_mlp_layer_norm", None, None))


def _tensor_map(cfg: T5Config) -> list[tuple[tuple[str, ...], str, bool]]:
    """(our path, HF name, transpose) for every tensor but the embeddings."""
    mapping: list[tuple[tuple[str, ...], str, bool]] = []

    def attention(ours: tuple[str, ...], theirs: str) -> None:
        for our_name, their_name in _ATTENTION:
            mapping.append((ours + (our_name, "kernel"), f"{theirs}.{their_name}.weight", True))

    def mlp(ours: tuple[str, ...], theirs: str) -> None:
        for name in _MLP:
            mapping.append((ours + ("mlp", name, "kernel"),
                            f"{theirs}.DenseReluDense.{name}.weight", True))

    for stack, num_layers, sublayers in (("encoder", cfg.num_encoder_layers, _ENCODER_SUBLAYERS),
                                         ("decoder", cfg.num_decoder_layers, _DECODER_SUBLAYERS)):
        for i in range(num_layers):
            ours = (stack, f"layers_{i}")
            for j, (norm, our_attention, their_attention) in enumerate(sublayers):
                theirs = f"{stack}.block.{i}.layer.{j}"
                mapping.append((ours + (norm, "scale"), f"{theirs}.layer_norm.weight", False))
                if our_attention is None:
                    mlp(ours, theirs)
                else:
                    attention(ours + (our_attention,), f"{theirs}.{their_attention}")
    for stack in ("encoder", "decoder"):
        # Only the first block carries the table; every layer of the stack shares it.
        mapping.append(((stack, "relpos_bias", "rel_embedding"),
                        f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                        True))
    mapping.append((("encoder", "encoder_norm", "scale"), "encoder.final_layer_norm.weight", False))
    mapping.append((("decoder", "decoder_norm", "scale"), "decoder.final_layer_norm.weight", False))
    return mapping


# T5Config's field -> its config.json key, for the keys every config holds
# (both directions read it; the fields with defaults are written out in each).
_HF_NAMES = {"vocab_size": "vocab_size", "d_model": "d_model", "d_kv": "d_kv", "d_ff": "d_ff",
             "num_heads": "num_heads", "num_encoder_layers": "num_layers"}


def t5_config_from_hf(hf: Mapping[str, Any], **overrides) -> T5Config:
    """Builds a T5Config from a Hugging Face ``config.json`` (or ``to_dict()``) dict.

    Only the v1.1 architecture is supported: gated-GELU MLP and an output
    projection applied without the original T5's ``d_model**-0.5`` rescale.
    ``transformers`` >= 5 writes ``tie_word_embeddings: true`` for every T5 and
    records the rescale in ``scale_decoder_outputs``; older versions wrote
    ``tie_word_embeddings: false`` for v1.1. Both spellings are read.
    """
    model_type = hf.get("model_type", "")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"t5_config_from_hf: unknown architecture {model_type!r}; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}.")
    feed_forward = hf.get("feed_forward_proj", "relu")
    if feed_forward != SUPPORTED_FEED_FORWARD:
        raise ValueError(
            f"t5_config_from_hf: feed_forward_proj={feed_forward!r} is the original T5; only "
            f"T5 v1.1 ({SUPPORTED_FEED_FORWARD!r}: v1.1, Flan-T5, mT5) is supported.")
    scaled = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
    if scaled:
        raise ValueError(
            "t5_config_from_hf: this config rescales decoder outputs by d_model**-0.5 before "
            "tied logits (original T5); T5 v1.1 is untied and unscaled. Set "
            "tie_word_embeddings=false (transformers < 5) or scale_decoder_outputs=false.")
    start = hf.get("decoder_start_token_id")
    if start is None:
        start = hf.get("pad_token_id") or 0
    fields = {ours: hf[theirs] for ours, theirs in _HF_NAMES.items()}
    fields.update(
        num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"],
        relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        decoder_start_token_id=int(start),
    )
    fields.update(overrides)
    return T5Config(**fields)


def t5_config_to_hf(cfg: T5Config) -> dict:
    """Keyword arguments that make ``transformers.T5Config`` build the same network."""
    return {
        "model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
        **{theirs: getattr(cfg, ours) for ours, theirs in _HF_NAMES.items()},
        "num_decoder_layers": cfg.num_decoder_layers,
        "relative_attention_num_buckets": cfg.relative_attention_num_buckets,
        "relative_attention_max_distance": cfg.relative_attention_max_distance,
        "layer_norm_epsilon": cfg.layer_norm_eps, "feed_forward_proj": SUPPORTED_FEED_FORWARD,
        "tie_word_embeddings": False, "decoder_start_token_id": cfg.decoder_start_token_id,
        "pad_token_id": cfg.decoder_start_token_id, "dropout_rate": 0.0,
    }


def _get(state: Mapping[str, Any], name: str) -> np.ndarray:
    if name not in state:
        raise ValueError(
            f"checkpoint is missing tensor {name!r}; is it a T5 v1.1 model with the layer "
            "counts of its config?")
    return np.asarray(state[name], dtype=np.float32)


def t5_params_from_hf(state: Mapping[str, Any], cfg: T5Config) -> dict:
    """Converts a HF T5ForConditionalGeneration state dict (numpy arrays) to the t5x tree.

    ``lm_head.weight`` falls back to ``shared.weight`` when absent:
    ``transformers`` >= 5 ties the two and may save only the shared one.
    """
    embedding = _get(state, "shared.weight")
    lm_head = _get(state, "lm_head.weight") if "lm_head.weight" in state else embedding
    params: dict[str, Any] = {"token_embedder": {"embedding": embedding}}
    set_path(params, ("decoder", "logits_dense", "kernel"), lm_head.T)
    for ours, theirs, transpose in _tensor_map(cfg):
        value = _get(state, theirs)
        set_path(params, ours, value.T if transpose else value)
    check_shapes(params, T5EncoderDecoderLM(cfg).init_params)
    return params


def t5_params_to_hf(params: Mapping[str, Any], cfg: T5Config) -> dict[str, np.ndarray]:
    """Inverse of :func:`t5_params_from_hf`; loads strictly into T5ForConditionalGeneration
    (the shared embedding is also written under the encoder/decoder aliases)."""
    embedding = np.asarray(params["token_embedder"]["embedding"])
    state = {"shared.weight": embedding, "encoder.embed_tokens.weight": embedding,
             "decoder.embed_tokens.weight": embedding,
             "lm_head.weight": np.asarray(get_path(params, ("decoder", "logits_dense",
                                                           "kernel"))).T}
    for ours, theirs, transpose in _tensor_map(cfg):
        value = np.asarray(get_path(params, ours))
        state[theirs] = value.T if transpose else value
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in state.items()}


