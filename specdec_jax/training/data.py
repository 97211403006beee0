"""Training data with a position that a checkpoint can store.

Batch ``k`` of a run is a pure function of ``(seed, k)``: the examples are
visited in a fresh permutation per epoch (drawn from ``seed`` and the epoch
number), and batch ``k`` holds stream positions ``k * B .. (k + 1) * B - 1``
of that endless stream. The data iterator's position is therefore just the
next batch index, saved with every checkpoint; a resumed run reads exactly
the batches the uninterrupted run would have read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from specdec_jax.training.forward import Batch


def epoch_indices(n: int, index: int, batch_size: int, seed: int) -> np.ndarray:
    """Indices (into ``n`` examples) of batch ``index``: stream positions
    ``index * B .. (index + 1) * B - 1``, each epoch in a fresh permutation
    drawn from ``(seed, epoch)``. Any dataset with this protocol trains on the
    core (token datasets here, feature datasets for the SpecDec++ head)."""
    positions = np.arange(index * batch_size, (index + 1) * batch_size)
    epochs, offsets = np.divmod(positions, n)
    out = np.empty(batch_size, np.int64)
    for epoch in np.unique(epochs):
        order = np.random.default_rng([seed, int(epoch)]).permutation(n)
        out[epochs == epoch] = order[offsets[epochs == epoch]]
    return out


def padded_chunks(n: int, batch_size: int):
    """Yields (rows [batch_size], real): ``n`` examples in order, ``batch_size``
    at a time, the last chunk padded with copies of example 0 that only its
    first ``real`` rows are not (callers give those zero weight)."""
    for start in range(0, n, batch_size):
        rows = np.arange(start, min(start + batch_size, n))
        yield np.concatenate([rows, np.zeros(batch_size - len(rows), np.int64)]), len(rows)


@dataclasses.dataclass(frozen=True, eq=False)
class ArrayDataset:
    """Tokenised examples as right-padded arrays (row ``i`` is example ``i``)."""

    targets: np.ndarray  # int32 [N, L]
    weights: np.ndarray  # float32 [N, L]
    inputs: np.ndarray | None = None  # int32 [N, P] (encoder-decoder only)
    input_lengths: np.ndarray | None = None  # int32 [N]

    def __post_init__(self):
        n = len(self.targets)
        if n == 0:
            raise ValueError("the dataset is empty; check the task split and filters.")
        if self.weights.shape != self.targets.shape:
            raise ValueError(f"weights {self.weights.shape} and targets "
                             f"{self.targets.shape} must have the same shape.")
        if (self.inputs is None) != (self.input_lengths is None) or (
                self.inputs is not None and (len(self.inputs) != n
                                             or len(self.input_lengths) != n)):
            raise ValueError("inputs and input_lengths come together, one row per example.")

    def __len__(self) -> int:
        return len(self.targets)

    def indices(self, index: int, batch_size: int, seed: int) -> np.ndarray:
        """Example indices of batch ``index`` (see the module docstring)."""
        return epoch_indices(len(self), index, batch_size, seed)

    def subset(self, rows) -> ArrayDataset:
        """The examples at ``rows`` (an index array or a slice), in that order."""
        pick = lambda a: None if a is None else a[rows]  # noqa: E731
        return ArrayDataset(targets=self.targets[rows], weights=self.weights[rows],
                            inputs=pick(self.inputs), input_lengths=pick(self.input_lengths))

    def as_batch(self) -> Batch:
        return Batch(targets=self.targets, weights=self.weights, inputs=self.inputs,
                     input_lengths=self.input_lengths)

    def batch(self, index: int, batch_size: int, seed: int) -> Batch:
        return self.subset(self.indices(index, batch_size, seed)).as_batch()

    def batches(self, batch_size: int) -> list[Batch]:
        """The whole dataset in order (for evaluation); the last batch is padded
        with zero-weight copies of the first example so every batch has one shape."""
        out = []
        for rows, real in padded_chunks(len(self), batch_size):
            padded = self.subset(rows).as_batch()
            weights = padded.weights.copy()
            weights[real:] = 0.0
            out.append(padded.replace(weights=weights))
        return out


def pad_rows(rows: Sequence[Sequence[int]], width: int, what: str) -> tuple[np.ndarray,
                                                                             np.ndarray]:
    """Right-pads token rows to ``width`` (zeros); returns tokens and lengths.
    A row longer than ``width`` is an error, never cut."""
    longest = max((len(r) for r in rows), default=0)
    if longest > width:
        raise ValueError(f"a {what} row has {longest} tokens but the width is {width}; raise "
                         "the length setting or filter long examples explicitly.")
    tokens = np.zeros((len(rows), width), np.int32)
    lengths = np.zeros(len(rows), np.int32)
    for i, row in enumerate(rows):
        tokens[i, :len(row)] = row
        lengths[i] = len(row)
    return tokens, lengths


def lm_dataset(sequences: Sequence[Sequence[int]], *, length: int,
               prompt_lengths: Sequence[int] | None = None) -> ArrayDataset:
    """A decoder-only dataset: each sequence is a row; the loss covers every
    token after the row's prompt (``prompt_lengths``, default 0)."""
    targets, lengths = pad_rows(sequences, length, "sequence")
    positions = np.arange(length)[None, :]
    start = np.zeros(len(sequences), np.int32) if prompt_lengths is None \
        else np.asarray(prompt_lengths, np.int32)
    weights = ((positions >= start[:, None]) & (positions < lengths[:, None]))
    return ArrayDataset(targets=targets, weights=weights.astype(np.float32))


def seq2seq_dataset(inputs: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], *,
                    input_length: int, target_length: int) -> ArrayDataset:
    """An encoder-decoder dataset: (input, target) token pairs."""
    if len(inputs) != len(targets):
        raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets.")
    input_tokens, input_lengths = pad_rows(inputs, input_length, "input")
    target_tokens, target_lengths = pad_rows(targets, target_length, "target")
    weights = np.arange(target_length)[None, :] < target_lengths[:, None]
    return ArrayDataset(targets=target_tokens, weights=weights.astype(np.float32),
                        inputs=input_tokens, input_lengths=input_lengths)
