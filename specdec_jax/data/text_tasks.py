"""EN->DE translation and package-description summarisation as evaluation tasks.

Both tasks are built from real corpora of the Debian archive (``corpora``), so they need no
dataset hub and no TensorFlow:

* ``translation_en_de``: English -> German pairs from the Debian Administrator's Handbook
  (paragraphs, 4-60 words) and the Ding dictionary (full example sentences). Prompt in T5
  style, ``"translate English to German: {en}"``; reference the German text; metric BLEU.
* ``summarisation_debian``: a package's long description (at least 20 words; " ." paragraph
  markers dropped, whitespace collapsed) -> its one-line synopsis. Prompt
  ``"summarize: {long}"``; reference the synopsis; metric ROUGE-2. Like XSum, the target is a
  single short line written by the same author as the document.

Fixed splits: every example has a stable id, ``"<corpus>:<index>"`` with the index in the
corpus's source order (``corpora`` documents that order). The examples are shuffled once by
sorting on ``sha256(f"{SPLIT_SEED}:{id}")``, which gives the same order on every machine and
every Python or numpy version; the first ``TEST_SIZE`` are the test split, the next
``VALIDATION_SIZE`` the validation split, the rest train (``SPLIT_SIZES``). ``load(split,
limit)`` returns a prefix of a split, so ``limit=100`` is always the same 100 examples.

Users without TensorFlow iterate a split as plain dicts with ``iterate``; ``seqio_tasks``
wraps the same iterators as seqio Tasks.
"""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Iterator

from specdec_jax.data import corpora, metrics, tasks

TRANSLATION_TASK = "translation_en_de"
SUMMARISATION_TASK = "summarisation_debian"
TRANSLATION_PREFIX = "translate English to German: "
SUMMARISATION_PREFIX = "summarize: "
# References are single lines, so a decoder-only model's output is cut at its first newline.
STOP_STRINGS = ("\n",)

SPLIT_SEED = 20241123
SPLITS = ("train", "validation", "test")
TEST_SIZE = 1000
VALIDATION_SIZE = 1000

_TRANSLATION_RECORDS = corpora.HANDBOOK_RECORDS + corpora.DING_RECORDS
SPLIT_SIZES = {
    TRANSLATION_TASK: {"train": _TRANSLATION_RECORDS - TEST_SIZE - VALIDATION_SIZE,
                       "validation": VALIDATION_SIZE, "test": TEST_SIZE},
    SUMMARISATION_TASK: {"train": corpora.DESCRIPTION_RECORDS - TEST_SIZE - VALIDATION_SIZE,
                         "validation": VALIDATION_SIZE, "test": TEST_SIZE},
}


def _check_count(corpus: str, found: int) -> None:
    expected = corpora.CORPORA[corpus].records
    if found != expected:
        raise ValueError(
            f"corpus {corpus} gave {found} records, expected {expected}: the cached files or "
            f"the parser in specdec_jax.data.corpora changed. Delete the corpus from the cache "
            f"({corpora.data_dir()}) and run again; if the change is intended, update the "
            "record counts there.")


@functools.lru_cache(maxsize=None)
def _translation_examples() -> tuple[tasks.Example, ...]:
    examples = []
    for corpus, pairs in (("debian-handbook", corpora.handbook_pairs()),
                          ("trans-de-en", corpora.ding_pairs())):
        _check_count(corpus, len(pairs))
        examples += [tasks.Example(id=f"{corpus}:{i}", prompt=TRANSLATION_PREFIX + en,
                                   reference=de) for i, (en, de) in enumerate(pairs)]
    return tuple(examples)


@functools.lru_cache(maxsize=None)
def _summarisation_examples() -> tuple[tasks.Example, ...]:
    records = corpora.description_records()
    if os.environ.get(corpora.UNPINNED_ENV) != "1":  # an unpinned snapshot has its own count
        _check_count("debian-descriptions", len(records))
    return tuple(tasks.Example(id=f"debian-descriptions:{i}",
                               prompt=SUMMARISATION_PREFIX + r["description"],
                               reference=r["synopsis"]) for i, r in enumerate(records))


_EXAMPLES = {TRANSLATION_TASK: _translation_examples,
             SUMMARISATION_TASK: _summarisation_examples}


def _shuffle_key(example: tasks.Example) -> str:
    return hashlib.sha256(f"{SPLIT_SEED}:{example.id}".encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def _splits(task_name: str) -> dict[str, tuple[tasks.Example, ...]]:
    ordered = sorted(_EXAMPLES[task_name](), key=_shuffle_key)
    cut = TEST_SIZE + VALIDATION_SIZE
    return {"test": tuple(ordered[:TEST_SIZE]),
            "validation": tuple(ordered[TEST_SIZE:cut]),
            "train": tuple(ordered[cut:])}


def load_split(task_name: str, split: str, limit: int | None = None) -> list[tasks.Example]:
    """The first ``limit`` examples (all when None) of a fixed split of one of these tasks."""
    if task_name not in _EXAMPLES:
        raise ValueError(f"unknown task {task_name!r}; choose one of {', '.join(_EXAMPLES)}.")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}.")
    examples = _splits(task_name)[split]
    if limit is not None and not 1 <= limit <= len(examples):
        raise ValueError(f"limit must be in [1, {len(examples)}] for the {split} split of "
                         f"{task_name}, got {limit}.")
    return list(examples if limit is None else examples[:limit])


