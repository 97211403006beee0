"""Decoder-only transformer for the Llama and Qwen2 families.

RMSNorm, rotary embeddings (configurable base), grouped-query attention,
SwiGLU MLP, optional QKV bias (Qwen2), tied or untied embeddings. Parameters
use t5x-style names so every model in the project reads the same way::

    embedder/embedding                          [V, D]
    layers_{i}/pre_attention_norm/scale         [D]
    layers_{i}/attention/{query,key,value}/kernel (+ bias with qkv_bias)
    layers_{i}/attention/out/kernel
    layers_{i}/pre_mlp_norm/scale
    layers_{i}/mlp/{wi_0 (gate), wi_1 (up), wo}/kernel
    decoder_norm/scale
    logits_dense/kernel                         [D, V] (absent when tied)

The decode layout (``with_kernel_layout(..., OUT_IN)``) stores every kernel
``[out, in]`` and, by default, fuses each layer's three input projections of
attention and two of the MLP (``fused_projections``)::

    layers_{i}/attention/qkv/kernel             [H_kv, G + 2, D_head, D]
    layers_{i}/attention/qkv/bias               [H_kv, G + 2, D_head] (qkv_bias)
    layers_{i}/mlp/wi/kernel                    [2, I, D]   ([0] gate, [1] up)

with ``G = num_heads / num_kv_heads``: slot ``g < G`` of kv group ``h`` is
query head ``h * G + g`` (the head that reads kv head ``h``), slot ``G`` the
key and ``G + 1`` the value. One product then computes what three (two)
did, and the leading axis is the unit of tensor parallelism: sharding it
over the ``model`` axis hands each device whole kv groups with their query
heads (``sharding.DECODER_RULES_OUT_IN``), never part of a head; ``wi`` is
sharded along ``I``, so a device holds the gate and up rows of the same
units. Gate and up are whole blocks (``[2, I, D]``, not interleaved
``[I, 2, D]``): the MLP cuts the product's output into gate and up, and XLA
moves such a cut onto the kernel; on an interleaved kernel that is a strided
copy of it, which the TPU compiler made once per layer before the decoding
loop and kept alive through it (1.4 GiB of HBM temporaries for the 1.5B
target, issue 55). A block's cut is a plain slice of the stored kernel.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import precision
from specdec_jax.models import interface
from specdec_jax.models.interface import Prompt, StepOutput
from specdec_jax.models.layers import (
    HEAD_VOCAB,
    IN_OUT,
    OUT_IN,
    Linear,
    RMSNorm,
    check_kernel_layout,
    masked_softmax_attention,
    matmul_out_in,
    rotary_embedding,
    stored_in,
    stored_matrix,
    transpose_kernels,
)
from specdec_jax.native import attention as native_attention
from specdec_jax.native import stored_blocks

Array = jax.Array
# A wide call over a long cache (a prefill: 512 prompt tokens into 2,048 of room at
# batch 64) would hold float32 attention scores [B, H, G, K, S] of GiBs per layer
# (3.5 GiB for a 0.5B layer there). Above this size the queries are scored in
# blocks, one after another (``blocked_attention``): each query's scores, softmax
# and sum are computed as before, over the same keys.
ATTENTION_SCORES_LIMIT_BYTES = 2 ** 30


def query_blocks(k: int, scores_bytes: int, limit: int) -> int:
    """How many blocks to cut ``k`` queries into so that each block's scores
    fit ``limit``: the smallest divisor of ``k`` that is enough (1 when the
    whole call fits). E.g. 512 queries with 3.5 GiB of scores, limit 1 GiB: 4."""
    needed = min(-(-scores_bytes // limit), k)  # k blocks of one query: the most there is
    return next((n for n in range(max(needed, 1), k + 1) if k % n == 0), 1)  # k = 0: 1


def blocked_attention(q_BxKxHxGxD: Array, keys_BxHxSxD: Array, values_BxHxSxD: Array,
                      mask_BxKxS: Array, scale: float, *, precision: str | None = None,
                      limit: int | None = None, by_query: bool = False) -> Array:
    """``masked_softmax_attention``, its queries scored in ``query_blocks``
    blocks (a ``lax.map``) when the float32 scores of the whole call exceed
    ``limit`` (default ``ATTENTION_SCORES_LIMIT_BYTES``): the memory of one
    block's scores instead of all of them, the same result per query. With
    ``by_query``, one query per block: each query's result is the same bits
    as a one-query call's (``DecoderConfig.row_independent``)."""
    if by_query:
        return native_attention.attend_each_query(
            q_BxKxHxGxD, keys_BxHxSxD, values_BxHxSxD, mask_BxKxS, scale,
            fallback=functools.partial(_attention_in_blocks, scale=scale, precision=precision,
                                       limit=limit, by_query=True))
    return _attention_in_blocks(q_BxKxHxGxD, keys_BxHxSxD, values_BxHxSxD, mask_BxKxS, scale,
                                precision=precision, limit=limit, by_query=False)


