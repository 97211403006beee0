"""Drafting strategies (docs/algorithms.md, 'Drafter cascades'): exactness of Max-Gram, vertical,
horizontal and K-matrix drafting with the target as the final reviewer, at
temperature 1 (chi-square on enumerable toy models) and greedy; the known-wrong
vertical cascade (outer review with the inner drafter's q after a lenient
inner review) is rejected; ModelDrafter reproduces the pre-interface loop.
"""

import dataclasses
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax import target_functions
from specdec_jax.api import sampling_params
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.drafting import (
    HorizontalCascade,
    MaxGramDrafter,
    ModelDrafter,
    VerticalCascade,
    cs_drafter,
    lenient_law,
    make_drafter,
)
from specdec_jax.models.interface import make_prompt
from tests.exactness import (
    DRAFTER,
    DRAFTER_PARAMS,
    LENGTH,
    P_MIN,
    PROMPT,
    ROWS,
    TARGET,
    TARGET_PARAMS,
    V,
    chi_square_pvalue,
    exact_sequence_probs,
)
from tests.table_lm import TableLM

SMALL = TableLM(V, order=2)  # a third model: the smaller drafter of a 2-level cascade
SMALL_PARAMS = SMALL.init_params(jax.random.PRNGKey(13), scale=2.0)
BIGRAM = jax.random.randint(jax.random.PRNGKey(14), (V,), 0, V)
NAMED = {"big": DRAFTER_PARAMS, "small": SMALL_PARAMS, "mag": BIGRAM}
BIG_D = ModelDrafter(DRAFTER, name="big")
SMALL_D = ModelDrafter(SMALL, name="small")
MAG = MaxGramDrafter(V)
LENIENCE = 2.0

# (id, drafter, gamma, lenience). Every one ends with the target as the reviewer.
STRATEGIES = [
    ("mag", MAG, 2, 1.0),
    ("vertical-l2", VerticalCascade(DRAFTER, SMALL_D, inner_gamma=2, name="big"), 2, LENIENCE),
    ("vertical-mag", VerticalCascade(DRAFTER, MAG, inner_gamma=2, name="big", lenient=False),
     3, 1.0),
    ("horizontal", HorizontalCascade((BIG_D, MAG), (1, 2)), 3, 1.0),
    ("kmatrix", cs_drafter([[1, 1, 1], [0, 1, 1], [0, 0, 2]], [BIG_D, SMALL_D, MAG]), 3,
     LENIENCE),
]


def params_for(drafter):
    return drafter.select_params(NAMED)


def sample(drafter, gamma, lenience, temperature=1.0, rows=ROWS, seed=0,
           method="specdecode", prompts=None, max_new_tokens=LENGTH, target=TARGET,
           target_params=TARGET_PARAMS):
    decoder = SpeculativeDecoder(target=target, drafter=drafter,
                                 target_fn=target_functions.get_target(method), gamma=gamma,
                                 max_new_tokens=max_new_tokens)
    prompt = make_prompt(prompts or [list(PROMPT)] * rows)
    out = jax.jit(decoder.generate)(target_params, params_for(drafter), prompt,
                                    jax.random.PRNGKey(seed),
                                    sampling_params(temperature=temperature, lenience=lenience))
    return out


def target_probs():
    return exact_sequence_probs(lambda c: TARGET.next_probs(TARGET_PARAMS, c))


@pytest.mark.long
@pytest.mark.parametrize("name, drafter, gamma, lenience", STRATEGIES,
                         ids=[s[0] for s in STRATEGIES])
def test_drafting_strategy_is_exact(name, drafter, gamma, lenience):
    """With the target reviewing, sequences follow the target (chi-square, 64 cells)."""
    out = sample(drafter, gamma, lenience)
    tokens = np.asarray(out.tokens)
    assert np.all(np.asarray(out.lengths) == LENGTH)
    assert chi_square_pvalue(tokens, target_probs()) > P_MIN
    hist = np.asarray(out.stats.accepted_histogram).sum(0)
    assert hist[0] > 0 and hist[1:].sum() > 0, "rejections and acceptances both occur"


