"""The tree decoding loop (``decode/tree.py``): greedy output = the
autoregressive target's (toy and random decoder models, static and dynamic
trees, a ragged batch with an EOS), a width-1 tree = today's chain decoder,
and (``-m long``) the emitted tokens follow pi at T = 1 for RRS and traversal
verification under speculative decoding and a cascade (chi-square)."""

import functools

import jax
import numpy as np
import pytest

from specdec_jax import api, target_functions, verify
from specdec_jax.api import sampling_params
from specdec_jax.decode.autoregressive import AutoregressiveDecoder
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.decode.tree import TreeDecoder, TreeSpec, make_tree_drafter
from specdec_jax.drafting import MaxGramDrafter, ModelDrafter
from specdec_jax.drafting.tree import DynamicTreeDrafter, StaticTreeDrafter, TreeShape
from specdec_jax.models import DecoderConfig, DecoderOnlyLM, make_prompt
from specdec_jax.verify import tree as verify_tree
from tests import exactness
from tests.table_lm import TableLM

V = 16
TOY = TableLM(V, order=2)
TOY_PARAMS = TOY.init_params(jax.random.PRNGKey(1))
# The drafter: the target's table, perturbed (accepts often, not always).
TOY_DRAFT_PARAMS = {"table": TOY_PARAMS["table"] + 0.8 * jax.random.normal(
    jax.random.PRNGKey(2), TOY_PARAMS["table"].shape)}
PROMPTS = [[3, 1, 5, 9, 1, 5], [7, 2, 4]]  # ragged
MAX_NEW = 24
GREEDY = sampling_params(temperature=0.0)


@functools.lru_cache(maxsize=None)
def _autoregressive(target, eos_ids=()):
    return jax.jit(AutoregressiveDecoder(target, max_new_tokens=MAX_NEW,
                                         eos_ids=eos_ids).generate)


def _check_same_as_autoregressive(out, want):
    np.testing.assert_array_equal(np.asarray(out.lengths), np.asarray(want.lengths))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(want.tokens))
    stats = out.stats
    np.testing.assert_array_equal(np.asarray(stats.emitted), np.asarray(out.lengths))
    # Every round emits its accepted path and one token (the last may be cut).
    rounds = np.asarray(stats.target_calls)
    assert (np.asarray(stats.accepted() + rounds) >= np.asarray(out.lengths)).all()
    assert int(np.asarray(stats.nan_logits).sum()) == 0


def test_greedy_tree_output_is_the_targets_in_a_ragged_batch_with_eos():
    """A static tree (3, 2, 1) on the toy pair: each row of a ragged batch
    gets exactly the autoregressive target's tokens, stopping at the EOS
    where the target does; rows accept different path depths per round."""
    prompt = make_prompt(PROMPTS)
    free = _autoregressive(TOY)(TOY_PARAMS, None, prompt, jax.random.PRNGKey(0), GREEDY)
    eos = int(np.asarray(free.tokens)[0, 9])  # row 0 stops at its 10th token (or before)
    want = _autoregressive(TOY, (eos,))(TOY_PARAMS, None, prompt, jax.random.PRNGKey(0), GREEDY)
    assert int(np.asarray(want.lengths)[0]) < MAX_NEW
    decoder = TreeDecoder(TOY, StaticTreeDrafter(TOY, TreeShape.from_widths((3, 2, 1))),
                          target_functions.SpecDecode(), MAX_NEW,
                          verifier=verify_tree.GreedyTreeVerifier(), eos_ids=(eos,))
    out = jax.jit(decoder.generate)(TOY_PARAMS, TOY_DRAFT_PARAMS, prompt,
                                    jax.random.PRNGKey(0), GREEDY)
    _check_same_as_autoregressive(out, want)
    hist = np.asarray(out.stats.accepted_histogram)
    assert hist.shape == (2, 4)
    assert (hist[:, :-1] > 0).any() and (hist[:, 1:] > 0).any()  # short and long paths
    assert not np.array_equal(hist[0], hist[1])  # ragged acceptance
    # The tree pays: fewer target calls than tokens.
    assert (np.asarray(out.stats.target_calls) < np.asarray(out.lengths)).all()
    assert np.asarray(out.stats.target_fed).tolist() == [
        int(c) * (1 + decoder.num_nodes) for c in np.asarray(out.stats.target_calls)]


