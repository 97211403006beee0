"""Max-Gram: longest-match semantics, which occurrence wins, the bigram
fallback, ragged batches, a full history buffer, and the bigram table builder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.api import sampling_params
from specdec_jax.data import bigram as bigram_lib
from specdec_jax.drafting import Context, MaxGramDrafter
from specdec_jax.drafting.maxgram import longest_match_next
from specdec_jax.models.interface import make_prompt
from specdec_jax.sampling import SamplingConfig

V = 10
BIGRAM = np.arange(V)[::-1].copy()  # token t -> V - 1 - t, easy to recognise
MAG = MaxGramDrafter(V, max_ngram=8)


def reference_next(text, bigram, max_ngram):
    """Plain-Python Max-Gram (maxgram.py docstring)."""
    n = len(text)
    best, best_m = 0, -1
    for m in range(n - 1):
        run = 0
        while run < max_ngram and m - run >= 0 and text[m - run] == text[n - 1 - run]:
            run += 1
        if run > 0 and run >= best:  # >=: the most recent occurrence wins ties
            best, best_m = run, m
    return text[best_m + 1] if best > 0 else int(bigram[text[-1]])


def propose(texts, num, room=4):
    width = max(len(t) for t in texts) + room
    history = np.zeros((len(texts), width), np.int32)
    for row, t in enumerate(texts):
        history[row, : len(t)] = t
    context = Context(history=jnp.asarray(history),
                      length=jnp.asarray([len(t) for t in texts], jnp.int32))
    state = MAG.init(jnp.asarray(BIGRAM), make_prompt([list(t) for t in texts]), width, False)
    proposal, _ = MAG.propose(jnp.asarray(BIGRAM), state, context, num, False,
                              jax.random.PRNGKey(0), sampling_params(), SamplingConfig())
    return np.asarray(proposal.tokens), proposal


def next_token(text, max_ngram=8):
    arr = jnp.asarray([list(text) + [0] * 3], jnp.int32)
    return int(longest_match_next(arr, jnp.asarray([len(text)]), jnp.asarray(BIGRAM),
                                  max_ngram)[0])


def test_longest_match_wins_over_shorter_and_more_recent():
    # suffix [1 2 3]: occurs (length 3) ending at m = 3; [2 3] alone also at m = 7.
    text = [5, 1, 2, 3, 4, 0, 2, 3, 6, 1, 2, 3]
    assert next_token(text) == 4
    assert reference_next(text, BIGRAM, 8) == 4


def test_most_recent_occurrence_wins_a_tie():
    # [7 8] occurs ending at m = 2 (followed by 1) and at m = 6 (followed by 2).
    text = [0, 7, 8, 1, 3, 7, 8, 2, 4, 7, 8]
    assert next_token(text) == 2


def test_no_match_falls_back_to_the_bigram():
    text = [1, 2, 3, 4]
    assert next_token(text) == BIGRAM[4] == 5


def test_runs_are_capped_at_max_ngram_then_recency_decides():
    # With max_ngram = 1 only the last token is matched: the most recent 3 wins.
    text = [1, 2, 3, 9, 0, 3, 8, 2, 3]
    assert next_token(text, max_ngram=1) == 8
    assert next_token(text, max_ngram=8) == 9  # [2 3] at m = 2 beats [3] at m = 5


def test_worked_example_copies_through_its_own_output():
    """maxgram.py docstring: [5 1 2 3 9 1 2] -> 3, then 9, then 1 2 3 ..."""
    tokens, proposal = propose([[5, 1, 2, 3, 9, 1, 2]], num=5)
    assert tokens[0].tolist() == [3, 9, 1, 2, 3]
    np.testing.assert_array_equal(np.asarray(proposal.q[0, :5]).argmax(-1), tokens[0])
    assert np.asarray(proposal.q).max(-1)[0, :5].tolist() == [1.0] * 5  # one-hot laws


def test_ragged_batch_rows_are_independent_and_match_the_reference():
    rng = np.random.default_rng(0)
    texts = [list(rng.integers(0, 4, size=n)) for n in (3, 17, 1, 30, 9)]
    batched, _ = propose(texts, num=6)
    for row, text in enumerate(texts):
        alone, _ = propose([text], num=6)
        assert batched[row].tolist() == alone[0].tolist()
        expect, t = [], list(text)
        for _ in range(6):
            expect.append(reference_next(t, BIGRAM, 8))
            t.append(expect[-1])
        assert batched[row].tolist() == expect


def test_a_full_history_buffer_is_still_read_correctly():
    """Rows whose history fills the buffer to its last slot (no room left):
    MaG's text buffer adds its own room for the proposals, so nothing is
    dropped or clamped."""
    text = [1, 2, 3, 1, 2, 3, 1, 2]
    tokens, _ = propose([text], num=4, room=0)
    t, expect = list(text), []
    for _ in range(4):
        expect.append(reference_next(t, BIGRAM, 8))
        t.append(expect[-1])
    assert tokens[0].tolist() == expect == [3, 1, 2, 3]


def test_encoder_decoder_text_is_the_prompt_then_the_output():
    """Encoder-decoder rows: the text is the encoder prompt followed by the
    decoder history without its start token (copying from the source)."""
    prompt = make_prompt([[4, 5, 6, 7], [8, 9]])
    state = MAG.init(jnp.asarray(BIGRAM), prompt, 8, True)
    history = jnp.asarray([[0, 5, 6, 0], [0, 0, 0, 0]], jnp.int32)  # start token 0
    context = Context(history=history, length=jnp.asarray([3, 1], jnp.int32))
    text, n = MAG.text(state, context, 0)
    assert np.asarray(text)[0, :6].tolist() == [4, 5, 6, 7, 5, 6]
    assert np.asarray(n).tolist() == [6, 2]
    proposal, _ = MAG.propose(jnp.asarray(BIGRAM), state, context, 2, False,
                              jax.random.PRNGKey(0), sampling_params(), SamplingConfig())
    assert np.asarray(proposal.tokens)[0].tolist() == [7, 5]


def test_bigram_table_builder_counts_within_documents():
    streams = [[1, 2, 1, 2, 1, 3], [2, 4, 2, 4], [5]]
    table, count = bigram_lib.build_table(streams, 7)
    assert count == 5 + 3
    assert table[1] == 2  # 1 -> 2 twice, 1 -> 3 once
    assert table[2] == 1  # 2 -> 1 twice, 2 -> 4 twice: a tie goes to the smaller id
    assert table[4] == 2
    assert table[6] == 2  # unseen -> the most frequent token (2 appears 4 times)
    assert table[5] == 2  # no bigram crosses from the first document into "5"


def test_bigram_table_roundtrip_and_checks(tmp_path):
    table = np.arange(V, dtype=np.int32)
    path = tmp_path / "t.npz"
    bigram_lib.save_table(table, path)
    np.testing.assert_array_equal(bigram_lib.load_table(str(path), V), table)
    with pytest.raises(ValueError, match="shape"):
        bigram_lib.load_table(str(path), V + 1)
    with pytest.raises(FileNotFoundError, match="neither a known bigram table"):
        bigram_lib.load_table(str(tmp_path / "missing.npz"))
    with pytest.raises(ValueError, match="bigram table has shape"):
        MAG.init(jnp.zeros((V + 1,), jnp.int32), make_prompt([[1]]), 4, False)


def test_packaged_table_matches_its_pinned_hash():
    spec = bigram_lib.TABLES["qwen2.5-coder"]
    table = bigram_lib.load_table("qwen2.5-coder")
    assert table.shape == (spec.vocab_size,)
    assert 0 <= table.min() and table.max() < spec.vocab_size


def test_every_tokenizer_gets_a_table_built_once_pinned_and_rebuilt_when_altered(
        tmp_path, monkeypatch, capsys):
    """'auto' picks the packaged table only for the tokenizer that made it; any
    other tokenizer (here UTF-8 bytes) gets one built from the corpus on first
    use, cached and pinned by sha256; an altered cached file is refused on load
    and rebuilt by the next 'auto'."""
    from specdec_jax.checkpoints.tokenizer import ByteTokenizer  # noqa: PLC0415

    monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path / "cache"))
    corpus = [tmp_path / "a.py", tmp_path / "b.py"]
    corpus[0].write_text("abab")
    corpus[1].write_text("ba")
    monkeypatch.setattr(bigram_lib, "stdlib_sources", lambda: corpus)
    tok = ByteTokenizer()

    class Qwen:  # the packaged table's tokenizer, by fingerprint
        fingerprint = bigram_lib.TABLES["qwen2.5-coder"].tokenizer_fingerprint

    assert bigram_lib.table_for("auto", Qwen(), 151936) == "qwen2.5-coder"
    assert bigram_lib.table_for("my.npz", tok, 256) == "my.npz"  # an explicit choice wins
    path = bigram_lib.table_for("auto", tok, 256, progress=False)
    assert "Building Max-Gram's bigram table" in capsys.readouterr().err
    table = bigram_lib.load_table(path, 256)
    expected, _ = bigram_lib.build_table([list(b"abab"), list(b"ba")], 256)
    np.testing.assert_array_equal(table, expected)
    assert table[ord("a")] == ord("b") and table[ord("b")] == ord("a")
    np.testing.assert_array_equal(bigram_lib.load_unigram(path, 256)[[97, 98]], [3, 3])

    monkeypatch.setattr(bigram_lib, "build_table", lambda *a: pytest.fail("built twice"))
    assert bigram_lib.table_for("auto", tok, 256) == path  # cached: no rebuild
    with open(path, "ab") as f:
        f.write(b"tampered")
    with pytest.raises(ValueError, match="does not match its pinned sha256"):
        bigram_lib.load_table(path, 256)
    monkeypatch.undo()
    monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bigram_lib, "stdlib_sources", lambda: corpus)
    rebuilt = bigram_lib.table_for("auto", tok, 256, progress=False)
    np.testing.assert_array_equal(bigram_lib.load_table(rebuilt, 256), expected)
