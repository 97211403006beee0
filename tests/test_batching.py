"""Prompt batches: length-sorted, bucketed widths, padding rows, clear errors."""

import numpy as np
import pytest

from specdec_jax.data import batching


def test_length_sorted_batches_pad_each_batch_to_its_own_bucket():
    prompts = [[1] * n for n in (5, 130, 3, 70, 129, 1, 64)]
    batches = list(batching.length_sorted_batches(prompts, 3, 64))
    assert [rows for *_, rows in batches] == [[5, 2, 0], [6, 3, 4], [1]]
    assert [prompt.tokens.shape for _, prompt, *_ in batches] == [(3, 64), (3, 192), (3, 192)]
    # Every prompt comes back exactly once; the last batch is padded with copies.
    assert sorted(i for *_, rows in batches for i in rows) == list(range(len(prompts)))
    last = batches[-1][1]
    np.testing.assert_array_equal(np.asarray(last.lengths), [130, 130, 130])


def test_fixed_shape_batches_share_one_shape():
    prompts = [[1] * n for n in (5, 9, 2)]
    shapes = {prompt.tokens.shape for _, prompt, _ in batching.fixed_shape_batches(prompts, 2)}
    assert shapes == {(2, 9)}


def test_fixed_shape_batches_pad_to_their_bucket_never_past_the_longest():
    """In the prompts' order, each batch to its longest prompt rounded up to
    the bucket, at most the longest prompt of all: 5 -> 8, 9 -> 9 (not 16),
    2 -> 8; a bucket of 1 is each batch's own longest; the real rows kept."""
    prompts = [[1] * n for n in (5, 9, 2)]
    batches = list(batching.fixed_shape_batches(prompts, 1, width_bucket=8))
    assert [p.tokens.shape for _, p, _ in batches] == [(1, 8), (1, 9), (1, 8)]
    assert [rows for *_, rows in batches] == [[p] for p in prompts]
    np.testing.assert_array_equal(np.asarray(batches[1][1].lengths), [9])
    shapes = [p.tokens.shape for _, p, _ in batching.fixed_shape_batches(prompts, 2, 1)]
    assert shapes == [(2, 9), (2, 2)]
    with pytest.raises(ValueError, match="width_bucket must be >= 1"):
        list(batching.fixed_shape_batches(prompts, 2, width_bucket=0))


@pytest.mark.parametrize("prompts, batch_size, bucket, match", [
    ([], 2, 8, "at least one prompt"), ([[1], []], 2, 8, "at least one token"),
    ([[1]], 0, 8, "batch_size must be >= 1"), ([[1]], 2, 0, "width_bucket must be >= 1")])
def test_bad_batches_say_what_is_wrong(prompts, batch_size, bucket, match):
    with pytest.raises(ValueError, match=match):
        list(batching.length_sorted_batches(prompts, batch_size, bucket))