def _attention_in_blocks(q_BxKxHxGxD: Array, keys_BxHxSxD: Array, values_BxHxSxD: Array,
                         mask_BxKxS: Array, scale: float, *, precision: str | None,
                         limit: int | None, by_query: bool) -> Array:
    """``blocked_attention`` through XLA."""
    batch, k, heads, groups, _ = q_BxKxHxGxD.shape
    scores_bytes = 4 * batch * heads * groups * k * keys_BxHxSxD.shape[2]
    blocks = max(k, 1) if by_query else query_blocks(k, scores_bytes,
                                                     limit or ATTENTION_SCORES_LIMIT_BYTES)
    if blocks == 1:
        return masked_softmax_attention(q_BxKxHxGxD, keys_BxHxSxD, values_BxHxSxD, mask_BxKxS,
                                        scale, precision=precision, heads_major=True)
    width = k // blocks
    # [B, K, ...] -> [n, B, K / n, ...]: block j holds queries j * K/n .. (j + 1) * K/n - 1.
    q_n = q_BxKxHxGxD.reshape(batch, blocks, width, *q_BxKxHxGxD.shape[2:]).swapaxes(0, 1)
    mask_n = mask_BxKxS.reshape(mask_BxKxS.shape[0], blocks, width,
                                mask_BxKxS.shape[-1]).swapaxes(0, 1)
    out_n = jax.lax.map(lambda qm: masked_softmax_attention(
        qm[0], keys_BxHxSxD, values_BxHxSxD, qm[1], scale, precision=precision,
        heads_major=True),
        (q_n, mask_n))
    return out_n.swapaxes(0, 1).reshape(q_BxKxHxGxD.shape[:-1] + out_n.shape[-1:])


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Hyperparameters of a Llama/Qwen2-style decoder (names follow HF configs)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None  # defaults to hidden_size // num_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False  # Qwen2 has biases on q, k, v
    tie_embeddings: bool = False
    dtype: str = "float32"  # activations; probabilities are always float32
    param_dtype: str = "float32"
    # jax.lax.Precision name for every matmul ("highest" keeps float32 exact on GPUs,
    # whose default is TF32; "default": the backend's own). None: decided where the
    # model runs, "highest" for float32 on an accelerator unless
    # $SPECDEC_JAX_MATMUL_PRECISION opts out (specdec_jax.precision).
    matmul_precision: str | None = None
    # How dense kernels are stored: "in_out" (the documented tree) or "out_in"
    # (the decode layout, faster for few-row products; see decode_layout).
    kernel_layout: str = IN_OUT
    # > 0: the output head scores only this many token ids (``with_head_vocab``;
    # every other token gets probability 0). 0: the whole vocabulary.
    head_vocab: int = 0
    # out_in only: q/k/v in one kernel and gate/up in one (module docstring).
    fused_projections: bool = False
    # out_in only: gate/up in one kernel ``wi`` while q/k/v stay apart (a GGUF
    # file's blocks: every layer's gate and up share a block type, its q, k and
    # v may not; ``gguf.load_stored``). One product instead of two.
    fused_mlp: bool = False
    # Compute every per-row reduction the same way whatever K: each query's
    # attention alone (``blocked_attention``), as a one-token step scores its
    # one, and norms summed by a fixed tree (``layers.row_sum``). With
    # row-independent products (the block kernel's int8 activations) a row's
    # logits in a G + 1 scoring call are then the same bits as in a step: the
    # target is one function of each row. Without it XLA sums K rows in
    # another order than one; int8 activations turn those 1e-7 differences
    # into flipped codes. On one CPU device with the kernel loaded the queries'
    # attention is one call that sums each query alone (``native.attention``);
    # elsewhere it is K reads of the KV cache per layer instead of one.
    row_independent: bool = False
    # > 0: a prompt is fed in chunks of this many tokens, in a loop that stops
    # after the longest row's last chunk, so a prefill costs what its prompt
    # is long, not what it is padded to (the block kernel's cost grows with the
    # rows of a product: 15 ms a row for the 1.5B on 2 cores). 0: one call.
    prefill_chunk: int = 0

    def __post_init__(self):
        check_kernel_layout(self.kernel_layout, "DecoderConfig: kernel_layout")
        for fused in ("fused_projections", "fused_mlp"):
            if getattr(self, fused) and self.kernel_layout != OUT_IN:
                raise ValueError(f"DecoderConfig: {fused} is part of the decode layout "
                                 "(kernels stored [out, in]); convert with with_kernel_layout.")
        if self.prefill_chunk < 0:
            raise ValueError(f"DecoderConfig: prefill_chunk={self.prefill_chunk} must be >= 0 "
                             "(0: the whole prompt in one call).")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"DecoderConfig: num_heads={self.num_heads} is not a multiple of "
                f"num_kv_heads={self.num_kv_heads}.")

    @property
    def compute_precision(self) -> str | None:
        """``matmul_precision`` resolved for this dtype on the running backend."""
        return precision.resolve_matmul_precision(self.matmul_precision, self.dtype)

    @property
    def dims_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads


@flax.struct.dataclass
class DecoderCache:
    """Per-layer key/value buffers plus per-row lengths (see interface docs).

    Heads-major: a query's product with one head's keys reads them where they
    lie. Stored ``[B, S, H, D]``, every query scored alone (``row_independent``)
    copied the whole cache into this order first; this layout took the stored
    1.5B's 6-token call at 294 cached tokens from 104.6 to 96.6 ms (medians,
    2 CPU cores)."""

    keys: tuple[Array, ...]  # num_layers x [B, H_kv, S, D_head]
    values: tuple[Array, ...]  # num_layers x [B, H_kv, S, D_head]
    lengths: Array  # int32 [B]: tokens fed so far; keys at >= lengths are stale

    SEQ_AXIS = 2  # of keys[i] and values[i]

    @property
    def max_length(self) -> int:
        return self.keys[0].shape[self.SEQ_AXIS]

    def window(self, start_B: Array, width: int) -> tuple:
        """Every layer's keys and values at ``start .. start + width - 1``."""
        read = lambda b: interface.read_at_lengths(b, start_B, width, self.SEQ_AXIS)  # noqa: E731
        return tuple(map(read, self.keys)), tuple(map(read, self.values))

    def with_window(self, window: tuple, start_B: Array, lengths_B: Array) -> "DecoderCache":
        """This cache with ``window`` (``window()``'s) written at ``start`` and
        the rows' lengths set to ``lengths``."""
        write = lambda b, w: interface.write_at_lengths(b, w, start_B, self.SEQ_AXIS)  # noqa: E731
        keys, values = window
        return self.replace(keys=tuple(map(write, self.keys, keys)),
                            values=tuple(map(write, self.values, values)), lengths=lengths_B)

    @classmethod
    def zeros(cls, batch_size: int, max_length: int, num_layers: int, num_kv_heads: int,
              head_dim: int, dtype) -> "DecoderCache":
        shape = (batch_size, num_kv_heads, max_length, head_dim)
        buffers = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(num_layers))  # noqa: E731
        return cls(keys=buffers(), values=buffers(),
                   lengths=jnp.zeros((batch_size,), jnp.int32))


def _linear(cfg: DecoderConfig, features: int | tuple[int, ...], name: str, *,
            use_bias: bool = False) -> Linear:
    """A dense layer as ``cfg`` stores it; a shape of ``features`` fuses
    projections (the ``out_in`` layout's ``fused_projections``)."""
    return Linear(features, use_bias=use_bias, kernel_layout=cfg.kernel_layout,
                  dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype),
                  precision=cfg.compute_precision, name=name)


def _norm(cfg: DecoderConfig, name: str) -> RMSNorm:
    """An RMSNorm as ``cfg`` computes it (by row where ``row_independent``)."""
    return RMSNorm(cfg.rms_norm_eps, jnp.dtype(cfg.dtype), cfg.row_independent, name=name)


