"""Hugging Face <-> specdec_jax conversion for Llama/Qwen2 decoders.

Both directions are pure renames plus transposes (torch ``Linear`` stores
``[out, in]``, Flax ``Dense`` stores ``[in, out]``), so a round trip is exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from specdec_jax.checkpoints.tree_paths import check_shapes, get_path, set_path
from specdec_jax.models.decoder_only import DecoderConfig, DecoderOnlyLM, with_kernel_layout
from specdec_jax.models.layers import IN_OUT

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "mistral")

# DecoderConfig's field -> its config.json key, for the keys every config holds
# (both directions read it; the fields with fallbacks are written out in each).
_HF_NAMES = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
             "intermediate_size": "intermediate_size", "num_layers": "num_hidden_layers",
             "num_heads": "num_attention_heads"}

# (ours within layers_{i}, HF within model.layers.{i}, transpose)
_LAYER_MAP = (
    (("attention", "query", "kernel"), "self_attn.q_proj.weight", True),
    (("attention", "key", "kernel"), "self_attn.k_proj.weight", True),
    (("attention", "value", "kernel"), "self_attn.v_proj.weight", True),
    (("attention", "out", "kernel"), "self_attn.o_proj.weight", True),
    (("mlp", "wi_0", "kernel"), "mlp.gate_proj.weight", True),
    (("mlp", "wi_1", "kernel"), "mlp.up_proj.weight", True),
    (("mlp", "wo", "kernel"), "mlp.down_proj.weight", True),
    (("pre_attention_norm", "scale"), "input_layernorm.weight", False),
    (("pre_mlp_norm", "scale"), "post_attention_layernorm.weight", False),
)
_BIAS_MAP = (
    (("attention", "query", "bias"), "self_attn.q_proj.bias"),
    (("attention", "key", "bias"), "self_attn.k_proj.bias"),
    (("attention", "value", "bias"), "self_attn.v_proj.bias"),
)


def decoder_config_from_hf(hf: Mapping[str, Any], **overrides) -> DecoderConfig:
    """Builds a DecoderConfig from a Hugging Face ``config.json`` dict."""
    model_type = hf.get("model_type", "")
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"decoder_config_from_hf: unknown architecture {model_type!r}; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}.")
    if hf.get("rope_scaling") not in (None, {}) and hf["rope_scaling"].get("rope_type",
                                                                        "default") != "default":
        raise ValueError(
            f"decoder_config_from_hf: rope_scaling {hf['rope_scaling']} is not supported yet.")
    rope_theta = hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 1e4))
    fields = {ours: hf[theirs] for ours, theirs in _HF_NAMES.items()}
    fields.update(
        num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        rope_theta=float(rope_theta),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )
    fields.update(overrides)
    return DecoderConfig(**fields)


def decoder_config_to_hf(cfg: DecoderConfig, model_type: str = "llama") -> dict:
    """The ``config.json`` dict that makes ``transformers`` build the same network."""
    if model_type not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"decoder_config_to_hf: unknown architecture {model_type!r}.")
    if cfg.qkv_bias and model_type == "llama":
        model_type = "qwen2"  # Llama has no per-projection q/k/v bias switch in older HF
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "mistral": "MistralForCausalLM"}[model_type]
    return {
        "architectures": [arch], "model_type": model_type,
        **{theirs: getattr(cfg, ours) for ours, theirs in _HF_NAMES.items()},
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.dims_per_head,
        "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu",
        "attention_bias": cfg.qkv_bias, "torch_dtype": "float32",
        "max_position_embeddings": 32768,
    }


def _get(state: Mapping[str, Any], name: str) -> np.ndarray:
    if name not in state:
        raise KeyError(f"checkpoint is missing tensor {name!r}; is it a Llama/Qwen2 model?")
    return np.asarray(state[name], dtype=np.float32)


def decoder_entry_keys(cfg: DecoderConfig) -> list[str]:
    """The top-level entries of our parameter tree for ``cfg``."""
    keys = ["embedder", "decoder_norm"] + [f"layers_{i}" for i in range(cfg.num_layers)]
    return keys + ([] if cfg.tie_embeddings else ["logits_dense"])


def decoder_entry_from_hf(state: Mapping[str, Any], cfg: DecoderConfig, key: str) -> dict:
    """One top-level entry of our tree (``decoder_entry_keys``), reading from
    ``state`` only the tensors it needs: a converter may build the tree entry
    by entry and keep one layer in memory at a time."""
    if key == "embedder":
        return {"embedding": _get(state, "model.embed_tokens.weight")}
    if key == "decoder_norm":
        return {"scale": _get(state, "model.norm.weight")}
    if key == "logits_dense":
        return {"kernel": _get(state, "lm_head.weight").T}
    i = int(key.removeprefix("layers_"))
    layer: dict[str, Any] = {}
    for ours, theirs, transpose in _LAYER_MAP:
        value = _get(state, f"model.layers.{i}.{theirs}")
        set_path(layer, ours, value.T if transpose else value)
    if cfg.qkv_bias:
        for ours, theirs in _BIAS_MAP:
            set_path(layer, ours, _get(state, f"model.layers.{i}.{theirs}"))
    return layer


def decoder_params_from_hf(state: Mapping[str, Any], cfg: DecoderConfig) -> dict:
    """Converts a HF Llama/Qwen2 state dict (numpy arrays) to our parameter tree."""
    params = {key: decoder_entry_from_hf(state, cfg, key) for key in decoder_entry_keys(cfg)}
    check_shapes(params, DecoderOnlyLM(cfg).init_params)
    return params


def decoder_params_to_hf(params: Mapping[str, Any], cfg: DecoderConfig) -> dict[str, np.ndarray]:
    """Inverse of :func:`decoder_params_from_hf` (for exporting trained drafters).
    Parameters in the decode layout (``cfg.kernel_layout == "out_in"``) are
    exported alike."""
    _, params = with_kernel_layout(DecoderOnlyLM(cfg), params, IN_OUT)
    state = {"model.embed_tokens.weight": params["embedder"]["embedding"],
             "model.norm.weight": params["decoder_norm"]["scale"]}
    for i in range(cfg.num_layers):
        layer = params[f"layers_{i}"]
        for ours, theirs, transpose in _LAYER_MAP:
            value = np.asarray(get_path(layer, ours))
            state[f"model.layers.{i}.{theirs}"] = value.T if transpose else value
        if cfg.qkv_bias:
            for ours, theirs in _BIAS_MAP:
                state[f"model.layers.{i}.{theirs}"] = get_path(layer, ours)
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = np.asarray(params["logits_dense"]["kernel"]).T
    return {k: np.ascontiguousarray(np.asarray(v, np.float32)) for k, v in state.items()}
