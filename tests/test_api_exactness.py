"""Exact through every public door: each verifier the API accepts, paired with
the library's own drafters (chains; static, dynamic, custom and Max-Gram
trees), decodes sequences that follow the target's law at T = 1, through
``specdec_jax.generate`` (the same decoder ``make_decoder`` and
``make_generate_fn`` build); the pairings that cannot be exact are refused
with an error that names the fix.

Statistics (``tests/exactness.py``): 20 000 rows of 3 tokens from one prompt,
a chi-square against the exact law of the toy target (64 cells); a correct
pairing passes at ``P_MIN = 1e-3``. The known-wrong pairing (children drawn
without replacement in a tree that says they were drawn with it: the
``rrs-replacement`` hole this module guards) must fall below ``P_WRONG``
(measured: 0.0).

Time (this machine, 2 CPU cores): about 5 s a pairing (one compile, one
decode), so the chi-square matrix runs under ``-m long``; the refusals and the
statistics checks run in the default suite.
"""

from __future__ import annotations

import dataclasses
import zlib

import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax import verify
from specdec_jax.decode.tree import TreeDecoder
from specdec_jax.drafting.tree import StaticTreeDrafter, TreeShape
from specdec_jax.sampling import WITH_REPLACEMENT
from tests import exactness

ROWS = 20_000
P_WRONG = 1e-9
BIGRAM = jnp.asarray([2, 3, 0, 1], jnp.int32)  # Max-Gram's table for V = 4
CUSTOM = TreeShape((-1, -1, 0, 0, 2))  # root: 2 children; the first has 2, one of them 1


def _expected():
    return exactness.exact_sequence_probs(
        lambda context: exactness.TARGET.next_probs(exactness.TARGET_PARAMS, context))


def _drafter(kind: str):
    """(drafter, its params) for a drafter kind of the matrix below."""
    if kind == "mag":
        return sj.MaxGramDrafter(exactness.V), BIGRAM
    return exactness.DRAFTER, exactness.DRAFTER_PARAMS


def _sample(drafter, drafter_params, *, seed: int, rows: int = ROWS, **kwargs):
    out = sj.generate(target=exactness.TARGET, target_params=exactness.TARGET_PARAMS,
                      drafter=drafter, drafter_params=drafter_params,
                      prompts=[list(exactness.PROMPT)] * rows, temperature=1.0,
                      max_new_tokens=exactness.LENGTH, seed=seed, **kwargs)
    assert np.all(np.asarray(out.lengths) == exactness.LENGTH)
    return out


# (verifier, drafter kind, tree): every pairing the API accepts at T = 1.
# None is the default verifier (token for chains, traversal for trees).
CHAINS = [(v, d, None) for v in (None, "token", "block", "block-seed") for d in ("model", "mag")]
TREES = [(v, "model", t) for v in (None, "traversal", "rrs", "rrs-replacement", "token", "block")
         for t in ("2,2", "dynamic:2,1,2")]
TREES += [(v, "model", CUSTOM) for v in ("traversal", "rrs", "rrs-replacement")]
# Depth 4: the dynamic tree's middle depths drafted in a loop (two iterations).
TREES += [(v, "model", "dynamic:4,1,2") for v in ("traversal", "rrs")]
TREES += [(v, "mag", t) for v in ("traversal", "rrs") for t in ("2,1", "parents:-1,-1,0,1")]


@pytest.mark.long
@pytest.mark.parametrize("verifier, kind, tree", CHAINS + TREES,
                         ids=lambda x: str(x) if x is not None else "default")
def test_every_accepted_pairing_follows_the_target(verifier, kind, tree):
    """The emitted sequences follow the target's law (chi-square), with
    rejections and fully accepted rounds both exercised."""
    drafter, params = _drafter(kind)
    seed = zlib.crc32(f"{verifier}|{kind}|{tree}".encode())  # fixed, one per pairing
    out = _sample(drafter, params, seed=seed, verifier=verifier, tree=tree)
    pvalue = exactness.chi_square_pvalue(np.asarray(out.tokens), _expected())
    assert pvalue > exactness.P_MIN, pvalue
    hist = np.asarray(out.stats.accepted_histogram).sum(0)
    assert hist[0] > 0 and hist[1:].sum() > 0, hist


