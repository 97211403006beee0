"""The network of a feature-level draft head (EAGLE, Li et al. 2024): one
decoder layer over the target's hidden states, scored by the target's own
output head.

    x_s   = W_fc [embed(t_s) ; f_{s-1}] + b_fc          (f_{-1} = 0)
    f^_s  = Layer(x_s | x_<s)                          one decoder layer, own KV cache
    q(t_{s+1}) = softmax(head(f^_s))                    the target's output head

This module holds the network and its parameters (shape, init, one step, the
shared output head, layout conversion); the drafter that runs it inside a
decoding round is ``drafting.feature.FeatureDrafter``.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import precision
from specdec_jax.models import interface, layers
from specdec_jax.models.decoder_only import (
    Attention,
    DecoderCache,
    DecoderConfig,
    DecoderOnlyLM,
    SwiGLU,
    head_rows,
)

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class FeatureHeadConfig:
    """Shape of a feature head for a target of hidden size ``feature_size``."""

    vocab_size: int
    feature_size: int  # D: the target's hidden size (the features' width)
    embed_size: int  # the target's embedding width (D for the decoders here)
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"
    matmul_precision: str | None = None
    # How the layer's dense kernels are stored (models.layers): "in_out" as
    # trained, "out_in" the decode layout (``with_kernel_layout`` converts).
    kernel_layout: str = layers.IN_OUT

    def __post_init__(self):
        layers.check_kernel_layout(self.kernel_layout, "FeatureHeadConfig: kernel_layout")
        for name in ("vocab_size", "feature_size", "embed_size", "num_heads", "num_kv_heads",
                     "intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"FeatureHeadConfig: {name} must be >= 1, got "
                                 f"{getattr(self, name)}.")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"FeatureHeadConfig: num_heads={self.num_heads} is not a multiple "
                             f"of num_kv_heads={self.num_kv_heads}.")

    @classmethod
    def for_target(cls, target: DecoderOnlyLM, intermediate_size: int | None = None,
                   **overrides) -> FeatureHeadConfig:
        """A head shaped like one of ``target``'s layers (EAGLE-1's choice); a
        smaller ``intermediate_size`` gives a cheaper MLP."""
        if not isinstance(target, DecoderOnlyLM):
            raise ValueError("a feature head reads a decoder-only target's hidden states; got "
                             f"{type(target).__name__}.")
        c = target.config
        fields = dict(vocab_size=c.vocab_size, feature_size=c.hidden_size,
                      embed_size=c.hidden_size, num_heads=c.num_heads,
                      num_kv_heads=c.num_kv_heads,
                      intermediate_size=intermediate_size or c.intermediate_size,
                      head_dim=c.head_dim, rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps,
                      qkv_bias=c.qkv_bias, dtype=c.dtype, param_dtype=c.param_dtype,
                      matmul_precision=c.matmul_precision)
        return cls(**{**fields, **overrides})

    def layer_config(self) -> DecoderConfig:
        """The decoder layer's shape (``models.decoder`` modules run it)."""
        return DecoderConfig(
            vocab_size=self.vocab_size, hidden_size=self.feature_size,
            intermediate_size=self.intermediate_size, num_layers=1, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps, qkv_bias=self.qkv_bias, dtype=self.dtype,
            param_dtype=self.param_dtype, matmul_precision=self.matmul_precision,
            kernel_layout=self.kernel_layout)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> FeatureHeadConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"FeatureHeadConfig: unknown fields {unknown}.")
        return cls(**fields)


class _FeatureNet(nn.Module):
    """fc over [embedding ; feature], then one pre-norm decoder layer."""

    config: FeatureHeadConfig

    @nn.compact
    def __call__(self, embeds_BxKxE, features_BxKxD, cache: DecoderCache):
        layer = self.config.layer_config()
        dtype = jnp.dtype(layer.dtype)
        inputs = jnp.concatenate([embeds_BxKxE.astype(dtype), features_BxKxD.astype(dtype)], -1)
        x = layers.Linear(layer.hidden_size, use_bias=True, kernel_layout=layer.kernel_layout,
                   dtype=dtype,
                   param_dtype=jnp.dtype(layer.param_dtype), precision=layer.compute_precision,
                   name="fc")(inputs)
        k = x.shape[1]
        positions_BxK = cache.lengths[:, None] + jnp.arange(k)[None, :]
        mask_BxKxS = interface.causal_cache_mask(cache.lengths, k, cache.max_length)
        attn_out, keys, values = Attention(layer, name="attention")(
            layers.RMSNorm(layer.rms_norm_eps, dtype, name="pre_attention_norm")(x), positions_BxK,
            mask_BxKxS, cache.keys[0], cache.values[0], cache.lengths)
        x = x + attn_out
        x = x + SwiGLU(layer, name="mlp")(layers.RMSNorm(layer.rms_norm_eps, dtype,
                                                  name="pre_mlp_norm")(x))
        return x, cache.replace(keys=(keys,), values=(values,), lengths=cache.lengths + k)


