"""Training data of a feature head (``drafting.feature``): token sequences and
the target's features along them, cached to disk.

For a sequence ``t_0 .. t_{n-1}`` one prefill of the target gives, at every
position ``s``, its last hidden state ``f_s`` (after the final norm: the
output head's input, what the head learns to predict) and its greedy next
token ``g_s = argmax_v (f_s . W_v)`` (full output head, float32), all in one
jitted call per batch of fixed shape ``[batch_size, width]``. ``g`` lets the
evaluation score drafts against the target's own choice on any text, and on
the target's greedy responses ``g_s = t_{s+1}`` (up to float ties).

Shards: ``shard-00000.npz`` with ``tokens`` int32 [n, W] (0-padded),
``lengths`` int32 [n], ``starts`` int32 [n] (first response position; 0 for
plain text), ``features`` float16 [n, W, D] (0 past a row's length) and
``greedy`` int32 [n, W]; plus ``manifest.json`` (the target's name and weight
fingerprint, the source's record, the settings, per-shard counts), written
atomically by ``runtime.shards``: a run killed at any point (``kill -9``)
resumes by skipping the shards the manifest lists; ``load_shards`` refuses
another target's data and an unfinished build.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints.feature_head_io import target_fingerprint
from specdec_jax.data import batching
from specdec_jax.models import feature_head
from specdec_jax.models.interface import Prompt
from specdec_jax.runtime import data_shards

MANIFEST = data_shards.MANIFEST
WHAT = "feature data"
WIDTH_BUCKET = 64  # a build's width rounds up to a multiple of this (one compiled shape)
ARRAYS = ("tokens", "lengths", "starts", "features", "greedy")


def target_record(target_name: str, target, target_params) -> dict:
    """Who the features belong to: the target's name and weight fingerprint."""
    return {"target": target_name,
            "target_fingerprint": target_fingerprint(target_params, target)}