@dataclasses.dataclass(frozen=True)
class InnerQVertical(VerticalCascade):
    """Known-wrong: reports the inner drafter's q as the law of its reviewed
    proposals, although the lenient review (l = 2) changed their law."""

    @staticmethod
    def review_law(q_xV, p_xV, lenience):
        return q_xV


@pytest.mark.long
def test_outer_review_with_the_inner_q_is_rejected():
    """The same statistic rejects the wrong law: p-value < 1e-12 (asserted)."""
    wrong = InnerQVertical(DRAFTER, SMALL_D, inner_gamma=2, name="big")
    tokens = np.asarray(sample(wrong, 2, LENIENCE).tokens)
    assert chi_square_pvalue(tokens, target_probs()) < 1e-12


def test_lenient_law_is_the_law_of_a_lenient_review():
    """Monte Carlo of one lenient review position against ``lenient_law``, and
    the paper's worked numbers (cs_drafting.py docstring)."""
    q = jnp.asarray([0.9, 0.1])
    np.testing.assert_allclose(lenient_law(q, jnp.asarray([0.6, 0.4]), 2.0), [0.9, 0.1])
    np.testing.assert_allclose(lenient_law(q, jnp.asarray([0.3, 0.7]), 2.0), [0.6, 0.4],
                               atol=1e-6)
    rng = np.random.default_rng(0)
    q, p = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
    law = np.asarray(lenient_law(jnp.asarray(q), jnp.asarray(p), 1.7))
    assert abs(law.sum() - 1) < 1e-6
    n = 200_000
    s = rng.choice(V, size=n, p=q)
    accept = rng.random(n) < np.minimum(1, 1.7 * p[s] / q[s])
    residual = np.maximum(1.7 * p - q, 0)
    out = np.where(accept, s, rng.choice(V, size=n, p=residual / residual.sum()))
    np.testing.assert_allclose(np.bincount(out, minlength=V) / n, law, atol=5e-3)
    # l = 1: a lossless review, whose law is p itself.
    np.testing.assert_allclose(lenient_law(jnp.asarray(q), jnp.asarray(p), 1.0), p, atol=1e-6)


# ---------------------------------------------------------------------------
# Greedy: token-for-token the target's greedy output (V = 16, ragged prompts)
# ---------------------------------------------------------------------------

GV = 16
G_TARGET, G_BIG, G_SMALL = TableLM(GV, 2), TableLM(GV, 1), TableLM(GV, 2)
G_NAMED = {"big": G_BIG.init_params(jax.random.PRNGKey(1), scale=3.0),
           "small": G_SMALL.init_params(jax.random.PRNGKey(2), scale=3.0),
           "mag": jax.random.randint(jax.random.PRNGKey(3), (GV,), 0, GV)}
G_TARGET_PARAMS = G_TARGET.init_params(jax.random.PRNGKey(0), scale=3.0)
G_PROMPTS = [[1, 2, 3, 1, 2], [4], [5, 6, 7, 8, 9, 5, 6]]
G_BIG_D, G_SMALL_D, G_MAG = (ModelDrafter(G_BIG, name="big"),
                             ModelDrafter(G_SMALL, name="small"), MaxGramDrafter(GV))
GREEDY = [
    ("mag", G_MAG, 3),
    ("vertical-l2", VerticalCascade(G_BIG, G_SMALL_D, inner_gamma=3, name="big"), 3),
    ("horizontal", HorizontalCascade((G_BIG_D, G_MAG), (2, 3)), 5),
    ("kmatrix-seed", cs_drafter([[2, 10], [0, 10]], [G_BIG_D, G_MAG]), 12),
    ("kmatrix-3", cs_drafter([[2, 1, 2], [0, 2, 1], [0, 0, 4]], [G_BIG_D, G_SMALL_D, G_MAG]),
     5),
]


@pytest.mark.parametrize("name, drafter, gamma", GREEDY, ids=[g[0] for g in GREEDY])
def test_greedy_drafting_equals_greedy_target(name, drafter, gamma):
    reference = sj.generate(target=G_TARGET, target_params=G_TARGET_PARAMS, prompts=G_PROMPTS,
                            method="autoregressive", max_new_tokens=24)
    decoder = SpeculativeDecoder(target=G_TARGET, drafter=drafter,
                                 target_fn=target_functions.SpecDecode(), gamma=gamma,
                                 max_new_tokens=24)
    out = jax.jit(decoder.generate)(G_TARGET_PARAMS, drafter.select_params(G_NAMED),
                                    make_prompt(G_PROMPTS), jax.random.PRNGKey(0),
                                    sampling_params(temperature=0.0, lenience=3.0))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference.tokens))
    assert np.asarray(out.stats.rejections).sum() > 0, "drafts must be rejected sometimes"


