"""The evaluation tasks as seqio Tasks, for T5X-style pipelines (optional: needs seqio).

Registers ``translation_en_de``, ``summarisation_debian`` (``text_tasks``) and ``humaneval``
(the 164 problems of ``humaneval.load_problems``: inputs the prompt, targets the canonical
solution; one split, "test") with ``seqio.TaskRegistry``. Each source is a
``seqio.FunctionDataSource`` over the plain-Python iterators, so the examples, ids and fixed
splits are exactly those of ``text_tasks`` (``shuffle_files`` has nothing to shuffle: a split
is one ordered sequence; shuffle downstream if training).

Vocabulary: by default the features are raw text (``tf.string``, rank 0) under a
``seqio.PassThroughVocabulary``, because the library tokenizes prompts itself with each
checkpoint's own tokenizer and no sentencepiece model is needed to read the data. Pass a real
vocabulary (e.g. ``seqio.SentencePieceVocabulary`` of a T5 checkpoint) to
``register_all(vocabulary=...)`` to get token ids instead (``seqio.preprocessors.tokenize``
and ``append_eos``). Each example also carries its ``id``.

Install with ``pip install -e ".[seqio]"`` (pulls TensorFlow, ~2.5 GB). Importing this module
without seqio raises ImportError saying so.
"""

from __future__ import annotations

try:
    import seqio
    import tensorflow as tf
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        'specdec_jax.data.seqio_tasks needs seqio and TensorFlow: pip install -e ".[seqio]" '
        f"(missing: {err.name})") from err

from specdec_jax.data import humaneval, metrics, tasks, text_tasks

HUMANEVAL_TASK = "humaneval"
HUMANEVAL_SPLITS = ("test",)
TEXT_VOCABULARY_SIZE = 0  # PassThroughVocabulary over raw strings has no ids
_FEATURES = ("inputs", "targets")
_SIGNATURE = {key: tf.TensorSpec(shape=(), dtype=tf.string)
              for key in ("id", *_FEATURES)}


def _iterate_humaneval(split: str):
    if split not in HUMANEVAL_SPLITS:
        raise ValueError(f"unknown split {split!r} for {HUMANEVAL_TASK}; choose one of "
                         f"{', '.join(HUMANEVAL_SPLITS)}.")
    for problem in humaneval.load_problems():
        yield {"id": problem["task_id"], "inputs": problem["prompt"],
               "targets": problem["canonical_solution"]}


def _iterator(task_name: str):
    if task_name == HUMANEVAL_TASK:
        return _iterate_humaneval
    return lambda split: text_tasks.iterate(task_name, split)


def _source(task_name: str) -> seqio.FunctionDataSource:
    iterate = _iterator(task_name)

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
        del shuffle_files, seed  # one ordered sequence per split
        return tf.data.Dataset.from_generator(lambda: iterate(split),
                                              output_signature=_SIGNATURE)

    if task_name == HUMANEVAL_TASK:
        sizes = {"test": humaneval.NUM_PROBLEMS}
    else:
        sizes = dict(text_tasks.SPLIT_SIZES[task_name])
    return seqio.FunctionDataSource(dataset_fn=dataset_fn, splits=tuple(sizes),
                                    num_input_examples=sizes)


def _metric_fn(metric: tasks.Metric):
    """A seqio metric function (targets, predictions) -> {name: score} from a library metric."""

    def metric_fn(targets, predictions) -> dict[str, float]:
        examples = [tasks.Example(id=str(i), prompt="", reference=target)
                    for i, target in enumerate(targets)]
        items = metric.score_examples(list(predictions), examples)
        return {metric.name: metric.aggregate(items)}

    metric_fn.__name__ = metric.name
    return metric_fn


# pass@1 needs the sandboxed execution of the library (``metrics.PASS_AT_1``), not a seqio
# metric over strings, so HumanEval has none here.
_METRICS = {text_tasks.TRANSLATION_TASK: [_metric_fn(metrics.BLEU)],
            text_tasks.SUMMARISATION_TASK: [_metric_fn(metrics.ROUGE2)],
            HUMANEVAL_TASK: []}
TASK_NAMES = tuple(_METRICS)


def _features(vocabulary: seqio.Vocabulary | None) -> dict[str, seqio.Feature]:
    if vocabulary is None:
        text = seqio.Feature(seqio.PassThroughVocabulary(size=TEXT_VOCABULARY_SIZE),
                             add_eos=False, dtype=tf.string, rank=0)
        return {key: text for key in _FEATURES}
    return {key: seqio.Feature(vocabulary, add_eos=True) for key in _FEATURES}


def register_all(*, vocabulary: seqio.Vocabulary | None = None,
                 prefix: str = "") -> tuple[str, ...]:
    """Registers the three tasks as seqio Tasks named ``prefix + name``; returns the names.

    With ``vocabulary=None`` the features stay text; with a vocabulary they are tokenized and
    end in EOS. Registering again replaces the earlier registration (e.g. another vocabulary).
    """
    preprocessors = [] if vocabulary is None else [seqio.preprocessors.tokenize,
                                                   seqio.preprocessors.append_eos]
    names = []
    for task_name in TASK_NAMES:
        name = prefix + task_name
        if name in seqio.TaskRegistry.names():
            seqio.TaskRegistry.remove(name)
        seqio.TaskRegistry.add(name, source=_source(task_name),
                               output_features=_features(vocabulary),
                               preprocessors=preprocessors, metric_fns=_METRICS[task_name])
        names.append(name)
    return tuple(names)


# Importing the module registers the tasks, as seqio task modules conventionally do.
register_all()
