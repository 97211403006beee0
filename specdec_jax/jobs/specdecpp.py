"""The SpecDec++ jobs the gin launcher runs (``configs/runs/specdecpp_*.gin``):
build the acceptance head's training data for a drafter/target pair, then
train a head on it.

    python -m train.main --gin_file=configs/runs/specdecpp_data.gin
    python -m train.main --gin_file=configs/runs/specdecpp_train.gin --gin.W_REJ=6.0
"""

from __future__ import annotations

import json
import pathlib

from specdec_jax.data import humaneval
from specdec_jax.data.stdlib_prompts import stdlib_prompts
from specdec_jax.jobs import resolver
from specdec_jax.training import distill
from specdec_jax.training.specdecpp import data as data_lib
from specdec_jax.training.specdecpp.train import train_head

SOURCES = ("target", "corpus")
TEACHER_SAMPLES = "teacher_samples.jsonl"  # the target's responses, kept for resuming


def run_specdecpp_data(*, target: str, drafter: str, out_dir: str, num_prompts: int = 500,
                       source: str = "target", max_new_tokens: int = 128,
                       temperature: float = 1.0, batch_size: int = 8, shard_batches: int = 8,
                       teacher_batch_size: int = 32, speculative_teacher: bool = False,
                       seed: int = 0, dtype: str = "auto", progress: bool = True) -> dict:
    """Data for the head of ``drafter`` under ``target`` (models as in the
    evaluation jobs) on ``num_prompts`` standard-library prompts (disjoint
    from HumanEval). ``source="target"``: X is the target's own sample at
    ``temperature`` (up to ``max_new_tokens``), as SpecDec++ does, sampled in
    length-sorted batches of ``teacher_batch_size`` and kept in
    ``out_dir/teacher_samples.jsonl`` (a rerun resumes there). Plain
    autoregressive sampling by default: at a wide batch on a CPU it is cheaper
    than speculative sampling, whose verification is compute-bound there
    (``speculative_teacher=True`` draws the same law with the pair, the better
    choice at small batches on an accelerator);
    ``source="corpus"``: X is the function's real body from the standard
    library, its first ``max_new_tokens`` tokens (the documented, cheaper
    option: no target generation). Writes shards and a manifest to ``out_dir``."""
    if source not in SOURCES:
        raise ValueError(f"unknown data source {source!r}; choose one of {', '.join(SOURCES)}.")
    if num_prompts < 1 or max_new_tokens < 1:
        raise ValueError("num_prompts and max_new_tokens must be >= 1.")
    entry_points = [p["entry_point"] for p in humaneval.load_problems()]
    chosen, record = stdlib_prompts(num_prompts, seed=seed, exclude_names=entry_points)
    pair = resolver.load_pair(target=target, drafter=drafter, dtype=dtype)
    prompts = [pair.encode(prompt) for _, prompt, _ in chosen]
    identity = data_lib.pair_record(target_name=target, target_params=pair.target_params,
                                    drafter_name=drafter, drafter_params=pair.drafter_params,
                                    target=pair.target, drafter=pair.drafter)
    if source == "target":
        speculative = ({"drafter": pair.drafter, "drafter_params": pair.drafter_params}
                       if speculative_teacher else {})
        full = distill.teacher_continuations(
            teacher=pair.target, teacher_params=pair.target_params, prompts=prompts,
            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
            eos_ids=pair.eos_ids, batch_size=teacher_batch_size, progress=progress,
            width_bucket=data_lib.WIDTH_BUCKET, **speculative,
            cache_path=pathlib.Path(out_dir) / TEACHER_SAMPLES,
            cache_key=json.dumps(identity, sort_keys=True))
        responses = [seq[len(p):] for seq, p in zip(full, prompts)]
    else:
        responses = [pair.encode(prompt + body)[len(p):][:max_new_tokens]
                     for (_, prompt, body), p in zip(chosen, prompts)]
    sequences = [(p, r) for p, r in zip(prompts, responses) if r]
    record = {**record, "with_response": len(sequences), "max_new_tokens": max_new_tokens}
    if source == "target":
        record["teacher"] = {"batch_size": teacher_batch_size, "speculative": speculative_teacher}
    return data_lib.build_shards(
        out_dir, target=pair.target, target_params=pair.target_params, drafter=pair.drafter,
        drafter_params=pair.drafter_params, pair=identity, sequences=sequences,
        prompts_record=record, source=source, temperature=temperature,
        batch_size=batch_size, shard_batches=shard_batches, seed=seed, progress=progress)


def run_specdecpp_train(*, data_dir: str, workdir: str, depth: int = 3, w_rej: float = 6.0,
                        w_acc: float = 1.0, learning_rate: float = 5e-5, epochs: float = 3.0,
                        batch_size: int = 32, held_out_shards: int = 1, seed: int = 0,
                        progress: bool = True) -> dict:
    """Trains a head on ``data_dir`` (for the pair its manifest names) into
    ``workdir/head``; writes ``workdir/summary.json`` with the binary KL fit."""
    manifest_path = pathlib.Path(data_dir) / data_lib.MANIFEST
    if not manifest_path.exists():
        raise FileNotFoundError(f"{data_dir} holds no acceptance data; run "
                                "configs/runs/specdecpp_data.gin first.")
    pair = json.loads(manifest_path.read_text())["pair"]
    summary = train_head(workdir=workdir, data_dir=data_dir, pair=pair, depth=depth,
                         w_acc=w_acc, w_rej=w_rej, learning_rate=learning_rate, epochs=epochs,
                         batch_size=batch_size, held_out_shards=held_out_shards, seed=seed,
                         progress=progress)
    pathlib.Path(workdir, "summary.json").write_text(json.dumps(summary, indent=1))
    fit, constant = summary["binary_kl"], summary["constant_binary_kl"]
    print(f"binary KL train {fit['train']:.4f} (best constant under the same loss, "
          f"{summary['constant']:.3f}: {constant['train']:.4f}), held-out {fit['held_out']:.4f} "
          f"(constant {constant['held_out']:.4f})")
    return summary
