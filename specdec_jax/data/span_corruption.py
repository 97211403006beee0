"""T5's span-corruption pre-training objective (Raffel et al. 2020, §3.1.4).

A random 15% of a sequence's tokens, in spans of mean length 3, is dropped
from the input; each dropped span is replaced by one sentinel token, and the
target lists the spans, each after its sentinel::

    tokens   The  quick  brown  fox  jumps  over  the  lazy  dog
    noise     .     x      x     .     .     .     x    .     .
    inputs   The  <X0>   fox  jumps  over  <X1>  lazy  dog
    targets  <X0> quick brown <X1> the

Sentinels are the last ids of the vocabulary, counting down (T5's
``extra_ids``: ``<X0>`` = vocab_size - 1). Segmenting is as in T5's
``random_spans_noise_mask``: ``round(n * density)`` noise tokens split into
``round(noise / mean_span)`` spans, noise and non-noise each cut into that
many positive lengths uniformly at random, interleaved starting with
non-noise. Pure numpy: the corruption of example ``i`` at epoch ``e`` is a
function of its seed, so training data stays reproducible and resumable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NOISE_DENSITY = 0.15
MEAN_SPAN_LENGTH = 3.0


def _random_segmentation(rng: np.random.Generator, items: int, segments: int) -> np.ndarray:
    """``segments`` positive lengths summing to ``items``, uniformly at random."""
    cuts = np.sort(rng.choice(np.arange(1, items), size=segments - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [items]]))


def noise_mask(length: int, rng: np.random.Generator, *, noise_density: float = NOISE_DENSITY,
               mean_span_length: float = MEAN_SPAN_LENGTH) -> np.ndarray:
    """bool [length]: which tokens are noise (dropped from the input)."""
    if not 0.0 < noise_density < 1.0 or mean_span_length < 1.0:
        raise ValueError(f"noise_density must be in (0, 1) and mean_span_length >= 1 "
                         f"(got {noise_density}, {mean_span_length}).")
    if length < 2:
        raise ValueError(f"span corruption needs sequences of 2 or more tokens, got {length}.")
    noise = min(max(int(round(length * noise_density)), 1), length - 1)
    spans = max(min(int(round(noise / mean_span_length)), noise, length - noise), 1)
    noise_lengths = _random_segmentation(rng, noise, spans)
    keep_lengths = _random_segmentation(rng, length - noise, spans)
    mask = np.zeros(length, bool)
    position = 0
    for keep, drop in zip(keep_lengths, noise_lengths):
        position += keep
        mask[position:position + drop] = True
        position += drop
    return mask


def span_corrupt(tokens: Sequence[int], rng: np.random.Generator, *, vocab_size: int,
                 num_sentinels: int, noise_density: float = NOISE_DENSITY,
                 mean_span_length: float = MEAN_SPAN_LENGTH) -> tuple[list[int], list[int]]:
    """(inputs, targets) of one sequence; see the module docstring."""
    tokens = np.asarray(tokens)
    mask = noise_mask(len(tokens), rng, noise_density=noise_density,
                      mean_span_length=mean_span_length)
    starts = mask & ~np.concatenate([[False], mask[:-1]])
    if int(starts.sum()) > num_sentinels:
        raise ValueError(f"{int(starts.sum())} noise spans need more than the vocabulary's "
                         f"{num_sentinels} sentinels; shorten the sequences or add extra ids.")
    if np.any(tokens >= vocab_size - num_sentinels):
        raise ValueError("the sequence already contains sentinel ids (the last "
                         f"{num_sentinels} of {vocab_size}); encode text with the base "
                         "vocabulary only.")
    inputs, targets, span = [], [], -1
    for token, noisy, start in zip(tokens.tolist(), mask, starts):
        if start:
            span += 1
            sentinel = vocab_size - 1 - span
            inputs.append(sentinel)
            targets.append(sentinel)
        (targets if noisy else inputs).append(token)
    return inputs, targets


def uncorrupt(inputs: Sequence[int], targets: Sequence[int], *, vocab_size: int,
              num_sentinels: int) -> list[int]:
    """The original sequence back from a corrupted pair (the objective's inverse)."""
    first_sentinel = vocab_size - num_sentinels
    spans: dict[int, list[int]] = {}
    current = None
    for token in targets:
        if token >= first_sentinel:
            current = spans.setdefault(token, [])
        elif current is not None:
            current.append(token)
    out: list[int] = []
    for token in inputs:
        out += spans.get(token, []) if token >= first_sentinel else [token]
    return out
