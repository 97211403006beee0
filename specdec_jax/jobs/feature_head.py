"""The feature-head (EAGLE) jobs the gin launcher runs
(``configs/runs/feature_head_*.gin``): cache a target's features along code
text and along its own greedy responses, then train a head on them.

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
from specdec_jax.training import distill
from specdec_jax.training.feature_head import data as data_lib
from specdec_jax.training.feature_head.train import train_feature_head

SOURCES = ("code", "responses")
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
    chunks = data_lib.code_chunks(streams, length=length, max_positions=max_positions,
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
    entry_points = [p["entry_point"] for p in humaneval.load_problems()]
    chosen, record = stdlib_prompts(num_prompts, seed=seed, exclude_names=entry_points)
    prompts = [tok.encode(prompt) for _, prompt, _ in chosen]
    full = distill.teacher_continuations(
        teacher=target, teacher_params=target_params, prompts=prompts,
        max_new_tokens=max_new_tokens, temperature=0.0, seed=seed,
        eos_ids=tok.eos_token_ids, batch_size=batch_size, progress=progress,
        width_bucket=data_lib.WIDTH_BUCKET, cache_path=cache_path,
        cache_key=json.dumps({"target": target_name}, sort_keys=True))
    kept = [(seq, len(p)) for seq, p in zip(full, prompts) if len(seq) > len(p)]
    return ([s for s, _ in kept], [start for _, start in kept],
            {"kind": "responses", "temperature": 0.0, "max_new_tokens": max_new_tokens,
             "prompts": record, "with_response": len(kept)})


def run_feature_head_data(*, target: str, out_dir: str, sources=SOURCES,
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
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown or not sources:
        raise ValueError(f"unknown feature data sources {unknown}; choose from "
                         f"{', '.join(SOURCES)}.")
    model, params, tok = resolver.resolve(target, dtype=dtype)
    record = data_lib.target_record(target, model, params)
    out = pathlib.Path(out_dir)
    manifests = {}
    # Responses first: the held-out evaluation needs them, and they are the slow part.
    if "responses" in sources:
        sequences, starts, source = response_sequences(
            model, params, tok, target_name=target, num_prompts=num_prompts,
            max_new_tokens=max_new_tokens, cache_path=out / RESPONSES_FILE, seed=seed,
            batch_size=generation_batch_size, progress=progress)
        manifests["responses"] = data_lib.build_shards(
            out / RESPONSES_DIR, target=model, target_params=params, record=record,
            sequences=sequences, starts=starts, source=source, batch_size=batch_size,
            shard_sequences=batch_size, progress=progress)
    if "code" in sources:
        sequences, source = code_sequences(tok, length=length, max_positions=max_positions,
                                           seed=seed)
        manifests["code"] = data_lib.build_shards(
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
    ``training.feature_head.train.train_feature_head`` for the arguments);
    writes ``workdir/summary.json`` and ``workdir/acceptance.md``. ``data``:
    build ``data_dir`` first with these ``run_feature_head_data`` arguments
    (one job for a whole small run, e.g. ``feature_head_toy.gin``; a finished
    build is only checked)."""
    if data is not None:
        run_feature_head_data(target=target, out_dir=data_dir, dtype=dtype, progress=progress,
                              **dict(data))
    model, params, tok = resolver.resolve(target, dtype=dtype)
    token_ids = head_token_ids(target, tok, model.vocab_size, head_vocab)
    summary = train_feature_head(
        workdir=workdir, data_dir=data_dir, target_name=target, target=model,
        target_params=params, token_ids=token_ids, train_positions=train_positions,
        intermediate_size=intermediate_size or None, w_reg=w_reg, w_ce=w_ce, noise=noise,
        learning_rate=learning_rate, warmup_steps=warmup_steps, epochs=epochs,
        batch_size=batch_size, held_out_code_shards=held_out_code_shards,
        held_out_responses=held_out_responses, depth=depth, eval_every=eval_every, seed=seed,
        progress=progress)
    print(pathlib.Path(workdir, "acceptance.md").read_text())
    return summary
