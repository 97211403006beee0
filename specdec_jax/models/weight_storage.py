"""Weight-only storage of a decoder's parameters in fewer bytes.

A drafter may be stored in any precision without touching exactness:
verification needs only the law the drafts were drawn from, and a drafter
with rounded weights has a law of its own that the verifier is given. What it
changes is the bytes a step reads (a few-row step is bound by them) and, a
little, the acceptance. The formats:

- ``f32``: as loaded.
- ``bf16``: every kernel and the embedding (also the tied output head) in
  bfloat16; norms and biases stay float32. Half the bytes.
- ``int8``: every dense kernel of the layers as int8 with a float32 scale per
  output row (``w ~= q * scale``, ``scale = max |w_row| / 127``, rounded to
  nearest); the embedding and output head in bfloat16. A quarter of the
  bytes of the layers. Needs the ``out_in`` decode layout,
  where a kernel's rows are its outputs.

An embedding that is only looked up (the model has a separate output head)
stays as loaded in every format: a step reads a few of its rows, so narrower
storage saves no time, and a narrowed copy would sit whole in memory where the
loaded one (mapped from the converted cache) is resident only in the rows read.

Activations and accumulation stay float32; the CPU kernel (``native.matmul``)
widens the stored weights in registers, and elsewhere XLA widens them first.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax.models.layers import HEAD_VOCAB, KERNEL_SCALE, OUT_IN, is_kernel
from specdec_jax.native import matmul as native_matmul

Array = jax.Array
WEIGHT_FORMATS = ("f32", "bf16", "int8")
# A decoder stored narrow (int8, bf16) for the CPU kernel costs about the same
# per prompt token fed in one call or in chunks (the 0.5B in int8, 2 cores, a
# 166-token prompt: 956 vs 911 ms), so it is fed in chunks of 32 and its prefill
# follows each prompt's length instead of the padded width (96 of 166 tokens:
# 477 vs 913 ms). A float32 model stays one call: XLA's product of the whole
# width is 27% cheaper per token than in chunks of 32.
NARROW_PREFILL_CHUNK = 32


def check_format(weight_format: str) -> str:
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight format {weight_format!r}; choose one of "
                         f"{', '.join(WEIGHT_FORMATS)}.")
    return weight_format


def with_prefill_for(model, weight_format: str, on_kernel: bool | None = None):
    """``model`` fed its prompt in chunks of ``NARROW_PREFILL_CHUNK`` where its
    weights are stored narrow and the CPU kernel multiplies them (``on_kernel``;
    default: whether it is active now); ``model`` itself otherwise, and for a
    model without a chunked prefill (T5)."""
    config = getattr(model, "config", None)
    on_kernel = native_matmul.active() if on_kernel is None else on_kernel
    if weight_format == "f32" or not on_kernel or not hasattr(config, "prefill_chunk"):
        return model
    return dataclasses.replace(model, config=dataclasses.replace(
        config, prefill_chunk=NARROW_PREFILL_CHUNK))


@jax.jit
def quantize_rows(w: Array) -> tuple[Array, Array]:
    """``(q int8 [..., K], scale float32 [...])`` with ``w ~= q * scale[..., None]``:
    a symmetric scale per output row (all axes but the last)."""
    w = w.astype(jnp.float32)
    peak = jnp.max(jnp.abs(w), axis=-1)
    scale = jnp.where(peak > 0, peak / 127.0, 1.0)
    q = jnp.clip(jnp.round(w / scale[..., None]), -127, 127).astype(jnp.int8)
    return q, scale


_to_bf16 = jax.jit(lambda leaf: leaf.astype(jnp.bfloat16))


def _is_embedding(path) -> bool:
    return getattr(path[-1], "key", None) == "embedding"


def _in_layer(path) -> bool:
    return str(getattr(path[0], "key", "")).startswith("layers_")


def store_weights(params: dict, weight_format: str, *, kernel_layout: str = OUT_IN) -> dict:
    """``params`` with its kernels (and embedding) stored in ``weight_format``.

    Converts one leaf at a time; the caller drops its reference to the old
    tree so the float32 leaves are freed as the new ones appear.
    """
    check_format(weight_format)
    if weight_format == "f32":
        return params
    if weight_format == "int8" and kernel_layout != OUT_IN:
        raise ValueError("int8 weights need the out_in decode layout (rows are outputs); "
                         "convert with models.decoder.with_kernel_layout first.")

    # A separate head (full or restricted to a token subset) leaves the
    # embedding a lookup table.
    lookup_only = "logits_dense" in params or HEAD_VOCAB in params

    def convert(node, path=()):
        if isinstance(node, dict):
            out = {}
            for key in list(node):
                sub = convert(node[key], path + (jax.tree_util.DictKey(key),))
                if isinstance(sub, tuple):  # an int8 kernel and its scale
                    out[key], out[KERNEL_SCALE] = sub
                else:
                    out[key] = sub
            return out
        if is_kernel(path) and node.ndim >= 2 and weight_format == "int8" and _in_layer(path):
            return quantize_rows(node)
        if (is_kernel(path) and node.ndim >= 2) or (_is_embedding(path) and not lookup_only):
            return _to_bf16(node)
        return node

    return convert(params)


def stored_bytes(params: dict) -> int:
    """Bytes the parameter leaves occupy as stored."""
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))