def test_greedy_dynamic_tree_on_a_random_decoder_is_the_targets():
    """A small random ``DecoderOnlyLM`` pair (real attention, KV caches moved by
    commit_path) with an EAGLE-2 dynamic tree through the public API:
    greedy output identical to the autoregressive target's."""
    cfg = DecoderConfig(vocab_size=V, hidden_size=24, intermediate_size=20, num_layers=1,
                        num_heads=2, num_kv_heads=1)
    model = DecoderOnlyLM(cfg)
    params = model.init_params(jax.random.PRNGKey(0))
    draft_params = jax.tree_util.tree_map(
        lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(3), x.shape, x.dtype), params)
    prompt = make_prompt(PROMPTS)
    want = _autoregressive(model)(params, None, prompt, jax.random.PRNGKey(0), GREEDY)
    fn = api.make_generate_fn(target=model, drafter=model, tree="dynamic:3,2,2",
                              verifier="greedy", max_new_tokens=MAX_NEW)
    out = fn(params, draft_params, prompt, jax.random.PRNGKey(0), GREEDY)
    _check_same_as_autoregressive(out, want)
    assert np.asarray(out.stats.accepted_histogram)[:, 1:].sum() > 0


def test_greedy_max_gram_tree_through_generate_is_the_targets():
    """``api.generate`` with a Max-Gram drafter and ``tree=``: a static
    Max-Gram tree (every n-gram match, then the bigram table), greedy output
    = the target's; the toy target's output cycles, so paths get accepted."""
    prompts = [[3, 1, 5, 9, 1, 5, 3, 1, 5, 9], [7, 2, 4, 7, 2]]
    want = _autoregressive(TOY)(TOY_PARAMS, None, make_prompt(prompts), jax.random.PRNGKey(0),
                                GREEDY)
    bigram = jax.numpy.roll(jax.numpy.arange(V, dtype=jax.numpy.int32), 1)
    out = api.generate(target=TOY, target_params=TOY_PARAMS, drafter=MaxGramDrafter(V),
                       drafter_params=bigram, prompts=prompts, tree=(3, 1),
                       max_new_tokens=MAX_NEW, max_cache_length=128)
    _check_same_as_autoregressive(out, want)
    stats = out.stats
    calls = np.asarray(stats.target_calls)
    # A round drafts 6 nodes and offers a path of at most 2 (as a chain's G = 2).
    np.testing.assert_array_equal(np.asarray(stats.drafted_nodes), 6 * calls)
    np.testing.assert_array_equal(np.asarray(stats.drafted), 2 * calls)
    by_rank = np.asarray(stats.accepted_by_rank)
    assert by_rank.shape == (2, 3)  # the root's 3 children are the widest node
    np.testing.assert_array_equal(by_rank.sum(-1), np.asarray(stats.accepted()))
    assert np.asarray(out.stats.accepted()).sum() > 0


def test_a_width_one_tree_is_the_chain():
    """Widths (1, 1, 1, 1) = a chain of 4: the same tokens as the chain decoder
    with G = 4, greedy and at T = 1 with the same key (traversal verification
    on a chain is the block verifier, and the drafter draws the same tokens)."""
    prompt = make_prompt(PROMPTS)
    chain = SpeculativeDecoder(TOY, ModelDrafter(TOY, catch_up_widths=(1, 5)),
                               target_functions.SpecDecode(), gamma=4, max_new_tokens=MAX_NEW,
                               verifier=verify.get_verifier("block"))
    tree = TreeDecoder(TOY, StaticTreeDrafter(TOY, TreeShape.from_widths((1,) * 4),
                                              catch_up_widths=(1, 5)),
                       target_functions.SpecDecode(), MAX_NEW,
                       verifier=verify_tree.TraversalVerifier())
    chain_fn, tree_fn = jax.jit(chain.generate), jax.jit(tree.generate)
    for temperature, seed in ((0.0, 0), (1.0, 0), (1.0, 1)):
        sp = sampling_params(temperature=temperature)
        key = jax.random.PRNGKey(seed)
        want = chain_fn(TOY_PARAMS, TOY_DRAFT_PARAMS, prompt, key, sp)
        got = tree_fn(TOY_PARAMS, TOY_DRAFT_PARAMS, prompt, key, sp)
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
        np.testing.assert_array_equal(np.asarray(got.stats.accepted_histogram),
                                      np.asarray(want.stats.accepted_histogram))
        np.testing.assert_array_equal(np.asarray(got.stats.target_calls),
                                      np.asarray(want.stats.target_calls))


