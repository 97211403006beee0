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

import dataclasses
import functools
import math
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from specdec_jax.checkpoints import file_header
from specdec_jax.checkpoints.hf_decoder import (
    decoder_config_from_hf,
    decoder_entry_from_hf,
    decoder_entry_keys,
)
from specdec_jax.checkpoints.tree_paths import Deferred, check_shapes, check_shapes_against
from specdec_jax.models.decoder_only import DecoderConfig, DecoderOnlyLM
from specdec_jax.models.layers import OUT_IN
from specdec_jax.native import stored_blocks
from specdec_jax.runtime.progress import tqdm

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
# Prompt tokens a stored-weight decoder feeds per prefill call on a CPU
# (``DecoderConfig.prefill_chunk``): the block kernel's rows stay in cache.
STORED_PREFILL_CHUNK = 16
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def _reader(path: os.PathLike) -> file_header.GGUFHeader:
    """The file's key/values and tensor descriptions (``file_header``: one pass
    over the header, ~0.5 s for a Qwen2.5 file where ``gguf.GGUFReader`` took
    ~10 s); a file that is not GGUF, or is cut short, raises ValueError naming it."""
    return file_header.read_header(path)


def read_metadata(reader: file_header.GGUFHeader) -> dict[str, Any]:
    """All GGUF key/values as Python values (token lists included)."""
    return dict(reader.metadata)


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


class _DequantisedOnRead(Mapping):
    """The file's tensors under Hugging Face names, each dequantised (and
    un-permuted) when read and not kept: a converter reading one layer holds
    one layer in memory."""

    def __init__(self, reader, cfg: DecoderConfig, arch: str):
        self._cfg, self._arch, self._tensors = cfg, arch, {}
        for tensor in reader.tensors:
            name = tensor.name
            if name in _GLOBAL_NAMES:
                self._tensors[_GLOBAL_NAMES[name]] = tensor
            elif name.startswith("blk."):
                _, layer, kind, suffix = name.split(".")
                if kind in _LAYER_NAMES:  # others (e.g. rope frequency tables) are unused
                    self._tensors[f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}"] = tensor

    def __getitem__(self, hf_name: str) -> np.ndarray:
        tensor = self._tensors[hf_name]
        value = dequantize(tensor)
        kind = kind_of(tensor.name)
        if self._arch == "llama" and kind in ("attn_q", "attn_k"):
            value = _unpermute(value, self._cfg.num_heads if kind == "attn_q"
                               else self._cfg.num_kv_heads)
        return value

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def gguf_entries(path: os.PathLike, **config_overrides) -> tuple[DecoderConfig,
                                                                  dict[str, Deferred],
                                                                  dict[str, Any]]:
    """(config, {top-level entry: Deferred}, metadata) of a GGUF file: each
    entry (the embedding, a layer, the head) is dequantised when made, so a
    converter writing entry by entry never holds the float32 tree (7 GB for
    a 1.5B model) at once."""
    reader = _reader(path)
    meta = read_metadata(reader)
    cfg = config_from_metadata(meta, "output.weight" in {t.name for t in reader.tensors},
                               **config_overrides)
    state = _DequantisedOnRead(reader, cfg, meta["general.architecture"])
    shapes = jax.eval_shape(DecoderOnlyLM(cfg).init_params, jax.random.key(0))
    f32 = np.dtype(np.float32)

    def make(key: str) -> dict:
        entry = {key: decoder_entry_from_hf(state, cfg, key)}
        check_shapes_against(entry, {key: shapes[key]})
        return entry[key]

    entries = {key: Deferred(
        jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s.shape, f32), shapes[key]),
        functools.partial(make, key)) for key in decoder_entry_keys(cfg)}
    return cfg, entries, meta


def load_gguf(path: os.PathLike, **config_overrides) -> tuple[DecoderConfig, dict,
                                                                 dict[str, Any]]:
    """Reads a GGUF file; returns (config, params, metadata)."""
    cfg, entries, meta = gguf_entries(path, **config_overrides)
    params = {key: entry.make() for key, entry in
              tqdm(entries.items(), desc=f"dequantise {os.path.basename(path)}",
                   unit="entry", leave=False)}
    check_shapes(params, DecoderOnlyLM(cfg).init_params)
    return cfg, params, meta


