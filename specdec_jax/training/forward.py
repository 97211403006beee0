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


def teacher_forced(model, params, batch: Batch) -> tuple[Array, Array, Array, Array]:
    """Logits [B, L, V] with the labels [B, L] and label weights [B, L] they
    predict, and the final hidden states [B, L, D] (what a head on top reads)."""
    if is_encoder_decoder(model) != batch.encoder_decoder:
        kind = "an encoder-decoder" if is_encoder_decoder(model) else "a decoder-only"
        raise ValueError(f"{kind} model needs batches "
                         f"{'with' if is_encoder_decoder(model) else 'without'} encoder "
                         "inputs; build them with the task's encoder_decoder setting.")
    batch_size, length = batch.targets.shape
    if batch.encoder_decoder:
        cache = model.init_cache(batch_size, length, batch.inputs.shape[1])
        cache = model.prefill(params, Prompt(tokens=batch.inputs,
                                             lengths=batch.input_lengths), cache).cache
        start_Bx1 = jnp.full((batch_size, 1), model.decoder_start_token_id, jnp.int32)
        fed_BxL = jnp.concatenate([start_Bx1, batch.targets[:, :-1]], axis=1)
        out = model.extend(params, fed_BxL, cache)
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


def lm_loss(model, params, batch: Batch, rng: Array = None,  # noqa: ARG001
            extras: Any = None) -> tuple[Array, dict[str, Array]]:  # noqa: ARG001
    """The language-modelling loss (pre-training and fine-tuning)."""
    logits, labels, weights, _ = teacher_forced(model, params, batch)
    return cross_entropy(logits, labels, weights)