def _nucleus(probs, top_p):
    """The target's law after top-p, by its definition (a sort, ties kept)."""
    probs = np.asarray(probs, np.float64)
    desc = -np.sort(-probs)
    before = np.cumsum(desc) - desc
    kept = probs >= np.min(desc[before < top_p])
    return np.where(kept, probs, 0.0) / probs[kept].sum()


@pytest.mark.long
@pytest.mark.parametrize("tree", [None, "dynamic:2,1,2"], ids=["chain", "tree"])
def test_top_p_decoding_follows_the_targets_nucleus(tree):
    """With top_p = 0.8 both models' laws are cut to their nucleus (found by
    bisection, not a sort) and the sequences follow the target's nucleus law:
    no sequence outside it, a chi-square over the rest. The full law instead
    (a decoder that ignored top_p) is refused by the zero cells alone."""
    top_p = 0.8
    expected = exactness.exact_sequence_probs(lambda context: _nucleus(
        exactness.TARGET.next_probs(exactness.TARGET_PARAMS, context), top_p))
    out = _sample(exactness.DRAFTER, exactness.DRAFTER_PARAMS, seed=5, tree=tree, top_p=top_p)
    tokens = np.asarray(out.tokens)[:, :exactness.LENGTH]
    outside = [seq for seq, prob in expected.items() if prob == 0]
    assert outside, "top_p must cut some sequences for this test to mean anything"
    seen = {tuple(int(t) for t in row) for row in tokens}
    assert not seen & set(outside)
    inside = {seq: prob for seq, prob in expected.items() if prob > 0}
    assert exactness.chi_square_pvalue(tokens, inside) > exactness.P_MIN


class MislabelledTreeDrafter(StaticTreeDrafter):
    """Known-wrong: draws children without replacement but says it draws them
    with replacement, so the verifier tests each sibling against ``q`` itself
    (what ``rrs-replacement`` did with the library's trees before the tree
    carried its drawing)."""

    @property
    def draws(self) -> str:
        return WITH_REPLACEMENT


@pytest.mark.long
def test_a_tree_verified_against_laws_it_was_not_drawn_from_fails():
    """Measured at this seed: p = 0.0 (below float64's smallest); the same
    drafter labelled truthfully ('rrs', tree '2,2', seed 3) gives p = 0.58."""
    drafter = MislabelledTreeDrafter(exactness.DRAFTER, TreeShape.from_widths((2, 2)))
    out = _sample(drafter, exactness.DRAFTER_PARAMS, seed=3, verifier="rrs")
    assert exactness.chi_square_pvalue(np.asarray(out.tokens), _expected()) < P_WRONG


# --- refusals, each naming the fix ----------------------------------------------------------


def _decoder(drafter=exactness.DRAFTER, **kwargs):
    return sj.make_decoder(target=exactness.TARGET, drafter=drafter,
                           max_new_tokens=exactness.LENGTH, **kwargs)


def test_rrs_replacement_makes_the_drafter_draw_with_replacement():
    decoder = _decoder(tree="2,2", verifier="rrs-replacement")
    assert decoder.drafter.replacement and decoder.drafter.draws == WITH_REPLACEMENT
    assert not _decoder(tree="2,2", verifier="rrs").drafter.replacement


def test_pairings_that_cannot_be_exact_are_refused():
    without = StaticTreeDrafter(exactness.DRAFTER, TreeShape.from_widths((2, 2)))
    with pytest.raises(ValueError, match="replacement=True, or verify with 'traversal'"):
        _decoder(drafter=without, verifier="rrs-replacement")
    with pytest.raises(ValueError, match="chosen, not drawn"):
        sj.make_decoder(target=exactness.TARGET, drafter=sj.MaxGramDrafter(exactness.V),
                        tree="2,1", verifier="rrs-replacement", max_new_tokens=3)
    with pytest.raises(ValueError, match="whatever the temperature"):
        _sample(exactness.DRAFTER, exactness.DRAFTER_PARAMS, seed=0, rows=2, tree="2,2",
                verifier="greedy")
    with pytest.raises(ValueError, match="takes no tree"):
        sj.make_generate_fn(target=exactness.TARGET, method="autoregressive", tree="2,2")
    with pytest.raises(ValueError, match="no tree form"):
        _decoder(tree="2,2", verifier="block-seed")


