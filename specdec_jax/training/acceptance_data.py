"""Training data of the acceptance head, built as in SpecDec++ (Huang et al.), §4.2.

For each prompt, a response ``X_1 .. X_N`` (the target's own sample, or
corpus text: the cheaper option); then, all in one jitted function per batch:

    q_i = q(. | prompt, X_<i),  p_i = p(. | prompt, X_<i)     (teacher-forced)
    Y_i ~ q_i,   label P_i = min(1, p_i(Y_i) / q_i(Y_i))       (acceptance prob.)
    Z_i = X_i with probability r = 0.15, else Y_i
    e_i = the drafter's final hidden state after (prompt, Z_<=i)  (one forward)

and the examples are ``(e_i, P_i)`` for the positions where ``Z_i = Y_i``.
Mixing in ``X`` keeps the contexts close to what the drafter sees while
decoding (mostly its own tokens, sometimes the target's).

Shards: ``shard-00000.npz`` (features float16 [n, D], labels float32 [n])
plus ``manifest.json`` (the pair's names and weight fingerprints, the prompt
set's record, the settings, per-shard counts), written atomically by
``runtime.shards``: a killed run resumes by skipping the shards it already
wrote; ``load_shards`` refuses another pair's data and an unfinished build.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.checkpoints.acceptance_head_io import drafter_fingerprint
from specdec_jax.data import batching
from specdec_jax.runtime import data_shards
from specdec_jax.training.forward import Batch, teacher_forced

MANIFEST = data_shards.MANIFEST
WHAT = "acceptance data"
ARRAYS = ("features", "labels")
MIX_RATE = 0.15  # SpecDec++: each position keeps the target's token X_i with probability r


def make_example_fn(target, drafter, *, temperature: float, mix_rate: float = MIX_RATE):
    """(target_params, drafter_params, Batch, key) -> (features [B, L, D],
    labels [B, L], keep [B, L]): position ``t`` describes the token at
    ``t + 1`` (decoder-only convention of ``training.forward``).

    Works in log space on the sampled token only: with a 152k vocabulary a
    batch's full probability tensors are gigabytes each, and the label needs
    just ``log p(Y) - log q(Y)`` (a gather minus a log-sum-exp)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for acceptance labels, got {temperature}; "
                         "the head is trained on sampled drafts.")
    inv_t = jnp.float32(1.0 / temperature)

    def log_prob_of(logits, tokens):
        scaled = logits.astype(jnp.float32) * inv_t
        picked = jnp.take_along_axis(scaled, tokens[..., None], axis=-1)[..., 0]
        return picked - jax.nn.logsumexp(scaled, axis=-1)

    def fn(target_params, drafter_params, batch: Batch, key):
        sample_key, mix_key = jax.random.split(key)
        q_logits, x_next, weights, _ = teacher_forced(drafter, drafter_params, batch)
        p_logits = teacher_forced(target, target_params, batch)[0]
        y_next = jax.random.categorical(
            sample_key, q_logits.astype(jnp.float32) * inv_t).astype(jnp.int32)
        log_ratio = log_prob_of(p_logits, y_next) - log_prob_of(q_logits, y_next)
        labels = jnp.exp(jnp.minimum(log_ratio, 0.0))  # min(1, p(Y) / q(Y))
        from_y = (jax.random.uniform(mix_key, x_next.shape) >= mix_rate) & (weights > 0)
        z_next = jnp.where(from_y, y_next, x_next)
        # Z in the sequence: position t + 1 holds z_next[t] wherever a response token sits.
        z_tokens = batch.targets.at[:, 1:].set(
            jnp.where(weights[:, :-1] > 0, z_next[:, :-1], batch.targets[:, 1:]))
        hidden = teacher_forced(drafter, drafter_params, batch.replace(targets=z_tokens))[3]
        # e for the token at t + 1 is the hidden state after feeding it: position t + 1.
        features = jnp.concatenate([hidden[:, 1:], hidden[:, :1]], axis=1)
        return features, labels, from_y

    return fn


WIDTH_BUCKET = 64  # batch widths round up to a multiple: few compiles, little padding


