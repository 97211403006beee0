"""Teacher-forced forward passes and the losses built on them.

Training runs the model's own ``prefill`` / ``extend`` on a fresh cache: one
``extend`` of the whole sequence is a teacher-forced forward (the cache's
causal mask makes position ``i`` see tokens ``0..i``), so the logits a model
is trained on are by construction the logits it decodes with (tested against
token-by-token decoding in ``tests/test_training.py``).

A :class:`Batch` is model-agnostic:

- decoder-only: ``targets`` is the whole sequence (prompt and continuation);
  the logits after token ``i`` predict token ``i + 1``, so ``weights[:, 0]``
  is never used (nothing predicts the first token) and a prompt is excluded by
  zero weights;
- encoder-decoder (T5): ``inputs`` / ``input_lengths`` feed the encoder; the
  decoder is fed ``[start] + targets[:-1]`` and predicts every target.

Worked example (decoder-only, one row)::

    targets = [5, 7, 9, 0]   weights = [0, 1, 1, 0]   (0 = padding)
    fed       5  7  9  0
    predicts  7  9  0  -     labels = [7, 9, 0, 0], label weights = [1, 1, 0, 0]
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
from jax import Array

from specdec_jax.models.interface import Prompt, is_encoder_decoder


@flax.struct.dataclass
class Batch:
    targets: Array  # int32 [B, L]: tokens to predict (decoder-only: the whole sequence)
    weights: Array  # float32 [B, L]: loss weight per target token (0: padding, prompt)
    inputs: Array | None = None  # int32 [B, P]: encoder inputs, right-padded (T5 only)
    input_lengths: Array | None = None  # int32 [B]: real tokens per encoder input row

    @property
    def encoder_decoder(self) -> bool:
        return self.inputs is not None


def uses_dropout(model) -> bool:
    """Whether the model's config asks for dropout in training (T5's dropout_rate)."""
    return getattr(getattr(model, "config", None), "dropout_rate", 0.0) > 0.0


def teacher_forced(model, params, batch: Batch, dropout_rng: Array | None = None
                   ) -> tuple[Array, Array, Array, Array]:
    """Logits [B, L, V] with the labels [B, L] and label weights [B, L] they
    predict, and the final hidden states [B, L, D] (what a head on top reads).
    ``dropout_rng`` turns on the model's dropout (T5; a training forward only)."""
    if is_encoder_decoder(model) != batch.encoder_decoder:
        kind = "an encoder-decoder" if is_encoder_decoder(model) else "a decoder-only"
        raise ValueError(f"{kind} model needs batches "
                         f"{'with' if is_encoder_decoder(model) else 'without'} encoder "
                         "inputs; build them with the task's encoder_decoder setting.")
    if dropout_rng is not None and not batch.encoder_decoder:
        raise ValueError("dropout is implemented for T5 (encoder-decoder) models only; "
                         "train decoder-only models with dropout_rate 0.")
    batch_size, length = batch.targets.shape
    if batch.encoder_decoder:
        encoder_rng, decoder_rng = ((None, None) if dropout_rng is None
                                    else tuple(jax.random.split(dropout_rng)))
        dropout = lambda rng: {} if rng is None else {"dropout_rng": rng}  # noqa: E731
        cache = model.init_cache(batch_size, length, batch.inputs.shape[1])
        cache = model.prefill(params, Prompt(tokens=batch.inputs, lengths=batch.input_lengths),
                              cache, **dropout(encoder_rng)).cache
        start_Bx1 = jnp.full((batch_size, 1), model.decoder_start_token_id, jnp.int32)
        fed_BxL = jnp.concatenate([start_Bx1, batch.targets[:, :-1]], axis=1)
        out = model.extend(params, fed_BxL, cache, **dropout(decoder_rng))
        return out.logits, batch.targets, batch.weights, out.hidden
    out = model.extend(params, batch.targets, model.init_cache(batch_size, length))
    # [B, L] -> [B, L]: the label of position i is token i + 1; the last has none.
    labels = jnp.concatenate([batch.targets[:, 1:], jnp.zeros_like(batch.targets[:, :1])], 1)
    weights = jnp.concatenate([batch.weights[:, 1:], jnp.zeros_like(batch.weights[:, :1])], 1)
    return out.logits, labels, weights, out.hidden


def cross_entropy(logits_BxLxV: Array, labels_BxL: Array, weights_BxL: Array
                  ) -> tuple[Array, dict[str, Array]]:
    """Weighted mean next-token cross-entropy, and sums for exact aggregation
    across steps (loss_sum, nll_sum = loss_sum, weight_sum, correct)."""
    log_probs = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
    nll_BxL = -jnp.take_along_axis(log_probs, labels_BxL[..., None], axis=-1)[..., 0]
    weight_sum = weights_BxL.sum()
    loss_sum = (nll_BxL * weights_BxL).sum()
    correct = ((logits_BxLxV.argmax(-1) == labels_BxL) * weights_BxL).sum()
    return loss_sum / jnp.maximum(weight_sum, 1.0), {
        "loss_sum": loss_sum, "nll_sum": loss_sum, "weight_sum": weight_sum, "correct": correct}


def lm_loss(model, params, batch: Batch, rng: Array | None = None,
            extras: Any = None) -> tuple[Array, dict[str, Array]]:  # noqa: ARG001
    """The language-modelling loss (pre-training and fine-tuning); with the
    model's dropout when it has some and ``rng`` is given (training steps)."""
    dropout_rng = rng if rng is not None and uses_dropout(model) else None
    logits, labels, weights, _ = teacher_forced(model, params, batch, dropout_rng)
    return cross_entropy(logits, labels, weights)
