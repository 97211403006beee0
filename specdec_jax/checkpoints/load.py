"""One call to load a model: name or path in, (model, params, tokenizer) out."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import precision
from specdec_jax.checkpoints import converted, fetch, gguf, registry, tokenizer
from specdec_jax.checkpoints.hf_decoder import decoder_config_from_hf
from specdec_jax.checkpoints.safetensors_io import load_hf_decoder
from specdec_jax.models.decoder_only import (
    DecoderOnlyLM,
    kernel_layout_converter,
    with_kernel_layout,
)
from specdec_jax.models.layers import IN_OUT, OUT_IN
from specdec_jax.runtime import sharding


def load_model(name_or_path: str | os.PathLike, dtype: str = "auto", *, mesh=None,
               kernel_layout: str = IN_OUT) -> tuple[DecoderOnlyLM, Any, Any]:
    """Loads a registry model (fetched on first use), a ``.gguf`` file, or a
    Hugging Face safetensors directory.

    ``mesh`` (``sharding.make_mesh``, one process or many): the params come
    back placed on it by ``sharding.DECODER_RULES``; a GGUF file's converted
    copy is then read slice by slice, each process reading only what its
    devices hold.

    ``dtype`` sets parameters and activations: ``"auto"`` is float32 on CPU
    and bfloat16 on accelerators; float32 anywhere computes its matmuls in
    full float32 (``specdec_jax.precision``). Probabilities are float32
    regardless.
    """
    dtype = precision.resolve_dtype(dtype)

    source = str(name_or_path)
    path = _local_file(source)
    overrides = dict(dtype=dtype, param_dtype=dtype,
                     matmul_precision=precision.matmul_precision(dtype))
    if path.is_dir():
        cfg, params = load_hf_decoder(path)
        cfg = type(cfg)(**{**cfg.__dict__, **overrides})
        tok = tokenizer.tokenizer_from_hf_dir(path)
    else:
        cfg, params, meta = _load_gguf(path, source, dtype, overrides, mesh,
                                       kernel_layout if mesh is None else IN_OUT)
        tok = tokenizer.tokenizer_from_gguf_metadata(meta)
        if mesh is not None:
            return DecoderOnlyLM(cfg), params, tok  # placed, already in dtype
    if mesh is not None:
        params = jax.tree_util.tree_map(lambda x: np.asarray(x).astype(dtype, copy=False),
                                        params)
        return DecoderOnlyLM(cfg), sharding.shard_params(params, mesh), tok
    params = jax.tree_util.tree_map(lambda x: _on_device(x, dtype), params)
    return DecoderOnlyLM(cfg), params, tok


WEIGHTS = ("f32", "stored")


def load_for_decoding(name_or_path: str | os.PathLike, dtype: str = "auto", *, mesh=None,
                      kernel_layout: str = OUT_IN,
                      weights: str = "f32") -> tuple[DecoderOnlyLM, Any, Any]:
    """``load_model``, then the kernel layout decoding runs fastest with
    (``"out_in"``: ``api.decode_layout``); ``"in_out"`` keeps the loaded tree
    (the switch that measures the difference). What the jobs, the CLI and the
    benchmarks decode with.

    ``weights="stored"`` (GGUF files only): every matrix of a block type the
    library reads (``native.stored_blocks``) stays in its file's bytes, in
    the ``out_in`` layout, q/k/v unfused (``load_stored``); ``"f32"``
    dequantises the file once into the converted cache."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights={weights!r}; choose one of {', '.join(WEIGHTS)}.")
    if weights == "stored":
        if mesh is not None or kernel_layout != OUT_IN:
            raise ValueError("stored GGUF weights run on one device in the out_in layout; "
                             "pass mesh=None and kernel_layout='out_in', or weights='f32'.")
        return load_stored(name_or_path, dtype)
    model, params, tok = load_model(name_or_path, dtype, mesh=mesh, kernel_layout=kernel_layout)
    model, params = with_kernel_layout(model, params, kernel_layout)  # when not loaded in it
    if mesh is not None:  # the fused projections have rules of their own
        params = sharding.reshard_params(params, mesh, sharding.rules_for(model))
    return model, params, tok


def load_stored(name_or_path: str | os.PathLike, dtype: str = "auto"
                ) -> tuple[DecoderOnlyLM, Any, Any]:
    """A GGUF model with its matrices kept in the file's blocks (``gguf.load_stored``).

    Activations run in ``dtype`` (float32 on CPU under ``auto``, where the
    block kernel multiplies them with the blocks); nothing is dequantised into
    the converted cache, and memory holds the file's bytes, not a float copy.
    """
    dtype = precision.resolve_dtype(dtype)
    path = _local_file(name_or_path)
    if path.is_dir() or path.suffix != ".gguf":
        raise ValueError(f"{name_or_path}: stored weights are read from a GGUF file; this is "
                         "not one. Use weights='f32'.")
    cfg, params, meta = gguf.load_stored(path, dtype=dtype, param_dtype=dtype,
                                         matmul_precision=precision.matmul_precision(dtype))
    params = _place_in_turn(
        params, lambda x: jax.device_put(x) if x.dtype == np.uint8 else _on_device(x, dtype))
    return DecoderOnlyLM(cfg), params, tokenizer.tokenizer_from_gguf_metadata(meta)