@dataclasses.dataclass(frozen=True)
class FeatureHead:
    """The head as pure functions (hashable; parameters live apart).

    Parameters: ``{"net": trainable, "embedding": [V, E], "head": {"rows": [N,
    D]} (+ "token_ids": int32 [N] when the head scores N < V tokens)}``;
    ``embedding`` and ``head`` are the target's arrays (``shared_params``).
    """

    config: FeatureHeadConfig

    @property
    def _net(self) -> _FeatureNet:
        return _FeatureNet(self.config)

    def init_net(self, rng: Array) -> dict:
        """Random trainable parameters (the ``net`` entry)."""
        c = self.config
        cache = self.init_cache(1, 2)
        embeds = jnp.zeros((1, 1, c.embed_size), jnp.dtype(c.dtype))
        features = jnp.zeros((1, 1, c.feature_size), jnp.dtype(c.dtype))
        return jax.jit(self._net.init)(rng, embeds, features, cache)["params"]

    def init_cache(self, batch_size: int, max_length: int) -> DecoderCache:
        layer = self.config.layer_config()
        return DecoderCache.zeros(batch_size, max_length, 1, layer.num_kv_heads,
                                  layer.dims_per_head, jnp.dtype(layer.dtype))

    def step(self, params: dict, tokens_BxK: Array, features_BxKxD: Array,
             cache: DecoderCache) -> tuple[Array, DecoderCache]:
        """Feeds K (token, previous feature) pairs; returns the predicted
        features [B, K, D] and the cache holding K more positions."""
        embeds = jnp.take(params["embedding"], tokens_BxK, axis=0)
        return self._net.apply({"params": params["net"]}, embeds, features_BxKxD, cache)

    def logits(self, params: dict, features_xD: Array) -> Array:
        """float32 [..., V]: the shared output head on predicted features
        (-inf outside a restricted head's tokens)."""
        head = params["head"]
        scores = jnp.matmul(features_xD.astype(jnp.float32), head["rows"].astype(jnp.float32).T,
                            precision=precision.resolve_matmul_precision(
                                self.config.matmul_precision, self.config.dtype))
        if "token_ids" not in head:
            return scores
        full = jnp.full(scores.shape[:-1] + (self.config.vocab_size,), -jnp.inf, jnp.float32)
        return full.at[..., head["token_ids"]].set(scores)


def with_kernel_layout(head: FeatureHead, net_params: dict, layout: str = layers.OUT_IN
                       ) -> tuple[FeatureHead, dict]:
    """The same head with its dense kernels stored in ``layout`` (every
    ``kernel`` transposed; the decode layout is ``out_in``, as for decoders)."""
    layers.check_kernel_layout(layout)
    if layout == head.config.kernel_layout:
        return head, net_params
    config = dataclasses.replace(head.config, kernel_layout=layout)
    return FeatureHead(config), layers.transpose_kernels(net_params)


def shared_params(target: DecoderOnlyLM, target_params: dict, token_ids=None) -> dict:
    """The target arrays a feature head reads: ``{"embedding", "head"}``; the
    same buffers as the target's (no copy) unless the head is restricted to
    ``token_ids`` or stored ``[in, out]``."""
    if not isinstance(target, DecoderOnlyLM):
        raise ValueError("a feature head shares a decoder-only target's embedding and head; "
                         f"got {type(target).__name__}.")
    if target.config.head_vocab or layers.HEAD_VOCAB in target_params:
        raise ValueError("the target's own head is restricted (with_head_vocab); share the "
                         "full target and restrict the feature head with token_ids instead.")
    embedding = target_params["embedder"]["embedding"]
    rows = head_rows(target.config, target_params)
    if token_ids is None:
        return {"embedding": embedding, "head": {"rows": rows}}
    ids = np.asarray(token_ids)
    vocab = target.config.vocab_size
    if ids.ndim != 1 or not ids.size or ids.min() < 0 or ids.max() >= vocab or \
            len(np.unique(ids)) != ids.size:
        raise ValueError(f"token_ids must be unique ids in [0, {vocab}) (a 1-D array).")
    ids = jnp.asarray(np.sort(ids).astype(np.int32))
    return {"embedding": embedding, "head": {"rows": jnp.take(rows, ids, axis=0),
                                             "token_ids": ids}}


def drafter_params(target: DecoderOnlyLM, target_params: dict, net_params: dict,
                   token_ids=None) -> dict:
    """A ``FeatureDrafter``'s parameters: its trained ``net`` plus the target's
    shared arrays."""
    return {"net": net_params, **shared_params(target, target_params, token_ids)}
