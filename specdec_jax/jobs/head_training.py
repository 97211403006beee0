"""The draft-head training jobs the gin launcher runs: the SpecDec++
acceptance head (``configs/runs/specdecpp_*.gin``) and the feature (EAGLE)
head (``configs/runs/feature_head_*.gin``). Each builds its training data for
a target (and drafter), resumably, then trains a head on it.

    python -m train.main --gin_file=configs/runs/specdecpp_data.gin
    python -m train.main --gin_file=configs/runs/specdecpp_train.gin --gin.W_REJ=6.0
    python -m train.main --gin_file=configs/runs/feature_head_data.gin \\
        --gin.OUT_DIR="'results/feature-data'"
    python -m train.main --gin_file=configs/runs/feature_head_train.gin \\
        --gin.DATA_DIR="'results/feature-data'" --gin.WORKDIR="'results/feature-head'"
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

from specdec_jax.data import bigram, humaneval
from specdec_jax.data.stdlib_prompts import stdlib_prompts
from specdec_jax.drafting import head_vocab as head_vocab_lib
from specdec_jax.jobs import resolver
from specdec_jax.training import (
    acceptance_data,
    acceptance_training,
    distill,
    feature_data,
    feature_training,
)

# ---------------------------------------------------------------------------
# SpecDec++: the acceptance head of a drafter under a target
# ---------------------------------------------------------------------------

ACCEPTANCE_SOURCES = ("target", "corpus")
TEACHER_SAMPLES = "teacher_samples.jsonl"  # the target's responses, kept for resuming


def training_prompts(num_prompts: int, seed: int) -> tuple[list, dict]:
    """``num_prompts`` standard-library prompts, none named like a HumanEval
    problem (the evaluation stays disjoint): ``stdlib_prompts``'s (chosen, record)."""
    entry_points = [p["entry_point"] for p in humaneval.load_problems()]
    return stdlib_prompts(num_prompts, seed=seed, exclude_names=entry_points)


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
    if source not in ACCEPTANCE_SOURCES:
        raise ValueError(f"unknown data source {source!r}; choose one of "
                         f"{', '.join(ACCEPTANCE_SOURCES)}.")
    if num_prompts < 1 or max_new_tokens < 1:
        raise ValueError("num_prompts and max_new_tokens must be >= 1.")
    chosen, record = training_prompts(num_prompts, seed)
    pair = resolver.load_pair(target=target, drafter=drafter, dtype=dtype)
    prompts = [pair.encode(prompt) for _, prompt, _ in chosen]
    identity = acceptance_data.pair_record(
        target_name=target, target_params=pair.target_params, drafter_name=drafter,
        drafter_params=pair.drafter_params, target=pair.target, drafter=pair.drafter)
    if source == "target":
        speculative = ({"drafter": pair.drafter, "drafter_params": pair.drafter_params}
                       if speculative_teacher else {})
        full = distill.teacher_continuations(
            teacher=pair.target, teacher_params=pair.target_params, prompts=prompts,
            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
            eos_ids=pair.eos_ids, batch_size=teacher_batch_size, progress=progress,
            width_bucket=acceptance_data.WIDTH_BUCKET, **speculative,
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
    return acceptance_data.build_shards(
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
    manifest_path = pathlib.Path(data_dir) / acceptance_data.MANIFEST
    if not manifest_path.exists():
        raise FileNotFoundError(f"{data_dir} holds no acceptance data; run "
                                "configs/runs/specdecpp_data.gin first.")
    pair = json.loads(manifest_path.read_text())["pair"]
    summary = acceptance_training.train_head(
        workdir=workdir, data_dir=data_dir, pair=pair, depth=depth, w_acc=w_acc, w_rej=w_rej,
        learning_rate=learning_rate, epochs=epochs, batch_size=batch_size,
        held_out_shards=held_out_shards, seed=seed, progress=progress)
    pathlib.Path(workdir, "summary.json").write_text(json.dumps(summary, indent=1))
    fit, constant = summary["binary_kl"], summary["constant_binary_kl"]
    print(f"binary KL train {fit['train']:.4f} (best constant under the same loss, "
          f"{summary['constant']:.3f}: {constant['train']:.4f}), held-out {fit['held_out']:.4f} "
          f"(constant {constant['held_out']:.4f})")
    return summary


# ---------------------------------------------------------------------------
# The feature (EAGLE) head of a target
# ---------------------------------------------------------------------------

FEATURE_SOURCES = ("code", "responses")
RESPONSES_FILE = "responses.jsonl"  # the target's greedy responses, kept for resuming
CODE_DIR, RESPONSES_DIR = "code", "responses"


def code_sequences(tok, *, length: int, max_positions: int, seed: int = 0,
                   max_chunks_per_file: int = 4) -> tuple[list[list[int]], dict]:
    """``length``-token chunks of CPython standard-library sources (the files
    ``bigram.stdlib_sources`` lists, in a seeded order; at most
    ``max_chunks_per_file`` from each), ``max_positions`` tokens in all, and
    the record of where they came from."""
    files = bigram.stdlib_sources()
    order = np.random.default_rng(seed).permutation(len(files))
    streams = (tok.encode(files[i].read_text(encoding="utf-8", errors="replace"))
               for i in order)
    chunks = feature_data.code_chunks(streams, length=length, max_positions=max_positions,
                                      max_chunks_per_stream=max_chunks_per_file)
    return chunks, {"kind": "code", "corpus": "CPython standard library (bigram.stdlib_sources)",
                    "files": len(files), "seed": seed, "length": length,
                    "max_positions": max_positions, "max_chunks_per_file": max_chunks_per_file}


def response_sequences(target, target_params, tok, *, target_name: str, num_prompts: int,
                       max_new_tokens: int, cache_path, seed: int = 0, batch_size: int = 16,
                       progress: bool = True) -> tuple[list[list[int]], list[int], dict]:
    """The target's greedy (T = 0) responses to ``num_prompts`` standard-library
    prompts (those of the SpecDec++ jobs, disjoint from HumanEval): (prompt +
    response sequences, where each response starts, record)."""
    chosen, record = training_prompts(num_prompts, seed)
    prompts = [tok.encode(prompt) for _, prompt, _ in chosen]
    full = distill.teacher_continuations(
        teacher=target, teacher_params=target_params, prompts=prompts,
        max_new_tokens=max_new_tokens, temperature=0.0, seed=seed,
        eos_ids=tok.eos_token_ids, batch_size=batch_size, progress=progress,
        width_bucket=feature_data.WIDTH_BUCKET, cache_path=cache_path,
        cache_key=json.dumps({"target": target_name}, sort_keys=True))
    kept = [(seq, len(p)) for seq, p in zip(full, prompts) if len(seq) > len(p)]
    return ([s for s, _ in kept], [start for _, start in kept],
            {"kind": "responses", "temperature": 0.0, "max_new_tokens": max_new_tokens,
             "prompts": record, "with_response": len(kept)})


def run_feature_head_data(*, target: str, out_dir: str, sources=FEATURE_SOURCES,
                          max_positions: int = 50_000, length: int = 256,
                          num_prompts: int = 24, max_new_tokens: int = 128,
                          batch_size: int = 8, shard_sequences: int = 32,
                          generation_batch_size: int = 24, seed: int = 0,
                          dtype: str = "auto", progress: bool = True) -> dict:
    """Features of ``target`` along (``code``) ``max_positions`` tokens of
    standard-library source in ``length``-token chunks, into ``out_dir/code``,
    and (``responses``) its greedy responses to ``num_prompts`` prompts (up to
    ``max_new_tokens`` tokens; kept in ``out_dir/responses.jsonl``), into
    ``out_dir/responses``. Resumes an interrupted build. Returns the manifests."""
    unknown = sorted(set(sources) - set(FEATURE_SOURCES))
    if unknown or not sources:
        raise ValueError(f"unknown feature data sources {unknown}; choose from "
                         f"{', '.join(FEATURE_SOURCES)}.")
    model, params, tok = resolver.resolve(target, dtype=dtype)
    record = feature_data.target_record(target, model, params)
    out = pathlib.Path(out_dir)
    manifests = {}
    # Responses first: the held-out evaluation needs them, and they are the slow part.
    if "responses" in sources:
        sequences, starts, source = response_sequences(
            model, params, tok, target_name=target, num_prompts=num_prompts,
            max_new_tokens=max_new_tokens, cache_path=out / RESPONSES_FILE, seed=seed,
            batch_size=generation_batch_size, progress=progress)
        manifests["responses"] = feature_data.build_shards(
            out / RESPONSES_DIR, target=model, target_params=params, record=record,
            sequences=sequences, starts=starts, source=source, batch_size=batch_size,
            shard_sequences=batch_size, progress=progress)
    if "code" in sources:
        sequences, source = code_sequences(tok, length=length, max_positions=max_positions,
                                           seed=seed)
        manifests["code"] = feature_data.build_shards(
            out / CODE_DIR, target=model, target_params=params, record=record,
            sequences=sequences, source=source, batch_size=batch_size,
            shard_sequences=shard_sequences, width=length, progress=progress)
    summary = {name: {"sequences": m["settings"]["sequences"],
                      "positions": m["settings"]["positions"],
                      "seconds": sum(s["seconds"] for s in m["shards"].values())}
               for name, m in manifests.items()}
    print(json.dumps(summary, indent=1))
    return manifests


def head_token_ids(target: str, tok, vocab_size: int, size: int) -> np.ndarray | None:
    """The ``size`` most frequent token ids of the standard library under the
    target's tokenizer (``bigram`` unigram counts; end-of-sequence ids kept);
    None for ``size`` 0 (the full head)."""
    if not size:
        return None
    table = bigram.table_for(bigram.AUTO, tok, vocab_size)
    counts = bigram.load_unigram(table, vocab_size)
    del target
    return head_vocab_lib.head_token_ids(counts, size, tok.eos_token_ids)


def run_feature_head_train(*, data_dir: str, workdir: str, target: str,
                           train_positions: int = 0, head_vocab: int = 8192,
                           intermediate_size: int = 0, w_reg: float = 1.0, w_ce: float = 0.1,
                           noise: float = 0.1, learning_rate: float = 3e-4,
                           warmup_steps: int = 20, epochs: float = 2.0, batch_size: int = 8,
                           held_out_code_shards: int = 1, held_out_responses: float = 0.5,
                           depth: int = 5, eval_every: int = 0, seed: int = 0,
                           dtype: str = "auto", data: dict | None = None,
                           progress: bool = True) -> dict:
    """Trains a feature head for ``target`` on ``data_dir`` (built by
    ``run_feature_head_data``) into ``workdir/head`` (see
    ``training.feature_training.train_feature_head`` for the arguments);
    writes ``workdir/summary.json`` and ``workdir/acceptance.md``. ``data``:
    build ``data_dir`` first with these ``run_feature_head_data`` arguments
    (one job for a whole small run, e.g. ``feature_head_toy.gin``; a finished
    build is only checked)."""
    if data is not None:
        run_feature_head_data(target=target, out_dir=data_dir, dtype=dtype, progress=progress,
                              **dict(data))
    model, params, tok = resolver.resolve(target, dtype=dtype)
    token_ids = head_token_ids(target, tok, model.vocab_size, head_vocab)
    summary = feature_training.train_feature_head(
        workdir=workdir, data_dir=data_dir, target_name=target, target=model,
        target_params=params, token_ids=token_ids, train_positions=train_positions,
        intermediate_size=intermediate_size or None, w_reg=w_reg, w_ce=w_ce, noise=noise,
        learning_rate=learning_rate, warmup_steps=warmup_steps, epochs=epochs,
        batch_size=batch_size, held_out_code_shards=held_out_code_shards,
        held_out_responses=held_out_responses, depth=depth, eval_every=eval_every, seed=seed,
        progress=progress)
    print(pathlib.Path(workdir, "acceptance.md").read_text())
    return summary