# GGUF tensor kinds -> (module path, parameter) in the decode layout's unfused tree.
_STORED_LAYER = {
    "attn_q": ("attention", "query"), "attn_k": ("attention", "key"),
    "attn_v": ("attention", "value"), "attn_output": ("attention", "out"),
    "ffn_gate": ("mlp", "wi_0"), "ffn_up": ("mlp", "wi_1"), "ffn_down": ("mlp", "wo"),
}
_STORED_NORMS = {"attn_norm": "pre_attention_norm", "ffn_norm": "pre_mlp_norm"}


def stored_format(tensor) -> str | None:
    """The ``native.stored_blocks`` format a tensor keeps, or None (dequantised)."""
    name = tensor.tensor_type.name.lower()
    return name if name in stored_blocks.FORMATS else None


def _file_bytes(file, tensor) -> np.ndarray:
    """uint8 [n_bytes]: a tensor's bytes, read from the open file into memory of
    their own. Slicing the reader's memory map instead would keep every page
    read in the process's resident set for as long as any slice lives: the
    1.5B's whole 1.1 GB file, on top of the arrays made from it."""
    file.seek(tensor.data_offset)
    data = np.fromfile(file, np.uint8, count=int(tensor.n_bytes))
    if data.size != tensor.n_bytes:
        raise ValueError(f"tensor {tensor.name}: the file ends {tensor.n_bytes - data.size} "
                         "bytes early; it is truncated: delete it and fetch again.")
    return data


def _stored_or_dequantised(tensor, file, name: str, rows_permutation=None, *,
                           interleave: bool = False) -> tuple[str, np.ndarray]:
    """(parameter name, value): ``{name}_{format}`` and the file's block bytes
    (uint8 [out, row bytes]) when its type is kept, else ``name`` and the
    dequantised float32 [out, in]. ``rows_permutation``: applied to the rows
    (llama's Q/K un-permutation is a permutation of output rows).
    ``interleave``: a matrix of a format in ``stored_blocks.INTERLEAVE`` (q4_k,
    q6_k, q5_0) and a multiple of 16 rows is kept in its ``_x16`` layout (the
    same values, laid out for the CPU kernel)."""
    fmt = stored_format(tensor)
    if fmt is None:
        value, key = dequantize(tensor), name
    else:
        rows = int(np.prod([int(d) for d in tensor.shape[1:]]))
        value, key = _file_bytes(file, tensor).reshape(rows, -1), f"{name}_{fmt}"
    if rows_permutation is not None:
        value = rows_permutation(value)
    if (interleave and fmt in stored_blocks.INTERLEAVE
            and value.shape[0] % stored_blocks.X16_ROWS == 0):
        return f"{name}_{stored_blocks.INTERLEAVE[fmt]}", stored_blocks.interleave(value, fmt)
    return key, np.ascontiguousarray(value)