class Attention(nn.Module):
    """Grouped-query self-attention against a cache (rotary positions, Qwen2's
    optional q/k/v bias); returns the output and the updated key/value buffers."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, x_BxKxD, positions_BxK, mask_BxKxS, keys, values, lengths_B,
                 prefill: bool = False):
        """A prefill's queries only fill the cache: they are scored together.
        Steps and scoring calls score each query alone where the decoder is one
        function of each row (``row_independent``)."""
        cfg = self.config
        head_dim, groups = cfg.dims_per_head, cfg.num_heads // cfg.num_kv_heads
        batch, k = x_BxKxD.shape[:2]

        def proj(name, heads, bias):
            dense = _linear(cfg, heads * head_dim, name, use_bias=bias)
            return dense(x_BxKxD).reshape(batch, k, heads, head_dim)

        if cfg.fused_projections:
            qkv = _linear(cfg, (cfg.num_kv_heads, groups + 2, head_dim), "qkv",
                          use_bias=cfg.qkv_bias)(x_BxKxD)  # [B, K, H_kv, G + 2, D_head]
            # [B, K, H_kv, G, D_head] -> [B, K, H_kv * G, D_head]: head h * G + g.
            q = qkv[:, :, :, :groups].reshape(batch, k, cfg.num_heads, head_dim)
            new_k, new_v = qkv[:, :, :, groups], qkv[:, :, :, groups + 1]
        else:
            q = proj("query", cfg.num_heads, cfg.qkv_bias)
            new_k = proj("key", cfg.num_kv_heads, cfg.qkv_bias)
            new_v = proj("value", cfg.num_kv_heads, cfg.qkv_bias)
        q = rotary_embedding(q, positions_BxK, cfg.rope_theta)
        new_k = rotary_embedding(new_k, positions_BxK, cfg.rope_theta)
        keys = interface.write_at_lengths(keys, new_k, lengths_B, DecoderCache.SEQ_AXIS)
        values = interface.write_at_lengths(values, new_v, lengths_B, DecoderCache.SEQ_AXIS)
        # [B, K, H*G, D] -> [B, K, H, G, D]: query head h*G + g reads kv head h.
        q = q.reshape(batch, k, cfg.num_kv_heads, groups, head_dim)
        out = blocked_attention(q, keys, values, mask_BxKxS, head_dim ** -0.5,
                                precision=cfg.compute_precision,
                                by_query=cfg.row_independent and not prefill)
        out = out.reshape(batch, k, cfg.num_heads * head_dim)
        out = _linear(cfg, cfg.hidden_size, "out")(out)
        return out, keys, values


class SwiGLU(nn.Module):
    """The gated MLP: ``wo(silu(wi_0 x) * wi_1 x)``."""

    config: DecoderConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        if cfg.fused_projections or cfg.fused_mlp:
            gate_up = _linear(cfg, (2, cfg.intermediate_size), "wi")(x)
            # [..., 2, I]; a stored block matrix [2I, D] gives [..., 2I].
            gate_up = gate_up.reshape(*x.shape[:-1], 2, cfg.intermediate_size)
            gate, up = gate_up[..., 0, :], gate_up[..., 1, :]
        else:
            gate = _linear(cfg, cfg.intermediate_size, "wi_0")(x)
            up = _linear(cfg, cfg.intermediate_size, "wi_1")(x)
        return _linear(cfg, cfg.hidden_size, "wo")(nn.silu(gate) * up)


class _DecoderNet(nn.Module):
    """Embeds tokens, runs the layers against the cache, returns final hidden states.

    ``select_BxK`` (optional) picks which of the K positions get logits, so a
    long prefill does not materialise [B, P, V] logits it will not use; the
    hidden states are returned at those positions too, or at all K with
    ``all_hidden`` (a feature drafter reads the whole prompt's).
    """

    config: DecoderConfig

    @nn.compact
    def __call__(self, tokens_BxK, cache: DecoderCache, select_BxN=None, head=None,
                 all_hidden: bool = False, tree=None, prefill: bool = False):
        cfg = self.config
        dtype = jnp.dtype(cfg.dtype)
        embedder = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype,
                            param_dtype=jnp.dtype(cfg.param_dtype), name="embedder")
        k = tokens_BxK.shape[1]
        if tree is None:  # a chain: K tokens at lengths .. lengths + K - 1
            positions_BxK = cache.lengths[:, None] + jnp.arange(k)[None, :]
            mask_BxKxS = interface.causal_cache_mask(cache.lengths, k, cache.max_length)
            write_at_B, new_lengths_B = cache.lengths, cache.lengths + k
        else:  # nodes start .. start + K - 1 of a tree (interface: 'Token trees')
            parents_BxN, start = tree
            positions_BxK, mask_BxKxS = interface.tree_positions_and_mask(
                cache.lengths, parents_BxN, cache.max_length, start, k)
            write_at_B, new_lengths_B = cache.lengths + start, cache.lengths
        stored_embedding = stored_in(self.variables.get("params", {}).get("embedder", {}),
                                      "embedding")
        x = (embedder(tokens_BxK) if stored_embedding is None
             else stored_embedding.take_rows(tokens_BxK).astype(dtype))
        new_keys, new_values = [], []
        for i in range(cfg.num_layers):
            attn_out, keys, values = Attention(cfg, name=f"layers_{i}_attention")(
                _norm(cfg, f"layers_{i}_pre_attention_norm")(x), positions_BxK, mask_BxKxS,
                cache.keys[i], cache.values[i], write_at_B, prefill)
            x = x + attn_out
            x = x + SwiGLU(cfg, name=f"layers_{i}_mlp")(_norm(cfg, f"layers_{i}_pre_mlp_norm")(x))
            new_keys.append(keys)
            new_values.append(values)
        every_hidden = _norm(cfg, "decoder_norm")(x)
        hidden = interface.select_positions(every_hidden, select_BxN)
        h32 = hidden.astype(jnp.float32)
        if head is not None:  # (token ids [N], their head rows [N, D])
            ids_N, rows_NxD = head
            # Rows stored narrower (bf16) are widened in registers by the CPU
            # kernel, not copied to float32 first.
            scores = matmul_out_in(h32, rows_NxD, cfg.compute_precision)
            logits = jnp.full(scores.shape[:-1] + (cfg.vocab_size,), -jnp.inf,
                              jnp.float32).at[..., ids_N].set(scores)
        elif cfg.tie_embeddings:
            logits = matmul_out_in(h32, stored_embedding or embedder.embedding,
                                   cfg.compute_precision)
        elif cfg.kernel_layout == OUT_IN:  # [V, D], like the tied embedding
            kernel = stored_matrix(self, "logits_dense_kernel") or self.param("logits_dense_kernel",
                                nn.initializers.lecun_normal(in_axis=-1, out_axis=-2),
                                (cfg.vocab_size, cfg.hidden_size), jnp.dtype(cfg.param_dtype))
            logits = matmul_out_in(h32, kernel, cfg.compute_precision)
        else:
            kernel = self.param("logits_dense_kernel", nn.initializers.lecun_normal(),
                                (cfg.hidden_size, cfg.vocab_size), jnp.dtype(cfg.param_dtype))
            logits = jnp.matmul(h32, kernel.astype(jnp.float32), precision=cfg.compute_precision)
        new_cache = cache.replace(keys=tuple(new_keys), values=tuple(new_values),
                                  lengths=new_lengths_B)
        return logits, every_hidden if all_hidden else hidden, new_cache


# Flax names submodules with underscores when created inline; these two maps
# turn them into the nested t5x-style tree documented above and back.
def _nest(flat: dict) -> dict:
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        if name.startswith("layers_"):
            index, rest = name[len("layers_"):].split("_", 1)
            tree.setdefault(f"layers_{index}", {})[rest] = value
        elif name.startswith("logits_dense_"):  # the kernel, or its stored blocks
            tree.setdefault("logits_dense", {})[name[len("logits_dense_"):]] = value
        else:
            tree[name] = value
    return tree


def _flatten(tree: dict) -> dict:
    flat: dict[str, Any] = {}
    for name, value in tree.items():
        if name.startswith("layers_"):
            for sub, leaf in value.items():
                flat[f"{name}_{sub}"] = leaf
        elif name == "logits_dense":
            for sub, leaf in value.items():
                flat[f"logits_dense_{sub}"] = leaf
        else:
            flat[name] = value
    return flat


@dataclasses.dataclass(frozen=True)
class DecoderOnlyLM:
    """Llama/Qwen2 decoder behind the functional interface (pure methods)."""

    config: DecoderConfig

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def _net(self) -> _DecoderNet:
        return _DecoderNet(self.config)

    def init_params(self, rng: Array) -> dict:
        """Random parameters in the documented tree (for tests and training)."""
        cache = self.init_cache(1, 2)
        # Jitted: one compilation instead of one per op of an eager init.
        variables = jax.jit(self._net.init)(rng, jnp.zeros((1, 1), jnp.int32), cache)
        return _nest(variables["params"])

    def init_cache(self, batch_size: int, max_length: int) -> DecoderCache:
        cfg = self.config
        return DecoderCache.zeros(batch_size, max_length, cfg.num_layers, cfg.num_kv_heads,
                                  cfg.dims_per_head, jnp.dtype(cfg.dtype))

    def _apply(self, params, tokens, cache, select=None, all_hidden=False, tree=None,
               prefill=False):
        flat = _flatten(params)
        head = flat.pop(HEAD_VOCAB, None)
        if (head is None) != (self.config.head_vocab == 0):
            raise ValueError(
                f"DecoderOnlyLM: config.head_vocab={self.config.head_vocab} but the parameters "
                f"{'lack' if head is None else 'carry'} a '{HEAD_VOCAB}' entry; build both "
                "with decoder.with_head_vocab.")
        if head is not None:  # rows float, or in their file's blocks
            head = (head["token_ids"], head["rows"] if "rows" in head else stored_in(head, "rows"))
        return self._net.apply({"params": flat}, tokens, cache, select, head, all_hidden,
                               tree, prefill)

    def prefill(self, params: dict, prompt: Prompt, cache: DecoderCache,
                all_hidden: bool = False) -> StepOutput:
        """Feeds each row's prompt; returns logits at the row's last prompt token.

        Rows are right-padded; padding is written past each row's length and
        masked. ``logits`` is [B, 1, V] (the next-token logits after the
        prompt); a row with an empty prompt gets the logits of position 0,
        which callers must not use. ``hidden`` is [B, 1, D] at the same
        position, or [B, P, D] at every position with ``all_hidden``.
        """
        interface.check_prompt(prompt, cache.lengths.shape[0], cache.max_length,
                               self.vocab_size)
        last_Bx1 = jnp.maximum(prompt.lengths - 1, 0)[:, None]
        chunk = self.config.prefill_chunk
        if all_hidden or not chunk or prompt.tokens.shape[1] <= chunk:
            logits, hidden, new_cache = self._apply(params, prompt.tokens, cache, last_Bx1,
                                                    all_hidden, prefill=True)
        else:
            logits, hidden, new_cache = self._chunked_prefill(params, prompt, cache,
                                                              last_Bx1[:, 0], chunk)
        new_cache = new_cache.replace(lengths=cache.lengths + prompt.lengths)
        return StepOutput(logits=logits, hidden=hidden, cache=new_cache)

    def _chunked_prefill(self, params, prompt: Prompt, cache: DecoderCache, last_B: Array,
                         chunk: int):
        """``prefill`` in chunks of ``chunk`` tokens: chunk ``i`` feeds prompt
        positions ``i * chunk ..`` of every row, and the loop stops after the
        chunk holding the longest row's last token (a traced count: one
        program serves every prompt of this width). Each row's logits and
        hidden state come from the chunk holding its last token; positions
        past the cache's end are dropped (``write_at_lengths``)."""
        width = prompt.tokens.shape[1]
        tokens = jnp.pad(prompt.tokens, ((0, 0), (0, -width % chunk)))
        count = (jnp.max(prompt.lengths) + chunk - 1) // chunk

        def feed(i, carry):
            logits, hidden, fed = carry
            start = i * chunk
            tokens_BxC = jax.lax.dynamic_slice_in_dim(tokens, start, chunk, axis=1)
            at_Bx1 = jnp.clip(last_B - start, 0, chunk - 1)[:, None]
            out_logits, out_hidden, fed = self._apply(
                params, tokens_BxC, fed.replace(lengths=cache.lengths + start), at_Bx1,
                prefill=True)
            here_Bx1x1 = ((last_B >= start) & (last_B < start + chunk))[:, None, None]
            return (jnp.where(here_Bx1x1, out_logits, logits),
                    jnp.where(here_Bx1x1, out_hidden, hidden), fed)

        # The loop carries the logits and hidden state of one chunk's call.
        shapes = jax.eval_shape(lambda c: self._apply(params, tokens[:, :chunk], c,
                                                      last_B[:, None], prefill=True), cache)
        zeros = [jnp.zeros(s.shape, s.dtype) for s in shapes[:2]]
        return jax.lax.fori_loop(0, count, feed, (*zeros, cache))

    def extend(self, params: dict, tokens: Array, cache: DecoderCache,
               logits_at: Array | None = None) -> StepOutput:
        """Feeds K tokens per row at positions lengths .. lengths + K - 1.

        Returns logits [B, K, V] (next-token logits after each fed token; [B,
        N, V] at the offsets ``logits_at`` [B, N] when given: the output head
        runs on those rows only) and a cache with lengths + K. See the
        interface module for rollback.
        """
        interface.check_extend(tokens, cache.lengths, cache.max_length, self.vocab_size)
        logits, hidden, new_cache = self._apply(params, tokens, cache, logits_at)
        return StepOutput(logits=logits, hidden=hidden, cache=new_cache)

    def score_tree(self, params: dict, tokens: Array, parents: Array, cache: DecoderCache,
                   start: int | Array = 0) -> StepOutput:
        """Scores the nodes ``start .. start + K - 1`` (``tokens`` [B, K]) of a
        token tree with ``parents`` [B, N] (-1 = the root) in one call.

        Node i sits at position ``lengths + depth_i`` and attends to the
        committed cache and to its ancestors (itself included); its
        keys/values are written to the scratch slot ``lengths + i``. Nodes
        before ``start`` must already be in their slots (an earlier call of
        the same tree: a drafter grows its tree one depth per call; ``start``
        may be a traced int32, as in a loop over equally wide depths). Returns
        logits [B, K, V] (next-token logits after each node) and the cache
        with the nodes in scratch and its lengths unchanged; ``commit_path``
        keeps the accepted path. See the interface module ('Token trees').
        """
        interface.check_tree(tokens, parents, cache.lengths, cache.max_length, self.vocab_size,
                             start)
        logits, hidden, new_cache = self._apply(params, tokens, cache,
                                                tree=(parents.astype(jnp.int32), start))
        return StepOutput(logits=logits, hidden=hidden, cache=new_cache)

    def commit_path(self, cache: DecoderCache, nodes: Array, count: Array) -> DecoderCache:
        """Moves the keys/values of the accepted path ``nodes[b, :count[b]]``
        (node indices, root to leaf) from their scratch slots to ``lengths ..
        lengths + count - 1`` and sets lengths to ``lengths + count``."""
        move = lambda buffers: tuple(  # noqa: E731
            interface.commit_tree_path(b, cache.lengths, nodes, count, DecoderCache.SEQ_AXIS)
            for b in buffers)
        return cache.replace(keys=move(cache.keys), values=move(cache.values),
                             lengths=cache.lengths + count.astype(cache.lengths.dtype))


