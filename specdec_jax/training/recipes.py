"""T5 v1.1 recipes: a vocabulary, pre-training by span corruption, fine-tuning
on the evaluation tasks, and the ``run_training`` job behind ``train.main``.

Everything a run needs is built from pinned corpora and cached under
``<cache>/vocab`` (SentencePiece models, named by the hash of their settings)
and the run's ``workdir``. A recipe states its sizes here and its budget in
its gin file (``configs/runs/*_t5.gin``)::

    python -m train.main --gin_file=configs/runs/finetune_t5.gin \\
        --gin_bindings="MODEL_SIZE = 't5-small-cpu'" --gin_bindings="WORKDIR = 'results/t5'"
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
from collections.abc import Sequence

import jax
import numpy as np

from specdec_jax.checkpoints import fetch, orbax_io
from specdec_jax.checkpoints.t5x_io import load_t5x
from specdec_jax.data import pretraining, span_corruption, tasks, text_tasks
from specdec_jax.data.vocabulary import SentencePieceVocabulary, train_sentencepiece
from specdec_jax.models.t5 import T5Config, T5EncoderDecoderLM
from specdec_jax.runtime import distributed, timing
from specdec_jax.runtime.progress import tqdm
from specdec_jax.training import distill, train_loop
from specdec_jax.training.datasets import (
    ArrayDataset,
    MixtureDataset,
    bucket_by_length,
    seq2seq_dataset,
)
from specdec_jax.training.optimizers import OptimizerConfig

# Shapes sized for the 2-core CPU machines (the "-cpu" pair is >= 4x apart in
# parameters at an 8k vocabulary); "t5-tiny" is for tests.
T5_SIZES = {
    "t5-tiny": dict(d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=1,
                    num_decoder_layers=1),
    "t5-small-cpu": dict(d_model=128, d_kv=32, d_ff=384, num_heads=4, num_encoder_layers=2,
                         num_decoder_layers=2),
    "t5-large-cpu": dict(d_model=256, d_kv=32, d_ff=1024, num_heads=8, num_encoder_layers=6,
                         num_decoder_layers=6),
}
VOCAB_SUBDIR = "vocab"
DEFAULT_VOCAB_SOURCES = ("gcide", "libc-de", "translation-train", "summarisation-train",
                         "python")
# SentencePiece sees at most this many characters per source (its sample is random anyway;
# this bounds the time to read and hash them on 2 cores).
VOCAB_CHARS_PER_SOURCE = 4_000_000


def run_optimizer(num_steps: int, **settings) -> OptimizerConfig:
    """The optimizer of a run of ``num_steps``. Only decaying schedules record
    the run's length; with the others a finished run can be extended by
    resuming it with more steps (the checkpoint fingerprint stays the same)."""
    decays = settings.get("schedule") in ("cosine", "linear")
    return OptimizerConfig(total_steps=num_steps if decays else 0, **settings)


def t5_model(size: str, vocab_size: int, dropout_rate: float = 0.0) -> T5EncoderDecoderLM:
    if size not in T5_SIZES:
        raise ValueError(f"unknown T5 size {size!r}; choose one of {', '.join(T5_SIZES)}.")
    return T5EncoderDecoderLM(T5Config(vocab_size=vocab_size, dropout_rate=dropout_rate,
                                       **T5_SIZES[size]))


def parameter_count(params) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def vocabulary(*, sources: Sequence[str] = DEFAULT_VOCAB_SOURCES, vocab_size: int = 8000,
               extra_ids: int = 100, seed: int = 0) -> SentencePieceVocabulary:
    """The SentencePiece vocabulary of these settings, trained once and cached."""
    settings = {"sources": list(sources), "vocab_size": vocab_size, "seed": seed,
                "chars_per_source": VOCAB_CHARS_PER_SOURCE}
    name = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    final = fetch.cache_dir() / VOCAB_SUBDIR / f"spm-{vocab_size}-{name}.model"

    def build() -> None:
        # One process per machine at a time (writer_first orders the processes of
        # one job, not two jobs or test workers): all would train into one .partial.
        with fetch.cache_lock(f"vocabulary-{final.stem}"):
            if not final.exists():
                train()

    def train() -> None:
        texts, budget = [], {s: VOCAB_CHARS_PER_SOURCE for s in sources}
        for source, text in tqdm(pretraining.documents(sources), desc="vocabulary text",
                                 unit="doc"):
            if budget[source] > 0:
                texts.append(text)
                budget[source] -= len(text)
        path = train_sentencepiece(texts, final.with_name(final.stem + ".partial"),
                                   vocab_size=vocab_size, seed=seed)
        final.with_suffix(".json").write_text(json.dumps(settings, indent=1))
        path.replace(final)  # complete files only, under their name

    # Across processes, process 0 trains it and the others read its file.
    distributed.writer_first("specdec_jax/vocabulary", build)
    return SentencePieceVocabulary(final, extra_ids=extra_ids)


def task_dataset(task_name: str, split: str, vocab: SentencePieceVocabulary, *,
                 input_length: int, target_length: int, limit: int | None = None
                 ) -> tuple[ArrayDataset, int]:
    """(inputs + EOS, reference + EOS) pairs of a task split, and how many
    examples were left out for not fitting the lengths (reported, not cut)."""
    return examples_dataset(tasks.get_task(task_name).load(split, limit), vocab,
                            input_length=input_length, target_length=target_length,
                            what=f"{split} example of {task_name}")


def examples_dataset(examples: Sequence[tasks.Example], vocab: SentencePieceVocabulary, *,
                     input_length: int, target_length: int, what: str
                     ) -> tuple[ArrayDataset, int]:
    """``task_dataset`` for a list of examples (a split, an auxiliary corpus)."""
    inputs, targets, dropped = [], [], 0
    for example in examples:
        if not isinstance(example.reference, str):
            raise ValueError(f"the {what} {example.id!r} has a non-text reference; fine-tune "
                             "on a text task (translation_en_de, summarisation_debian).")
        source = vocab.encode(example.prompt) + [vocab.eos_id]
        target = vocab.encode(example.reference) + [vocab.eos_id]
        if len(source) > input_length or len(target) > target_length:
            dropped += 1
            continue
        inputs.append(source)
        targets.append(target)
    if not inputs:
        raise ValueError(f"no {what} fits input_length {input_length} and target_length "
                         f"{target_length}; raise them.")
    return seq2seq_dataset(inputs, targets, input_length=input_length,
                           target_length=target_length), dropped


def training_mixture(task_name: str, vocab: SentencePieceVocabulary, *, input_length: int,
                     target_length: int, limit: int | None = None,
                     length_buckets: Sequence[Sequence[int]] | None = None,
                     auxiliary: dict[str, float] | None = None
                     ) -> tuple[ArrayDataset | MixtureDataset, dict]:
    """A task's training data, optionally in length buckets and mixed with
    auxiliary corpora (``text_tasks.AUXILIARY``; ``{name: share of batches}``),
    and notes for the run's summary (what was left out, the mixture)."""
    data, dropped = task_dataset(task_name, "train", vocab, input_length=input_length,
                                 target_length=target_length, limit=limit)
    notes: dict = {"train_dropped": dropped, "task_examples": len(data)}
    auxiliary = dict(auxiliary or {})
    if not length_buckets and not auxiliary:
        return data, notes
    for name, share in auxiliary.items():
        if text_tasks.AUXILIARY.get(name) != task_name:
            serves = [n for n, t in text_tasks.AUXILIARY.items() if t == task_name]
            raise ValueError(f"auxiliary corpus {name!r} does not serve task {task_name!r}; "
                             f"it can take {serves or 'none'}.")
        if not 0 < share < 1:
            raise ValueError(f"auxiliary share of {name!r} must be in (0, 1), got {share}.")
    task_share = 1.0 - sum(auxiliary.values())
    if task_share <= 0:
        raise ValueError(f"auxiliary shares {auxiliary} leave no batches for the task; "
                         "keep their sum below 1.")
    buckets = [tuple(b) for b in (length_buckets or [(input_length, target_length)])]
    if any(i > input_length or t > target_length for i, t in buckets):
        raise ValueError(f"length buckets {buckets} exceed input_length {input_length} / "
                         f"target_length {target_length}; keep each bucket within them.")
    parts = [(task_name, data, task_share)]
    for name, share in auxiliary.items():
        aux, notes[f"{name}_dropped"] = examples_dataset(
            text_tasks.auxiliary_examples(name), vocab, input_length=input_length,
            target_length=target_length, what=f"example of {name}")
        parts.append((name, aux, share))
    components, rates, names = [], [], []
    for name, part, share in parts:
        mix = bucket_by_length(part, buckets, name=name)
        components += mix.components
        names += mix.names
        rates += [share * p for p in mix.probabilities]
    mixture = MixtureDataset(components=tuple(components), rates=tuple(rates),
                             names=tuple(names))
    notes["mixture"] = [{"name": n, "examples": len(c), "rate": r}
                        for n, c, r in zip(names, components, mixture.probabilities.tolist())]
    notes["task_share"] = task_share
    return mixture, notes