@pytest.mark.long  # heavy (whole job or many programs): CI runs it with -m long
def test_drafting_strategies_work_with_every_verifier_and_a_cascade_target():
    """Block-verified CS Drafting and cascades drafted by Max-Gram run and stay
    exact in the greedy case (block verification of specdecode)."""
    drafter = cs_drafter([[2, 10], [0, 10]], [G_BIG_D, G_MAG])
    reference = sj.generate(target=G_TARGET, target_params=G_TARGET_PARAMS, prompts=G_PROMPTS,
                            method="autoregressive", max_new_tokens=16)
    for verifier in sj.VERIFIERS:
        out = sj.generate(target=G_TARGET, target_params=G_TARGET_PARAMS, prompts=G_PROMPTS,
                          drafter=drafter, drafter_params=G_NAMED, verifier=verifier,
                          max_new_tokens=16, lenience=2.0)
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference.tokens))
    out = sj.generate(target=G_TARGET, target_params=G_TARGET_PARAMS, prompts=G_PROMPTS,
                      drafter=G_MAG, drafter_params=G_NAMED["mag"], method="token-v3",
                      alpha=0.3, temperature=1.0, max_new_tokens=16)
    assert np.all(np.asarray(out.lengths) == 16)


# ---------------------------------------------------------------------------
# ModelDrafter = the pre-interface loop; the skipped (G+1)-th step
# ---------------------------------------------------------------------------

GOLDEN = json.loads((pathlib.Path(__file__).parent / "data" /
                     "model_drafter_golden.json").read_text())


@pytest.mark.parametrize("case", GOLDEN["cases"],
                         ids=[f"{c['method']}-{c['verifier']}-T{c['temperature']}"
                              for c in GOLDEN["cases"]])
def test_model_drafter_reproduces_the_pre_interface_loop(case):
    """Same key, same tokens as the loop before the drafter interface (outputs
    recorded at commit be80d5d: tests/data/model_drafter_golden.json)."""
    v = GOLDEN["vocab"]
    target, drafter = TableLM(v, order=2), TableLM(v, order=1)
    out = sj.generate(
        target=target, drafter=drafter, prompts=GOLDEN["prompts"],
        target_params=target.init_params(jax.random.PRNGKey(GOLDEN["target_seed"]),
                                         scale=GOLDEN["scale"]),
        drafter_params=drafter.init_params(jax.random.PRNGKey(GOLDEN["drafter_seed"]),
                                           scale=GOLDEN["scale"]),
        method=case["method"], verifier=case["verifier"], temperature=case["temperature"],
        alpha=case["alpha"], gamma=case["gamma"], max_new_tokens=case["max_new_tokens"],
        seed=case["seed"])
    assert np.asarray(out.tokens).tolist() == case["tokens"]
    assert np.asarray(out.stats.target_calls).tolist() == case["target_calls"]


# ---------------------------------------------------------------------------
# Bad specs fail before anything compiles
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("k_matrix, message", [
    ([[2, 10], [1, 10]], "upper-triangular"),
    ([[2, -1], [0, 10]], "negative"),
    ([[0, 0], [0, 10]], "no positive entry"),
    ([[2, 10]], "2 x 2"),
    ("[[2, 10], [0, 10]", "not JSON"),
    ([[2.5, 10], [0, 10]], "not an integer"),
])
def test_bad_k_matrix_is_rejected(k_matrix, message):
    with pytest.raises(ValueError, match=message):
        cs_drafter(k_matrix, [G_BIG_D, G_MAG])


