"""Bigram tables for Max-Gram's no-match fallback: the most likely next token
of every token id, counted over a real corpus.

The same file stores the corpus's token counts (``load_unigram``), which rank
the tokens a drafter's restricted output head keeps (``drafting.head_vocab``),
and the ``TOP_K`` most likely continuations of every token, best first
(``load_table(..., columns=K)``: int32 [V, K], column 0 = the one-column
table), which Max-Gram's best-first trees (``drafting.tree.MaxGramTrieDrafter``)
read; chains and static trees read the one-column table.

Build (documented command; prints the sha256 to pin in ``TABLES``)::

    python -m specdec_jax.data.bigram --model qwen2.5-coder-0.5b \\
        --out specdec_jax/data/packaged/qwen2.5-coder.stdlib.npz

Any other tokenizer gets its table built on first use from the same corpus
(``table_for``: about 20 s on 2 cores), cached under the cache directory
keyed by the tokenizer's fingerprint and the Python version, and pinned by a
sha256 written beside it (checked on every load, like converted weights).

The corpus for the code pair is the Python standard library's own sources
(``sysconfig`` stdlib path, ``*.py`` outside ``site-packages`` and test
directories; PSF licence), tokenized file by file (no bigram crosses a file
boundary). Ties go to the smaller token id; a token never seen in the corpus
falls back to the corpus's most frequent token; a token seen before fewer than
K distinct tokens repeats its first continuation in the remaining columns
(``count_candidates`` counts a repeated token once). Tables ship with the package
and are checked against their pinned sha256 and vocabulary size when loaded,
like the weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import pathlib
import sys
import sysconfig
from collections.abc import Iterable, Sequence

import numpy as np

from specdec_jax.checkpoints import fetch, gguf, registry, tokenizer
from specdec_jax.drafting import head_vocab
from specdec_jax.runtime.progress import tqdm

TABLE_DIR = pathlib.Path(__file__).parent / "packaged"
AUTO = "auto"  # the packaged table for its tokenizer, else one built on first use
CACHE_SUBDIR = "bigram"
SHA256_SUFFIX = ".sha256"
TOP_K = 8  # continuations per token stored beside the table (best-first Max-Gram trees)
TOP_K_KEY = "top_k"  # the npz array that holds them


@dataclasses.dataclass(frozen=True)
class BigramSpec:
    name: str
    filename: str
    sha256: str
    vocab_size: int
    tokenizer: str  # the registry model whose tokenizer made it
    tokenizer_fingerprint: str  # its fingerprint (checkpoints.tokenizer): who may use it
    corpus: str  # source, licence, size


TABLES: dict[str, BigramSpec] = {spec.name: spec for spec in (
    BigramSpec(
        name="qwen2.5-coder",
        filename="qwen2.5-coder.stdlib.npz",
        sha256="cdf65dac49b1f7623a3e9818d61d93dd6dc59241aeb90d4d85abc1230afa8253",
        vocab_size=151936,
        tokenizer="qwen2.5-coder-0.5b",
        tokenizer_fingerprint="2234fef7b1b52e29",
        corpus="CPython 3.11.7 standard library, 734 *.py files outside site-packages and "
               "test directories (PSF licence), 3,059,543 bigrams"),
)}


def build_table(streams: Iterable[Iterable[int]], vocab_size: int,
                unigram: np.ndarray | None = None,
                top_k: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """(table int32 [V], bigrams counted) from token streams (one per document).
    ``unigram`` (int64 [V], optional) receives the token counts; ``top_k``
    (int32 [V, K], optional) the K most frequent continuations of every token,
    best first (column 0 = the table; a token followed by fewer than K distinct
    tokens repeats column 0 in the rest). E.g. the streams [1, 2, 1, 3, 1, 2]
    give table[1] = 2 and, with K = 3, top_k[1] = [2, 3, 2]."""
    if top_k is not None and (top_k.ndim != 2 or top_k.shape[0] != vocab_size
                              or top_k.shape[1] < 1):
        raise ValueError(f"top_k has shape {top_k.shape}; expected ({vocab_size}, K), K >= 1.")
    pair_chunks = []
    unigram = np.zeros(vocab_size, np.int64) if unigram is None else unigram
    for stream in streams:
        ids = np.asarray(list(stream), np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token id outside [0, {vocab_size}) in the corpus; wrong "
                             "tokenizer for this vocabulary?")
        unigram += np.bincount(ids, minlength=vocab_size)
        if ids.size > 1:
            pair_chunks.append(ids[:-1] * vocab_size + ids[1:])
    pairs, counts = np.unique(np.concatenate(pair_chunks or [np.zeros(0, np.int64)]),
                              return_counts=True)
    first, second = pairs // vocab_size, pairs % vocab_size
    table = np.full(vocab_size, int(np.argmax(unigram)), np.int32)
    # Sort by (first, -count, second): each `first` group runs best first.
    order = np.lexsort((second, -counts, first))
    first, second = first[order], second[order]
    starts = np.flatnonzero(np.r_[True, first[1:] != first[:-1]]) if first.size else first
    table[first[starts]] = second[starts]
    if top_k is not None:
        top_k[:] = table[:, None]  # unfilled columns repeat column 0
        # A pair's rank within its group: [1,1,1,4,4] -> [0,1,2,0,1].
        rank = np.arange(first.size) - np.repeat(starts, np.diff(np.r_[starts, first.size]))
        keep = rank < top_k.shape[1]
        top_k[first[keep], rank[keep]] = second[keep]
    return table, int(counts.sum())


def table_for(name_or_path: str, tok, vocab_size: int, *, progress: bool = True) -> str:
    """What ``load_table`` / ``load_unigram`` should read for a model with the
    tokenizer ``tok``: ``name_or_path`` itself, unless it is ``"auto"``: then the
    packaged table made with this tokenizer, or else a table built for it from
    the standard library on first use (and cached)."""
    if name_or_path != AUTO:
        return name_or_path
    for spec in TABLES.values():
        if spec.tokenizer_fingerprint == tok.fingerprint and spec.vocab_size == vocab_size:
            return spec.name
    return str(cached_table(tok, vocab_size, progress=progress))


def cached_table(tok, vocab_size: int, *, progress: bool = True) -> pathlib.Path:
    """The cached table of the tokenizer ``tok`` over this Python's standard library,
    built (and pinned by sha256) when absent or when its file no longer
    matches its pin."""
    version = ".".join(map(str, sys.version_info[:3]))
    path = (fetch.cache_dir() / CACHE_SUBDIR /
            f"stdlib-py{version}-{tok.fingerprint}-v{vocab_size}-top{TOP_K}.npz")
    pin = path.with_name(path.name + SHA256_SUFFIX)
    if path.is_file() and pin.is_file() and _sha256(path) == pin.read_text().strip():
        return path
    with fetch.cache_lock(f"bigram-{path.stem}"):  # two processes would share one .tmp
        if path.is_file() and pin.is_file() and _sha256(path) == pin.read_text().strip():
            return path
        return _build_cached_table(tok, vocab_size, path, pin, version, progress)


def _build_cached_table(tok, vocab_size: int, path: pathlib.Path, pin: pathlib.Path,
                        version: str, progress: bool) -> pathlib.Path:
    files = stdlib_sources()
    print(f"Building Max-Gram's bigram table for this tokenizer ({vocab_size} tokens; not the "
          f"packaged one) from the Python {version} standard library ({len(files)} files; "
          f"about 20 s on 2 cores, once) into {path}.", file=sys.stderr)
    streams = (tok.encode(f.read_text(encoding="utf-8", errors="replace"))
               for f in tqdm(files, desc="tokenize stdlib", unit="file", disable=not progress))
    unigram = np.zeros(vocab_size, np.int64)
    top_k = np.zeros((vocab_size, TOP_K), np.int32)
    table, _ = build_table(streams, vocab_size, unigram, top_k)
    tmp = path.with_name(path.name + ".tmp")
    digest = save_table(table, tmp, unigram, top_k)
    os.replace(tmp, path)  # a killed build leaves no half table under the real name
    pin.write_text(digest + "\n")
    return path


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stdlib_sources() -> list[pathlib.Path]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))


def save_table(table: np.ndarray, path: os.PathLike, unigram: np.ndarray | None = None,
               top_k: np.ndarray | None = None) -> str:
    """Writes the table (and the corpus's token counts and the top-K
    continuations [V, K], when given; compressed) and returns the file's sha256."""
    path = pathlib.Path(path)
    if top_k is not None and (top_k.shape[:1] != table.shape or top_k.ndim != 2
                              or not np.array_equal(top_k[:, 0], table)):
        raise ValueError(f"top_k (shape {top_k.shape}) must be [V, K] with column 0 equal to "
                         f"the table (shape {table.shape}).")
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {"table": table.astype(np.int32)}
    if unigram is not None:
        arrays["unigram"] = unigram.astype(np.int64)
    if top_k is not None:
        arrays[TOP_K_KEY] = top_k.astype(np.int32)
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    return _sha256(path)