def _fuse_layer(layer: dict, num_kv_heads: int, head_dim: int) -> dict:
    """One layer's out_in q/k/v and gate/up entries as ``qkv`` and ``wi``."""
    attention, mlp = dict(layer["attention"]), dict(layer["mlp"])
    parts = [attention.pop(name) for name in ("query", "key", "value")]

    def by_group(leaf):  # [heads * D_head, *tail] -> [H_kv, heads / H_kv, D_head, *tail]
        return leaf.reshape(num_kv_heads, -1, head_dim, *leaf.shape[1:])

    attention["qkv"] = {field: jnp.concatenate([by_group(p[field]) for p in parts], axis=1)
                        for field in parts[0]}
    gate, up = mlp.pop("wi_0")["kernel"], mlp.pop("wi_1")["kernel"]
    mlp["wi"] = {"kernel": jnp.stack([gate, up])}  # 2 x [I, D] -> [2, I, D]
    return {**layer, "attention": attention, "mlp": mlp}


def _split_layer(layer: dict) -> dict:
    """``_fuse_layer`` undone; the shapes carry everything it needs."""
    attention, mlp = dict(layer["attention"]), dict(layer["mlp"])
    qkv = attention.pop("qkv")
    groups = qkv["kernel"].shape[1] - 2

    def flat(leaf):  # [H_kv, n, D_head, *tail] -> [H_kv * n * D_head, *tail]
        return leaf.reshape(-1, *leaf.shape[3:])

    for name, part in (("query", slice(0, groups)), ("key", slice(groups, groups + 1)),
                       ("value", slice(groups + 1, groups + 2))):
        attention[name] = {field: flat(leaf[:, part]) for field, leaf in qkv.items()}
    wi = mlp.pop("wi")["kernel"]
    mlp["wi_0"], mlp["wi_1"] = {"kernel": wi[0]}, {"kernel": wi[1]}
    return {**layer, "attention": attention, "mlp": mlp}