def test_bad_cascades_are_rejected():
    with pytest.raises(ValueError, match="list it last"):
        cs_drafter([[1, 1], [0, 1]], [G_MAG, G_BIG_D])
    with pytest.raises(ValueError, match="different vocabularies"):
        cs_drafter([[1, 1], [0, 1]], [G_BIG_D, MaxGramDrafter(GV + 1)])
    with pytest.raises(ValueError, match="lenience must be >= 1"):
        sampling_params(lenience=0.5)
    with pytest.raises(ValueError, match="conflicts with the drafter"):
        sj.make_decoder(target=G_TARGET, drafter=cs_drafter([[2, 10], [0, 10]],
                                                            [G_BIG_D, G_MAG]), gamma=5)
    with pytest.raises(ValueError, match="vocabulary"):
        sj.make_decoder(target=G_TARGET, drafter=MaxGramDrafter(GV + 1))


@pytest.mark.parametrize("spec, k_matrix, message", [
    ("big+nope", [[1, 1], [0, 1]], "unknown drafter 'nope'"),
    ("mag+big", [[1, 1], [0, 1]], "list it last"),
    ("big+mag", None, "pass a K-matrix"),
    ("big++mag", None, "empty item"),
    ("big+big", None, "names a drafter twice"),
    ("wide", None, "vocabulary"),
])
def test_bad_draft_specs_fail_before_compiling(spec, k_matrix, message):
    models = {"big": G_BIG, "wide": TableLM(GV + 1, 1)}
    with pytest.raises(ValueError, match=message):
        make_drafter(spec, models=models, vocab_size=GV, k_matrix=k_matrix)


def test_draft_specs_build_the_documented_strategies():
    models = {"big": G_BIG}
    assert isinstance(make_drafter("big", models=models, vocab_size=GV), ModelDrafter)
    assert isinstance(make_drafter("mag", models=models, vocab_size=GV), MaxGramDrafter)
    seed = make_drafter("big+mag", models=models, vocab_size=GV, k_matrix="[[2,10],[0,10]]")
    assert seed.lengths == (2, 10) and seed.gamma == 12
    vertical, mag = seed.drafters
    assert isinstance(vertical, VerticalCascade) and isinstance(mag, MaxGramDrafter)
    assert vertical.inner_gamma == 10 and not vertical.lenient  # never lenient on Max-Gram
    pure_vertical = make_drafter("big+mag", models=models, vocab_size=GV,
                                 k_matrix=[[4, 0], [0, 10]])
    assert len(pure_vertical.drafters) == 1 and pure_vertical.gamma == 4
    pure_horizontal = make_drafter("big+mag", models=models, vocab_size=GV,
                                   k_matrix=[[2, 10], [0, 0]])
    assert isinstance(pure_horizontal.drafters[0], ModelDrafter)
    assert sj.make_decoder(target=G_TARGET, drafter=seed).gamma == 12


def test_catch_up_by_two_one_token_calls_equals_one_two_token_call():
    """``catch_up_widths=(1,)`` (the CPU default) feeds a lagging draft in a
    headless 1-token call before the round's first call; the tokens are those
    of the 2-token window (ragged batch, T = 1), the calls one more per
    catch-up."""
    from specdec_jax.drafting.model_drafter import default_catch_up_widths

    assert default_catch_up_widths("cpu") == (1,) and default_catch_up_widths("gpu") == (1, 2)
    prompts = [[1, 2], [3], [0, 1, 2]]
    outs = {}
    for widths in [(1,), (1, 2)]:
        # "same": the drafter is the target, every block is accepted and every
        # round catches up; "other": a weaker drafter, ragged acceptance.
        for name, params in [("same", TARGET_PARAMS), ("other", DRAFTER_PARAMS)]:
            model = TARGET if name == "same" else DRAFTER
            drafter = ModelDrafter(model, catch_up_widths=widths)
            decoder = SpeculativeDecoder(target=TARGET, drafter=drafter,
                                         target_fn=target_functions.SpecDecode(), gamma=3,
                                         max_new_tokens=10)
            outs[widths, name] = jax.jit(decoder.generate)(
                TARGET_PARAMS, params, make_prompt(prompts), jax.random.PRNGKey(3),
                sampling_params(temperature=1.0))
    for name in ["same", "other"]:
        one, two = outs[(1,), name], outs[(1, 2), name]
        np.testing.assert_array_equal(np.asarray(one.tokens), np.asarray(two.tokens))
        full_accepts = np.asarray(two.stats.accepted_histogram)[:, 3].sum()
        extra = (np.asarray(one.stats.drafter_calls).sum()
                 - np.asarray(two.stats.drafter_calls).sum())
        # A row's last full accept has no next round to catch up in.
        assert full_accepts - len(prompts) <= extra <= full_accepts
    assert np.asarray(outs[(1, 2), "same"].stats.accepted_histogram)[:, 3].sum() > 3


