"""SentencePiece vocabularies in T5's layout, trained on our own corpora.

T5 v1.1 ids: 0 = pad (also the decoder start), 1 = EOS, 2 = UNK, then the
SentencePiece pieces, then ``extra_ids`` sentinels at the very end (used by
span corruption; ``<extra_id_0>`` is the last id). A vocabulary is identified
by the sha256 of its ``.model`` file plus its number of extra ids
(``fingerprint``); training runs store it with every checkpoint, so a model
never meets a vocabulary it was not trained with.

    path = train_sentencepiece(texts, "results/spm", vocab_size=8000)
    vocab = SentencePieceVocabulary(path, extra_ids=100)
    vocab.encode("Hallo Welt")  # -> [..., ] (no EOS; add vocab.eos_id yourself)
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from collections.abc import Iterable, Sequence

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
DEFAULT_EXTRA_IDS = 100
# SentencePiece reads at most this many sentences (chosen at random) when training.
MAX_TRAINING_SENTENCES = 2_000_000


def train_sentencepiece(texts: Iterable[str], prefix: str | os.PathLike, *, vocab_size: int,
                        model_type: str = "unigram", character_coverage: float = 0.9995,
                        seed: int = 0) -> pathlib.Path:
    """Trains a SentencePiece model on ``texts`` (one sentence or line each;
    newlines inside a text are split into lines); writes ``<prefix>.model``.

    ``vocab_size`` counts the pieces including pad/EOS/UNK, not the extra ids.
    Deterministic for the same texts and seed (single-threaded on purpose:
    SentencePiece's multi-threaded trainer is not).
    """
    import sentencepiece as spm  # noqa: PLC0415

    prefix = pathlib.Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    lines = [line for text in texts for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("no text to train a vocabulary on; check the corpora.")
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=vocab_size,
        model_type=model_type, character_coverage=character_coverage,
        pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        input_sentence_size=MAX_TRAINING_SENTENCES, shuffle_input_sentence=True,
        num_threads=1, minloglevel=2, byte_fallback=True)
    # The model records where it was written; clear that so the file (and its
    # sha256, the vocabulary's identity) depends on the texts and settings only.
    from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415

    path = pathlib.Path(f"{prefix}.model")  # SentencePiece appends, never replaces
    proto = sentencepiece_model_pb2.ModelProto.FromString(path.read_bytes())
    proto.trainer_spec.model_prefix = ""
    path.write_bytes(proto.SerializeToString())
    return path


class SentencePieceVocabulary:
    """encode / decode over a SentencePiece model, with T5's sentinels."""

    def __init__(self, model_path: str | os.PathLike, extra_ids: int = DEFAULT_EXTRA_IDS):
        import sentencepiece as spm  # noqa: PLC0415

        path = pathlib.Path(model_path)
        if not path.exists():
            raise FileNotFoundError(f"no SentencePiece model at {path}; train one with "
                                    "specdec_jax.data.vocabulary.train_sentencepiece.")
        data = path.read_bytes()
        self.path = path
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.extra_ids = extra_ids
        self._sp = spm.SentencePieceProcessor(model_proto=data)
        if (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id()) != (PAD_ID, EOS_ID, UNK_ID):
            raise ValueError(f"{path} does not use T5's special ids (pad 0, eos 1, unk 2); "
                             "train it with train_sentencepiece.")

    @property
    def base_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def vocab_size(self) -> int:
        return self.base_size + self.extra_ids

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return (EOS_ID,)

    @property
    def fingerprint(self) -> str:
        return f"sentencepiece:{self.sha256}+{self.extra_ids}"

    def sentinel(self, index: int) -> int:
        """``<extra_id_{index}>``: counted down from the last id, as in T5."""
        if not 0 <= index < self.extra_ids:
            raise ValueError(f"sentinel {index} outside the {self.extra_ids} extra ids.")
        return self.vocab_size - 1 - index

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` up to the first EOS; pad and sentinels are dropped."""
        ids = list(ids)
        if EOS_ID in ids:
            ids = ids[:ids.index(EOS_ID)]
        return self._sp.decode([i for i in ids if PAD_ID < i < self.base_size])
