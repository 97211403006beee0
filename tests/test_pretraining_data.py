"""Span corruption (T5's objective) and SentencePiece vocabularies in T5's layout."""

import numpy as np
import pytest

from specdec_jax.data import span_corruption as sc
from specdec_jax.data import vocabulary

VOCAB, SENTINELS = 500, 50


@pytest.mark.parametrize("length", [2, 3, 10, 57, 200])
def test_span_corruption_is_invertible_and_drops_15_percent(length):
    rng = np.random.default_rng(length)
    tokens = rng.integers(3, VOCAB - SENTINELS, length).tolist()
    for _ in range(20):
        inputs, targets = sc.span_corrupt(tokens, rng, vocab_size=VOCAB, num_sentinels=SENTINELS)
        assert sc.uncorrupt(inputs, targets, vocab_size=VOCAB, num_sentinels=SENTINELS) == tokens
        sentinels = [t for t in targets if t >= VOCAB - SENTINELS]
        noise = len(targets) - len(sentinels)
        assert noise == min(max(round(length * 0.15), 1), length - 1)
        # sentinels count down from the last id, in order, once per span
        assert sentinels == list(range(VOCAB - 1, VOCAB - 1 - len(sentinels), -1))
        assert [t for t in inputs if t >= VOCAB - SENTINELS] == sentinels


def test_span_lengths_average_three_and_spans_are_not_adjacent():
    rng = np.random.default_rng(0)
    lengths, first_noisy = [], 0
    for _ in range(300):
        mask = sc.noise_mask(100, rng)
        runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]]).astype(int))))
        lengths += runs[::2].tolist()  # noise runs (mask starts with a kept run)
        first_noisy += bool(mask[0])
    # 15 noise tokens in round(15 / 3) = 5 spans: mean exactly 3 per sequence
    assert np.mean(lengths) == pytest.approx(3.0)
    assert first_noisy == 0  # T5 starts with non-noise, so no span touches the start
    assert min(lengths) >= 1 and max(lengths) > 3  # random, not fixed, lengths


def test_span_corruption_errors_name_the_problem():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="2 or more tokens"):
        sc.span_corrupt([5], rng, vocab_size=VOCAB, num_sentinels=SENTINELS)
    with pytest.raises(ValueError, match="already contains sentinel ids"):
        sc.span_corrupt([5, VOCAB - 1, 6, 7], rng, vocab_size=VOCAB, num_sentinels=SENTINELS)
    with pytest.raises(ValueError, match="more than the vocabulary's 2 sentinels"):
        sc.span_corrupt(list(range(3, 203)), rng, vocab_size=VOCAB, num_sentinels=2)
    with pytest.raises(ValueError, match="noise_density must be in"):
        sc.noise_mask(10, rng, noise_density=0.0)


TEXTS = ["The quick brown fox jumps over the lazy dog.",
         "Der schnelle braune Fuchs springt über den faulen Hund.",
         "def add(x, y):\n    return x + y"] * 30


def test_sentencepiece_vocabulary_in_t5_layout(tmp_path):
    first = vocabulary.train_sentencepiece(TEXTS, tmp_path / "a", vocab_size=300)
    again = vocabulary.train_sentencepiece(TEXTS, tmp_path / "b", vocab_size=300)
    vocab = vocabulary.SentencePieceVocabulary(first, extra_ids=10)
    assert vocab.sha256 == vocabulary.SentencePieceVocabulary(again, 10).sha256  # deterministic
    assert (vocab.base_size, vocab.vocab_size) == (300, 310)
    assert vocab.sentinel(0) == 309 and vocab.sentinel(9) == 300
    ids = vocab.encode("Der schnelle Fuchs")
    assert min(ids) > vocabulary.UNK_ID and max(ids) < vocab.base_size
    # decode stops at EOS and drops pad and sentinels
    assert vocab.decode([0, *ids, vocab.sentinel(3), vocabulary.EOS_ID, *ids]) == \
        "Der schnelle Fuchs"
    assert vocab.fingerprint.endswith("+10")
    with pytest.raises(FileNotFoundError, match="train one with"):
        vocabulary.SentencePieceVocabulary(tmp_path / "missing.model")


def test_pack_joins_documents_with_eos_and_reports_the_rest():
    from specdec_jax.data import pretraining  # noqa: PLC0415

    rows, rest = pretraining.pack([[5, 6, 7], [8], [9, 10]], length=4, eos_id=1)
    assert rows == [[5, 6, 7, 1], [8, 1, 9, 10]] and rest == 1  # the final EOS
    with pytest.raises(ValueError, match="length of 2 or more"):
        pretraining.pack([[5]], length=1, eos_id=1)


@pytest.mark.parametrize("source", ["gcide", "libc-de", "python"])
def test_pretraining_corpora_have_their_recorded_sizes(source):
    """Pinned .debs (sha256-checked on fetch) give the recorded record counts."""
    from specdec_jax.data import corpora, pretraining  # noqa: PLC0415

    docs = list(pretraining.SOURCES[source]())
    assert len(docs) == corpora.CORPORA[source].records
    assert all(doc.strip() for doc in docs)
    if source == "libc-de":
        assert any("Datei" in doc for doc in docs)  # German
    if source == "gcide":
        assert not any("\ufffd" in doc for doc in docs)  # the cp1252 bytes were read as such
    with pytest.raises(ValueError, match="unknown pre-training source"):
        next(pretraining.documents(["c4"]))
