"""A feature-level draft head (EAGLE, Li et al. 2024): one decoder layer that
drafts from the target's own hidden states.

The target's last hidden state ``f_s`` at position ``s`` (the input of its
output head: what ``extend`` returns as ``hidden``) already holds most of
what the next token will be. The head predicts the next feature from the
current token and the previous feature, and scores the prediction with the
target's own output head, frozen and shared::

    x_s   = W_fc [embed(t_s) ; f_{s-1}] + b_fc          (f_{-1} = 0)
    f^_s  = Layer(x_s | x_<s)                          one decoder layer, own KV cache
    q(t_{s+1}) = softmax(head(f^_s))                    the target's output head

``embed`` is the target's embedding, ``Layer`` is shaped like one of the
target's (optionally with a narrower MLP), and ``head`` may score only the
frequent tokens (``head_vocab``: the law is renormalised over them; a token
outside is never drafted and the target still emits it through the
residual). EAGLE-1 reads the same feature as here, the output head's input.

Inside a round the head has no target features for its own drafts, so it
feeds back its predictions: ``d_{i+1}`` is drawn from ``head(f^)`` after
feeding ``(d_i, f^_prev)``. After verification the target's features of the
accepted tokens are known (the scoring call computed them) and the head
re-feeds those positions with them, in one windowed call at the start of the
next round, as EAGLE does.

Compositions: the head is a leaf of CS Drafting like a model
(``cs_drafting.cs_drafter``: a segment, a level under a model, or a reviewer of
the layer below through ``score``, which feeds given tokens one at a time)
and takes SpecDec++'s stopping rule (``adaptive.AdaptiveFeatureDrafter``).

Exactness: ``q`` is the law the drafts are drawn from, a function of the
drafter's state, which never sees the target's verdict in advance; every
verifier therefore keeps the target's output law. Under a cascade target
function ``pi = T(q, p)``, ``q`` at a position depends on its role in the
round (a round's first draft reads real features; later drafts read
predicted ones), and the output follows ``T(q, p)`` with the ``q`` of that
role (``tests/test_feature_drafter.py`` pins that law exactly).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import sampling
from specdec_jax.drafting.base import Context, Proposal, pad_to
from specdec_jax.drafting.model_drafter import has_nan
from specdec_jax.loops import write_rows
from specdec_jax.models.decoder_only import DecoderCache
from specdec_jax.models.feature_head import FeatureHead
from specdec_jax.models.interface import Prompt
from specdec_jax.sampling import sample_from_weights

Array = jax.Array

# Rows further behind than the round's window are first fed in chunks this
# wide (the first round feeds the whole prompt).
CATCH_UP_CHUNK = 64


@flax.struct.dataclass
class FeatureDrafterState:
    cache: DecoderCache  # the head's one-layer cache; lengths = history positions fed
    real: Array  # int32 [B]: positions < real were fed with the target's features
    own: Array  # float32 [B, S, D]: own[b, s] = the head's prediction after position s


def _gather(buffer_BxS_: Array, positions_BxK: Array) -> Array:
    """buffer[b, positions[b, k]] with positions clipped into range."""
    safe = jnp.clip(positions_BxK, 0, buffer_BxS_.shape[1] - 1)
    index = safe.reshape(safe.shape + (1,) * (buffer_BxS_.ndim - 2))
    return jnp.take_along_axis(buffer_BxS_, index, axis=1)


@dataclasses.dataclass(frozen=True)
class FeatureDrafter:
    """Drafts with a ``FeatureHead`` on the target's hidden states (module
    docstring). Params: ``select_params({name: drafter_params(...)})``.

    A round: (1) positions whose target features became known since the head
    fed them (with predictions, or not at all) are re-fed with the real
    features: one call of width ``window`` (default ``G + 1``, what a round
    can accept) ending at the last such position, after chunks of
    ``CATCH_UP_CHUNK`` for rows further behind (the prompt, in round 1);
    (2) history tokens beyond the target's (drafts of another drafter in a
    cascade) are fed one at a time on predicted features; (3) ``G`` drafts
    (``G + 1`` calls' worth of predictions with ``with_next``), each step
    feeding the previous draft and prediction.
    """

    head: FeatureHead
    name: str = "feature"
    window: int | None = None
    needs_target_features: ClassVar[bool] = True

    @property
    def vocab_size(self) -> int:
        return self.head.config.vocab_size

    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.name,)

    def select_params(self, named: dict):
        if self.name not in named:
            raise KeyError(f"feature drafter {self.name!r} needs params under that name "
                           "(feature.drafter_params(target, target_params, net_params)).")
        return named[self.name]

    def init(self, params, prompt: Prompt, max_length: int,
             encoder_decoder: bool) -> FeatureDrafterState:
        del params
        if encoder_decoder:
            raise ValueError("a feature drafter reads a decoder-only target's hidden states; "
                             "the target here is an encoder-decoder model.")
        batch = prompt.tokens.shape[0]
        zeros_B = jnp.zeros((batch,), jnp.int32)
        return FeatureDrafterState(
            cache=self.head.init_cache(batch, max_length), real=zeros_B,
            own=jnp.zeros((batch, max_length, self.head.config.feature_size), jnp.float32))

    def _feed(self, params, cache, own, context: Context, start_B: Array, width: int,
              end_B: Array):
        """Feeds positions ``start .. start + width - 1`` on the target's
        features; predictions at positions below ``end`` go to ``own``."""
        positions_BxW = start_B[:, None] + jnp.arange(width)[None, :]
        tokens = _gather(context.history, positions_BxW)
        features = jnp.where((positions_BxW >= 1)[..., None],
                             _gather(context.features, positions_BxW - 1), 0)
        predicted, cache = self.head.step(params, tokens, features,
                                          cache.replace(lengths=start_B))
        own = write_rows(own, predicted, start_B, jnp.clip(end_B - start_B, 0, width))
        return cache, own

    def _catch_up_real(self, params, state: FeatureDrafterState, context: Context,
                       width: int):
        """Step (1) of a round; returns (cache, real, own, calls_B, fed_B)."""
        cache, own = state.cache, state.own
        length_B = context.length
        end_B = jnp.minimum(length_B, context.feature_length + 1)
        refresh_B = end_B > state.real
        start_B = jnp.where(refresh_B, jnp.minimum(cache.lengths, state.real), cache.lengths)
        chunk = max(CATCH_UP_CHUNK, width)

        def chunk_cond(carry):
            cache, _, _, _ = carry
            return jnp.any(refresh_B & (end_B - cache.lengths > width))

        def chunk_body(carry):
            cache, own, calls_B, fed_B = carry
            behind_B = refresh_B & (end_B - cache.lengths > width)
            new_cache, own = self._feed(params, cache, own, context, cache.lengths, chunk,
                                        jnp.where(behind_B, end_B, 0))
            lengths = jnp.where(behind_B, jnp.minimum(cache.lengths + chunk, end_B),
                                cache.lengths)
            behind = behind_B.astype(jnp.int32)
            return (new_cache.replace(lengths=lengths), own, calls_B + behind,
                    fed_B + behind * chunk)

        zeros_B = jnp.zeros_like(length_B)
        cache, own, calls_B, fed_B = jax.lax.while_loop(
            chunk_cond, chunk_body, (cache.replace(lengths=start_B), own, zeros_B, zeros_B))
        # Rows with nothing new feed the window past their cache's end (stale
        # slots, dropped past the buffer) and keep what they hold. When no row
        # has anything new (a cascade's later inner rounds) the call is skipped:
        # it would change nothing, and no row counts it.
        window_start_B = jnp.where(refresh_B, jnp.maximum(end_B - width, 0), cache.lengths)
        new_cache, own = jax.lax.cond(
            jnp.any(refresh_B),
            lambda cache, own: self._feed(params, cache, own, context, window_start_B, width,
                                          jnp.where(refresh_B, end_B, 0)),
            lambda cache, own: (cache, own), cache, own)
        cache = new_cache.replace(lengths=jnp.where(refresh_B, end_B, state.cache.lengths))
        real_B = jnp.where(refresh_B, end_B, state.real)
        refresh = refresh_B.astype(jnp.int32)
        return cache, real_B, own, calls_B + refresh, fed_B + refresh * width

    def _catch_up_predicted(self, params, cache, own, context: Context):
        """Step (2): history positions past the target's, one at a time."""
        length_B = context.length

        def cond(carry):
            cache, _, _ = carry
            return jnp.any(cache.lengths < length_B)

        def body(carry):
            cache, own, calls_B = carry
            position_B = cache.lengths
            active_B = position_B < length_B
            token = _gather(context.history, position_B[:, None])
            feature = _gather(own, position_B[:, None] - 1)
            predicted, new_cache = self.head.step(params, token, feature, cache)
            own = write_rows(own, predicted, position_B, active_B.astype(jnp.int32))
            lengths = jnp.where(active_B, position_B + 1, position_B)
            return new_cache.replace(lengths=lengths), own, calls_B + active_B.astype(jnp.int32)

        return jax.lax.while_loop(cond, body, (cache, own, jnp.zeros_like(length_B)))

    def _catch_up(self, params, state: FeatureDrafterState, context: Context, width: int):
        """Steps (1) and (2): the cache then holds every history token (the
        pending one included) and ``own[length - 1]`` predicts the next
        feature. Returns (cache, real, own, calls_B, fed_B, walked_B)."""
        if context.features is None:
            raise ValueError("the feature drafter needs the target's hidden states; decode "
                             "with decoding.SpeculativeDecoder (it hands them over when "
                             "drafting.needs_features(drafter)).")
        # A cache never holds the pending token's successors at a round's start.
        cache = state.cache.replace(lengths=jnp.minimum(state.cache.lengths, context.length))
        state = state.replace(cache=cache, real=jnp.minimum(state.real, cache.lengths))
        cache, real_B, own, calls_B, fed_B = self._catch_up_real(params, state, context, width)
        cache, own, walked_B = self._catch_up_predicted(params, cache, own, context)
        return cache, real_B, own, calls_B, fed_B, walked_B

    def propose(self, params, state: FeatureDrafterState, context: Context, num: int,
                with_next: bool, key: Array, sp: sampling.SamplingParams,
                config: sampling.SamplingConfig) -> tuple[Proposal, FeatureDrafterState]:
        length_B = context.length
        width = self.window or num + 1
        cache, real_B, own, calls_B, fed_B, walked_B = self._catch_up(params, state, context,
                                                                      width)

        keys = jax.random.split(key, num + 1)
        feature_BxD = _gather(own, (length_B - 1)[:, None])[:, 0]
        first_logits = self.head.logits(params, feature_BxD)
        first = sampling.distributions(first_logits, sp.temperature, sp.top_p, config)
        first_B = sample_from_weights(keys[0], first.probs)

        def body_fn(carry, step_key):
            cache, token_B, feature_BxD = carry
            predicted, cache = self.head.step(params, token_B[:, None], feature_BxD[:, None],
                                              cache)
            logits = self.head.logits(params, predicted[:, 0])
            dist = sampling.distributions(logits, sp.temperature, sp.top_p, config)
            next_B = sample_from_weights(step_key, dist.probs)
            return (cache, next_B, predicted[:, 0].astype(jnp.float32)), (
                next_B, dist.probs, dist.stats, predicted[:, 0].astype(jnp.float32),
                has_nan(logits))

        steps = num - 1 + int(with_next)
        (cache, _, _), (tokens_TxB, q_TxBxV, qs_TxBxV, predicted_TxBxD, nan_TxB) = \
            jax.lax.scan(body_fn, (cache, first_B, feature_BxD), keys[1:1 + steps])
        own = write_rows(own, jnp.moveaxis(predicted_TxBxD, 0, 1), length_B)
        cat = lambda head, rest: jnp.concatenate([head[:, None], jnp.moveaxis(rest, 0, 1)], 1)
        proposal = Proposal(
            tokens=cat(first_B, tokens_TxB)[:, :num],
            q=pad_to(cat(first.probs, q_TxBxV), num + 1),
            q_stat=pad_to(cat(first.stats, qs_TxBxV), num + 1),
            hidden=pad_to(cat(feature_BxD, predicted_TxBxD), num + 1),
            calls=(calls_B + walked_B + steps)[:, None],
            fed=(fed_B + walked_B + steps)[:, None],
            single=(walked_B + steps + int(width == 1) * calls_B)[:, None],
            nan=has_nan(first_logits) + jnp.sum(nan_TxB, axis=0))
        return proposal, FeatureDrafterState(cache=cache, real=real_B, own=own)

    def score(self, params, state: FeatureDrafterState, context: Context, tokens_BxK: Array
              ) -> tuple[Array, Array, FeatureDrafterState, Array, Array, Array]:
        """The head's logits after the pending token and after each of ``K``
        given tokens (another drafter's proposals, which this head reviews):
        ``(logits [B, 1 + K, V], hidden [B, 1 + K, D], state, calls_B, fed_B,
        single_B)``, like ``base.extend_from_history`` for a model; the
        state's cache then holds ``length + K`` positions.

        A model scores a block in one call; the head cannot: the feature it
        feeds with ``t_i`` is its own prediction after ``t_{i-1}``, so the
        ``K`` tokens go in one at a time (``K`` one-token calls, after the
        round's catch-up). Index 0 reads the catch-up's prediction, no call.
        """
        k = tokens_BxK.shape[1]
        length_B = context.length
        width = self.window or k + 1
        cache, real_B, own, calls_B, fed_B, walked_B = self._catch_up(params, state, context,
                                                                      width)
        feature_BxD = _gather(own, (length_B - 1)[:, None])[:, 0]

        def body_fn(carry, token_B):
            cache, feature_BxD = carry
            predicted, cache = self.head.step(params, token_B[:, None], feature_BxD[:, None],
                                              cache)
            predicted_BxD = predicted[:, 0].astype(jnp.float32)
            return (cache, predicted_BxD), predicted_BxD

        (cache, _), predicted_KxBxD = jax.lax.scan(body_fn, (cache, feature_BxD),
                                                   jnp.moveaxis(tokens_BxK, 1, 0))
        predicted_BxKxD = jnp.moveaxis(predicted_KxBxD, 0, 1)
        own = write_rows(own, predicted_BxKxD, length_B)
        hidden = jnp.concatenate([feature_BxD[:, None], predicted_BxKxD], axis=1)
        logits = self.head.logits(params, hidden)
        single_B = walked_B + k + int(width == 1) * calls_B
        return (logits, hidden, FeatureDrafterState(cache=cache, real=real_B, own=own),
                calls_B + walked_B + k, fed_B + walked_B + k, single_B)

    def rewind(self, state: FeatureDrafterState, valid_B: Array) -> FeatureDrafterState:
        lengths = jnp.minimum(state.cache.lengths, valid_B)
        return state.replace(cache=state.cache.replace(lengths=lengths),
                             real=jnp.minimum(state.real, lengths))
