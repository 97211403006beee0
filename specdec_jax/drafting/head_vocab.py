"""A drafter whose output head scores only the most frequent tokens (FR-Spec).

Zhao et al. (2025, "FR-Spec: Accelerating Large-Vocabulary Language Models via
Frequency-Ranked Speculative Sampling") observe that a small drafter with a
large vocabulary spends much of its step in the output head, and restrict the
head to the tokens a corpus uses most. Qwen2.5-Coder-0.5B ties a 151,936-row
embedding: 136 M of its 494 M parameters, read by every drafting step; the
Python standard library uses about a third of those rows at all.

Exactness does not depend on the subset: the restricted drafter is another
drafter (its law is the full model's renormalised over the subset, zero
elsewhere), and every verifier checks drafts against the law they were drawn
from (``models.decoder.with_head_vocab``). What the subset costs is
acceptance: the target's mass on tokens outside it can only come from the
residual. ``coverage`` reports the corpus share the subset keeps.

The ranking comes from corpus token counts; the shipped ones are stored with
the Max-Gram bigram table (``data.bigram.load_unigram``, and
``data.bigram.restrict_head`` cuts a head by them: the CPython standard library for the
Qwen2.5-Coder vocabulary): most frequent first, ties and unseen tokens by id
(Qwen's byte-level BPE numbers its merges in order, frequent ones first); the
tokenizer's end-of-sequence ids are always kept, so a drafter can still end a
sequence.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdec_jax.models.decoder_only import DecoderOnlyLM, with_head_vocab


def check_size(size: int, label: str) -> None:
    """Fails early (before any weights load) on a negative head size;
    ``label`` names the setting as the caller spells it."""
    if size < 0:
        raise ValueError(f"{label}: pass a token count, or 0 for the drafter's full head.")


def ranked_token_ids(counts_V: np.ndarray, always: Sequence[int] = ()) -> np.ndarray:
    """Every token id, ``always`` first, then by count (descending) and id."""
    vocab = counts_V.shape[0]
    order = np.lexsort((np.arange(vocab), -counts_V))
    pinned = np.asarray(list(dict.fromkeys(int(i) for i in always)), np.int64)
    if pinned.size and (pinned.min() < 0 or pinned.max() >= vocab):
        raise ValueError(f"head vocabulary: an always-kept id lies outside [0, {vocab}).")
    return np.concatenate([pinned, order[~np.isin(order, pinned)]]).astype(np.int32)


def head_token_ids(counts_V: np.ndarray, size: int, always: Sequence[int] = ()) -> np.ndarray:
    """The ``size`` top-ranked ids (``ranked_token_ids``), sorted by id."""
    vocab = counts_V.shape[0]
    if not 0 < size <= vocab:
        raise ValueError(f"head vocabulary size {size}: choose 1 .. {vocab} (the vocabulary), "
                         "or 0 for the full head.")
    if size < len(set(always)):
        raise ValueError(f"head vocabulary size {size} cannot hold the {len(set(always))} "
                         "end-of-sequence ids it must keep; choose a larger size.")
    return np.sort(ranked_token_ids(counts_V, always)[:size])


def coverage(counts_V: np.ndarray, token_ids: np.ndarray) -> float:
    """Share of the corpus's tokens that ``token_ids`` covers."""
    return float(counts_V[token_ids].sum() / max(counts_V.sum(), 1))


def check_decoder(model) -> None:
    """A restricted output head needs a decoder-only model."""
    if not isinstance(model, DecoderOnlyLM):
        raise ValueError(f"a restricted output head needs a decoder-only drafter, not "
                         f"{type(model).__name__}; pass a head vocabulary of 0.")


def restrict(model, params, size: int, *, counts_V: np.ndarray, eos_ids: Sequence[int] = ()):
    """``(model, params)`` with the output head cut to the ``size`` tokens that
    ``counts_V`` (corpus counts per token id) ranks first (``size`` 0: unchanged).
    Decoder-only models only (``models.decoder.with_head_vocab``)."""
    if not size:
        return model, params
    check_decoder(model)
    return with_head_vocab(model, params, head_token_ids(counts_V, size, eos_ids))