def translation_en_de() -> tasks.Task:
    """EN->DE translation (debian-handbook paragraphs + Ding sentences), scored by BLEU."""
    handbook, ding = corpora.CORPORA["debian-handbook"], corpora.CORPORA["trans-de-en"]
    return tasks.Task(
        name=TRANSLATION_TASK,
        description=f"English -> German: {handbook.records} Debian Administrator's Handbook "
                    f"paragraphs and {ding.records} Ding dictionary sentences; "
                    f"prompt {TRANSLATION_PREFIX!r} + English.",
        source=f"{handbook.source}; {ding.source}",
        licence=f"debian-handbook: {handbook.licence}; trans-de-en: {ding.licence}",
        metric=metrics.BLEU,
        load=functools.partial(load_split, TRANSLATION_TASK),
        stop_strings=STOP_STRINGS)


def summarisation() -> tasks.Task:
    """Debian package long description -> one-line synopsis, scored by ROUGE-2."""
    corpus = corpora.CORPORA["debian-descriptions"]
    return tasks.Task(
        name=SUMMARISATION_TASK,
        description=f"{corpus.records} Debian package long descriptions (>= "
                    f"{corpora.MIN_DESCRIPTION_WORDS} words) -> their synopsis; prompt "
                    f"{SUMMARISATION_PREFIX!r} + description.",
        source=corpus.source,
        licence=corpus.licence,
        metric=metrics.ROUGE2,
        load=functools.partial(load_split, SUMMARISATION_TASK),
        stop_strings=STOP_STRINGS)


FACTORIES = {TRANSLATION_TASK: translation_en_de, SUMMARISATION_TASK: summarisation}

# Training-only corpora that a recipe may mix into a task's train split, by the task they
# serve. They never enter a split, and an auxiliary example whose prompt equals a validation
# or test prompt of its task is left out.
AUXILIARY = {"ding-phrases": TRANSLATION_TASK, "ui-messages": TRANSLATION_TASK}
_AUXILIARY_PAIRS = {"ding-phrases": corpora.ding_phrase_pairs,  # name -> (source, reference)
                    "ui-messages": corpora.ui_message_pairs}
_PREFIXES = {TRANSLATION_TASK: TRANSLATION_PREFIX, SUMMARISATION_TASK: SUMMARISATION_PREFIX}


@functools.lru_cache(maxsize=None)
def auxiliary_examples(name: str) -> tuple[tasks.Example, ...]:
    """The examples of an auxiliary training corpus, in its task's prompt format."""
    if name not in AUXILIARY:
        raise ValueError(f"unknown auxiliary corpus {name!r}; choose one of "
                         f"{', '.join(AUXILIARY)}.")
    task_name = AUXILIARY[name]
    pairs = _AUXILIARY_PAIRS[name]()
    _check_count(name, len(pairs))
    held_out = {e.prompt for split in ("validation", "test")
                for e in _splits(task_name)[split]}
    examples = (tasks.Example(id=f"{name}:{i}", prompt=_PREFIXES[task_name] + source,
                              reference=reference)
                for i, (source, reference) in enumerate(pairs))
    return tuple(e for e in examples if e.prompt not in held_out)


def register_all() -> None:
    """Registers both tasks with ``tasks.register`` (no corpus is read until a task is used)."""
    for name, factory in FACTORIES.items():
        tasks.register(name, factory)


def iterate(task_name: str, split: str, *, limit: int | None = None) -> Iterator[dict]:
    """Yields ``{"id", "inputs", "targets"}`` dicts of a split, with no TensorFlow needed.

    ``inputs`` is the prompt (prefix included), ``targets`` the reference text. Any other
    registered task whose references are texts (or HumanEval-style dicts, whose
    ``canonical_solution`` is used) works too. To feed a ``grain`` pipeline (not a
    dependency of this library), materialise a split and wrap it::

        import grain  # ``import grain.python as grain`` in releases before 0.2.8
        records = list(text_tasks.iterate("translation_en_de", "train"))
        loader = grain.MapDataset.source(records).shuffle(seed=0).batch(8)
    """
    if task_name in _EXAMPLES:
        examples = load_split(task_name, split, limit)
    else:
        examples = tasks.get_task(task_name).load(split, limit)
    for example in examples:
        reference = example.reference
        if isinstance(reference, dict):
            reference = reference["canonical_solution"]
        yield {"id": example.id, "inputs": example.prompt, "targets": reference}