@pytest.mark.parametrize("widths", [(1,), (2,), (1, 2), (2, 3), (1, 2, 5)])
@pytest.mark.parametrize("num_extra", [0, 2])
def test_catch_up_feeds_what_the_cache_lacks_in_chunks_then_one_window(widths, num_extra):
    """``extend_from_history`` on ragged lags (7, 1 and 3 tokens behind): the
    cache ends holding the history then the extra tokens, the logits are the
    model's after the pending token and after each extra one (a from-scratch
    call is the reference), and the counters follow the documented rule:
    rows more than the widest window behind are fed ``widest``-token chunks
    (one call each), then every row one call of the smallest width covering
    what is left. Several widths run their chunks through the widest
    window's call; one width gives chunks a call without the output head."""
    from specdec_jax.drafting.base import Context, extend_from_history

    history = jax.random.randint(jax.random.PRNGKey(21), (3, 12), 0, V).astype(jnp.int32)
    lengths, held = np.array([9, 7, 5]), np.array([2, 6, 2])
    extra = jax.random.randint(jax.random.PRNGKey(22), (3, num_extra), 0, V).astype(jnp.int32)
    cache = TARGET.init_cache(3, 16)
    cache = TARGET.prefill(TARGET_PARAMS, make_prompt(
        [np.asarray(history[b, :n]).tolist() for b, n in enumerate(held)]), cache).cache
    logits, _, cache, calls, fed, single = jax.jit(
        lambda c: extend_from_history(TARGET, TARGET_PARAMS, c, Context(
            history=history, length=jnp.asarray(lengths, jnp.int32)), extra, widths))(cache)

    np.testing.assert_array_equal(np.asarray(cache.lengths), lengths + num_extra)
    for b, n in enumerate(lengths):
        row = np.concatenate([np.asarray(history[b, :n]), np.asarray(extra[b])])
        np.testing.assert_array_equal(np.asarray(cache.history[b, :n + num_extra]), row)
        out = TARGET.extend(TARGET_PARAMS, jnp.asarray(row[None], jnp.int32),
                            TARGET.init_cache(1, 16))
        np.testing.assert_allclose(np.asarray(logits[b]),
                                   np.asarray(out.logits[0, n - 1:n + num_extra]), rtol=1e-6)
    widest, lag = max(widths), lengths - held
    chunks = np.zeros(3, int)
    while (lag > widest).any():
        chunks += lag > widest
        lag = np.where(lag > widest, lag - widest, lag)
    width = min(w for w in widths if w >= lag.max())
    np.testing.assert_array_equal(np.asarray(calls), chunks + 1)
    np.testing.assert_array_equal(np.asarray(fed), chunks * widest + width + num_extra)
    np.testing.assert_array_equal(np.asarray(single),
                                  chunks * (widest == 1) + (width + num_extra == 1))


def test_unrolled_draft_steps_draw_the_same_drafts():
    """``unroll=True`` (what a round program compiles, so a cost analysis sees
    each draft step) changes the code, not the drafts or the counts (T = 1)."""
    prompts = [[1, 2], [3], [0, 1, 2]]
    outs = []
    for unroll in (False, True):
        decoder = SpeculativeDecoder(target=TARGET, drafter=ModelDrafter(DRAFTER, unroll=unroll),
                                     target_fn=target_functions.SpecDecode(), gamma=4,
                                     max_new_tokens=10)
        outs.append(jax.jit(decoder.generate)(
            TARGET_PARAMS, DRAFTER_PARAMS, make_prompt(prompts), jax.random.PRNGKey(5),
            sampling_params(temperature=1.0)))
    rolled, unrolled = outs
    np.testing.assert_array_equal(np.asarray(rolled.tokens), np.asarray(unrolled.tokens))
    np.testing.assert_array_equal(np.asarray(rolled.stats.drafter_calls),
                                  np.asarray(unrolled.stats.drafter_calls))