def test_tree_specs_and_drafters():
    assert TreeSpec.parse("3,2,1,1").num_nodes == 21
    assert TreeSpec.parse((2, 2)).depth == 2
    assert TreeSpec.parse("dynamic:5,2,2").num_nodes == 18
    for bad in ("", "3,0", "dynamic:3,3,2", "dynamic:3,2", "x"):
        with pytest.raises(ValueError):
            TreeSpec.parse(bad)
    assert isinstance(make_tree_drafter(TOY, "2,1"), StaticTreeDrafter)
    assert isinstance(make_tree_drafter(ModelDrafter(TOY, name="small"), "dynamic:2,1,2"),
                      DynamicTreeDrafter)
    with pytest.raises(ValueError, match="block-seed"):
        api.make_decoder(target=TOY, drafter=TOY, tree=(2, 1), verifier="block-seed")
    with pytest.raises(ValueError, match="normalised"):
        api.make_decoder(target=TOY, drafter=TOY, tree=(2, 1), method="lossy",
                         verifier="traversal")
    decoder = api.make_decoder(target=TOY, drafter=TOY, tree=(2, 1), verifier="block")
    assert decoder.verifier.name == "traversal" and decoder.num_nodes == 4


# ---------------------------------------------------------------------------
# Exactness at T = 1 (chi-square over the 64 sequences of the enumerable toy)
# ---------------------------------------------------------------------------

ROWS = 20_000


def _pi_dist(target_fn, alpha):
    def next_dist(context):
        q = exactness.DRAFTER.next_probs(exactness.DRAFTER_PARAMS, context)
        p = exactness.TARGET.next_probs(exactness.TARGET_PARAMS, context)
        pi, _ = target_fn(np.float32(q), np.float32(p), np.float32(q), np.float32(p),
                          np.float32(alpha), np.float32(1.0))
        return np.asarray(pi, np.float64)
    return next_dist


@pytest.mark.long
@pytest.mark.parametrize("verifier, method, alpha, tree", [
    ("rrs", "specdecode", 0.0, "2,2"),
    ("traversal", "specdecode", 0.0, "2,2"),
    ("rrs", "token-v3", 0.5, "2,2"),
    ("traversal", "opt", 0.5, "2,2"),
    ("traversal", "token-v3", 0.5, "dynamic:2,1,2"),
])
def test_tree_decoding_follows_pi(verifier, method, alpha, tree):
    """Sequences of 3 tokens from 20 000 rows follow the autoregressive product
    of pi = T(q, p) (p for specdecode), with rejections, corrections and full
    paths all exercised."""
    target_fn = target_functions.get_target(method)
    decoder = api.make_decoder(target=exactness.TARGET, drafter=exactness.DRAFTER,
                               method=method, tree=tree, verifier=verifier,
                               max_new_tokens=exactness.LENGTH)
    prompt = make_prompt([list(exactness.PROMPT)] * ROWS)
    out = jax.jit(decoder.generate)(exactness.TARGET_PARAMS, exactness.DRAFTER_PARAMS, prompt,
                                    jax.random.PRNGKey(7),
                                    sampling_params(temperature=1.0, alpha=alpha))
    assert np.all(np.asarray(out.lengths) == exactness.LENGTH)
    expected = exactness.exact_sequence_probs(_pi_dist(target_fn, alpha))
    assert exactness.chi_square_pvalue(np.asarray(out.tokens), expected) > exactness.P_MIN
    hist = np.asarray(out.stats.accepted_histogram).sum(0)
    assert hist[:-1].sum() > 0 and hist[-1] > 0, hist  # short paths and full ones


