"""Building blocks shared by the decoder-only and encoder-decoder models."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.native import matmul as native_matmul
from specdec_jax.native.stored_blocks import FORMATS as STORED_FORMATS
from specdec_jax.native.stored_blocks import StoredMatrix

Array = jax.Array


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale and no bias (Llama, T5 v1.1).

    The variance is taken in float32 whatever the activation dtype, as both
    reference implementations do, so bfloat16 runs stay stable.
    """

    eps: float = 1e-6
    dtype: jnp.dtype = jnp.float32
    # Sum the squares by ``row_sum`` (a fixed tree of elementwise adds): each
    # row's norm is then the same bits however many rows share the call.
    by_row: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        x32 = x.astype(jnp.float32)
        squares = jnp.square(x32)
        if self.by_row:
            mean = row_sum(squares) / x.shape[-1]
        else:
            mean = jnp.mean(squares, axis=-1, keepdims=True)
        x32 = x32 * jax.lax.rsqrt(mean + self.eps)
        return (x32 * scale).astype(self.dtype)


def row_sum(x: Array) -> Array:
    """``x.sum(-1, keepdims=True)`` by a fixed tree of elementwise adds.

    XLA's reduction of ``[K, N]`` may order a row's additions differently for
    different ``K`` (it vectorises across rows or along them); an elementwise
    add has one result per element. So the last axis is folded in halves
    (after summing an odd factor's equal parts), each fold one elementwise
    add: a row's sum is the same bits alone or among any number of rows."""
    n = x.shape[-1]
    while n > 1:
        if n % 2:  # e.g. 1,536 = 3 x 512: add the three 512-wide parts first
            factor = next(f for f in range(3, n + 1, 2) if n % f == 0)
            parts = x.reshape(*x.shape[:-1], factor, n // factor)
            x = parts[..., 0, :]
            for i in range(1, factor):
                x = x + parts[..., i, :]
            n //= factor
            continue
        x = x[..., :n // 2] + x[..., n // 2:]
        n //= 2
    return x


def rotary_embedding(x_BxKxHxD: Array, positions_BxK: Array, theta: float) -> Array:
    """Applies rotary position embeddings in the "rotate half" layout.

    Hugging Face Llama/Qwen2 pair dimension i with i + D/2 (not 2i with 2i+1);
    GGUF loaders undo llama.cpp's interleaved permutation so this one layout
    serves every checkpoint.
    """
    half = x_BxKxHxD.shape[-1] // 2
    inv_freq_H = 1.0 / (theta ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles_BxKxH = positions_BxK[..., None].astype(jnp.float32) * inv_freq_H
    cos = jnp.cos(angles_BxKxH)[:, :, None, :]  # [B, K, 1, D/2]
    sin = jnp.sin(angles_BxKxH)[:, :, None, :]
    x32 = x_BxKxHxD.astype(jnp.float32)
    x1, x2 = x32[..., :half], x32[..., half:]
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x_BxKxHxD.dtype)


def masked_softmax_attention(q_BxKxHxGxD: Array, keys: Array, values: Array,
                             mask_BxKxS: Array, scale: float,
                             bias_HxKxS: Array | None = None, *,
                             precision: str | None = None, heads_major: bool = False) -> Array:
    """Grouped-query attention over a cache buffer.

    ``H`` key/value heads each serve ``G`` query heads. ``keys`` and ``values``
    are ``[B, S, H, D]``, or ``[B, H, S, D]`` with ``heads_major`` (the
    decoder's cache: each head's keys contiguous, so a product per head reads
    them in place instead of a transposed copy of the cache). Scores are
    computed in float32. Masked keys get a large negative score (not -inf, so
    a fully masked row, e.g. a padding query, yields a finite uniform average
    instead of NaN).
    """
    kv = "bhsd" if heads_major else "bshd"
    scores = jnp.einsum(f"bkhgd,{kv}->bhgks", q_BxKxHxGxD, keys,
                        preferred_element_type=jnp.float32, precision=precision) * scale
    if bias_HxKxS is not None:
        heads, groups = q_BxKxHxGxD.shape[2], q_BxKxHxGxD.shape[3]
        # [B?, H*G, K, S] -> [B?, H, G, K, S]
        scores = scores + bias_HxKxS.reshape(
            bias_HxKxS.shape[:-3] + (heads, groups) + bias_HxKxS.shape[-2:])
    scores = jnp.where(mask_BxKxS[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
    return jnp.einsum(f"bhgks,{kv}->bkhgd", weights, values, precision=precision)


# How a dense layer's kernel is stored. "in_out" ([in, out]) is the t5x/Flax
# tree every checkpoint loader returns and training uses; "out_in" ([out, in],
# what Hugging Face and GGUF files hold) is the decode layout: a product with
# few rows (M = 1 decode steps, M = G + 1 scoring calls) then reduces along the
# kernel's minor dimension, which XLA runs as a dot of contiguous rows instead
# of a strided column reduction (see ``models.decoder.with_kernel_layout``).
IN_OUT, OUT_IN = "in_out", "out_in"
KERNEL_LAYOUTS = (IN_OUT, OUT_IN)
# The parameters' entry of a decoder's restricted output head
# (``decoder_only.with_head_vocab``): rows copied from the head, a decoding-time view.
HEAD_VOCAB = "head_vocab"
# Beside an int8 ``kernel``: its per-output-row float32 scale (``models.weight_storage``).
KERNEL_SCALE = "kernel_scale"


def matmul_out_in(x: Array, w_NxK: Array, precision: str | None = None, *,
                  scale_N: Array | None = None) -> Array:
    """``x[..., K] @ w[N, K]^T``: a product with a kernel stored ``[out, in]``,
    reducing along the kernel's contiguous minor dimension. ``w`` may be stored
    narrower than ``x`` (bfloat16; int8 with a per-row ``scale_N``): see
    ``native.matmul``, which runs the few-row products of decoding on CPU."""
    return native_matmul.matmul_out_in(x, w_NxK, precision, scale_N=scale_N)


def stored_in(variables, name: str) -> StoredMatrix | None:
    """The parameter ``name`` of ``variables`` kept in its GGUF file's blocks,
    or ``None``.

    Stored as ``{name}_{format}`` (e.g. ``kernel_q4_k``): uint8 ``[out, row
    bytes]``, which the float kernel's shape check would refuse, under a name
    that gives the traced product its format statically (``native.stored_blocks``)."""
    for fmt in STORED_FORMATS:
        if f"{name}_{fmt}" in variables:
            return StoredMatrix.of_blocks(variables[f"{name}_{fmt}"], fmt)
    return None


def stored_matrix(module: nn.Module, name: str = "kernel") -> StoredMatrix | None:
    """``stored_in`` for a parameter of ``module``."""
    return stored_in(module.variables.get("params", {}), name)


def stored_scale(module: nn.Module) -> Array | None:
    """The per-output-row ``kernel_scale`` of a kernel stored as int8
    (``models.weight_storage``), or ``None`` for a float kernel."""
    if module.has_variable("params", KERNEL_SCALE):
        return module.get_variable("params", KERNEL_SCALE)
    return None


def is_kernel(path) -> bool:
    """Whether a ``tree_flatten_with_path`` path names a dense kernel (the
    leaves a kernel layout transposes)."""
    return getattr(path[-1], "key", None) == "kernel"


def check_kernel_layout(layout: str, name: str = "layout") -> None:
    """Refuses a layout that is not one of ``KERNEL_LAYOUTS``; ``name`` is what
    the message calls it (the argument, or ``"Config: kernel_layout"``)."""
    if layout not in KERNEL_LAYOUTS:
        raise ValueError(f"{name}={layout!r}; choose one of {', '.join(KERNEL_LAYOUTS)}.")


def transpose_kernels(tree, transpose=lambda leaf: leaf.T):
    """``tree`` with every dense ``kernel`` transposed (``is_kernel``): the
    other layout of the same weights; everything else as it was. ``leaf.T``
    keeps a NumPy leaf NumPy (and its dtype); pass a jitted transpose to
    convert device arrays one program per shape."""
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: transpose(leaf) if is_kernel(path) else leaf, tree)


class Linear(nn.Module):
    """``y = x W (+ b)`` with ``W`` stored in ``kernel_layout`` (names and
    initialisation of ``nn.Dense`` in the default layout: ``kernel``,
    ``bias``).

    In the ``out_in`` layout ``features`` may be a shape: ``W`` is stored
    ``[*features, in]`` and ``y`` is ``[..., *features]``, several projections
    of the same input as one product (the decode layout's fused ``qkv`` and
    ``wi``): one dot over the kernel as stored (never reshaped:
    ``matmul_out_in``), whose rows are contiguous in memory."""

    features: int | tuple[int, ...]
    use_bias: bool = False
    kernel_layout: str = IN_OUT
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    precision: str | None = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        fan_in = x.shape[-1]
        out_shape = (self.features,) if isinstance(self.features, int) else self.features
        if self.kernel_layout == OUT_IN:
            out_axes = tuple(range(len(out_shape)))
            init = nn.initializers.lecun_normal(in_axis=-1, out_axis=out_axes)
            kernel = stored_matrix(self) or self.param("kernel", init, (*out_shape, fan_in),
                                                       self.param_dtype)
            y = matmul_out_in(x.astype(self.dtype), kernel, self.precision,
                              scale_N=stored_scale(self))  # [..., *out_shape]
        elif len(out_shape) == 1:
            kernel = self.param("kernel", nn.initializers.lecun_normal(),
                                (fan_in, self.features), self.param_dtype)
            y = jnp.einsum("...i,io->...o", x.astype(self.dtype), kernel.astype(self.dtype),
                           precision=self.precision)
        else:
            raise ValueError(f"Linear: features={self.features} (several projections in one "
                             "kernel) needs the out_in layout.")
        if self.use_bias:
            bias = self.param("bias", nn.initializers.zeros, out_shape, self.param_dtype)
            y = y + bias.astype(self.dtype)
        return y