def span_corruption_dataset(vocab: SentencePieceVocabulary, *, sources: Sequence[str],
                            length: int, seed: int, max_rows: int | None = None
                            ) -> ArrayDataset:
    """Packed rows of ``length`` tokens, each span-corrupted once (row ``i``
    with the generator seeded by ``(seed, i)``): T5's pre-training pairs."""
    token_lists = (vocab.encode(text) for _, text in pretraining.documents(sources))
    rows, _ = pretraining.pack(tqdm(token_lists, desc="pack", unit="doc"), length=length,
                               eos_id=vocab.eos_id)
    if max_rows is not None:
        rows = rows[:max_rows]
    pairs = [span_corruption.span_corrupt(row, np.random.default_rng([seed, i]),
                                          vocab_size=vocab.vocab_size,
                                          num_sentinels=vocab.extra_ids)
             for i, row in enumerate(rows)]
    targets = [t + [vocab.eos_id] for _, t in pairs]
    return seq2seq_dataset([i for i, _ in pairs], targets, input_length=length,
                           target_length=max(len(t) for t in targets))


def init_params(model: T5EncoderDecoderLM, vocab: SentencePieceVocabulary, *,
                init_checkpoint: str | None, seed: int) -> dict:
    """Random parameters, or a checkpoint's, checked against this model's
    shapes and vocabulary. ``init_checkpoint`` is a t5x checkpoint or one of
    our own finished runs (a ``run_training`` workdir, e.g. a span-corruption
    pre-training run to fine-tune from)."""
    if not init_checkpoint:
        return model.init_params(jax.random.PRNGKey(seed))
    if pathlib.Path(init_checkpoint, "summary.json").exists():
        loaded, params, loaded_vocab, _ = load_run(init_checkpoint)
        if loaded_vocab.fingerprint != vocab.fingerprint:
            raise ValueError(
                f"INIT_CHECKPOINT {init_checkpoint} was trained with the vocabulary "
                f"{loaded_vocab.fingerprint}, this run uses {vocab.fingerprint}: fine-tune "
                "with the vocabulary settings (vocab_size, vocab_sources, extra_ids, "
                "vocab_seed) of the run it starts from.")
    else:
        loaded, params = load_t5x(init_checkpoint)
    stored, wanted = dataclasses.asdict(loaded.config), dataclasses.asdict(model.config)
    changed = {k: (stored[k], wanted[k]) for k in ("vocab_size", "d_model", "d_kv", "d_ff",
                                                    "num_heads", "num_encoder_layers",
                                                    "num_decoder_layers")
               if stored[k] != wanted[k]}
    if changed:
        detail = ", ".join(f"{k}: checkpoint {a}, this run {b}" for k, (a, b) in changed.items())
        fix = (" The vocabulary differs: fine-tune with the vocabulary the checkpoint was "
               "trained with." if "vocab_size" in changed else
               " Choose the model_size the checkpoint was trained with.")
        raise ValueError(f"INIT_CHECKPOINT {init_checkpoint} does not match the model: "
                         f"{detail}.{fix}")
    return params