def load_stored(path: os.PathLike, *, platform: str | None = None, **config_overrides
                ) -> tuple[DecoderConfig, dict, dict[str, Any]]:
    """(config, params, metadata) with every matrix of a supported block type
    (``native.stored_blocks.FORMATS``) kept as the file's bytes, in the decode
    layout (``out_in``, q, k and v unfused: they may be of different types;
    gate and up fused where they share one, ``_fuse_gate_up``); norms, biases
    and matrices of other types dequantised
    to float32. No float32 copy of the kept matrices is made, in memory or on
    disk; the returned leaves are numpy arrays (the caller places them).
    ``platform``: where the model will run (default: jax's default backend);
    a CPU gets the kernel's layout, any other platform the file's."""
    reader = _reader(path)
    meta = read_metadata(reader)
    arch = meta["general.architecture"]
    names = {t.name for t in reader.tensors}
    # On a CPU a stored product takes int8 activations, row by row (q4_k, q6_k
    # and q5_0 matrices interleaved by 16 rows for the kernel); computing
    # attention and norms row by row too makes the target one function of each
    # row there (``DecoderConfig.row_independent``): a scoring call's rows are
    # a step's.
    on_cpu = (platform or jax.default_backend()) == "cpu"
    config_overrides.setdefault("row_independent", on_cpu)
    # The block kernel keeps a product's int8 activations in cache for up to ~16
    # rows; a longer prompt fed in chunks of 16 took the 1.5B's prefill from
    # ~15 to ~10 ms a token on 2 cores (docs/results.md), and stops at its length.
    config_overrides.setdefault("prefill_chunk", STORED_PREFILL_CHUNK if on_cpu else 0)
    cfg = config_from_metadata(meta, "output.weight" in names, kernel_layout=OUT_IN,
                               fused_projections=False, **config_overrides)
    params: dict[str, Any] = {}
    with open(path, "rb") as file:
        for tensor in tqdm(reader.tensors, desc=f"read {os.path.basename(path)}", unit="tensor",
                           leave=False):
            name = tensor.name
            if name == "token_embd.weight":
                key, value = _stored_or_dequantised(tensor, file, "embedding")
                params.setdefault("embedder", {})[key] = value
            elif name == "output.weight":
                key, value = _stored_or_dequantised(tensor, file, "kernel",
                                                    interleave=on_cpu)
                params.setdefault("logits_dense", {})[key] = value
            elif name == "output_norm.weight":
                params["decoder_norm"] = {"scale": dequantize(tensor)}
            elif name.startswith("blk."):
                _, layer, kind, suffix = name.split(".")
                entry = params.setdefault(f"layers_{layer}", {})
                if kind in _STORED_NORMS:
                    entry[_STORED_NORMS[kind]] = {"scale": dequantize(tensor)}
                elif kind in _STORED_LAYER:
                    module, proj = _STORED_LAYER[kind]
                    heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}.get(kind)
                    permute = ((lambda v, h=heads: _unpermute(v, h))
                               if arch == "llama" and heads is not None else None)
                    target = entry.setdefault(module, {}).setdefault(proj, {})
                    if suffix == "weight":
                        key, value = _stored_or_dequantised(tensor, file, "kernel", permute,
                                                            interleave=on_cpu)
                    else:
                        key, value = "bias", dequantize(tensor)
                        value = value if permute is None else permute(value)
                    target[key] = value
    if _fuse_gate_up(params):
        cfg = dataclasses.replace(cfg, fused_mlp=True)
    check_stored_shapes(cfg, params)
    return cfg, params, meta


def _fuse_gate_up(params: dict) -> bool:
    """Joins every layer's gate and up blocks into one ``wi`` matrix
    ``[2I, row bytes]`` (gate rows, then up rows) when all of them are kept in
    one block type: one kernel call instead of two, each output the same bits
    (a block product computes each output row alone). False, and nothing
    changed, otherwise."""
    layers = [entry["mlp"] for name, entry in params.items() if name.startswith("layers_")]
    keys = {key for mlp in layers for proj in ("wi_0", "wi_1") for key in mlp.get(proj, {})}
    if not layers or len(keys) != 1 or not next(iter(keys)).startswith("kernel_"):
        return False
    (key,) = keys
    for mlp in layers:
        gate, up = mlp.pop("wi_0")[key], mlp.pop("wi_1")[key]
        mlp["wi"] = {key: np.concatenate([gate, up])}
    return True


def check_stored_shapes(cfg: DecoderConfig, params: dict) -> None:
    """Every leaf the model expects is there, stored or float, in its shape."""
    expected = jax.eval_shape(DecoderOnlyLM(cfg).init_params, jax.random.key(0))

    def check(want, have, where):
        for key, spec in want.items():
            if isinstance(spec, dict):
                check(spec, have.get(key, {}), f"{where}/{key}")
                continue
            if key in have:
                found = tuple(have[key].shape)
            else:
                stored = next((k for k in have if k.startswith(f"{key}_")), None)
                if stored is None:
                    raise ValueError(f"GGUF file: {where}/{key} is missing.")
                found = stored_blocks.StoredMatrix.of_blocks(have[stored],
                                                             stored[len(key) + 1:]).shape
                # A fused kernel [*N, in] is kept as the [prod(N), in] matrix it is.
                spec = jax.ShapeDtypeStruct((math.prod(spec.shape[:-1]), spec.shape[-1]),
                                            spec.dtype)
            if found != tuple(spec.shape):
                raise ValueError(f"GGUF file: {where}/{key} has shape {found}, the config "
                                 f"says {tuple(spec.shape)}.")

    check(expected, params, "")


def kind_of(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) == 4 and parts[0] == "blk" else None
