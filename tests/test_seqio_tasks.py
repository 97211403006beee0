"""The seqio Tasks build and yield examples (skipped without the seqio extra)."""

import pytest

seqio = pytest.importorskip("seqio")

from specdec_jax.data import seqio_tasks, text_tasks  # noqa: E402


@pytest.mark.parametrize("name", seqio_tasks.TASK_NAMES)
def test_each_task_reads_two_examples_of_each_split(name):
    task = seqio.get_mixture_or_task(name)
    for split in task.splits:
        dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False)
        rows = list(dataset.take(2).as_numpy_iterator())
        assert len(rows) == 2
        for row in rows:
            assert row["inputs"] and row["targets"] and row["id"]
    if name in text_tasks.SPLIT_SIZES:
        first = next(text_tasks.iterate(name, "test", limit=1))
        row = next(task.get_dataset(sequence_length=None, split="test",
                                    shuffle=False).as_numpy_iterator())
        assert row["inputs"].decode() == first["inputs"]
        assert row["targets"].decode() == first["targets"]


def test_a_vocabulary_gives_token_ids():
    names = seqio_tasks.register_all(vocabulary=seqio.ByteVocabulary(), prefix="bytes_")
    task = seqio.get_mixture_or_task(names[0])
    row = next(task.get_dataset(sequence_length=None, split="test",
                                shuffle=False).as_numpy_iterator())
    assert row["inputs"].dtype.kind == "i" and row["targets"][-1] == 1  # ends in EOS


def test_metric_functions():
    bleu = seqio_tasks._METRICS[text_tasks.TRANSLATION_TASK][0]
    assert bleu(["Das ist gut so."], ["Das ist gut so."])["bleu"] == pytest.approx(100.0)
    rouge = seqio_tasks._METRICS[text_tasks.SUMMARISATION_TASK][0]
    assert rouge(["a small tool"], ["a small tool"])["rouge2"] == pytest.approx(100.0)