def split_projections(params: dict) -> dict:
    """Fused out_in parameters back to separate q/k/v and gate/up kernels (the
    documented names, still [out, in]). Needs no config: the fused shapes
    ``[H_kv, G + 2, D_head, D]`` and ``[2, I, D]`` say how to cut them."""
    split = jax.jit(_split_layer)
    return {name: split(value) if name.startswith("layers_") and "qkv" in value["attention"]
            else value for name, value in params.items()}


def with_kernel_layout(model: DecoderOnlyLM, params: dict, layout: str = OUT_IN, *,
                       fused: bool | None = None) -> tuple[DecoderOnlyLM, dict]:
    """The same network with its dense kernels stored in ``layout``: the model
    (its config says the layout) and the parameters (every ``kernel``
    transposed; embeddings, norms and biases as they were). ``fused``
    (default: True for ``OUT_IN``) also fuses each layer's q/k/v and gate/up
    kernels (three products per layer fewer, the names of the module
    docstring; ``split_projections`` undoes it); ``fused=False`` keeps the
    documented names.

    ``OUT_IN`` is the decode layout. A decode step multiplies 1 to G + 1 rows
    by every kernel; stored ``[out, in]`` the product reduces along the
    kernel's contiguous minor dimension (a dot product of rows, as in a
    matrix-vector kernel), while ``[in, out]`` makes XLA reduce strided
    columns or materialise the elementwise product (``benchmarks/configs/scoring.gin``
    measures both). Checkpoints and training keep the
    documented ``[in, out]`` tree; this converts once, after loading, and
    converts back just as well. Sharded parameters stay sharded (a kernel's
    spec is transposed with it; ``sharding.rules_for`` gives the rules).

    Each top-level entry (a layer, the embedder, ...) is converted by one jitted
    call that splits, transposes and fuses at once, so the peak memory is the
    old tree plus the new one, never a third copy in between.
    """
    config, convert_entry = kernel_layout_converter(model.config, layout, fused=fused)
    if convert_entry is None:
        return model, params
    return DecoderOnlyLM(config), {name: convert_entry(name, entry)
                                   for name, entry in params.items()}