def _batches(sequences: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int,
             width: int | None = None):
    """Fixed-shape decoder-only Batches: prompt + response, weights on the
    response. Each batch is as wide as its longest row rounded up to
    ``WIDTH_BUCKET`` (or exactly ``width``)."""
    for start in range(0, len(sequences), batch_size):
        chunk = list(sequences[start:start + batch_size])
        rows = len(chunk)
        chunk += [chunk[0]] * (batch_size - rows)
        longest = max(len(p) + len(r) for p, r in chunk)
        batch_width = width or batching.bucketed_width(longest, WIDTH_BUCKET)
        tokens = np.zeros((batch_size, batch_width), np.int32)
        weights = np.zeros((batch_size, batch_width), np.float32)
        for b, (prompt, response) in enumerate(chunk):
            seq = list(prompt) + list(response)
            if len(seq) > batch_width:
                raise ValueError(f"prompt + response of {len(seq)} tokens exceed the batch "
                                 f"width {batch_width}; pass a larger width (or None).")
            tokens[b, :len(seq)] = seq
            weights[b, len(prompt):len(seq)] = 1.0 if b < rows else 0.0
        yield start, Batch(targets=jnp.asarray(tokens), weights=jnp.asarray(weights))


def pair_record(*, target_name: str, target_params: Any, drafter_name: str,
                drafter_params: Any, target: Any = None, drafter: Any = None) -> dict:
    """Names and weight fingerprints of a pair (the models, when given, tell
    their kernel layout)."""
    return {"target": target_name,
            "target_fingerprint": drafter_fingerprint(target_params, target),
            "drafter": drafter_name,
            "drafter_fingerprint": drafter_fingerprint(drafter_params, drafter)}


def build_shards(out_dir: str | pathlib.Path, *, target, target_params, drafter,
                 drafter_params, pair: dict, sequences: Sequence[tuple[Sequence[int],
                                                                    Sequence[int]]],
                 prompts_record: dict, source: str, temperature: float = 1.0,
                 mix_rate: float = MIX_RATE, batch_size: int = 8, shard_batches: int = 8,
                 seed: int = 0, progress: bool = True) -> dict:
    """Writes the shards of ``(prompt, response)`` token sequences (module
    docstring); resumes a run of the same pair and settings. Returns the manifest."""
    settings = {"source": source, "temperature": temperature, "mix_rate": mix_rate,
                "batch_size": batch_size, "shard_batches": shard_batches, "seed": seed,
                "sequences": len(sequences), "prompts": prompts_record}
    manifest = data_shards.open_build(out_dir, identity={"pair": pair}, settings=settings,
                                      what=WHAT)
    fn = jax.jit(make_example_fn(target, drafter, temperature=temperature, mix_rate=mix_rate))
    per_shard = batch_size * shard_batches
    # Within each shard, rows of similar length share a batch (less padding);
    # shards keep their prompts, so held-out shards stay unseen prompts.
    length = lambda pair: len(pair[0]) + len(pair[1])  # noqa: E731
    ordered = [seq for s in range(0, len(sequences), per_shard)
               for seq in sorted(sequences[s:s + per_shard], key=length)]
    batches = list(_batches(ordered, batch_size))

    def make_shard(first):
        features, labels = [], []
        for start, batch in batches:
            if not first <= start < first + per_shard:
                continue
            f, y, keep = jax.device_get(fn(target_params, drafter_params, batch,
                                           jax.random.fold_in(jax.random.PRNGKey(seed), start)))
            features.append(f[keep].astype(np.float16))
            labels.append(y[keep].astype(np.float32))
        return ({"features": np.concatenate(features), "labels": np.concatenate(labels)},
                {"examples": int(sum(len(y) for y in labels))})

    return data_shards.write_missing_shards(out_dir, manifest, items=len(sequences),
                                       per_shard=per_shard, make_shard=make_shard,
                                       desc="acceptance data", progress=progress)


def load_shards(out_dir: str | pathlib.Path, pair: dict) -> tuple[np.ndarray, np.ndarray, dict]:
    """(features [n, D] float32, labels [n], manifest) of a finished build, for ``pair``."""
    manifest = data_shards.load_manifest(out_dir, identity={"pair": pair}, what=WHAT,
                                    build_hint="build it with configs/runs/specdecpp_data.gin")
    arrays = data_shards.read_shards(out_dir, sorted(manifest["shards"]), ARRAYS)
    return arrays["features"].astype(np.float32), arrays["labels"], manifest
