"""Tree drafters (``drafting/tree.py``; docs/algorithms.md, 'Token trees'): shapes and
topological order, children without replacement, T = 0 children = the
drafter's top-k, every node's law = the drafter's at that node's context, a
width-1 static tree = today's chain for the same key, EAGLE-2 expansion by
path probability, and Max-Gram trees from every n-gram match."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.api import sampling_params
from specdec_jax.drafting import MaxGramDrafter, ModelDrafter
from specdec_jax.drafting.base import Context
from specdec_jax.drafting.tree import (
    DynamicTreeDrafter,
    MaxGramTreeDrafter,
    MaxGramTrieDrafter,
    StaticTreeDrafter,
    TreeShape,
    count_candidates,
    ranked_candidates,
)
from specdec_jax.models import DecoderConfig, DecoderOnlyLM, make_prompt
from specdec_jax.sampling import POINT_MASS, SamplingConfig
from tests.table_lm import TableLM

V = 16
MAX_LENGTH = 48
PROMPTS = [[3, 1, 5, 9, 1, 5], [7, 2, 4]]
TOY = TableLM(V, order=2)
TOY_PARAMS = TOY.init_params(jax.random.PRNGKey(5))
TOY_TABLE = np.asarray(TOY_PARAMS["table"], np.float64)


def _toy_law(context):
    """The toy drafter's next-token law on the host (``TableLM.next_probs``)."""
    row = TOY_TABLE[TOY.context_index(context)]
    e = np.exp(row - row.max())
    return e / e.sum()
CONFIG = SamplingConfig()


def _start(drafter, params, prompts=PROMPTS):
    prompt = make_prompt(prompts)
    state = drafter.init(params, prompt, MAX_LENGTH, False)
    history = jnp.pad(prompt.tokens, ((0, 0), (0, MAX_LENGTH - prompt.tokens.shape[1])))
    return state, Context(history=history, length=prompt.lengths)


def _propose(drafter, params, temperature, key=0, with_next=True):
    state, context = _start(drafter, params)
    return _jitted(drafter, with_next)(params, state, context, jax.random.PRNGKey(key),
                                       sampling_params(temperature=temperature))[0]


@functools.lru_cache(maxsize=None)  # one compilation per drafter: sp is traced
def _jitted(drafter, with_next, num=None):
    if num is None:
        return jax.jit(lambda params, state, context, key, sp: drafter.propose_tree(
            params, state, context, with_next, key, sp, CONFIG))
    return jax.jit(lambda params, state, context, key, sp: drafter.propose(
        params, state, context, num, with_next, key, sp, CONFIG))


def _path_tokens(proposal, b, i):
    par, tok = np.asarray(proposal.parents[b]), np.asarray(proposal.tokens[b])
    path = []
    while i >= 0:
        path.append(int(tok[i]))
        i = int(par[i])
    return path[::-1]


def _check_tree(proposal, n):
    batch = len(PROMPTS)
    assert proposal.tokens.shape == proposal.parents.shape == (batch, n)
    assert proposal.q.shape == (batch, n + 1, V)
    par = np.asarray(proposal.parents)
    assert (par < np.arange(n)).all() and (par >= -1).all()  # topological
    assert (np.diff(par, axis=1) >= 0).all()  # depth by depth, siblings contiguous
    tok = np.asarray(proposal.tokens)
    for b in range(batch):
        for p in set(par[b].tolist()):
            kids = tok[b][par[b] == p]
            assert len(set(kids.tolist())) == len(kids), f"duplicate siblings in row {b}"


def test_tree_shape_from_widths():
    shape = TreeShape.from_widths((3, 2, 1))
    assert shape.num_nodes == 3 + 6 + 6 and shape.depth == 3
    assert shape.parents[:5] == (-1, -1, -1, 0, 0) and shape.parents[-1] == 8
    assert shape.levels == ((0, 3), (3, 9), (9, 15))
    with pytest.raises(ValueError, match="non-decreasing"):
        TreeShape((-1, 0, -1))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_tree_laws_are_the_drafters_at_every_node(temperature):
    """Shapes, order, distinct siblings, and q[1 + i] = the drafter's law at
    node i's context (each depth scored by one score_tree call)."""
    shape = TreeShape.from_widths((3, 2, 1, 1))
    drafter = StaticTreeDrafter(TOY, shape, name="toy")
    for key in range(2):
        proposal = _propose(drafter, TOY_PARAMS, temperature, key)
        _check_tree(proposal, shape.num_nodes)
        assert proposal.calls.tolist() == [[1 + shape.depth]] * 2
        for b, prompt in enumerate(PROMPTS):
            for i in range(-1, shape.num_nodes):
                context = tuple(prompt) + tuple(_path_tokens(proposal, b, i) if i >= 0 else [])
                law = _toy_law(context)
                if temperature == 0:
                    law = np.eye(V)[np.argmax(law)]
                np.testing.assert_allclose(np.asarray(proposal.q[b, i + 1]), law, atol=1e-5)
                kids = np.asarray(proposal.tokens[b])[np.asarray(proposal.parents[b]) == i]
                assert (law[kids] > 0).all() or temperature == 0
                if temperature == 0:  # children = the drafter's top-k, best first
                    full = _toy_law(context)
                    np.testing.assert_array_equal(kids, np.argsort(-full)[:len(kids)])