def test_greedy_at_temperature_zero_is_the_targets_argmax_path():
    greedy = sj.generate(target=exactness.TARGET, target_params=exactness.TARGET_PARAMS,
                         drafter=exactness.DRAFTER, drafter_params=exactness.DRAFTER_PARAMS,
                         prompts=[list(exactness.PROMPT)], tree="2,2", verifier="greedy",
                         max_new_tokens=6)
    default = sj.generate(target=exactness.TARGET, target_params=exactness.TARGET_PARAMS,
                          drafter=exactness.DRAFTER, drafter_params=exactness.DRAFTER_PARAMS,
                          prompts=[list(exactness.PROMPT)], tree="2,2", max_new_tokens=6)
    np.testing.assert_array_equal(np.asarray(greedy.tokens), np.asarray(default.tokens))


def test_tree_requests_in_any_form():
    """Lists, tuples, strings, a ``TreeShape`` or a ``TreeSpec`` name one decoder
    (so one compiled program); a tree defaults to traversal verification."""
    as_list = _decoder(tree=[2, 2])
    assert isinstance(as_list, TreeDecoder) and as_list.verifier.name == "traversal"
    assert _decoder(tree=(2, 2)) is as_list and _decoder(tree="2, 2") is as_list
    assert _decoder(tree=sj.TreeSpec(widths=(2, 2))) is as_list
    fn = sj.make_generate_fn(target=exactness.TARGET, drafter=exactness.DRAFTER,
                             max_new_tokens=exactness.LENGTH, tree=[2, 2])
    assert fn is sj.make_generate_fn(target=exactness.TARGET, drafter=exactness.DRAFTER,
                                     max_new_tokens=exactness.LENGTH, tree="2,2")
    custom = _decoder(tree=CUSTOM)
    assert custom is _decoder(tree="parents:-1,-1,0,0,2")
    assert custom.drafter.shape == CUSTOM and custom.num_nodes == 5 and custom.depth == 3
    assert _decoder().verifier.name == "token"  # chains keep token verification
    with pytest.raises(ValueError, match="parents"):
        sj.TreeSpec.parse("parents:-1,2")
    assert {"traversal", "rrs", "rrs-replacement", "greedy"} == set(sj.TREE_VERIFIERS)


def test_tree_statistics_compare_with_a_chains():
    """``drafted`` counts a tree round's deepest path (a chain's G), so accepted
    / drafted is a per-draft acceptance rate as for chains; ``drafted_nodes``
    counts every node; ``accepted_by_rank`` says which sibling each accepted
    draft was, and sums to the accepted drafts. A chain's drafts are all rank 0."""
    tree = _sample(exactness.DRAFTER, exactness.DRAFTER_PARAMS, seed=1, rows=200, tree="3,1")
    stats = tree.stats
    calls = np.asarray(stats.target_calls)
    np.testing.assert_array_equal(np.asarray(stats.drafted), 2 * calls)
    np.testing.assert_array_equal(np.asarray(stats.drafted_nodes), 6 * calls)
    by_rank = np.asarray(stats.accepted_by_rank)
    assert by_rank.shape == (200, 3)
    np.testing.assert_array_equal(by_rank.sum(-1), np.asarray(stats.accepted()))
    assert by_rank[:, 1:].sum() > 0  # later siblings are accepted too
    chain = _sample(exactness.DRAFTER, exactness.DRAFTER_PARAMS, seed=1, rows=200, gamma=2)
    assert np.asarray(chain.stats.accepted_by_rank).shape == (200, 1)
    np.testing.assert_array_equal(np.asarray(chain.stats.accepted_by_rank)[:, 0],
                                  np.asarray(chain.stats.accepted()))
    np.testing.assert_array_equal(np.asarray(chain.stats.drafted_nodes),
                                  np.asarray(chain.stats.drafted))


def test_cache_errors_name_the_tree():
    with pytest.raises(ValueError,
                       match=r"room for 6 tree nodes \(at least 64\) \+ 1 .* a smaller tree"):
        _sample(exactness.DRAFTER, exactness.DRAFTER_PARAMS, seed=0, rows=1, tree="3,1",
                max_cache_length=8)


def test_exports():
    for name in ("TreeSpec", "TreeShape", "StaticTreeDrafter", "DynamicTreeDrafter",
                 "TREE_VERIFIERS"):
        assert name in sj.__all__ and hasattr(sj, name)
    assert verify.ALL_VERIFIERS[:3] == sj.VERIFIERS
    assert dataclasses.is_dataclass(sj.TreeSpec)

