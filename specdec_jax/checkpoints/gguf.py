"""GGUF checkpoints (llama.cpp format) -> our decoder config and parameters.

Tensors are dequantised to float32 with the ``gguf`` package and renamed to
Hugging Face names, so one conversion (``hf_decoder``) serves GGUF and
safetensors alike. Two details matter for exact parity:

* numpy views of GGUF tensors are ``[out, in]`` like torch ``Linear``
  weights (GGUF lists dims innermost first);
* llama.cpp permutes the Q and K projections of the *llama* architecture so
  that its kernels can use interleaved rotary pairs; we undo the permutation
  so our rotate-half rotary embedding applies. Qwen2 files use rotate-half
  ("NEOX") already and are not permuted.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from specdec_jax.checkpoints.hf_decoder import decoder_config_from_hf, decoder_params_from_hf
from specdec_jax.models.decoder import DecoderConfig
from specdec_jax.runtime.progress import tqdm

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def _reader(path: os.PathLike):
    import gguf  # noqa: PLC0415 (heavy import, only when loading)

    try:
        return gguf.GGUFReader(os.fspath(path))
    except Exception as err:  # the gguf package raises bare ValueError/IndexError
        raise ValueError(f"{path} is not a readable GGUF file ({err}); it may be truncated: "
                         "delete it and fetch again.") from err


def read_metadata(reader) -> dict[str, Any]:
    """All GGUF key/values as Python values (token lists included)."""
    meta = {}
    for key, field in reader.fields.items():
        try:
            meta[key] = field.contents()
        except Exception:  # noqa: BLE001 (fields of exotic types are not needed)
            continue
    return meta


def config_from_metadata(meta: dict[str, Any], has_output: bool, **overrides) -> DecoderConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)}.")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"])
    heads = meta[f"{arch}.attention.head_count"]
    hf = {
        "model_type": arch, "vocab_size": int(vocab),
        "hidden_size": meta[f"{arch}.embedding_length"],
        "intermediate_size": meta[f"{arch}.feed_forward_length"],
        "num_hidden_layers": meta[f"{arch}.block_count"], "num_attention_heads": heads,
        "num_key_value_heads": meta.get(f"{arch}.attention.head_count_kv", heads),
        "rope_theta": meta.get(f"{arch}.rope.freq_base", 10000.0),
        "rms_norm_eps": meta[f"{arch}.attention.layer_norm_rms_epsilon"],
        "tie_word_embeddings": not has_output,
    }
    if meta.get(f"{arch}.rope.scaling.type", "none") not in ("none", ""):
        raise ValueError(f"GGUF rope scaling {meta[f'{arch}.rope.scaling.type']!r} is not "
                         "supported.")
    return decoder_config_from_hf(hf, **overrides)


def _unpermute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K permutation (interleaved -> rotate-half pairs)."""
    rows = weight.shape[0]
    return (weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def dequantize(tensor) -> np.ndarray:
    """float32 numpy array of one GGUF tensor, in [out, in] (torch) layout."""
    from gguf import GGMLQuantizationType, quants  # noqa: PLC0415

    kind = tensor.tensor_type
    shape = tuple(int(d) for d in reversed(tensor.shape))
    if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
        return np.asarray(tensor.data, np.float32).reshape(shape)
    try:
        values = quants.dequantize(tensor.data, kind)
    except NotImplementedError as err:
        raise ValueError(f"tensor {tensor.name}: quantisation type {kind.name} cannot be "
                         "dequantised by the installed gguf package; upgrade gguf or convert "
                         "the file to another type.") from err
    return np.asarray(values, np.float32).reshape(shape)


def load_gguf(path: os.PathLike, **config_overrides) -> tuple[DecoderConfig, dict,
                                                                 dict[str, Any]]:
    """Reads a GGUF file; returns (config, params, metadata)."""
    reader = _reader(path)
    meta = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    cfg = config_from_metadata(meta, "output.weight" in names, **config_overrides)
    arch = meta["general.architecture"]
    state: dict[str, np.ndarray] = {}
    for tensor in tqdm(reader.tensors, desc=f"dequantise {os.path.basename(path)}",
                       unit="tensor", leave=False):
        name = tensor.name
        if name in _GLOBAL_NAMES:
            hf_name = _GLOBAL_NAMES[name]
        elif name.startswith("blk."):
            _, layer, kind, suffix = name.split(".")
            if kind not in _LAYER_NAMES:
                continue  # e.g. rope frequency tables, unused here
            hf_name = f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"
        else:
            continue
        value = dequantize(tensor)
        if arch == "llama" and kind_of(name) in ("attn_q", "attn_k"):
            heads = cfg.num_heads if kind_of(name) == "attn_q" else cfg.num_kv_heads
            value = _unpermute(value, heads)
        state[hf_name] = value
    return cfg, decoder_params_from_hf(state, cfg), meta


def kind_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) == 4 and parts[0] == "blk" else None
