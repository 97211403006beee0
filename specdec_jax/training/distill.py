"""Drafter distillation: train a small model to match a target's next-token
distributions, and measure what that buys speculative decoding.

Why total variation: with token-level verification at temperature 1 a draft
token drawn from ``q`` is accepted with probability ``sum_x min(p(x), q(x)) =
1 - TV(p, q)`` (docs/algorithms.md, 'Token verification'), so the expected acceptance rate is one
minus the mean TVD; minimising TVD is minimising rejections directly.
Forward KL ``KL(p || q)`` is the usual smooth alternative (it upper-bounds
``2 TV^2`` by Pinsker). Both are computed position by position on
teacher-forced sequences (corpus text or the target's own continuations),
with the target's logits computed on the fly, inside the same jitted step::

    loss = make_distillation_loss(target, divergence="tvd")
    training.train(model=drafter, params=..., loss_fn=loss,
                   loss_extras=target_params, ...)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from specdec_jax import api
from specdec_jax.data import batching
from specdec_jax.data.metrics import ratio_ci
from specdec_jax.runtime.progress import tqdm
from specdec_jax.runtime.resume import ResumeLog
from specdec_jax.training.forward import Batch, cross_entropy, teacher_forced

DIVERGENCES = ("tvd", "forward_kl")


def divergence(teacher_logits: Array, student_logits: Array, kind: str,
               temperature: float = 1.0) -> Array:
    """Per-position divergence [...] between softmax(teacher / T) = p and
    softmax(student / T) = q: ``tvd`` = 1/2 sum |p - q|, ``forward_kl`` =
    sum p (log p - log q)."""
    if kind not in DIVERGENCES:
        raise ValueError(f"unknown divergence {kind!r}; choose one of {', '.join(DIVERGENCES)}.")
    log_p = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    p = jnp.exp(log_p)
    if kind == "tvd":
        return 0.5 * jnp.abs(p - jnp.exp(log_q)).sum(-1)
    # p log p is 0 where p underflows to 0 (log_p = -inf there would give nan)
    return jnp.where(p > 0, p * (log_p - log_q), 0.0).sum(-1)


def make_distillation_loss(teacher, *, kind: str = "tvd", temperature: float = 1.0):
    """A ``LossFn`` whose ``extras`` are the teacher's parameters.

    Sums: ``loss_sum`` (the divergence), ``tvd_sum`` (always, the quantity
    acceptance depends on), ``nll_sum`` (the student's cross-entropy on the
    sequence), ``correct`` (student argmax = teacher argmax: greedy
    acceptance) and ``weight_sum``.
    """
    if kind not in DIVERGENCES:
        raise ValueError(f"unknown divergence {kind!r}; choose one of {', '.join(DIVERGENCES)}.")
    if temperature <= 0:
        raise ValueError(f"distillation temperature must be > 0, got {temperature}.")

    def loss_fn(model, params, batch: Batch, rng: Array, teacher_params: Any):  # noqa: ARG001
        if teacher_params is None:
            raise ValueError("the distillation loss needs the teacher's parameters: pass "
                             "loss_extras=teacher_params to training.train.")
        if teacher.vocab_size != model.vocab_size:
            raise ValueError(f"teacher ({teacher.vocab_size} tokens) and student "
                             f"({model.vocab_size}) must share a vocabulary.")
        teacher_logits = jax.lax.stop_gradient(teacher_forced(teacher, teacher_params,
                                                              batch)[0])
        logits, labels, weights, _ = teacher_forced(model, params, batch)
        per_position = divergence(teacher_logits, logits, kind, temperature)
        tvd = per_position if kind == "tvd" else divergence(teacher_logits, logits, "tvd")
        weight_sum = weights.sum()
        loss_sum = (per_position * weights).sum()
        _, ce = cross_entropy(logits, labels, weights)
        agree = (logits.argmax(-1) == teacher_logits.argmax(-1)) * weights
        return loss_sum / jnp.maximum(weight_sum, 1.0), {
            "loss_sum": loss_sum, "weight_sum": weight_sum, "nll_sum": ce["nll_sum"],
            "tvd_sum": (tvd * weights).sum(), "correct": agree.sum()}

    return loss_fn


def teacher_continuations(*, teacher, teacher_params, prompts: Sequence[Sequence[int]],
                          max_new_tokens: int, temperature: float = 1.0, seed: int = 0,
                          eos_ids: Sequence[int] = (), batch_size: int = 32,
                          progress: bool = True, drafter=None, drafter_params=None,
                          gamma: int = 4, width_bucket: int | None = None,
                          cache_path=None, cache_key: str = "") -> list[list[int]]:
    """The teacher's own samples after each prompt (decoder-only: prompt +
    continuation), the contexts a drafter meets during speculative decoding.

    With a ``drafter``, the samples come from speculative decoding, whose
    output law is the teacher's exactly (the engine's proven guarantee), at a
    fraction of the teacher's calls; on a CPU with a wide batch, plain
    autoregressive sampling is cheaper (verification there is compute-bound).
    ``width_bucket``: sort prompts by length and pad each batch only to its
    longest (rounded up to a multiple), instead of every batch to the longest
    of all. ``cache_path``: a JSON-lines file of finished batches; a rerun
    with the same settings (``cache_key`` names the models) resumes from it."""


    speculative = ({"method": "specdecode", "drafter": drafter, "drafter_params": drafter_params,
                    "gamma": gamma} if drafter is not None else {"method": "autoregressive"})
    if width_bucket is not None and width_bucket < 1:
        raise ValueError(f"width_bucket must be >= 1 or None, got {width_bucket}.")
    batches = (batching.length_sorted_batches(prompts, batch_size, width_bucket) if width_bucket
               else ((start, prompt, chunk, range(start, start + len(chunk)))
                     for start, prompt, chunk in batching.fixed_shape_batches(prompts, batch_size)))
    cache = None
    if cache_path is not None:
        digest = hashlib.sha256(repr([list(map(int, p)) for p in prompts]).encode()).hexdigest()
        cache = ResumeLog(cache_path, {
            "models": cache_key, "prompts_sha256": digest, "max_new_tokens": max_new_tokens,
            "temperature": temperature, "seed": seed, "eos_ids": list(map(int, eos_ids)),
            "batch_size": batch_size, "width_bucket": width_bucket,
            "method": speculative["method"], "gamma": gamma if drafter is not None else None})
    sequences: list = [None] * len(prompts)
    for start, prompt, chunk, rows in tqdm(batches, desc="teacher samples",
                                           total=-(-len(prompts) // batch_size), unit="batch",
                                           disable=not progress):
        if cache is not None and start in cache.done:
            batch_sequences = cache.done[start]
        else:
            out = api.generate(target=teacher, target_params=teacher_params, prompts=prompt,
                               temperature=temperature, max_new_tokens=max_new_tokens,
                               eos_ids=eos_ids, seed=seed + start, **speculative)
            tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
            batch_sequences = [row + tokens[i, :lengths[i]].tolist()
                               for i, row in enumerate(chunk)]
            if cache is not None:
                cache.add(start, batch_sequences)
        for row, sequence in zip(rows, batch_sequences):
            sequences[row] = sequence
    return sequences


def block_efficiency(*, target, target_params, drafter, drafter_params,
                     prompts: Sequence[Sequence[int]], gamma: int = 5,
                     temperature: float = 1.0, max_new_tokens: int = 32, seed: int = 0,
                     eos_ids: Sequence[int] = (), batch_size: int = 8) -> dict:
    """Speculative decoding's block efficiency (tokens emitted per target call)
    and acceptance rate (accepted drafts / proposed drafts) on ``prompts``, with
    95% bootstrap intervals over prompts (``data.metrics.bootstrap_ci``)."""
    rows = []
    for start, prompt, chunk in batching.fixed_shape_batches(prompts, batch_size):
        out = api.generate(target=target, target_params=target_params, drafter=drafter,
                           drafter_params=drafter_params, prompts=prompt, method="specdecode",
                           gamma=gamma, temperature=temperature,
                           max_new_tokens=max_new_tokens, eos_ids=eos_ids, seed=seed + start)
        stats = jax.device_get(out.stats)
        rows += [{"emitted": int(e), "calls": int(c), "accepted": int(a), "proposed": int(p)}
                 for e, c, a, p in zip(stats.emitted, stats.target_calls, stats.accepted(),
                                       stats.drafted)][:len(chunk)]
    efficiency = ratio_ci(rows, "emitted", "calls")
    acceptance = ratio_ci(rows, "accepted", "proposed")
    return {"block_efficiency": efficiency[0], "block_efficiency_ci": efficiency[1:],
            "acceptance_rate": acceptance[0], "acceptance_rate_ci": acceptance[1:],
            "prompts": len(rows), "gamma": gamma, "temperature": temperature}
