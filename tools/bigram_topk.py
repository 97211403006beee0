"""A Max-Gram bigram table of K continuations per token (int32 [V, K], best
first), for best-first Max-Gram trees (``drafting.tree.MaxGramTrieDrafter``
reads every column; chains and static trees read column 0).

Counted over the same corpus as the packaged table (``data.bigram``: the
Python standard library's sources, file by file); column 0 is the packaged
rule (most frequent continuation, ties to the smaller id, unseen tokens ->
the corpus's most frequent token), columns 1.. the next most frequent
continuations; a token with fewer than K seen continuations repeats its
column 0 in the rest (repeated tokens vote once per distinct token in
``count_candidates``, so the repeats only add bigram mass to column 0's
token). Example::

    python tools/bigram_topk.py --k 4 --out /tmp/qwen2.5-coder.top4.npy
    python tools/maxgram_replay.py --reference ... --table /tmp/qwen2.5-coder.top4.npy \\
        --tree trie:32,8
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from specdec_jax.checkpoints import gguf, registry, tokenizer
from specdec_jax.data import bigram


def top_k_table(streams, vocab_size: int, k: int) -> np.ndarray:
    """int32 [V, k] (module docstring)."""
    pair_chunks = []
    unigram = np.zeros(vocab_size, np.int64)
    for stream in streams:
        ids = np.asarray(list(stream), np.int64)
        unigram += np.bincount(ids, minlength=vocab_size)
        if ids.size > 1:
            pair_chunks.append(ids[:-1] * vocab_size + ids[1:])
    pairs, counts = np.unique(np.concatenate(pair_chunks), return_counts=True)
    first, second = pairs // vocab_size, pairs % vocab_size
    table = np.full((vocab_size, k), int(np.argmax(unigram)), np.int32)
    order = np.lexsort((second, -counts, first))  # by first, then count down, then id
    first, second = first[order], second[order]
    start = np.r_[0, np.nonzero(first[1:] != first[:-1])[0] + 1]
    rank = np.arange(len(first)) - np.repeat(start, np.diff(np.r_[start, len(first)]))
    keep = rank < k
    table[first[keep], rank[keep]] = second[keep]
    seen = np.bincount(first, minlength=vocab_size)
    for j in range(1, k):  # fewer than k continuations: repeat column 0
        table[seen <= j, j] = table[seen <= j, 0]
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    path = registry.local_path(args.model)
    reader = gguf._reader(path)
    meta = gguf.read_metadata(reader)
    names = {t.name for t in reader.tensors}
    vocab = gguf.config_from_metadata(meta, "output.weight" in names).vocab_size
    tok = tokenizer.tokenizer_from_gguf_metadata(meta)
    files = bigram.stdlib_sources()
    streams = (tok.encode(f.read_text(encoding="utf-8", errors="replace")) for f in files)
    table = top_k_table(streams, vocab, args.k)
    packaged = bigram.load_table("qwen2.5-coder") if vocab == 151936 else None
    if packaged is not None:
        same = float(np.mean(packaged == table[:, 0]))
        print(f"column 0 equals the packaged table on {same:.4%} of tokens")
    np.save(args.out, table)
    print(f"{args.out}: [{vocab}, {args.k}], {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