@pytest.mark.long
@pytest.mark.parametrize("verifier", ["rrs", "traversal"])
def test_max_gram_trees_at_t1_follow_pi_and_accept_later_siblings(verifier):
    """A deterministic tree (Max-Gram, static widths (2, 1)) at T = 1: the
    round verifies point-mass laws (``Tree.point_mass``), so the emitted
    sequences follow p (chi-square, 20 000 rows), and the *second* root child
    is accepted as a draft too. One round per row (``max_new_tokens = 1``,
    whose histogram is that round's): both root children are accepted on some
    rows, and a root child's token is never emitted without being accepted
    (the residual after rejecting the children has no mass on them). Reading
    the first child's one-hot ``q`` as every sibling's law (the loop before
    point masses) accepts only the first child: 1 distinct accepted token."""
    bigram = jax.numpy.asarray([2, 3, 0, 1], jax.numpy.int32)
    prompt = make_prompt([list(exactness.PROMPT)] * ROWS)
    sp = sampling_params(temperature=1.0)

    def generate(max_new_tokens, key):
        decoder = api.make_decoder(target=exactness.TARGET, drafter=MaxGramDrafter(exactness.V),
                                   tree="2,1", verifier=verifier,
                                   max_new_tokens=max_new_tokens)
        return jax.jit(decoder.generate)(exactness.TARGET_PARAMS, bigram, prompt,
                                         jax.random.PRNGKey(key), sp)

    out = generate(exactness.LENGTH, 9)
    assert np.all(np.asarray(out.lengths) == exactness.LENGTH)
    p_dist = lambda context: np.asarray(  # noqa: E731
        exactness.TARGET.next_probs(exactness.TARGET_PARAMS, context), np.float64)
    expected = exactness.exact_sequence_probs(p_dist)
    assert exactness.chi_square_pvalue(np.asarray(out.tokens), expected) > exactness.P_MIN
    one = generate(1, 10)
    first = np.asarray(one.tokens)[:, 0]
    accepted = np.asarray(one.stats.accepted_histogram)[:, 1:].sum(-1) > 0
    assert np.asarray(one.stats.target_calls).max() == 1
    children = set(np.unique(first[accepted]).tolist())
    assert len(children) == 2, children  # both root children pay
    assert not np.any(np.isin(first, list(children)) & ~accepted)


# --- token trees through the gin jobs (jobs.studies) --------------------------------


def test_tree_grids_check_every_request_before_anything_loads(monkeypatch, tmp_path):
    """A sweep grid drafts each tree beside its chains (chain keys unchanged,
    so stored sweeps resume); every bad request fails before a model loads,
    naming the argument and the fix."""
    from specdec_jax.jobs import resolver  # noqa: PLC0415
    from specdec_jax.jobs.studies import gin_jobs as study  # noqa: PLC0415
    from specdec_jax.jobs.studies import sweep  # noqa: PLC0415

    points = sweep.plan_points(methods={"specdecode": [], "token-v3": [0.1], "oracle": [0.2]},
                               gammas=[5], temperatures=[0.0], trees=["2, 1"],
                               verifier="block")
    keys = {p.key for p in points}
    assert "specdecode|alpha=None|gamma=5|T=0.0|verifier=block" in keys
    assert "specdecode|alpha=None|gamma=None|T=0.0|tree=2,1|verifier=block" in keys
    assert "token-v3|alpha=0.1|gamma=None|T=0.0|tree=2,1|verifier=block" in keys
    assert not any(p.tree for p in points if p.method in ("oracle", "target", "drafter"))
    assert sweep.Point("specdecode", None, 5, 0.0).key == "specdecode|alpha=None|gamma=5|T=0.0"

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the tree request was checked")

    monkeypatch.setattr(resolver, "load_pair", no_loading)
    common = dict(task="humaneval", target="toy-bytes-large", drafter="toy-bytes-small",
                  out_path=str(tmp_path / "gen.json"))
    for kwargs, message in [
            (dict(tree="3,0"), "run_generate.tree: tree '3,0': give widths per depth"),
            (dict(tree="2,1", gamma=3), "drop run_generate.gamma (3)"),
            (dict(tree="2,1", method="target"), "method 'target' drafts nothing"),
            (dict(tree="2,1", verifier="block-seed"), "has no tree form"),
            (dict(tree="2,1", method="lossy", alpha=0.1, verifier="traversal"),
             "needs a normalised pi"),
            (dict(verifier="traversal"), "verifies token trees only")]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            study.run_generate(**common, **kwargs)
    with pytest.raises(ValueError, match=r"run_study.trees = \['2,1'\]: none of the methods"):
        study.run_study(task="humaneval", target="t", drafter="d", out_dir=str(tmp_path),
                        stem="s", methods={"oracle": [0.1]}, trees=["2,1"])
    with pytest.raises(ValueError, match="run_benchmark.trees: tree 'dynamic:2,3,1'"):
        study.run_benchmark(task="humaneval", target="t", drafter="d",
                            out_path=str(tmp_path / "b.json"), trees=["dynamic:2,3,1"])