def test_children_are_drawn_without_replacement():
    """Gumbel-top-k: the root's first child ~ q, the second ~ q without the
    first (renormalised); checked by frequencies over many keys."""
    shape = TreeShape.from_widths((2,))
    drafter = StaticTreeDrafter(TOY, shape, name="toy")
    state, context = _start(drafter, TOY_PARAMS, [[3, 1]])
    run = jax.jit(jax.vmap(lambda key: drafter.propose_tree(
        TOY_PARAMS, state, context, False, key, sampling_params(temperature=1.0),
        CONFIG)[0].tokens[0]))
    draws = np.asarray(run(jax.random.split(jax.random.PRNGKey(0), 20_000)))
    q = _toy_law((3, 1))
    assert (draws[:, 0] != draws[:, 1]).all()
    first = np.bincount(draws[:, 0], minlength=V) / len(draws)
    second = np.bincount(draws[:, 1], minlength=V) / len(draws)
    want_second = sum(q[a] * np.where(np.arange(V) == a, 0, q) / (1 - q[a]) for a in range(V))
    np.testing.assert_allclose(first, q, atol=0.012)
    np.testing.assert_allclose(second, want_second, atol=0.012)


@functools.lru_cache(maxsize=None)
def _small_decoder():
    cfg = DecoderConfig(vocab_size=V, hidden_size=16, intermediate_size=16, num_layers=1,
                        num_heads=2, num_kv_heads=1)
    model = DecoderOnlyLM(cfg)
    return model, model.init_params(jax.random.PRNGKey(2))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("which", ["toy", "decoder"])
def test_a_width_one_static_tree_is_the_chain(which, temperature):
    model, params = (TOY, TOY_PARAMS) if which == "toy" else _small_decoder()
    chain = ModelDrafter(model, name="d", catch_up_widths=(1,))
    tree = StaticTreeDrafter(model, TreeShape.from_widths((1,) * 4), name="d",
                             catch_up_widths=(1,))
    state, context = _start(chain, params)
    sp = sampling_params(temperature=temperature)
    for key in range(2):
        k = jax.random.PRNGKey(key)
        want = _jitted(chain, True, 4)(params, state, context, k, sp)[0]
        got = _jitted(tree, True)(params, state, context, k, sp)[0]
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
        np.testing.assert_array_equal(np.asarray(got.parents), [[-1, 0, 1, 2]] * 2)
        np.testing.assert_allclose(np.asarray(got.q), np.asarray(want.q), atol=1e-5)
        np.testing.assert_array_equal(np.asarray(got.calls), np.asarray(want.calls))


