"""T5 v1.1 encoder-decoder behind the functional model interface.

T5 v1.1 (and Flan-T5, mT5) differ from the original T5 in ways that matter for
parity: a gated-GELU MLP (``gelu(x W_0) * (x W_1)``, tanh-approximated GELU),
RMSNorm without bias or mean subtraction, no ``1/sqrt(d)`` scaling of attention
scores (T5 folds it into the query initialisation), and an untied output
projection applied without the ``d_model**-0.5`` rescale of the original.
Positions enter only through a learned relative-position bias, computed once
per stack from the first layer's table and shared by every layer of that
stack (bidirectional buckets in the encoder, causal ones in the decoder).

Parameters follow the t5x tree, so t5x checkpoints load by name::

    token_embedder/embedding                                   [V, D] (shared)
    encoder/relpos_bias/rel_embedding                          [H, num_buckets]
    encoder/layers_{i}/pre_attention_layer_norm/scale          [D]
    encoder/layers_{i}/attention/{query,key,value}/kernel      [D, H*Dh]
    encoder/layers_{i}/attention/out/kernel                    [H*Dh, D]
    encoder/layers_{i}/pre_mlp_layer_norm/scale                [D]
    encoder/layers_{i}/mlp/{wi_0,wi_1}/kernel                  [D, F]
    encoder/layers_{i}/mlp/wo/kernel                           [F, D]
    encoder/encoder_norm/scale                                 [D]
    decoder/relpos_bias/rel_embedding                          [H, num_buckets]
    decoder/layers_{i}/pre_self_attention_layer_norm/scale
    decoder/layers_{i}/self_attention/{query,key,value,out}/kernel
    decoder/layers_{i}/pre_cross_attention_layer_norm/scale
    decoder/layers_{i}/encoder_decoder_attention/{query,key,value,out}/kernel
    decoder/layers_{i}/pre_mlp_layer_norm/scale
    decoder/layers_{i}/mlp/{wi_0,wi_1,wo}/kernel
    decoder/decoder_norm/scale                                 [D]
    decoder/logits_dense/kernel                                [D, V]

How the interface maps onto an encoder-decoder:

* ``init_cache(batch_size, max_length, max_input_length=None)``: ``max_length``
  sizes the decoder self-attention buffers; ``max_input_length`` (static, it
  sizes the cross-attention buffers) defaults to ``max_length``, which is what
  the decoding loops already size by the prompt width, so the generic
  ``init_cache(batch, max_length)`` call always fits the prompt.
* ``prefill`` encodes the prompt (padding masked by ``prompt.lengths``),
  projects the encoder output once into every decoder layer's cross-attention
  keys/values, stores them in the cache, and resets the decoder to an empty
  sequence (``lengths = 0``). It feeds no decoder token: the decoding loop
  treats ``decoder_start_token_id`` as the first pending token and feeds it with
  ``extend`` like any other. The logits prefill returns are a preview: the
  next-token logits after the start token, computed on a throwaway copy of the
  cache (the returned cache does not contain the start token).
* ``extend`` runs the decoder on K tokens per row at positions ``lengths ..
  lengths + K - 1``; rollback is ``cache.replace(lengths=...)`` as for every
  model (see ``interface``).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import precision
from specdec_jax.models import interface
from specdec_jax.models.interface import Prompt, StepOutput
from specdec_jax.models.layers import RMSNorm, masked_softmax_attention

Array = jax.Array

# T5 does not divide attention scores by sqrt(head_dim); the factor is folded
# into the query initialisation (``_query_init``).
ATTENTION_SCORE_SCALE = 1.0
# t5x initialises the shared token embedding with unit variance.
EMBEDDING_INIT_STDDEV = 1.0


@dataclasses.dataclass(frozen=True)
class T5Config:
    """Hyperparameters of a T5 v1.1 model (names follow Hugging Face configs)."""

    vocab_size: int
    d_model: int
    d_kv: int  # dimensions per attention head
    d_ff: int
    num_heads: int
    num_encoder_layers: int
    num_decoder_layers: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_eps: float = 1e-6
    decoder_start_token_id: int = 0
    dtype: str = "float32"  # activations and caches; logits are always float32
    param_dtype: str = "float32"
    matmul_precision: str | None = None  # as DecoderConfig.matmul_precision
    # Training only: applied when prefill/extend get a dropout_rng (decoding never does).
    dropout_rate: float = 0.0

    @property
    def compute_precision(self) -> str | None:
        """``matmul_precision`` resolved for this dtype on the running backend."""
        return precision.resolve_matmul_precision(self.matmul_precision, self.dtype)

    def __post_init__(self):
        sizes = {name: getattr(self, name) for name in (
            "vocab_size", "d_model", "d_kv", "d_ff", "num_heads", "num_encoder_layers",
            "num_decoder_layers")}
        for name, value in sizes.items():
            if value <= 0:
                raise ValueError(f"T5Config: {name} must be positive, got {value}.")
        # Bidirectional bucketing halves the buckets, then keeps half of those
        # exact: at least 4 buckets leave one exact bucket per direction.
        min_buckets = 4
        if self.relative_attention_num_buckets < min_buckets:
            raise ValueError(
                f"T5Config: relative_attention_num_buckets must be >= {min_buckets}, got "
                f"{self.relative_attention_num_buckets}.")
        if self.relative_attention_max_distance <= self.relative_attention_num_buckets // 2:
            raise ValueError(
                "T5Config: relative_attention_max_distance "
                f"({self.relative_attention_max_distance}) must exceed the exact-bucket range "
                f"({self.relative_attention_num_buckets // 2}).")
        if not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(f"T5Config: dropout_rate must be in [0, 1), got "
                             f"{self.dropout_rate}.")
        if not 0 <= self.decoder_start_token_id < self.vocab_size:
            raise ValueError(
                f"T5Config: decoder_start_token_id {self.decoder_start_token_id} is outside "
                f"the vocabulary [0, {self.vocab_size}).")


@flax.struct.dataclass
class T5Cache:
    """Decoder self-attention buffers, precomputed cross-attention keys/values,
    and per-row lengths (see the interface module for rollback)."""

    keys: tuple[Array, ...]  # num_decoder_layers x [B, S, H, Dh]: decoder self-attention
    values: tuple[Array, ...]  # num_decoder_layers x [B, S, H, Dh]
    cross_keys: tuple[Array, ...]  # num_decoder_layers x [B, P, H, Dh]: projected encoder output
    cross_values: tuple[Array, ...]  # num_decoder_layers x [B, P, H, Dh]
    encoder_lengths: Array  # int32 [B]: real input tokens; cross keys at >= this are padding
    lengths: Array  # int32 [B]: decoder tokens fed so far; keys at >= lengths are stale

    @property
    def max_length(self) -> int:
        """Decoder positions the cache holds (S)."""
        return self.keys[0].shape[1]

    @property
    def max_input_length(self) -> int:
        """Encoder positions the cache holds (P)."""
        return self.cross_keys[0].shape[1]


def relative_position_bucket(relative_position: Array, *, bidirectional: bool,
                             num_buckets: int, max_distance: int) -> Array:
    """Maps ``key_position - query_position`` to a T5 relative-attention bucket.

    Half of the buckets (per direction when ``bidirectional``) hold exact
    distances; the rest cover distances up to ``max_distance`` on a log scale,
    and anything farther shares the last bucket. Causal (decoder) buckets only
    distinguish keys in the past; future keys map to bucket 0 and are masked
    anyway. The float32 arithmetic follows Mesh TensorFlow / Hugging Face, so
    bucket boundaries agree exactly.

    Worked example (num_buckets=32, max_distance=128):
        causal: distance 0..15 -> buckets 0..15; 16 -> 16; 127 -> 31; 500 -> 31
        bidirectional: key 3 before the query -> 3; key 3 after it -> 16 + 3
    """
    relative_position = relative_position.astype(jnp.int32)
    if bidirectional:
        num_buckets //= 2
        direction_offset = (relative_position > 0).astype(jnp.int32) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        direction_offset = jnp.zeros_like(relative_position)
        distance = jnp.maximum(-relative_position, 0)
    max_exact = num_buckets // 2
    # The clamp only keeps log() finite on entries the where() below discards.
    log_ratio = (jnp.log(jnp.maximum(distance, max_exact).astype(jnp.float32) / max_exact)
                 / math.log(max_distance / max_exact))
    large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return direction_offset + jnp.where(distance < max_exact, distance, large)


def _query_init(config: T5Config):
    """Query kernels absorb T5's missing 1/sqrt(Dh) score scale (as in t5x)."""
    return nn.initializers.variance_scaling(1.0 / config.d_kv, "fan_in", "truncated_normal")


_kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")


def _dense(config: T5Config, features: int, kernel_init=_kernel_init, **kwargs) -> nn.Dense:
    return nn.Dense(features, use_bias=False, dtype=jnp.dtype(config.dtype),
                    param_dtype=jnp.dtype(config.param_dtype), kernel_init=kernel_init,
                    precision=config.compute_precision, **kwargs)


def _dropout(module: nn.Module, x: Array) -> Array:
    """T5's dropout, active only in a training forward: when the caller passed a
    ``dropout`` RNG (``prefill``/``extend`` with ``dropout_rng``). Decoding never
    does, so the decoding forward is deterministic whatever ``dropout_rate``."""
    rate = module.config.dropout_rate
    if rate == 0.0 or not module.has_rng("dropout"):
        return x
    # Inline rather than nn.Dropout: setup-style modules cannot create submodules in calls.
    keep = jax.random.bernoulli(module.make_rng("dropout"), 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


def _norm(config: T5Config, **kwargs) -> RMSNorm:
    return RMSNorm(config.layer_norm_eps, jnp.dtype(config.dtype), **kwargs)


class _RelativePositionBias(nn.Module):
    """Learned per-head bias indexed by relative-position bucket (t5x layout)."""

    config: T5Config
    bidirectional: bool

    @nn.compact
    def __call__(self, relative_position: Array) -> Array:
        """int [..., K, S] (key - query positions) -> float32 [..., H, K, S]."""
        cfg = self.config
        table_HxN = self.param(
            "rel_embedding", nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
            (cfg.num_heads, cfg.relative_attention_num_buckets), jnp.dtype(cfg.param_dtype))
        buckets = relative_position_bucket(
            relative_position, bidirectional=self.bidirectional,
            num_buckets=cfg.relative_attention_num_buckets,
            max_distance=cfg.relative_attention_max_distance)
        bias = jnp.take(table_HxN.astype(jnp.float32), buckets, axis=1)  # [H, ..., K, S]
        return jnp.moveaxis(bias, 0, -3)  # [..., H, K, S]


class _Attention(nn.Module):
    """Multi-head attention over given key/value buffers (no score scaling).

    Split into ``project_kv`` and ``__call__`` so that cross-attention keys and
    values are projected once per input at prefill, and self-attention ones are
    written into the cache before attending.
    """

    config: T5Config

    def setup(self):
        cfg = self.config
        inner = cfg.num_heads * cfg.d_kv
        self.query = _dense(cfg, inner, kernel_init=_query_init(cfg))
        self.key = _dense(cfg, inner)
        self.value = _dense(cfg, inner)
        self.out = _dense(cfg, cfg.d_model)

    def _heads(self, x_BxSxF: Array) -> Array:
        # [B, S, H*Dh] -> [B, S, H, Dh]
        return x_BxSxF.reshape(x_BxSxF.shape[:2] + (self.config.num_heads, self.config.d_kv))

    def project_kv(self, x_BxSxD: Array) -> tuple[Array, Array]:
        """Keys and values [B, S, H, Dh] of the attended-to states."""
        return self._heads(self.key(x_BxSxD)), self._heads(self.value(x_BxSxD))

    def __call__(self, x_BxKxD: Array, keys_BxSxHxDh: Array, values_BxSxHxDh: Array,
                 mask_BxKxS: Array, bias=None) -> Array:
        """Attends K queries to S keys; ``bias`` is [H, K, S] or [B, H, K, S]."""
        batch, k = x_BxKxD.shape[:2]
        # [B, K, H*Dh] -> [B, K, H, 1, Dh]: one query head per key/value head.
        q = self._heads(self.query(x_BxKxD))[:, :, :, None, :]
        out = masked_softmax_attention(q, keys_BxSxHxDh, values_BxSxHxDh, mask_BxKxS,
                                       ATTENTION_SCORE_SCALE, bias,
                                       precision=self.config.compute_precision)
        out = out.reshape(batch, k, self.config.num_heads * self.config.d_kv)
        return self.out(out)


class _GatedGeluMlp(nn.Module):
    """T5 v1.1 feed-forward: ``wo(gelu_tanh(x wi_0) * (x wi_1))``."""

    config: T5Config

    @nn.compact
    def __call__(self, x_BxKxD: Array) -> Array:
        cfg = self.config
        gate = _dense(cfg, cfg.d_ff, name="wi_0")(x_BxKxD)
        linear = _dense(cfg, cfg.d_ff, name="wi_1")(x_BxKxD)
        # approximate=True is HF's "gelu_new" and t5x's gelu.
        hidden = _dropout(self, nn.gelu(gate, approximate=True) * linear)
        return _dense(cfg, cfg.d_model, name="wo")(hidden)


class _EncoderLayer(nn.Module):
    config: T5Config

    @nn.compact
    def __call__(self, x_BxPxD: Array, mask_BxPxP: Array, bias_HxPxP: Array) -> Array:
        cfg = self.config
        y = _norm(cfg, name="pre_attention_layer_norm")(x_BxPxD)
        attention = _Attention(cfg, name="attention")
        keys, values = attention.project_kv(y)
        x_BxPxD = x_BxPxD + _dropout(self, attention(y, keys, values, mask_BxPxP,
                                                      bias_HxPxP))
        y = _norm(cfg, name="pre_mlp_layer_norm")(x_BxPxD)
        return x_BxPxD + _dropout(self, _GatedGeluMlp(cfg, name="mlp")(y))


class _Encoder(nn.Module):
    """Bidirectional stack over right-padded inputs; padding keys are masked."""

    config: T5Config

    @nn.compact
    def __call__(self, x_BxPxD: Array, lengths_B: Array) -> Array:
        cfg = self.config
        batch, width = x_BxPxD.shape[:2]
        positions_P = jnp.arange(width)
        relative_PxP = positions_P[None, :] - positions_P[:, None]  # key - query
        bias_HxPxP = _RelativePositionBias(cfg, bidirectional=True, name="relpos_bias")(
            relative_PxP)
        valid_BxP = positions_P[None, :] < lengths_B[:, None]
        mask_BxPxP = jnp.broadcast_to(valid_BxP[:, None, :], (batch, width, width))
        x_BxPxD = _dropout(self, x_BxPxD)
        for i in range(cfg.num_encoder_layers):
            x_BxPxD = _EncoderLayer(cfg, name=f"layers_{i}")(x_BxPxD, mask_BxPxP, bias_HxPxP)
        return _dropout(self, _norm(cfg, name="encoder_norm")(x_BxPxD))


class _DecoderLayer(nn.Module):
    config: T5Config

    def setup(self):
        cfg = self.config
        self.pre_self_attention_layer_norm = _norm(cfg)
        self.self_attention = _Attention(cfg)
        self.pre_cross_attention_layer_norm = _norm(cfg)
        self.encoder_decoder_attention = _Attention(cfg)
        self.pre_mlp_layer_norm = _norm(cfg)
        self.mlp = _GatedGeluMlp(cfg)

    def cross_kv(self, encoded_BxPxD: Array) -> tuple[Array, Array]:
        """Cross-attention keys/values [B, P, H, Dh] of the (final-normed) encoder output."""
        return self.encoder_decoder_attention.project_kv(encoded_BxPxD)

    def __call__(self, x_BxKxD, lengths_B, keys, values, self_mask_BxKxS, self_bias_BxHxKxS,
                 cross_keys, cross_values, cross_mask_BxKxP):
        y = self.pre_self_attention_layer_norm(x_BxKxD)
        new_keys, new_values = self.self_attention.project_kv(y)
        keys = interface.write_at_lengths(keys, new_keys, lengths_B)
        values = interface.write_at_lengths(values, new_values, lengths_B)
        x_BxKxD = x_BxKxD + _dropout(self, self.self_attention(
            y, keys, values, self_mask_BxKxS, self_bias_BxHxKxS))
        y = self.pre_cross_attention_layer_norm(x_BxKxD)
        x_BxKxD = x_BxKxD + _dropout(self, self.encoder_decoder_attention(
            y, cross_keys, cross_values, cross_mask_BxKxP))
        x_BxKxD = x_BxKxD + _dropout(self, self.mlp(self.pre_mlp_layer_norm(x_BxKxD)))
        return x_BxKxD, keys, values


class _Decoder(nn.Module):
    """Causal stack over the cache plus cross-attention to the encoded input."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.relpos_bias = _RelativePositionBias(cfg, bidirectional=False)
        self.layers = [_DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)]
        self.decoder_norm = _norm(cfg)
        # Logits in float32 whatever the activation dtype (probabilities stay exact).
        self.logits_dense = nn.Dense(cfg.vocab_size, use_bias=False, dtype=jnp.float32,
                                     param_dtype=jnp.dtype(cfg.param_dtype),
                                     kernel_init=_kernel_init, precision=cfg.compute_precision)

    def cross_kv(self, encoded_BxPxD: Array):
        """Per-layer cross-attention keys and values, as two tuples."""
        pairs = [layer.cross_kv(encoded_BxPxD) for layer in self.layers]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)

    def __call__(self, x_BxKxD: Array, cache: T5Cache, select_BxN: Array | None = None):
        batch, k = x_BxKxD.shape[:2]
        query_pos_BxK = cache.lengths[:, None] + jnp.arange(k)[None, :]
        key_pos_S = jnp.arange(cache.max_length)
        relative_BxKxS = key_pos_S[None, None, :] - query_pos_BxK[:, :, None]
        self_bias_BxHxKxS = self.relpos_bias(relative_BxKxS)
        self_mask_BxKxS = interface.causal_cache_mask(cache.lengths, k, cache.max_length)
        valid_BxP = jnp.arange(cache.max_input_length)[None, :] < cache.encoder_lengths[:, None]
        cross_mask_BxKxP = jnp.broadcast_to(valid_BxP[:, None, :],
                                            (batch, k, cache.max_input_length))
        new_keys, new_values = [], []
        x_BxKxD = _dropout(self, x_BxKxD)
        for i, layer in enumerate(self.layers):
            x_BxKxD, keys, values = layer(
                x_BxKxD, cache.lengths, cache.keys[i], cache.values[i], self_mask_BxKxS,
                self_bias_BxHxKxS, cache.cross_keys[i], cache.cross_values[i], cross_mask_BxKxP)
            new_keys.append(keys)
            new_values.append(values)
        hidden_BxKxD = interface.select_positions(_dropout(self, self.decoder_norm(x_BxKxD)),
                                                  select_BxN)
        logits_BxKxV = self.logits_dense(hidden_BxKxD)
        new_cache = cache.replace(keys=tuple(new_keys), values=tuple(new_values),
                                  lengths=cache.lengths + k)
        return logits_BxKxV, hidden_BxKxD, new_cache


class _T5Net(nn.Module):
    """The whole network; ``encode`` and ``decode`` are applied separately."""

    config: T5Config

    def setup(self):
        cfg = self.config
        self.token_embedder = nn.Embed(
            cfg.vocab_size, cfg.d_model, dtype=jnp.dtype(cfg.dtype),
            param_dtype=jnp.dtype(cfg.param_dtype),
            embedding_init=nn.initializers.normal(stddev=EMBEDDING_INIT_STDDEV))
        self.encoder = _Encoder(cfg)
        self.decoder = _Decoder(cfg)

    def encode(self, tokens_BxP: Array, lengths_B: Array):
        """Encodes the inputs; returns per-layer cross-attention (keys, values)."""
        encoded_BxPxD = self.encoder(self.token_embedder(tokens_BxP), lengths_B)
        return self.decoder.cross_kv(encoded_BxPxD)

    def decode(self, tokens_BxK: Array, cache: T5Cache, select_BxN: Array | None = None):
        return self.decoder(self.token_embedder(tokens_BxK), cache, select_BxN)

    def __call__(self, tokens_BxP: Array, lengths_B: Array, tokens_BxK: Array,
                 cache: T5Cache):
        """Touches every parameter (used by ``init``)."""
        cross_keys, cross_values = self.encode(tokens_BxP, lengths_B)
        cache = cache.replace(cross_keys=cross_keys, cross_values=cross_values,
                              encoder_lengths=lengths_B)
        return self.decode(tokens_BxK, cache)


def _dropout_rngs(dropout_rng: Array | None) -> dict:
    return {} if dropout_rng is None else {"dropout": dropout_rng}


@dataclasses.dataclass(frozen=True)
class T5EncoderDecoderLM:
    """T5 v1.1 behind the functional interface (pure methods; see module docs)."""

    config: T5Config

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def decoder_start_token_id(self) -> int:
        """The decoding loops start every output from this pending token."""
        return self.config.decoder_start_token_id

    @property
    def _net(self) -> _T5Net:
        return _T5Net(self.config)

    def init_params(self, rng: Array) -> dict:
        """Random parameters in the t5x tree (for tests and training)."""
        cache = self.init_cache(1, 2, 2)
        tokens = jnp.zeros((1, 1), jnp.int32)
        # Jitted: one compilation instead of one per op of an eager init.
        variables = jax.jit(self._net.init)(rng, tokens, jnp.ones((1,), jnp.int32), tokens, cache)
        return variables["params"]

    def init_cache(self, batch_size: int, max_length: int,
                   max_input_length: int | None = None) -> T5Cache:
        """Empty cache for ``max_length`` decoder tokens and inputs of up to
        ``max_input_length`` tokens (default ``max_length``; both are static)."""
        cfg = self.config
        if max_input_length is None:
            max_input_length = max_length
        if batch_size <= 0 or max_length <= 0 or max_input_length <= 0:
            raise ValueError(
                f"init_cache: batch_size ({batch_size}), max_length ({max_length}) and "
                f"max_input_length ({max_input_length}) must be positive.")
        dtype = jnp.dtype(cfg.dtype)

        def buffers(length):
            shape = (batch_size, length, cfg.num_heads, cfg.d_kv)
            return tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_decoder_layers))

        zeros_B = jnp.zeros((batch_size,), jnp.int32)
        return T5Cache(keys=buffers(max_length), values=buffers(max_length),
                       cross_keys=buffers(max_input_length),
                       cross_values=buffers(max_input_length),
                       encoder_lengths=zeros_B, lengths=zeros_B)

    def _decode(self, params, tokens_BxK, cache, select_BxN=None, dropout_rng=None):
        return self._net.apply({"params": params}, tokens_BxK, cache, select_BxN,
                               method=_T5Net.decode, rngs=_dropout_rngs(dropout_rng))

    def prefill(self, params: dict, prompt: Prompt, cache: T5Cache, *,
                dropout_rng: Array | None = None) -> StepOutput:
        """Encodes the prompt into the cache and starts an empty decoder sequence.

        Returns a cache with the cross-attention keys/values of this prompt,
        ``encoder_lengths = prompt.lengths`` and ``lengths = 0``: no decoder
        token is fed, the caller feeds ``decoder_start_token_id`` with
        ``extend``. ``logits`` [B, 1, V] and ``hidden`` [B, 1, D] preview that
        step (next-token logits after the start token) without committing it
        to the returned cache. A row with an empty prompt attends to padding;
        its outputs are defined but meaningless. ``dropout_rng`` (training
        only) turns on ``config.dropout_rate``.
        """
        batch = cache.lengths.shape[0]
        width = prompt.tokens.shape[1]
        lengths = interface._concrete(prompt.lengths)
        if width > cache.max_input_length:
            longest = int(lengths.max()) if lengths is not None else width
            raise ValueError(
                f"prefill: an input of {longest} tokens (padded to {width}) does not fit a "
                f"cache of max_input_length {cache.max_input_length}; pass a larger "
                "max_input_length to init_cache or shorten the input.")
        interface.check_prompt(prompt, batch, cache.max_input_length, self.vocab_size)
        if lengths is not None and (lengths > width).any():
            raise ValueError(
                f"prefill: prompt lengths {lengths.tolist()} exceed the token array's width "
                f"{width}; lengths count the real tokens of each right-padded row.")
        cross_keys, cross_values = self._net.apply(
            {"params": params}, prompt.tokens, prompt.lengths, method=_T5Net.encode,
            rngs=_dropout_rngs(dropout_rng))

        def store(buffer_BxPxHxDh, new_BxWxHxDh):
            # The input fills positions [0, width); the rest stays masked padding.
            return jax.lax.dynamic_update_slice(
                buffer_BxPxHxDh, new_BxWxHxDh.astype(buffer_BxPxHxDh.dtype), (0, 0, 0, 0))

        cache = cache.replace(
            cross_keys=tuple(map(store, cache.cross_keys, cross_keys)),
            cross_values=tuple(map(store, cache.cross_values, cross_values)),
            encoder_lengths=prompt.lengths.astype(jnp.int32),
            lengths=jnp.zeros_like(cache.lengths))
        start_Bx1 = jnp.full((batch, 1), self.decoder_start_token_id, jnp.int32)
        preview_rng = None if dropout_rng is None else jax.random.fold_in(dropout_rng, 1)
        logits, hidden, _ = self._decode(params, start_Bx1, cache, dropout_rng=preview_rng)
        return StepOutput(logits=logits, hidden=hidden, cache=cache)

    def extend(self, params: dict, tokens: Array, cache: T5Cache,
               logits_at: Array | None = None, *,
               dropout_rng: Array | None = None) -> StepOutput:
        """Feeds K decoder tokens per row at positions lengths .. lengths + K - 1.

        Returns float32 logits [B, K, V] (next-token logits after each fed
        token), final-normed hidden states [B, K, D] (both at the offsets
        ``logits_at`` [B, N] only, when given), and the cache with lengths +
        K. Roll back with ``cache.replace(lengths=...)``. ``dropout_rng``
        (training only) turns on ``config.dropout_rate``.
        """
        interface.check_extend(tokens, cache.lengths, cache.max_length, self.vocab_size)
        logits, hidden, new_cache = self._decode(params, tokens, cache, logits_at, dropout_rng)
        return StepOutput(logits=logits, hidden=hidden, cache=new_cache)
