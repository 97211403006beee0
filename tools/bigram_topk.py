"""A Max-Gram bigram table of K continuations per token (int32 [V, K], best
first) as a bare .npy, for best-first Max-Gram trees
(``drafting.tree.MaxGramTrieDrafter`` reads every column; chains and static
trees read column 0). The packaged table already stores K = ``bigram.TOP_K``
(its ``top_k`` array, built by ``python -m specdec_jax.data.bigram``); this
tool builds other K, or tables for another model's tokenizer.

Counted over the same corpus as the packaged table (``data.bigram``: the
Python standard library's sources, file by file) by ``bigram.build_table``:
column 0 is the packaged rule (most frequent continuation, ties to the
smaller id, unseen tokens -> the corpus's most frequent token), columns 1..
the next most frequent continuations; a token with fewer than K seen
continuations repeats its column 0 in the rest (repeated tokens vote once per
distinct token in ``count_candidates``, so the repeats only add bigram mass to
column 0's token). Example::

    python tools/bigram_topk.py --k 4 --out /tmp/qwen2.5-coder.top4.npy
    python benchmarks/scripts/maxgram_replay.py --reference ... \\
        --table /tmp/qwen2.5-coder.top4.npy --bigram-columns 4 --tree trie:32,8
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from specdec_jax.checkpoints import gguf, registry, tokenizer
from specdec_jax.data import bigram


def top_k_table(streams, vocab_size: int, k: int) -> np.ndarray:
    """int32 [V, k] (module docstring)."""
    table = np.zeros((vocab_size, k), np.int32)
    bigram.build_table(streams, vocab_size, top_k=table)
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
    spec = bigram.TABLES["qwen2.5-coder"]
    packaged = bigram.load_table(spec.name) if vocab == spec.vocab_size else None
    if packaged is not None:
        same = float(np.mean(packaged == table[:, 0]))
        print(f"column 0 equals the packaged table on {same:.4%} of tokens")
    np.save(args.out, table)
    print(f"{args.out}: [{vocab}, {args.k}], {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
