"""Prompts into batches for batched decoding.

A jitted decoding loop compiles once per (batch, width) shape, and every row
pays for the batch's widest prompt. Two ways to cut a prompt list:

* ``fixed_shape_batches``: the prompts' order; one shape for all (every
  batch padded to the longest prompt of the whole list: one compilation,
  most padding) or, with ``width_bucket``, each batch padded to its own
  longest prompt rounded up to it (at most the longest of the list);
* ``length_sorted_batches``: prompts sorted by length, each batch padded only
  to its own longest prompt rounded up to ``width_bucket`` (a few compiled
  shapes, little padding when lengths vary widely).

Both pad the last batch to ``batch_size`` rows with copies of its first
prompt; callers drop those rows' outputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from specdec_jax.models.interface import Prompt, make_prompt


def bucketed_width(length: int, width_bucket: int) -> int:
    """``length`` rounded up to a multiple of ``width_bucket``."""
    if width_bucket < 1:
        raise ValueError(f"width_bucket must be >= 1, got {width_bucket}.")
    return -(-length // width_bucket) * width_bucket


def _check(prompts: Sequence[Sequence[int]], batch_size: int) -> None:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token, and at least one prompt "
                         "is needed.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")


def fixed_shape_batches(prompts: Sequence[Sequence[int]], batch_size: int,
                        width_bucket: int | None = None
                        ) -> Iterator[tuple[int, Prompt, list[list[int]]]]:
    """Yields (start, Prompt, real rows) in the prompts' order, every batch of
    ``batch_size`` rows. Without ``width_bucket`` every batch is padded to the
    longest prompt (one shape: one compiled program); with it, each batch to
    its own longest prompt rounded up to a multiple of ``width_bucket``, never
    past the longest prompt (a shape per bucket: a short prompt does not pay
    for the longest one's prefill)."""
    _check(prompts, batch_size)
    longest = max(len(p) for p in prompts)
    if width_bucket is not None:
        bucketed_width(1, width_bucket)  # validates the bucket
    for start in range(0, len(prompts), batch_size):
        chunk = [list(p) for p in prompts[start:start + batch_size]]
        padded = chunk + [chunk[0]] * (batch_size - len(chunk))
        width = longest if width_bucket is None else min(
            longest, bucketed_width(max(len(p) for p in chunk), width_bucket))
        yield start, make_prompt(padded, pad_to=width), chunk


def length_sorted_batches(prompts: Sequence[Sequence[int]], batch_size: int,
                          width_bucket: int
                          ) -> Iterator[tuple[int, Prompt, list[list[int]], list[int]]]:
    """Yields (start, Prompt, real rows, their indices in ``prompts``), shortest
    prompts first."""
    _check(prompts, batch_size)
    bucketed_width(1, width_bucket)  # validates the bucket
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        chunk = [list(prompts[i]) for i in rows]
        padded = chunk + [chunk[0]] * (batch_size - len(chunk))
        width = bucketed_width(max(len(p) for p in chunk), width_bucket)
        yield start, make_prompt(padded, pad_to=width), chunk, rows