def run_training(*, workdir: str, model_size: str = "t5-small-cpu",
                 objective: str = "task", task: str = "translation_en_de",
                 pretraining_sources: Sequence[str] = ("gcide", "libc-de", "python"),
                 vocab_sources: Sequence[str] = DEFAULT_VOCAB_SOURCES,
                 vocab_size: int = 8000, extra_ids: int = 100, vocab_seed: int = 0,
                 init_checkpoint: str | None = None, num_steps: int = 1000,
                 batch_size: int = 32, input_length: int = 128, target_length: int = 128,
                 train_limit: int | None = None,
                 length_buckets: Sequence[Sequence[int]] | None = None,
                 auxiliary: dict[str, float] | None = None, eval_examples: int = 256,
                 eval_every: int = 200, checkpoint_every: int = 200, keep: int = 2,
                 optimizer: str = "adafactor", learning_rate: float = 1e-2,
                 schedule: str = "rsqrt", warmup_steps: int = 100, clip_norm: float = 1.0,
                 weight_decay: float = 0.0, dropout_rate: float = 0.0, seed: int = 0,
                 progress: bool = True) -> dict:
    """Pre-trains (``objective="span_corruption"``) or fine-tunes
    (``objective="task"``) a T5 v1.1 model; writes the run into ``workdir``
    and ``workdir/summary.json`` (parameter count, training tokens, seconds,
    final losses). Killed runs resume from their last checkpoint.

    ``length_buckets`` (``[(input_width, target_width), ...]``) batches task
    examples by length so a batch of short ones pays for short rows;
    ``auxiliary`` mixes training-only corpora in at a share of the batches
    (e.g. ``{"ding-phrases": 0.5}`` for translation). Both are task-only.
    ``dropout_rate`` is T5's dropout in training steps (0.1 in t5x's fine-tuning);
    evaluation and decoding run without it."""
    objectives = ("task", "span_corruption")
    if objective not in objectives:
        raise ValueError(f"unknown objective {objective!r}; choose one of "
                         f"{', '.join(objectives)}.")
    opt = run_optimizer(num_steps, name=optimizer, learning_rate=learning_rate,
                        schedule=schedule, warmup_steps=warmup_steps, clip_norm=clip_norm,
                        weight_decay=weight_decay)
    vocab = vocabulary(sources=vocab_sources, vocab_size=vocab_size, extra_ids=extra_ids,
                       seed=vocab_seed)
    model = t5_model(model_size, vocab.vocab_size, dropout_rate)
    notes: dict = {}
    if objective != "task" and (length_buckets or auxiliary):
        raise ValueError("length_buckets and auxiliary apply to objective='task' only; span "
                         "corruption packs its rows to one length.")
    if objective == "task":
        data, notes = training_mixture(task, vocab, input_length=input_length,
                                       target_length=target_length, limit=train_limit,
                                       length_buckets=length_buckets, auxiliary=auxiliary)
        eval_data, notes["eval_dropped"] = task_dataset(
            task, "validation", vocab, input_length=input_length,
            target_length=target_length, limit=eval_examples)
    else:
        rows = None if train_limit is None else train_limit + eval_examples
        both = span_corruption_dataset(vocab, sources=pretraining_sources, length=input_length,
                                       seed=seed, max_rows=rows)
        # The last eval_examples rows are held out.
        cut = len(both) - eval_examples
        if cut < 1:
            raise ValueError(f"{len(both)} packed rows cannot spare {eval_examples} for "
                             "evaluation; lower eval_examples.")
        data, eval_data = both.subset(slice(0, cut)), both.subset(slice(cut, None))
    params = init_params(model, vocab, init_checkpoint=init_checkpoint, seed=seed)
    mixing = {"length_buckets": [list(b) for b in length_buckets]} if length_buckets else {}
    if auxiliary:
        mixing["auxiliary"] = dict(auxiliary)
    if notes.get("train_dropped"):
        print(f"note: {notes['train_dropped']} training examples do not fit input_length "
              f"{input_length} / target_length {target_length} and are left out.")
    result = train_loop.train(model=model, params=params, optimizer=opt, data=data,
                        num_steps=num_steps, batch_size=batch_size, workdir=workdir, seed=seed,
                        eval_data=eval_data, eval_every=eval_every,
                        checkpoint_every=checkpoint_every, keep=keep, progress=progress,
                        fingerprint_extra={"vocabulary": vocab.fingerprint,
                                           "objective": objective, "task": task,
                                           "init_checkpoint": init_checkpoint or "",
                                           **mixing})
    final = result.history[-1]
    params_dir = _export_params(workdir, num_steps, result.state.params)
    summary = {
        "model_size": model_size, "config": dataclasses.asdict(model.config),
        "parameters": parameter_count(params), "objective": objective, "task": task,
        "vocabulary": vocab.fingerprint, "vocabulary_path": str(vocab.path),
        "extra_ids": vocab.extra_ids, "params": str(params_dir),
        "train_examples": len(data), "eval_examples": len(eval_data),
        "tokens_per_epoch": data.mean_tokens() * len(data),
        "training_tokens": data.mean_tokens() * num_steps * batch_size, **mixing,
        "init_checkpoint": init_checkpoint or "",
        "steps": num_steps, "batch_size": batch_size, "optimizer": dataclasses.asdict(opt),
        "seconds_this_invocation": result.seconds, "resumed_from": result.resumed_from,
        "final": final, "environment": timing.environment(),
        **notes}
    # Passes over the task's own training examples (auxiliary corpora take their share).
    summary["epochs"] = (num_steps * batch_size * notes.get("task_share", 1.0)
                         / notes.get("task_examples", len(data)))
    summary["eval_perplexity"] = final.get("eval/perplexity", math.nan)
    if distributed.is_writer():
        pathlib.Path(workdir, "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _export_params(workdir, step: int, params) -> pathlib.Path:
    """The final parameters as a plain orbax tree (``workdir/params_<step>``),
    what ``load_run`` and later jobs read without the optimizer state."""
    path = pathlib.Path(workdir).absolute() / f"params_{step}"
    exists = path.exists()
    # Every process must agree on whether to save (each writes its own shards).
    distributed.barrier("specdec_jax/export_params")
    if not exists:
        orbax_io.save_params(path, params)
    return path


def load_run(workdir: str | os.PathLike) -> tuple[T5EncoderDecoderLM, dict,
                                                   SentencePieceVocabulary, dict]:
    """(model, params, vocabulary, summary) of a finished ``run_training`` run."""
    summary_path = pathlib.Path(workdir) / "summary.json"
    if not summary_path.exists():
        raise FileNotFoundError(f"{workdir} holds no finished training run (no summary.json); "
                                "run train.main with this WORKDIR first.")
    summary = json.loads(summary_path.read_text())
    model = T5EncoderDecoderLM(T5Config(**summary["config"]))
    vocab = SentencePieceVocabulary(summary["vocabulary_path"], extra_ids=summary["extra_ids"])
    if vocab.fingerprint != summary["vocabulary"]:
        raise ValueError(f"the vocabulary at {vocab.path} is not the one {workdir} was trained "
                         f"with ({summary['vocabulary']}); rebuild it with the run's settings.")
    like = model.init_params(jax.random.PRNGKey(0))
    return model, orbax_io.restore_params(summary["params"], like), vocab, summary


def run_distillation(*, workdir: str, teacher_workdir: str, student_workdir: str,
                     task: str = "translation_en_de", divergence: str = "tvd",
                     data: str = "teacher", temperature: float = 1.0, num_steps: int = 500,
                     batch_size: int = 32, input_length: int = 128, target_length: int = 128,
                     train_limit: int | None = 4096, eval_examples: int = 200, gamma: int = 5,
                     eval_temperature: float = 1.0, eval_max_new_tokens: int = 64,
                     learning_rate: float = 1e-3, optimizer: str = "adamw",
                     schedule: str = "constant", warmup_steps: int = 0, seed: int = 0,
                     progress: bool = True) -> dict:
    """Distils the student run into the teacher run's distributions and reports
    speculative decoding's block efficiency and acceptance (``gamma``,
    ``eval_temperature``) on held-out validation inputs before and after, with
    95% CIs. ``data``: ``"teacher"`` (the teacher's own samples for the training
    inputs, at ``temperature``) or ``"corpus"`` (the task's references)."""
    if data not in ("teacher", "corpus"):
        raise ValueError(f"unknown distillation data {data!r}; choose teacher or corpus.")
    teacher, teacher_params, vocab, _ = load_run(teacher_workdir)
    student, student_params, student_vocab, _ = load_run(student_workdir)
    if student_vocab.fingerprint != vocab.fingerprint:
        raise ValueError(f"teacher ({vocab.fingerprint}) and student "
                         f"({student_vocab.fingerprint}) were trained with different "
                         "vocabularies; distil between runs that share one.")
    corpus, _ = task_dataset(task, "train", vocab, input_length=input_length,
                             target_length=target_length, limit=train_limit)
    held_out, _ = task_dataset(task, "validation", vocab, input_length=input_length,
                               target_length=target_length, limit=eval_examples)
    inputs = [row[:n].tolist() for row, n in zip(corpus.inputs, corpus.input_lengths)]
    if data == "teacher":
        outputs = distill.teacher_continuations(
            teacher=teacher, teacher_params=teacher_params, prompts=inputs,
            max_new_tokens=target_length - 1, temperature=temperature, seed=seed,
            eos_ids=vocab.eos_token_ids, progress=progress)
        targets = [out if out and out[-1] == vocab.eos_id else out + [vocab.eos_id]
                   for out in (o[len(i):] for o, i in zip(outputs, inputs))]
        corpus = seq2seq_dataset(inputs, targets, input_length=input_length,
                                 target_length=target_length)
    prompts = [row[:n].tolist() for row, n in zip(held_out.inputs, held_out.input_lengths)]
    measure = lambda params: distill.block_efficiency(  # noqa: E731
        target=teacher, target_params=teacher_params, drafter=student, drafter_params=params,
        prompts=prompts, gamma=gamma, temperature=eval_temperature,
        max_new_tokens=eval_max_new_tokens, eos_ids=vocab.eos_token_ids, seed=seed)
    before = measure(student_params)
    opt = run_optimizer(num_steps, name=optimizer, learning_rate=learning_rate,
                        schedule=schedule, warmup_steps=warmup_steps)
    result = train_loop.train(model=student, params=student_params, optimizer=opt, data=corpus,
                        num_steps=num_steps, batch_size=batch_size, workdir=workdir, seed=seed,
                        loss_fn=distill.make_distillation_loss(teacher, kind=divergence,
                                                               temperature=temperature),
                        loss_extras=teacher_params, eval_data=held_out,
                        eval_every=max(num_steps // 5, 1), progress=progress,
                        fingerprint_extra={"teacher": str(teacher_workdir),
                                           "student": str(student_workdir), "data": data,
                                           "divergence": divergence})
    after = measure(result.state.params)
    params_dir = _export_params(workdir, num_steps, result.state.params)
    summary = {"teacher": str(teacher_workdir), "student": str(student_workdir), "task": task,
               "divergence": divergence, "data": data, "steps": num_steps,
               "batch_size": batch_size,
               "config": dataclasses.asdict(student.config), "vocabulary": vocab.fingerprint,
               "vocabulary_path": str(vocab.path), "extra_ids": vocab.extra_ids,
               "params": str(params_dir), "before": before, "after": after,
               "final": result.history[-1], "seconds_this_invocation": result.seconds,
               "environment": timing.environment()}
    pathlib.Path(workdir, "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"block efficiency (G={gamma}, T={eval_temperature}) on {len(prompts)} held-out "
          f"inputs: {before['block_efficiency']:.3f} -> {after['block_efficiency']:.3f}; "
          f"acceptance {before['acceptance_rate']:.3f} -> {after['acceptance_rate']:.3f}")
    return summary
