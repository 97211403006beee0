"""The bigram table's K continuations per token (``data.bigram``: int32
[V, K], best first, column 0 = the one-column table), stored in the packaged
file for Max-Gram's best-first trees; the loader's refusals; and the trees
benchmark giving its best-first trees K columns from a registry name."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import trees
from specdec_jax.data import bigram

V = 7
STREAMS = [[1, 2, 1, 3, 1, 2, 1, 4], [2, 5, 2, 5, 2, 6], [0]]


def _top_k(streams, k, vocab=V):
    top_k = np.zeros((vocab, k), np.int32)
    table, _ = bigram.build_table(streams, vocab, top_k=top_k)
    return table, top_k


def test_top_k_is_best_first_with_column_0_the_table():
    table, top_k = _top_k(STREAMS, 3)
    assert top_k.shape == (V, 3)
    np.testing.assert_array_equal(top_k[:, 0], table)
    np.testing.assert_array_equal(table, bigram.build_table(STREAMS, V)[0])
    assert top_k[1].tolist() == [2, 3, 4]  # 1 -> 2 twice, then 3 and 4 once (tie: smaller id)
    assert top_k[2].tolist() == [1, 5, 6]  # 2 -> 1 and 2 -> 5 twice (tie: smaller id), 6 once
    assert top_k[5].tolist() == [2, 2, 2]  # one continuation seen: column 0 repeated
    # Unseen as a first token: the corpus's most frequent token (2 appears 5 times).
    assert top_k[6].tolist() == [2, 2, 2] and top_k[0].tolist() == [2, 2, 2]


def test_docstring_example():
    table, top_k = _top_k([[1, 2, 1, 3, 1, 2]], 3)
    assert table[1] == 2 and top_k[1].tolist() == [2, 3, 2]


def test_packaged_table_stores_top_k_with_column_0_the_table():
    spec = bigram.TABLES["qwen2.5-coder"]
    table = bigram.load_table(spec.name)
    top_k = bigram.load_table(spec.name, spec.vocab_size, columns=bigram.TOP_K)
    assert table.shape == (spec.vocab_size,) and table.dtype == np.int32
    assert top_k.shape == (spec.vocab_size, bigram.TOP_K) and top_k.dtype == np.int32
    np.testing.assert_array_equal(top_k[:, 0], table)
    assert 0 <= top_k.min() and top_k.max() < spec.vocab_size
    np.testing.assert_array_equal(bigram.load_table(spec.name, columns=3), top_k[:, :3])
    # The counts are of real code: most tokens seen in the corpus have several
    # continuations (a column differing from column 0).
    assert np.mean(top_k[:, 1] != top_k[:, 0]) > 0.05


def test_roundtrip_and_refusals(tmp_path):
    table, top_k = _top_k(STREAMS, 4)
    path = tmp_path / "t.npz"
    bigram.save_table(table, path, top_k=top_k)
    np.testing.assert_array_equal(bigram.load_table(str(path), V), table)
    np.testing.assert_array_equal(bigram.load_table(str(path), V, columns=4), top_k)
    with pytest.raises(ValueError, match=r"K >= 5"):
        bigram.load_table(str(path), V, columns=5)
    with pytest.raises(ValueError, match="shape"):
        bigram.load_table(str(path), V + 1, columns=2)
    with pytest.raises(ValueError, match="at least 1 column"):
        bigram.load_table(str(path), V, columns=0)

    one = tmp_path / "one.npz"  # a table saved before top_k existed
    bigram.save_table(table, one)
    np.testing.assert_array_equal(bigram.load_table(str(one), V), table)
    with pytest.raises(ValueError, match=r"no 'top_k' array.*tools/bigram_topk.py"):
        bigram.load_table(str(one), V, columns=bigram.TOP_K)

    bad = top_k.copy()
    bad[1, 0] = 3  # 1's second continuation first
    with pytest.raises(ValueError, match="column 0 equal to the table"):
        bigram.save_table(table, tmp_path / "bad.npz", top_k=bad)
    with pytest.raises(ValueError, match=r"expected \(7, K\)"):
        bigram.build_table(STREAMS, V, top_k=np.zeros((V + 1, 2), np.int32))
    mismatched = tmp_path / "mismatched.npz"  # written by hand: column 0 is not the table
    np.savez_compressed(mismatched, table=table, top_k=bad)
    with pytest.raises(ValueError, match="column 0"):
        bigram.load_table(str(mismatched), V, columns=2)


def test_bare_top_k_npy_serves_chains_and_trees(tmp_path):
    table, top_k = _top_k(STREAMS, 4)
    path = tmp_path / "top4.npy"  # what tools/bigram_topk.py writes
    np.save(path, top_k)
    np.testing.assert_array_equal(bigram.load_table(str(path), V), table)
    np.testing.assert_array_equal(bigram.load_table(str(path), V, columns=2), top_k[:, :2])
    with pytest.raises(ValueError, match="token counts"):
        bigram.load_unigram(str(path), V)


def test_best_first_trees_read_top_k_from_the_registry_name():
    """The trees benchmark (and benchmarks/scripts/maxgram_replay.py) load the packaged table
    by name: best-first trees get [V, TOP_K], chains and static trees [V]."""
    spec = bigram.TABLES["qwen2.5-coder"]
    configs = trees.check_configs([
        {"drafter": "mag", "tree": tree, "temperature": 0.0, "verifiers": [verifier]}
        for tree, verifier in (("chain:4", "token"), ("2,1", "greedy"), ("trie:8,4", "greedy"))])
    assert [c.bigram_columns for c in configs] == [1, 1, bigram.TOP_K]
    tables = trees.max_gram_tables(spec.name, spec.vocab_size, configs)
    assert tables[1].shape == (spec.vocab_size,)
    assert tables[bigram.TOP_K].shape == (spec.vocab_size, bigram.TOP_K)
    np.testing.assert_array_equal(np.asarray(tables[bigram.TOP_K][:, 0]), np.asarray(tables[1]))
    drafter = trees.max_gram_tree_drafter(configs[2], spec.vocab_size)
    assert isinstance(drafter, trees.MaxGramTrieDrafter)
