"""Token-tree scoring in the models (``score_tree`` / ``commit_path``;
docs/algorithms.md, 'Token trees'): a chain equals ``extend``, every node of a tree equals its
root -> node path fed as a chain (brute force), committing a path leaves the
cache that feeding the path would, for the toy table model and a random-weight
decoder in both kernel layouts, with ragged batches of different trees."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models import DecoderConfig, DecoderOnlyLM, make_prompt
from specdec_jax.models.decoder_only import with_kernel_layout
from specdec_jax.models.interface import (
    check_tree,
    supports_trees,
    tree_depths,
    tree_with_root,
)
from tests.table_lm import TableLM

V = 32
TOL = 2e-5  # float32: a different mask and gather, the same arithmetic
MAX_LENGTH = 32
PROMPTS = [[3, 17, 5, 9, 1], [7, 2], [30, 4, 4, 12, 8, 21, 6]]  # ragged: L = 5, 2, 7

# Grouped-query attention (3 query heads per kv head) with Qwen2's q/k/v bias.
CFG = DecoderConfig(vocab_size=V, hidden_size=24, intermediate_size=20, num_layers=2,
                    num_heads=6, num_kv_heads=2, qkv_bias=True)


def _decoder():
    model = DecoderOnlyLM(CFG)
    params = jax.tree_util.tree_map(  # non-zero biases, so a misplaced bias shows
        lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(3), x.shape),
        model.init_params(jax.random.PRNGKey(0)))
    return model, params


def _models():
    model, params = _decoder()
    fused_model, fused = with_kernel_layout(model, params)  # the decode layout, fused q/k/v
    table = TableLM(V, order=3)
    return {"table": (table, table.init_params(jax.random.PRNGKey(1))),
            "decoder": (model, params), "decoder-fused": (fused_model, fused)}


MODELS = _models()


@pytest.fixture(params=sorted(MODELS))
def model_params(request):
    return MODELS[request.param]


class _Jitted:
    """A model's methods, jitted once per model (eager Flax runs op by op)."""

    def __init__(self, model):
        self.extend = jax.jit(model.extend)
        self.score_tree = jax.jit(model.score_tree, static_argnames="start")
        self.commit_path = jax.jit(model.commit_path)
        self.prefill = jax.jit(model.prefill)
        self.init_cache = model.init_cache


JITTED = {}


def _jit(model):
    if model not in JITTED:
        JITTED[model] = _Jitted(model)
    return JITTED[model]


def _prefilled(model, params, prompts=PROMPTS):
    return model.prefill(params, make_prompt(prompts), model.init_cache(len(prompts),
                                                                        MAX_LENGTH)).cache


def _row(cache, b):
    return jax.tree_util.tree_map(lambda x: x[b:b + 1], cache)


def _random_trees(rng, batch, n):
    """Different random trees per row (topological parents), the last nodes of
    each row padding (a node nobody descends from, like a verifier's invalid
    slot): valid [B, N]."""
    parents = np.full((batch, n), -1, np.int32)
    valid = np.ones((batch, n), bool)
    for b in range(batch):
        real = n - b  # row b has b padding nodes
        for i in range(1, real):
            parents[b, i] = rng.integers(-1, i)
        valid[b, real:] = False
        parents[b, real:] = rng.integers(-1, real, size=n - real)
    tokens = rng.integers(0, V, size=(batch, n)).astype(np.int32)
    return jnp.asarray(tokens), jnp.asarray(parents), valid


def _path(parents_row, i):
    path = []
    while i >= 0:
        path.append(i)
        i = int(parents_row[i])
    return path[::-1]


def test_the_models_score_trees():
    assert all(supports_trees(model) for model, _ in MODELS.values())


def test_a_chain_equals_extend(model_params):
    model, params = model_params
    model = _jit(model)
    cache = _prefilled(model, params)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, size=(3, 6)), jnp.int32)
    chain = jnp.broadcast_to(jnp.arange(-1, 5, dtype=jnp.int32), (3, 6))
    ext = model.extend(params, tokens, cache)
    tree = model.score_tree(params, tokens, chain, cache)
    np.testing.assert_allclose(np.asarray(tree.logits), np.asarray(ext.logits), atol=TOL, rtol=0)
    np.testing.assert_array_equal(np.asarray(tree.cache.lengths), np.asarray(cache.lengths))
    committed = model.commit_path(tree.cache, jnp.broadcast_to(jnp.arange(6), (3, 6)),
                                  jnp.full((3,), 6, jnp.int32))
    np.testing.assert_array_equal(np.asarray(committed.lengths), np.asarray(ext.cache.lengths))
    for got, want in zip(jax.tree_util.tree_leaves(committed),
                         jax.tree_util.tree_leaves(ext.cache), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=TOL, rtol=0)