def load_table(name_or_path: str, vocab_size: int | None = None, *,
               columns: int = 1) -> np.ndarray:
    """A bigram table by registry name (sha256-checked) or path (.npz/.npy):
    int32 [V] (one continuation per token: chains, static trees) by default;
    with ``columns`` = K > 1, int32 [V, K], every token's K most likely
    continuations best first (``MaxGramTrieDrafter``; column 0 = the [V] table).
    A bare .npy of shape [V, K] (``tools/bigram_topk.py``) serves both."""
    if columns < 1:
        raise ValueError(f"columns={columns}: a bigram table has at least 1 column.")
    if columns == 1:
        return _load(name_or_path, "table", vocab_size).astype(np.int32)
    return _load(name_or_path, TOP_K_KEY, vocab_size, columns).astype(np.int32)


def load_unigram(name_or_path: str, vocab_size: int | None = None) -> np.ndarray:
    """The token counts of the table's corpus (int64 [V]), stored in the same
    file (``drafting.head_vocab`` ranks a drafter's output head with them)."""
    return _load(name_or_path, "unigram", vocab_size).astype(np.int64)


def restrict_head(model, params, size: int, *, eos_ids: Sequence[int] = (),
                  table: str = "qwen2.5-coder"):
    """``drafting.head_vocab.restrict`` ranked by ``table``'s corpus counts (a
    name or path; ``table_for`` picks one for a tokenizer): the drafter's
    output head cut to the ``size`` most frequent tokens (0: unchanged)."""
    if not size:
        return model, params
    head_vocab.check_decoder(model)
    return head_vocab.restrict(model, params, size, eos_ids=eos_ids,
                               counts_V=load_unigram(table, model.vocab_size))