def test_a_tree_gets_its_own_group_in_the_sweep_reports():
    """A tree record (gamma None) is a group of its own, with the
    autoregressive baselines; it does not join the chains' groups."""
    from specdec_jax.jobs.studies import report  # noqa: PLC0415

    def record(method, gamma, tree=None):
        return {"method": method, "alpha": None, "gamma": gamma, "temperature": 0.0,
                "task": "humaneval", "metric": "pass@1", "num_examples": 2,
                "quality": {"score": 50.0, "low": 0.0, "high": 100.0},
                "relative_latency": {"cost_model": 1.0}, "rejection_rate": None,
                "deferral_rate": 0.0, "calls": {"target": 4, "drafter": 0},
                **({"tree": tree} if tree else {})}

    records = [record("target", None), record("drafter", None), record("specdecode", 5),
               record("specdecode", None, "2,1")]
    text = report.markdown_table(records)
    chain, tree = text.split("#### humaneval (pass@1), T=0, γ=5")[1].split(
        "#### humaneval (pass@1), T=0, tree 2,1")
    for section in (chain, tree):
        assert section.count("| specdecode") == 1 and "| target" in section


@pytest.mark.long  # a whole gin job (two toy programs compiled)
def test_a_gin_job_decodes_a_tree_greedily_as_the_target(tmp_path):
    """``run_generate.tree`` through ``python -m eval.main`` on the byte-level
    toys: the record says the tree and verifier, and the greedy outputs equal
    the autoregressive target's (the same job, method 'target')."""
    import json  # noqa: PLC0415

    from eval import main as eval_main  # noqa: PLC0415

    def run(name, *bindings):
        out = tmp_path / f"{name}.json"
        args = ["--gin_file", "configs/runs/generate.gin",
                "--gin_file", "configs/models/toy_bytes.gin"]
        for binding in ("TASK = 'humaneval'", f"OUT_PATH = '{out}'",
                        "run_generate.max_new_tokens = 6", "run_generate.num_examples = 2",
                        "run_generate.batch_size = 2", "run_generate.progress = False",
                        *bindings):
            args += ["--gin_bindings", binding]
        assert eval_main.main(args) == 0
        return json.loads(out.read_text())

    tree = run("tree", "run_generate.tree = 'dynamic:3,2,2'",
               "run_generate.verifier = 'traversal'")
    assert tree["tree"] == "dynamic:3,2,2" and tree["verifier"] == "traversal"
    assert tree["gamma"] is None and tree["key"].endswith("|tree=dynamic:3,2,2|verifier=traversal")
    target = run("target", "run_generate.method = 'target'")
    assert [r["text"] for r in tree["per_example"]] == [r["text"] for r in target["per_example"]]