def test_every_node_equals_its_path_fed_as_a_chain(model_params):
    model, params = model_params
    model = _jit(model)
    cache = _prefilled(model, params)
    n = 9
    tokens, parents, valid = _random_trees(np.random.default_rng(1), 3, n)
    out = model.score_tree(params, tokens, parents, cache)
    assert out.logits.shape == (3, n, V)
    extend = model.extend
    par, toks = np.asarray(parents), np.asarray(tokens)
    for b in range(3):
        for i in range(n):
            path = _path(par[b], i)
            if not valid[b, i]:
                continue
            want = extend(params, jnp.asarray([toks[b, path]]), _row(cache, b)).logits[0, -1]
            np.testing.assert_allclose(np.asarray(out.logits[b, i]), np.asarray(want),
                                       atol=TOL, rtol=0, err_msg=f"row {b} node {i}")


def test_a_tree_scored_one_depth_per_call_equals_one_call(model_params):
    """What a tree drafter does: nodes ``start ..`` fed later, the earlier
    ones already in their scratch slots."""
    model, params = model_params
    model = _jit(model)
    cache = _prefilled(model, params)
    parents = jnp.asarray([[-1, -1, 0, 0, 1, 2, 3, 3]] * 3, jnp.int32)  # depths 0 0 1 1 1 2 2 2
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, V, size=(3, 8)), jnp.int32)
    whole = model.score_tree(params, tokens, parents, cache).logits
    parts, c = [], cache
    for start, stop in ((0, 2), (2, 5), (5, 8)):
        out = model.score_tree(params, tokens[:, start:stop], parents, c, start=start)
        parts.append(out.logits)
        c = out.cache
    np.testing.assert_allclose(np.asarray(jnp.concatenate(parts, axis=1)),
                               np.asarray(whole), atol=TOL, rtol=0)


def test_committing_a_path_leaves_the_cache_feeding_it_would(model_params):
    """Ragged acceptance: each row keeps a different path (and row 2 none);
    the next extend's logits equal those after feeding the path as a chain."""
    model, params = model_params
    model = _jit(model)
    cache = _prefilled(model, params)
    n = 8
    tokens, parents, _ = _random_trees(np.random.default_rng(3), 3, n)
    par, toks = np.asarray(parents), np.asarray(tokens)
    deepest = [int(np.argmax(np.asarray(tree_depths(parents))[b, :n - b])) for b in range(3)]
    paths = [_path(par[0], deepest[0]), _path(par[1], deepest[1])[:1], []]
    count = jnp.asarray([len(p) for p in paths], jnp.int32)
    nodes = jnp.asarray([p + [0] * (n - len(p)) for p in paths], jnp.int32)
    scored = model.score_tree(params, tokens, parents, cache)
    committed = model.commit_path(scored.cache, nodes, count)
    np.testing.assert_array_equal(np.asarray(committed.lengths),
                                  np.asarray(cache.lengths + count))
    after = jnp.asarray([[5, 11]] * 3, jnp.int32)
    got = model.extend(params, after, committed).logits
    for b in range(3):
        fed = jnp.asarray([list(toks[b, paths[b]]) + [5, 11]], jnp.int32)
        want = model.extend(params, fed, _row(cache, b)).logits[0, -2:]
        np.testing.assert_allclose(np.asarray(got[b]), np.asarray(want), atol=TOL, rtol=0,
                                   err_msg=f"row {b}")


def test_a_target_scores_the_root_with_the_tree():
    """``tree_with_root``: node 0 = the pending token, so the logits give p at
    [root, node 0 .. N - 1]; the root's equal extend's on the pending token."""
    model, params = MODELS["table"]
    model = _jit(model)
    cache = _prefilled(model, params)
    tokens, parents, _ = _random_trees(np.random.default_rng(4), 3, 5)
    pending = jnp.asarray([1, 2, 3], jnp.int32)
    t, p = tree_with_root(pending, tokens, parents)
    assert t.shape == p.shape == (3, 6)
    np.testing.assert_array_equal(np.asarray(p[:, 1:]), np.asarray(parents) + 1)
    out = model.score_tree(params, t, p, cache)
    root = model.extend(params, pending[:, None], cache).logits[:, 0]
    np.testing.assert_allclose(np.asarray(out.logits[:, 0]), np.asarray(root), atol=0)


def test_bad_trees_fail_clearly():
    model, params = MODELS["table"]
    cache = _prefilled(model, params)
    tokens = jnp.zeros((3, 3), jnp.int32)
    with pytest.raises(ValueError, match="topological"):
        check_tree(tokens, jnp.asarray([[-1, 2, 0]] * 3), cache.lengths, MAX_LENGTH, V)
    with pytest.raises(ValueError, match="scratch slots"):
        model.score_tree(params, tokens[:, :1], jnp.full((3, 30), -1, jnp.int32), cache)


def test_one_program_serves_every_tree_of_n_nodes():
    model, params = MODELS["table"]
    cache = _prefilled(model, params)
    score = jax.jit(model.score_tree)
    rng = np.random.default_rng(5)
    for _ in range(3):
        tokens, parents, _ = _random_trees(rng, 3, 6)
        score(params, tokens, parents, cache)
    assert score._cache_size() == 1