def kernel_layout_converter(old: DecoderConfig, layout: str = OUT_IN, *,
                            fused: bool | None = None):
    """``(config, convert_entry)``: the config of ``with_kernel_layout`` and
    the function that converts one top-level entry of the parameter tree,
    ``convert_entry(name, entry) -> entry`` (``None`` when the layout is
    already ``old``'s). For callers that convert entry by entry and drop each
    source entry as they go (the converted-checkpoint cache writes a
    decode-layout copy this way), so the old and new trees never both sit in
    memory."""
    check_kernel_layout(layout)
    fused = layout == OUT_IN if fused is None else fused
    if fused and layout != OUT_IN:
        raise ValueError("fused projections are part of the out_in decode layout; pass "
                         "fused=False with the in_out layout.")
    if layout == old.kernel_layout and fused == old.fused_projections:
        return old, None
    config = dataclasses.replace(old, kernel_layout=layout, fused_projections=fused)

    @jax.jit  # one program for every layer (same shapes)
    def convert_layer(layer: dict) -> dict:
        if old.fused_projections:
            layer = _split_layer(layer)
        if layout != old.kernel_layout:
            layer = transpose_kernels(layer)
        return _fuse_layer(layer, config.num_kv_heads, config.dims_per_head) if fused else layer

    transpose = jax.jit(jnp.transpose)
    other = (lambda entry: entry) if layout == old.kernel_layout else (
        lambda entry: transpose_kernels(entry, transpose))

    def convert_entry(name: str, entry):
        return convert_layer(entry) if name.startswith("layers_") else other(entry)

    return config, convert_entry


