"""Training data with a position that a checkpoint can store.

Batch ``k`` of a run is a pure function of ``(seed, k)``: the examples are
visited in a fresh permutation per epoch (drawn from ``seed`` and the epoch
number), and batch ``k`` holds stream positions ``k * B .. (k + 1) * B - 1``
of that endless stream. The data iterator's position is therefore just the
next batch index, saved with every checkpoint; a resumed run reads exactly
the batches the uninterrupted run would have read.

A ``MixtureDataset`` keeps that protocol over several datasets of their own
shapes (seqio's mixtures with rates, one source per batch): length buckets of
one task, so that short examples are not padded to the longest (``bucket_by_length``),
or a task beside an auxiliary corpus at a chosen rate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from specdec_jax.training.forward import Batch


def epoch_indices(n: int, index: int, batch_size: int,
                  seed: int | Sequence[int]) -> np.ndarray:
    """Indices (into ``n`` examples) of batch ``index``: stream positions
    ``index * B .. (index + 1) * B - 1``, each epoch in a fresh permutation
    drawn from ``(seed, epoch)``. Any dataset with this protocol trains on the
    core (token datasets here, feature datasets for the SpecDec++ head).
    ``seed`` may be a tuple (a mixture's component ``c`` draws with ``(seed, c)``)."""
    seeds = [int(s) for s in np.atleast_1d(seed)]
    positions = np.arange(index * batch_size, (index + 1) * batch_size)
    epochs, offsets = np.divmod(positions, n)
    out = np.empty(batch_size, np.int64)
    for epoch in np.unique(epochs):
        order = np.random.default_rng([*seeds, int(epoch)]).permutation(n)
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

    def mean_tokens(self) -> float:
        """Target tokens (weights) per example."""
        return float(self.weights.sum() / len(self))

    def trim(self, *, input_width: int | None = None, target_width: int | None = None
             ) -> ArrayDataset:
        """The same examples with rows cut to narrower widths; cutting anything
        but padding is an error."""
        targets, weights, inputs = self.targets, self.weights, self.inputs
        if target_width is not None:
            if np.any(targets[:, target_width:]) or np.any(weights[:, target_width:]):
                raise ValueError(f"a target row has tokens beyond width {target_width}.")
            targets, weights = targets[:, :target_width], weights[:, :target_width]
        if input_width is not None and inputs is not None:
            if np.any(self.input_lengths > input_width) or np.any(inputs[:, input_width:]):
                raise ValueError(f"an input row has tokens beyond width {input_width}.")
            inputs = inputs[:, :input_width]
        return ArrayDataset(targets=targets, weights=weights, inputs=inputs,
                            input_lengths=self.input_lengths)

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


# Component draws come in blocks of this many batches, each block from its own
# generator, so a batch's component and its index within the component are
# found without replaying the whole run.
MIXTURE_BLOCK = 1024


@dataclasses.dataclass(frozen=True, eq=False)
class MixtureDataset:
    """Batches drawn from ``components`` at ``rates``, a whole batch from one.

    Batch ``k`` takes component ``c`` with probability ``rates[c]`` (drawn from
    ``(seed, k // MIXTURE_BLOCK)``) and is that component's batch ``j``, where
    ``j`` counts the earlier batches that took ``c``; the component orders its
    examples as an ``ArrayDataset`` does, with the seed ``(seed, c)``. So batch
    ``k`` is still a pure function of ``(seed, k)`` and resume loses nothing.
    Components may differ in shape (each shape compiles the step once).
    """

    components: tuple[ArrayDataset, ...]
    rates: tuple[float, ...]
    names: tuple[str, ...] = ()  # what each component is, for reports

    def __post_init__(self):
        if not self.components or len(self.components) != len(self.rates):
            raise ValueError(f"a mixture needs one rate per component; got "
                             f"{len(self.components)} components and {len(self.rates)} rates.")
        if any(not (r > 0) for r in self.rates):
            raise ValueError(f"mixture rates must be positive, got {list(self.rates)}; drop a "
                             "component instead of giving it rate 0.")
        if self.names and len(self.names) != len(self.components):
            raise ValueError(f"{len(self.names)} names for {len(self.components)} components.")
        kinds = {c.inputs is None for c in self.components}
        if len(kinds) > 1:
            raise ValueError("a mixture cannot mix decoder-only and encoder-decoder datasets.")
        object.__setattr__(self, "_counts", {})  # block -> component counts before it

    @property
    def probabilities(self) -> np.ndarray:
        rates = np.asarray(self.rates, np.float64)
        return rates / rates.sum()

    def __len__(self) -> int:
        return sum(len(c) for c in self.components)

    def mean_tokens(self) -> float:
        """Expected target tokens (weights) per example of a batch."""
        return float(sum(p * c.mean_tokens()
                         for p, c in zip(self.probabilities, self.components)))

    def _block_choices(self, block: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng([seed, 0x6D6978, block])  # "mix": apart from epoch streams
        return rng.choice(len(self.components), size=MIXTURE_BLOCK, p=self.probabilities)

    def _counts_before(self, block: int, seed: int) -> np.ndarray:
        """How many batches of blocks ``0 .. block - 1`` took each component."""
        counts = self._counts
        known = max((b for (b, s) in counts if s == seed and b <= block), default=0)
        total = counts.get((known, seed), np.zeros(len(self.components), np.int64))
        for b in range(known, block):
            total = total + np.bincount(self._block_choices(b, seed),
                                        minlength=len(self.components))
            counts[(b + 1, seed)] = total
        return total

    def locate(self, index: int, seed: int) -> tuple[int, int]:
        """(component, that component's batch index) of batch ``index``."""
        block, offset = divmod(index, MIXTURE_BLOCK)
        choices = self._block_choices(block, seed)
        component = int(choices[offset])
        earlier = int(self._counts_before(block, seed)[component])
        return component, earlier + int(np.sum(choices[:offset] == component))

    def batch(self, index: int, batch_size: int, seed: int) -> Batch:
        component, local = self.locate(index, seed)
        data = self.components[component]
        return data.subset(epoch_indices(len(data), local, batch_size,
                                         (seed, component))).as_batch()


def bucket_by_length(data: ArrayDataset, widths: Sequence[tuple[int, int]], *,
                     name: str = "") -> MixtureDataset:
    """``data`` split into length buckets: each example goes to the first
    ``(input_width, target_width)`` that holds it (``input_width`` is ignored
    for decoder-only data) and is cut to that bucket's widths; rates are the
    buckets' sizes, so an epoch still visits every example about once while a
    batch of short examples pays for short rows."""
    if not widths:
        raise ValueError("bucket_by_length needs at least one (input_width, target_width).")
    widths = sorted((int(i), int(t)) for i, t in widths)
    target_lengths = (data.weights > 0).sum(axis=1)
    # A target's length is where its weights end (lm rows may have leading prompt zeros).
    target_ends = np.where(target_lengths > 0,
                           data.weights.shape[1] - np.argmax(data.weights[:, ::-1] > 0, axis=1),
                           0)
    input_lengths = (np.zeros(len(data), np.int64) if data.input_lengths is None
                     else data.input_lengths)
    taken = np.zeros(len(data), bool)
    components, names = [], []
    for input_width, target_width in widths:
        fits = ~taken & (target_ends <= target_width)
        if data.inputs is not None:
            fits &= input_lengths <= input_width
        taken |= fits
        if fits.any():
            components.append(data.subset(np.flatnonzero(fits)).trim(
                input_width=input_width if data.inputs is not None else None,
                target_width=target_width))
            names.append(f"{name or 'data'}[{input_width}x{target_width}]")
    if not taken.all():
        raise ValueError(f"{int((~taken).sum())} examples fit none of the buckets {widths}; "
                         "add a bucket as wide as the dataset's rows.")
    return MixtureDataset(components=tuple(components),
                          rates=tuple(float(len(c)) for c in components), names=tuple(names))


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
