"""Pre-training text (English, German, Python) from pinned Debian packages.

T5's recipe pre-trains with span corruption on unlabelled text before
fine-tuning; no C4 is reachable here, so the text comes from the Debian
archive, fetched and pinned like the task corpora (``corpora.fetch_deb``):

- ``gcide``: *The Collaborative International Dictionary of English* (dict-gcide;
  Webster's 1913 + WordNet glosses), English prose, one entry paragraph a document;
- ``libc-de``: the German message catalogue of the GNU C library (libc-l10n), one
  translated message a document;
- ``translation-train`` / ``summarisation-train``: both sides of the *train* splits of the
  evaluation tasks (never their validation or test examples, which the studies score);
- ``python``: the CPython 3.11 test suite sources (libpython3.11-testsuite), one file a
  document.

Documents are packed for training by ``pack``: tokenised, each followed by
EOS, concatenated, and cut into rows of a fixed length (T5's packing; the
objective sees every token exactly once per epoch, nothing is dropped but the
final partial row, whose size is reported).
"""

from __future__ import annotations

import codecs
import gzip
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

from specdec_jax.data import corpora, text_tasks

DICT_GCIDE, LIBC_L10N, PYTHON_TESTSUITE = (corpora.DICT_GCIDE, corpora.LIBC_L10N,
                                            corpora.PYTHON_TESTSUITE)

MIN_PARAGRAPH_WORDS = 8  # gcide: shorter paragraphs are headwords and cross-references
_MARKUP = re.compile(r"\{[^}]*\}|\[[^\]]*\]")  # dict markup: {links}, [etymologies]


def _cp1252_fallback(error: UnicodeDecodeError) -> tuple[str, int]:
    bad = error.object[error.start:error.end]
    return bad.decode("cp1252", errors="replace"), error.end


# gcide 0.48.5 is UTF-8 except for three Windows-1252 apostrophes (0x92): read those as such.
codecs.register_error("specdec_jax_cp1252", _cp1252_fallback)


def gcide_documents() -> Iterator[str]:
    root = corpora.fetch_deb(DICT_GCIDE)
    text = gzip.decompress((root / "usr/share/dictd/gcide.dict.dz").read_bytes()).decode(
        "utf-8", errors="specdec_jax_cp1252")
    for paragraph in re.split(r"\n\s*\n", text):
        words = _MARKUP.sub("", paragraph).split()
        if len(words) >= MIN_PARAGRAPH_WORDS and not words[0].startswith("00-database"):
            yield " ".join(words)


def libc_german_documents() -> Iterator[str]:
    root = corpora.fetch_deb(LIBC_L10N)
    catalog = corpora.message_catalog(root / "usr/share/locale/de/LC_MESSAGES/libc.mo")
    for msgid, msgstr in sorted(catalog.items(), key=lambda item: str(item[0])):
        if msgid and isinstance(msgstr, str) and msgstr.strip():
            yield msgstr.strip()


def python_documents() -> Iterator[str]:
    root = corpora.fetch_deb(PYTHON_TESTSUITE)
    for path in sorted((root / "usr/lib/python3.11/test").rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            yield text


def task_train_documents(task_name: str) -> Iterator[str]:
    for example in text_tasks.load_split(task_name, "train"):
        yield example.prompt.split(":", 1)[-1].strip()  # the task prefix is not text
        yield example.reference


SOURCES: dict[str, Callable[[], Iterator[str]]] = {
    "gcide": gcide_documents,
    "libc-de": libc_german_documents,
    "translation-train": lambda: task_train_documents(text_tasks.TRANSLATION_TASK),
    "summarisation-train": lambda: task_train_documents(text_tasks.SUMMARISATION_TASK),
    "python": python_documents,
}


def documents(sources: Sequence[str] = tuple(SOURCES)) -> Iterator[tuple[str, str]]:
    """(source, document) pairs of the named sources, in a fixed order."""
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise ValueError(f"unknown pre-training source(s) {unknown}; choose from "
                         f"{', '.join(SOURCES)}.")
    for source in sources:
        for document in SOURCES[source]():
            yield source, document


def pack(token_lists: Iterable[Sequence[int]], *, length: int, eos_id: int
         ) -> tuple[list[list[int]], int]:
    """Rows of exactly ``length`` tokens from documents joined by EOS; returns
    the rows and the number of tokens left over in the final partial row."""
    if length < 2:
        raise ValueError(f"packed rows need a length of 2 or more, got {length}.")
    rows, current = [], []
    for tokens in token_lists:
        current.extend(tokens)
        current.append(eos_id)
        while len(current) >= length:
            rows.append(current[:length])
            current = current[length:]
    return rows, len(current)