def _resolve(name_or_path: str) -> tuple[pathlib.Path, int | None]:
    """(file, its registered vocabulary size or None): a registry name checked
    against its pinned sha256, a path against the pin beside it (if any)."""
    if name_or_path in TABLES:
        spec = TABLES[name_or_path]
        path = TABLE_DIR / spec.filename
        if not path.is_file():
            raise FileNotFoundError(f"bigram table {path} is missing from the package; "
                                    f"rebuild it: python -m specdec_jax.data.bigram "
                                    f"--model {spec.tokenizer} --out {path}")
        digest = _sha256(path)
        if digest != spec.sha256:
            raise ValueError(f"bigram table {path} has sha256 {digest}, expected "
                             f"{spec.sha256} (altered file); restore it from the package.")
        return path, spec.vocab_size
    path = pathlib.Path(name_or_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{name_or_path!r} is neither a known bigram table "
                                f"({', '.join(TABLES)}) nor a file.")
    pin = path.with_name(path.name + SHA256_SUFFIX)
    if pin.is_file() and _sha256(path) != pin.read_text().strip():
        raise ValueError(f"bigram table {path} does not match its pinned sha256 ({pin}); "
                         "delete both files to rebuild it.")
    return path, None


def _load(name_or_path: str, key: str, vocab_size: int | None,
          columns: int | None = None) -> np.ndarray:
    """The array ``key`` of a table file, its shape checked: [V], or [V, K]
    cut to its first ``columns`` for ``TOP_K_KEY``."""
    path, expected = _resolve(name_or_path)
    loaded = np.load(path)
    if not isinstance(loaded, np.lib.npyio.NpzFile):  # a bare table: [V] or [V, K]
        if key == "unigram":
            raise ValueError(f"{path} holds a bare table without token counts; rebuild it "
                             "with python -m specdec_jax.data.bigram.")
        if key == "table" and loaded.ndim == 2:
            loaded = loaded[:, 0]  # a [V, K] table's first column is the [V] one
        arrays = {key: loaded}
    else:
        arrays = loaded
    if key not in arrays:
        if key == TOP_K_KEY:
            raise ValueError(
                f"{path} holds one continuation per token (no '{TOP_K_KEY}' array); Max-Gram's "
                f"best-first trees read {columns}. Rebuild it with every array: python -m "
                f"specdec_jax.data.bigram --model MODEL --out {path} (K = {TOP_K}); or build "
                f"a [V, K] table with python tools/bigram_topk.py --model MODEL --k {columns} "
                "--out FILE.npy and pass that file.")
        raise ValueError(f"{path} has no '{key}' array; rebuild it with python -m "
                         "specdec_jax.data.bigram.")
    table = arrays[key]
    if key == TOP_K_KEY:
        if table.ndim != 2 or table.shape[1] < columns:
            raise ValueError(f"bigram table {path} has shape {table.shape}; expected [V, K] "
                             f"with K >= {columns} continuations per token.")
        if "table" in arrays and not np.array_equal(table[:, 0], arrays["table"]):
            raise ValueError(f"bigram table {path}: column 0 of '{TOP_K_KEY}' differs from "
                             "'table'; rebuild it with python -m specdec_jax.data.bigram.")
        table = table[:, :columns]
    for want in (expected, vocab_size):
        shape = (want,) if key != TOP_K_KEY else (want, columns)
        if want is not None and table.shape != shape:
            raise ValueError(f"bigram table {path} has shape {table.shape}, expected "
                             f"{shape} for this vocabulary.")
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b",
                        help="registry model (or .gguf) whose tokenizer and vocabulary to use")
    parser.add_argument("--out", required=True)
    parser.add_argument("--top-k", type=int, default=TOP_K,
                        help="continuations per token stored as 'top_k' (best-first trees)")
    args = parser.parse_args(argv)

    path = registry.local_path(args.model) if args.model in registry.MODELS else args.model
    reader = gguf._reader(path)
    meta = gguf.read_metadata(reader)
    names = {t.name for t in reader.tensors}
    vocab = gguf.config_from_metadata(meta, "output.weight" in names).vocab_size
    tok = tokenizer.tokenizer_from_gguf_metadata(meta)
    files = stdlib_sources()
    streams = (tok.encode(f.read_text(encoding="utf-8", errors="replace"))
               for f in tqdm(files, desc="tokenize stdlib", unit="file"))
    unigram = np.zeros(vocab, np.int64)
    top_k = np.zeros((vocab, args.top_k), np.int32)
    table, count = build_table(streams, vocab, unigram, top_k)
    digest = save_table(table, args.out, unigram, top_k)
    print(f"{args.out}: vocab {vocab}, top {args.top_k}, {len(files)} files, {count} bigrams, "
          f"Python {sys.version.split()[0]} stdlib, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