def head_rows(config: DecoderConfig, params: dict) -> Array:
    """[V, D]: the full output head as one row per token, in either kernel
    layout (the tied embedding; an ``out_in`` kernel as stored, an ``in_out``
    one transposed), for those that read the head row by row."""
    if config.tie_embeddings:
        return params["embedder"]["embedding"]
    if config.kernel_layout == OUT_IN:
        return params["logits_dense"]["kernel"]
    return params["logits_dense"]["kernel"].T  # [D, V] -> [V, D]


def with_head_vocab(model: DecoderOnlyLM, params: dict, token_ids) -> tuple[DecoderOnlyLM, dict]:
    """The same network whose output head scores only ``token_ids``; every other
    token gets logit -inf (probability 0).

    For a *drafter* (FR-Spec, Zhao et al. 2025): a small model's step spends
    much of its time in the output head (Qwen2.5-0.5B ties a 151,936 x 896
    embedding: 136 M of its 494 M parameters, read every step), while the
    tokens it drafts come from a far smaller set. The restricted drafter is
    just another drafter: its law ``q`` is the full model's renormalised over
    the subset, and verification against ``q`` keeps the target's output law
    exact (a token outside the subset is never drafted; the target still emits
    it through the residual). Acceptance drops only by the target's mass
    outside the subset. The ids (sorted, unique) and their head rows are
    stored under ``params['head_vocab']`` (``{'token_ids': int32 [N], 'rows':
    [N, D]}``), so the jitted model stays hashable and the rows are read
    contiguously. The embedding is kept (it still embeds inputs); an untied
    full output head is dropped, since the restricted model never reads it.
    """
    if model.config.head_vocab:
        raise ValueError("with_head_vocab: the model's head is already restricted to "
                         f"{model.config.head_vocab} tokens; start from the full model.")
    ids = np.asarray(token_ids)
    vocab = model.config.vocab_size
    if ids.ndim != 1 or not ids.size or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError("with_head_vocab: token_ids must be a non-empty 1-D array of ints.")
    if ids.min() < 0 or ids.max() >= vocab or len(np.unique(ids)) != ids.size:
        raise ValueError(f"with_head_vocab: token_ids must be unique ids in [0, {vocab}).")
    ids = np.sort(ids).astype(np.int32)
    stored = (stored_in(params["embedder"], "embedding") if model.config.tie_embeddings
              else stored_in(params.get("logits_dense", {}), "kernel"))
    if stored is not None and stored_blocks.block_format(stored.format).interleave > 1:
        raise ValueError(f"with_head_vocab: the output head is kept as {stored.format}, whose "
                         "byte rows interleave 16 output rows, so its rows cannot be taken "
                         "apart; keep the full head (drafter head vocabulary 0) or load the "
                         "drafter with float32 weights.")
    if stored is not None:  # the kept rows stay in their file's blocks
        head = {f"rows_{stored.format}": jnp.take(stored.blocks, jnp.asarray(ids), axis=0)}
    else:
        head = {"rows": jax.jit(lambda full, ids: jnp.take(full, ids, axis=0))(
            head_rows(model.config, params), jnp.asarray(ids))}
    config = dataclasses.replace(model.config, head_vocab=int(ids.size))
    kept = {name: entry for name, entry in params.items() if name != "logits_dense"}
    return DecoderOnlyLM(config), {**kept, HEAD_VOCAB: {"token_ids": jnp.asarray(ids), **head}}