def code_chunks(streams: Iterable[Sequence[int]], *, length: int, max_positions: int,
                max_chunks_per_stream: int = 0) -> list[list[int]]:
    """Consecutive ``length``-token chunks of each stream, in order, until
    ``max_positions`` tokens are taken (the last chunk is cut to fit). A
    stream's tail shorter than ``length`` is kept only if it holds at least
    ``length // 4`` tokens (short tails are mostly padding). At most
    ``max_chunks_per_stream`` chunks per stream (0: no limit), so that a few
    long files do not make up the whole set."""
    if length < 2 or max_positions < 1 or max_chunks_per_stream < 0:
        raise ValueError(f"code_chunks: length ({length}) must be >= 2, max_positions "
                         f"({max_positions}) >= 1, max_chunks_per_stream >= 0.")
    chunks: list[list[int]] = []
    taken = 0
    for stream in streams:
        ids = list(map(int, stream))
        pieces = [ids[i:i + length] for i in range(0, len(ids), length)]
        pieces = [p for p in pieces if len(p) >= max(2, length // 4)]
        for piece in pieces[:max_chunks_per_stream or None]:
            piece = piece[:max_positions - taken]
            if len(piece) >= 2:
                chunks.append(piece)
                taken += len(piece)
            if taken >= max_positions:
                return chunks
    return chunks


def make_feature_fn(target, rows_VxD_of):
    """``(target_params, tokens [B, W], lengths [B]) -> (features [B, W, D]
    float32, greedy [B, W] int32)``: one prefill with every position's hidden
    state, then the full output head's argmax at each position.
    ``rows_VxD_of(target_params)`` gives the output head's rows."""

    def fn(target_params, tokens_BxW, lengths_B):
        batch, width = tokens_BxW.shape
        out = target.prefill(target_params, Prompt(tokens=tokens_BxW, lengths=lengths_B),
                             target.init_cache(batch, width), all_hidden=True)
        hidden = out.hidden.astype(jnp.float32)
        scores = jnp.einsum("bwd,vd->bwv", hidden, rows_VxD_of(target_params).astype(
            jnp.float32))
        mask = (jnp.arange(width)[None, :] < lengths_B[:, None])
        return (jnp.where(mask[..., None], hidden, 0.0),
                jnp.where(mask, jnp.argmax(scores, -1), 0).astype(jnp.int32))

    return fn


def _rows_of(target):
    """The target's output-head rows [V, D] from its params (shared with the head)."""
    return lambda params: feature_head.shared_params(target, params)["head"]["rows"]


def build_shards(out_dir: str | os.PathLike, *, target, target_params, record: dict,
                 sequences: Sequence[Sequence[int]], starts: Sequence[int] | None = None,
                 source: dict, batch_size: int = 8, shard_sequences: int = 32,
                 width: int | None = None, progress: bool = True) -> dict:
    """Writes the shards of ``sequences`` (token ids; ``starts[i]``: where
    sequence ``i``'s response begins) for the target ``record`` names;
    resumes a build of the same target, source and settings. ``width``
    (default: the longest sequence rounded up to ``WIDTH_BUCKET``) is the one
    shape every batch is padded to. Returns the manifest."""
    if not sequences:
        raise ValueError("no sequences to extract features for.")
    if batch_size < 1 or shard_sequences < 1 or shard_sequences % batch_size:
        raise ValueError(f"shard_sequences ({shard_sequences}) must be a positive multiple of "
                         f"batch_size ({batch_size}).")
    starts = [0] * len(sequences) if starts is None else list(map(int, starts))
    if len(starts) != len(sequences):
        raise ValueError(f"{len(starts)} starts for {len(sequences)} sequences.")
    longest = max(len(s) for s in sequences)
    width = width or batching.bucketed_width(longest, WIDTH_BUCKET)
    if longest > width:
        raise ValueError(f"a sequence of {longest} tokens exceeds width {width}; pass a larger "
                         "width (or None).")
    settings = {"source": source, "batch_size": batch_size, "shard_sequences": shard_sequences,
                "width": width, "sequences": len(sequences),
                "positions": int(sum(len(s) for s in sequences))}
    manifest = data_shards.open_build(out_dir, identity=record, settings=settings, what=WHAT)
    fn = jax.jit(make_feature_fn(target, _rows_of(target)))

    def make_shard(first):
        rows = list(sequences[first:first + shard_sequences])
        n = len(rows)
        tokens = np.zeros((n, width), np.int32)
        lengths = np.array([len(r) for r in rows], np.int32)
        for i, r in enumerate(rows):
            tokens[i, :len(r)] = r
        features = np.zeros((n, width, target.config.hidden_size), np.float16)
        greedy = np.zeros((n, width), np.int32)
        for b in range(0, n, batch_size):
            real = min(batch_size, n - b)
            # Padding rows repeat row b (a fixed shape: one compilation), then are dropped.
            pick = np.r_[np.arange(b, b + real), np.full(batch_size - real, b)]
            f, g = jax.device_get(fn(target_params, jnp.asarray(tokens[pick]),
                                     jnp.asarray(lengths[pick])))
            features[b:b + real] = f[:real].astype(np.float16)
            greedy[b:b + real] = g[:real]
        arrays = {"tokens": tokens, "lengths": lengths,
                  "starts": np.asarray(starts[first:first + n], np.int32),
                  "features": features, "greedy": greedy}
        return arrays, {"sequences": n, "positions": int(lengths.sum())}

    return data_shards.write_missing_shards(out_dir, manifest, items=len(sequences),
                                            per_shard=shard_sequences, make_shard=make_shard,
                                            desc="feature data", progress=progress)


def load_shards(out_dir: str | os.PathLike, record: dict, shards: slice = slice(None)
                ) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, manifest) of the shards ``shards`` (a slice of the sorted
    names) of a finished build for the target ``record`` names; arrays as in
    the module docstring, concatenated over shards."""
    manifest = data_shards.load_manifest(
        out_dir, identity=record, what=WHAT,
        build_hint="build it with configs/runs/feature_head_data.gin")
    names = sorted(manifest["shards"])[shards]
    if not names:
        raise ValueError(f"no shards of {out_dir} selected by {shards}.")
    return data_shards.read_shards(out_dir, names, ARRAYS), manifest