@pytest.mark.parametrize(("depth", "with_next"), [(3, True), (5, True), (5, False)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_dynamic_tree_expands_the_most_probable_paths(temperature, depth, with_next):
    """Every node's law is the drafter's at its context (the last depth's
    only with ``with_next``, else zero), and each depth's ``expand`` most probable nodes
    get the children. Depths 1 .. depth - 2 are drafted in a ``fori_loop``:
    depth 5 runs it three times."""
    drafter = DynamicTreeDrafter(TOY, depth=depth, expand=2, children=3, name="toy")
    n = 3 + (depth - 1) * 6
    assert drafter.num_nodes == n
    proposal = _propose(drafter, TOY_PARAMS, temperature, key=4, with_next=with_next)
    _check_tree(proposal, n)
    par, tok = np.asarray(proposal.parents), np.asarray(proposal.tokens)
    leaves = set(range(n)) - set(par.ravel().tolist())
    for b, prompt in enumerate(PROMPTS):
        value = {-1: 1.0}
        for i in range(n):
            context = tuple(prompt) + tuple(_path_tokens(proposal, b, par[b, i]) if par[b, i] >= 0
                                            else [])
            full = _toy_law(context)  # q_stat: the unscaled softmax at T = 0
            value[i] = value[par[b, i]] * full[tok[b, i]]
            law = np.eye(V)[np.argmax(full)] if temperature == 0 else full
            np.testing.assert_allclose(np.asarray(proposal.q[b, par[b, i] + 1]), law, atol=1e-5)
            if i in leaves:
                leaf = _toy_law(context + (int(tok[b, i]),))
                scored = with_next or i < n - 6  # the last depth is scored only with_next
                want = (np.eye(V)[np.argmax(leaf)] if temperature == 0 else leaf) if scored \
                    else np.zeros(V)
                np.testing.assert_allclose(np.asarray(proposal.q[b, i + 1]), want, atol=1e-5)
        starts = [0, 3] + [3 + 6 * d for d in range(1, depth - 1)]
        for start, stop in zip(starts, starts[1:] + [n]):  # its 2 most probable nodes expand
            if stop == n:
                break
            expanded = sorted(set(par[b, stop:stop + 6].tolist()))
            best = sorted(start + np.argsort([-value[i] for i in range(start, stop)],
                                             kind="stable")[:2])
            assert expanded == [int(i) for i in best]


def test_ranked_candidates_take_every_match():
    text = jnp.asarray([[5, 1, 2, 3, 9, 1, 2, 4, 1, 2, 0, 0]], jnp.int32)
    bigram = jnp.full((V,), 7, jnp.int32)
    got = ranked_candidates(text, jnp.asarray([10]), bigram, 32, 5)
    assert got.tolist() == [[4, 3, 7, 0, 1]]


def test_max_gram_trees():
    bigram = jax.random.randint(jax.random.PRNGKey(14), (V,), 0, V)
    prompts = [[5, 1, 2, 3, 9, 1, 2, 4, 1, 2], [7, 2, 4]]
    chain = MaxGramDrafter(V)
    state, context = _start(chain, bigram, prompts)
    sp = sampling_params()
    key = jax.random.PRNGKey(0)
    want = _jitted(chain, True, 3)(bigram, state, context, key, sp)[0]
    one = MaxGramTreeDrafter(V, TreeShape.from_widths((1, 1, 1)))
    got = _jitted(one, True)(bigram, state, context, key, sp)[0]
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
    np.testing.assert_array_equal(np.asarray(got.q), np.asarray(want.q))
    assert got.draws == POINT_MASS
    wide = MaxGramTreeDrafter(V, TreeShape.from_widths((3, 2)))
    got = _jitted(wide, False)(bigram, state, context, key, sp)[0]
    tok = np.asarray(got.tokens)
    assert tok[0, :3].tolist()[:2] == [4, 3]  # both matches of [1 2], most recent first
    assert tok[0, 3] == 1  # after ... 1 2 | 4: [1 2 4] occurred before, followed by 1
    assert int(got.q[0, 0].argmax()) == 4 and float(got.q[0, -1].sum()) == 0
    par = np.asarray(got.parents)
    for b in range(2):
        for p in set(par[b].tolist()):
            kids = tok[b][par[b] == p]
            assert len(set(kids.tolist())) == len(kids)


def test_count_candidates_worked_example():
    """``count_candidates``'s docstring: votes 2 for 4 and 3 (runs of 2, 4 more
    recent), 1 for the bigram's 7, 1 unseen: probs 2/6, 2/6, 1/6, then none."""
    text = jnp.asarray([[5, 1, 2, 3, 9, 1, 2, 4, 1, 2, 0, 0]], jnp.int32)
    bigram = jnp.full((V,), 7, jnp.int32)
    tokens, probs = count_candidates(text, jnp.asarray([10]), bigram, max_ngram=32, matches=8,
                                     k=4, run_power=1.0, bigram_mass=1.0, unseen_mass=1.0)
    assert tokens[0, :3].tolist() == [4, 3, 7]
    np.testing.assert_allclose(np.asarray(probs[0]), [2 / 6, 2 / 6, 1 / 6, 0], rtol=1e-6)
    # A [V, K] table: the second continuation votes half as much; votes for one token add.
    table = jnp.stack([jnp.full((V,), 7), jnp.full((V,), 4)], axis=1).astype(jnp.int32)
    tokens, probs = count_candidates(text, jnp.asarray([10]), table, max_ngram=32, matches=8,
                                     k=3, run_power=1.0, bigram_mass=1.0, unseen_mass=1.0)
    assert tokens[0].tolist() == [4, 3, 7]
    np.testing.assert_allclose(np.asarray(probs[0]), [2.5 / 6.5, 2 / 6.5, 1 / 6.5], rtol=1e-6)


def _trie_values(drafter, params, prompt, proposal):
    """Host check of best-first growth: every node's path probability (product
    of its ancestors' candidate probabilities, recomputed with
    ``count_candidates`` at each context) and the best candidate left out."""
    tok, par = np.asarray(proposal.tokens[0]).tolist(), np.asarray(proposal.parents[0]).tolist()
    cand = jax.jit(drafter.candidates)

    def candidates(path):
        text = jnp.asarray([list(prompt) + path + [0] * 4], jnp.int32)
        t, p = cand(params, text, jnp.asarray([len(prompt) + len(path)]))
        return np.asarray(t[0]).tolist(), np.asarray(p[0], np.float64)

    paths, values = {-1: []}, {-1: 1.0}
    left_out = 0.0
    for node in range(-1, len(tok)):
        if node >= 0:
            parent_path = paths[par[node]]
            t, p = candidates(parent_path)
            paths[node] = parent_path + [tok[node]]
            values[node] = values[par[node]] * p[t.index(tok[node])]
        if len(paths[node]) < drafter.depth:
            t, p = candidates(paths[node])
            kids = {tok[i] for i in range(len(tok)) if par[i] == node}
            left = [values[node] * pj for tj, pj in zip(t, p) if tj not in kids]
            left_out = max([left_out] + left)
    return paths, values, left_out


def test_max_gram_trie_grows_best_first():
    prompt = [5, 1, 2, 3, 9, 1, 2, 4, 1, 2, 3, 9, 8, 1, 2]
    bigram = jax.random.randint(jax.random.PRNGKey(14), (V,), 0, V)
    drafter = MaxGramTrieDrafter(V, num_nodes=9, depth=4, children=3, matches=16)
    state, context = _start(drafter, bigram, [prompt, [7, 2, 4]])
    proposal = _jitted(drafter, True)(bigram, state, context, jax.random.PRNGKey(0),
                                      sampling_params())[0]
    assert proposal.draws == POINT_MASS and proposal.tokens.shape == (2, 9)
    par = np.asarray(proposal.parents)
    assert (par < np.arange(9)).all() and (par >= -1).all()  # topological
    paths, values, left_out = _trie_values(drafter, bigram, prompt, proposal)
    assert len({tuple(p) for p in paths.values()}) == 10  # shared prefixes: one node each
    assert max(len(p) for p in paths.values()) <= 4
    # Best first: no candidate left out is worth more than a node taken.
    assert min(values[i] for i in range(9)) >= left_out * (1 - 1e-5)
    # [1 2] was followed by 3 9 (twice, longer matches) and 4: the copy 3 9 is the spine.
    assert paths[0] == [3] and [3, 9] in paths.values()
    # q at a context: the one-hot of its first child (or of its best candidate at a leaf).
    q = np.asarray(proposal.q[0])
    assert q[0].argmax() == proposal.tokens[0, 0] and np.allclose(q.sum(-1), 1)


@pytest.mark.parametrize("commit, with_next", [(True, True), (True, False), (False, True)])
def test_the_next_round_after_an_accepted_path(commit, with_next):
    """Either the accepted path is committed in the drafter's cache (the next
    round feeds only the new pending token, plus the last depth's node when
    it was never scored: no ``with_next``) or it is re-fed from the history;
    every way gives the law at the new context."""
    shape = TreeShape.from_widths((2, 2))
    drafter = StaticTreeDrafter(TOY, shape, name="toy")
    state, context = _start(drafter, TOY_PARAMS)
    sp = sampling_params(temperature=1.0)
    proposal, state = _jitted(drafter, with_next)(TOY_PARAMS, state, context,
                                                  jax.random.PRNGKey(0), sp)
    # Row 0 accepts node 1 then its first child (node 4); row 1 accepts nothing.
    path = [[1, 4], [0, 0]]
    count = jnp.asarray([2, 0], jnp.int32)
    accepted = [[int(proposal.tokens[0, 1]), int(proposal.tokens[0, 4])], []]
    bonus = [11, 13]
    if commit:
        state = drafter.commit_path(state, jnp.asarray(path, jnp.int32), count)
    state = drafter.rewind(state, context.length + count)
    rows = [p + a + [y] for p, a, y in zip(PROMPTS, accepted, bonus, strict=True)]
    new = make_prompt(rows, pad_to=MAX_LENGTH)
    proposal, _ = _jitted(drafter, False)(TOY_PARAMS, state, Context(history=new.tokens,
                                                                     length=new.lengths),
                                          jax.random.PRNGKey(1), sp)
    for b, row in enumerate(rows):
        np.testing.assert_allclose(np.asarray(proposal.q[b, 0]), _toy_law(tuple(row)),
                                   atol=1e-5)
    # The round's first call: one window for the batch, 1 wide when no row lags
    # more than the pending token, else depth + 1 = 3 (widths (1, depth + 1)).
    root_fed = np.asarray(proposal.fed)[:, 0] - 2  # minus depth 1's two nodes
    assert root_fed.tolist() == ([1, 1] if commit and with_next else [3, 3])


@pytest.mark.parametrize("drafts_with", ["toy", "target"])
def test_greedy_tree_rounds_reproduce_the_targets_greedy_output(drafts_with):
    """Both halves together (drafter trees, target ``score_tree`` on
    ``tree_with_root``, ``commit_path`` on both caches), with a ten-line
    greedy acceptance standing in for the tree verifiers: the emitted tokens
    are the target's own greedy continuation. Drafting with the target
    itself accepts every round's whole depth (long committed paths)."""
    from specdec_jax.models.interface import start_token_and_prefill, tree_with_root

    target = TableLM(V, order=3)
    t_params = target.init_params(jax.random.PRNGKey(8))
    t_table = np.asarray(t_params["table"])
    d_model, d_params = (TOY, TOY_PARAMS) if drafts_with == "toy" else (target, t_params)
    drafter = StaticTreeDrafter(d_model, TreeShape.from_widths((3, 2, 1)), name="d")
    prompt = make_prompt(PROMPTS)
    t_cache, pending = start_token_and_prefill(target, t_params, prompt, MAX_LENGTH)
    d_state = drafter.init(d_params, prompt, MAX_LENGTH, False)
    score = jax.jit(target.score_tree)
    commit = jax.jit(target.commit_path)
    histories = [list(p) for p in PROMPTS]
    sp = sampling_params(temperature=0.0)
    for round_ in range(4):
        context = make_prompt(histories, pad_to=MAX_LENGTH)
        proposal, d_state = _jitted(drafter, False)(
            d_params, d_state, Context(history=context.tokens, length=context.lengths),
            jax.random.PRNGKey(round_), sp)
        tokens, parents = tree_with_root(pending, proposal.tokens, proposal.parents)
        scored = score(t_params, tokens, parents, t_cache)
        argmax = np.asarray(scored.logits.argmax(-1))
        tok, par = np.asarray(tokens), np.asarray(parents)
        paths = []
        for b in range(len(PROMPTS)):
            node, path = 0, []
            while True:
                match = [c for c in range(1, tok.shape[1])
                         if par[b, c] == node and tok[b, c] == argmax[b, node]]
                if not match:
                    break
                node = match[0]
                path.append(node)
            paths.append(path)
            assert drafts_with == "toy" or len(path) == 3
            histories[b] += [int(tok[b, c]) for c in path] + [int(argmax[b, node])]
        width = tok.shape[1]
        nodes = jnp.asarray([[0] + p + [0] * (width - 1 - len(p)) for p in paths], jnp.int32)
        count = jnp.asarray([len(p) for p in paths], jnp.int32)
        t_cache = commit(scored.cache, nodes, 1 + count)
        d_state = drafter.commit_path(d_state, jnp.maximum(nodes[:, 1:] - 1, 0), count)
        d_state = drafter.rewind(d_state, context.lengths + count)
        pending = jnp.asarray([h[-1] for h in histories], jnp.int32)
    for b, prompt_row in enumerate(PROMPTS):
        want = list(prompt_row)
        while len(want) < len(histories[b]):
            want.append(int(np.argmax(t_table[target.context_index(tuple(want))])))
        assert histories[b] == want, f"row {b}"
    assert sum(len(h) - len(p) for h, p in zip(histories, PROMPTS, strict=True)) > 8


def test_a_dynamic_trees_program_does_not_grow_with_its_depth():
    """Depths 1 .. depth - 2 share one traced drafter call (a ``fori_loop``):
    the program holds as many of the drafter's products at depth 6 as at 3
    (unrolled, each depth added a copy of the layers)."""
    model, params = _small_decoder()
    sp = sampling_params(temperature=1.0)

    def products(depth):
        drafter = DynamicTreeDrafter(model, depth=depth, expand=2, children=2, name="d",
                                     catch_up_widths=(1,))
        state, context = _start(drafter, params)
        lowered = _jitted(drafter, True).lower(params, state, context, jax.random.PRNGKey(0), sp)
        return lowered.as_text().count("dot_general")

    assert products(6) == products(3) > 0