def _place_in_turn(tree: dict, place) -> dict:
    """``place`` on each leaf of a nested dict, in place: each numpy leaf is
    dropped as soon as its device array exists, so loading holds the model
    once, not a numpy and a device copy of all of it at once."""
    for key, value in tree.items():
        tree[key] = _place_in_turn(value, place) if isinstance(value, dict) else place(value)
    return tree


def _local_file(name_or_path: str | os.PathLike) -> pathlib.Path:
    """A registry name's local file (fetched on first use) or an existing path."""
    source = str(name_or_path)
    if source in registry.MODELS:
        return registry.local_path(source)
    path = pathlib.Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"{source!r} is neither a known model ({', '.join(registry.MODELS)}) nor an "
            "existing path to a .gguf file or a Hugging Face directory.")
    return path


def random_model(name: str, dtype: str = "auto", seed: int = 0) -> tuple[DecoderOnlyLM, Any]:
    """A model of a named architecture's exact shapes with random weights.

    For timing where the real weights are not at hand (a GPU host with no
    network): a decoder step's cost depends on the shapes and the dtype, not
    on the values. ``registry.ARCHITECTURES`` lists the names (the registered
    models plus shape-only entries such as ``qwen2.5-coder-7b``). Different
    seeds give independent weights.
    """
    dtype = precision.resolve_dtype(dtype)
    cfg = decoder_config_from_hf(registry.architecture(name), dtype=dtype, param_dtype=dtype,
                                 matmul_precision=precision.matmul_precision(dtype))
    model = DecoderOnlyLM(cfg)
    params = model.init_params(jax.random.PRNGKey(seed))
    # Every leaf in ``dtype``, as load_model stores real weights (flax keeps
    # some initialisers' leaves, such as norm scales, in float32).
    return model, jax.tree_util.tree_map(lambda x: x.astype(dtype), params)


def _on_device(array, dtype: str):
    """``array`` as a device array of ``dtype``. ``device_put`` of an array
    already in ``dtype``: on CPU it uses an aligned host buffer in place (the
    converted copy's mapped tensors: no copy at all), elsewhere it is one
    transfer; ``jnp.asarray`` would copy on the host first."""
    if isinstance(array, np.ndarray) and array.dtype == jnp.dtype(dtype):
        return jax.device_put(array)
    return jnp.asarray(array, dtype)


def _load_gguf(path: pathlib.Path, source: str, dtype: str, overrides: dict, mesh=None,
               kernel_layout: str = IN_OUT):
    """A GGUF file through the converted-weights cache (``converted.py``):
    dequantised once per file and dtype, keyed by the file's sha256 (the
    registry's pinned hash for named models, computed for other files).
    ``kernel_layout`` other than ``"in_out"``: the copy is kept in that layout
    (``with_kernel_layout``'s, converted entry by entry as it is written),
    made from the ``"in_out"`` copy when one is already there (no
    dequantising), else from the GGUF file."""
    sha256 = (registry.get_spec(source).sha256 if source in registry.MODELS
              else fetch.sha256_file(path))
    layout = None
    if kernel_layout != IN_OUT:
        probe = gguf.config_from_metadata  # the config is known only with the metadata

        def converter(meta, has_output):
            base = probe(meta, has_output, **overrides)
            return kernel_layout_converter(base, kernel_layout)[1] or (lambda _, entry: entry)

        # v2: gate/up stored [2, I, D]; a copy of the old [I, 2, D] layout is not read.
        layout = converted.Layout(f"{kernel_layout}_fused_v2", converter)

    def convert():
        if layout is not None:
            in_out = converted.read_copy(sha256, dtype)
            if in_out is not None:
                return in_out
        cfg, entries, meta = gguf.gguf_entries(path, **overrides)
        # Entries are dequantised as the copy is written (one layer in memory at
        # a time); cast(copy=False): no second copy of an entry already in ``dtype``.
        params = {key: entry.cast(jnp.dtype(dtype)) for key, entry in entries.items()}
        if layout is None:  # the in_out copy is returned whole
            params = {key: entry.make() for key, entry in params.items()}
        return params, meta, not cfg.tie_embeddings

    params, meta, has_output = converted.load_or_convert(path, sha256, dtype, convert,
                                                         mesh=mesh, layout=layout)
    cfg = gguf.config_from_metadata(meta, has_output, **overrides)
    if layout is not None:
        cfg = kernel_layout_converter(cfg, kernel_layout)[0]
    return cfg, params, meta
