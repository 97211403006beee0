"""The greedy replay of tree decoding (``benchmarks/tree_replay.py``): for a
Max-Gram tree drafter it gives the real loop's accepted histogram and tokens,
round for round, from the target's greedy continuation alone (toy target
with an EOS token, ragged prompts, trees and a chain-shaped tree)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import tree_replay
from specdec_jax import api
from specdec_jax.drafting.tree import MaxGramTreeDrafter, MaxGramTrieDrafter, TreeShape
from specdec_jax.models import make_prompt
from tests.table_lm import TableLM

V = 12
TARGET = TableLM(V, order=2)
T_PARAMS = TARGET.init_params(jax.random.PRNGKey(3), scale=2.5)
T_TABLE = np.asarray(T_PARAMS["table"])
BIGRAM = jax.random.randint(jax.random.PRNGKey(4), (V,), 0, V)
PROMPTS = [[3, 1, 5, 9, 1, 5, 2, 7, 1, 5], [7, 2, 4], [6, 6, 1, 2, 6, 6, 1]]
MAX_NEW = 14


def greedy(prompt, length):
    out = list(prompt)
    for _ in range(length):
        out.append(int(np.argmax(T_TABLE[TARGET.context_index(tuple(out))])))
    return out[len(prompt):]


@pytest.mark.parametrize("drafter", [
    MaxGramTrieDrafter(V, num_nodes=6, depth=3, children=3, matches=8),
    MaxGramTreeDrafter(V, TreeShape.from_widths((2, 1, 1))),
    MaxGramTreeDrafter(V, TreeShape.from_widths((1, 1, 1, 1))),  # a chain
], ids=["trie", "static", "chain"])
@pytest.mark.parametrize("eos", [(), (0, 8)], ids=["no-eos", "eos"])
def test_replay_equals_the_real_loop(drafter, eos):
    decoder = api.make_decoder(target=TARGET, drafter=drafter, verifier="greedy",
                               max_new_tokens=MAX_NEW, eos_ids=eos)
    prompt = make_prompt(PROMPTS)
    out = jax.jit(decoder.generate)(T_PARAMS, BIGRAM, prompt, jax.random.PRNGKey(0),
                                    api.sampling_params(temperature=0.0))
    references = [greedy(p, MAX_NEW + 4) for p in PROMPTS]
    rows = tree_replay.replay_rows(drafter, BIGRAM, PROMPTS, references,
                                   max_new_tokens=MAX_NEW, eos_ids=eos, batch_size=2)
    assert [r["prompt"] for r in rows] == [0, 1, 2]
    hist = np.asarray(out.stats.accepted_histogram)
    for b, row in enumerate(rows):
        assert row["histogram"] == hist[b].tolist(), f"row {b}"
        assert row["tokens"] == np.asarray(out.tokens[b, :int(out.lengths[b])]).tolist()
        assert row["target_calls"] == int(out.stats.target_calls[b])
    if not eos:  # full-length rows: the toy repeats itself, drafts pay (an EOS may cut
        # the rows before any draft is accepted: 0 accepted on the static tree)
        assert sum(r["accepted"] for r in rows) > 0


def test_accepted_depth_is_the_deepest_matching_path():
    # parents [-1, -1, 0, 0, 2]: node 4 under 2 under 0.
    parents = jnp.asarray([[-1, -1, 0, 0, 2]] * 3, jnp.int32)
    tokens = jnp.asarray([[5, 6, 7, 8, 9]] * 3, jnp.int32)
    reference = jnp.asarray([[5, 7, 9, 0], [6, 1, 1, 1], [1, 5, 8, 2]], jnp.int32)
    got = tree_replay.accepted_depth(tokens, parents, reference, jnp.asarray([0, 0, 1]))
    assert got.tolist() == [3, 1, 2]


def test_replay_refuses_a_short_reference():
    drafter = MaxGramTrieDrafter(V, num_nodes=4, depth=3, children=2)
    with pytest.raises(ValueError, match="needs 17"):
        tree_replay.replay(drafter, BIGRAM, make_prompt(PROMPTS[:1]),
                           jnp.zeros((1, 16), jnp.int32), max_new_tokens=MAX_NEW)
