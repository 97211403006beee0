"""Properties of the target functions (docs/algorithms.md, 'Target functions')."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import sampling, target_functions
from specdec_jax.target_functions import get_target

V = 6
MIXTURES = ["bild", "chow", "diff", "opt", "difflog", "optlog"]
TOKEN_RULES = ["token-v1", "token-v2", "token-v3"]


def random_dists(seed, n=500, concentration=0.7):
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.full(V, concentration), size=n).astype(np.float32)
    p = rng.dirichlet(np.full(V, concentration), size=n).astype(np.float32)
    return jnp.asarray(q), jnp.asarray(p)


def apply(method, q, p, alpha, beta=1.0, q_stat=None, p_stat=None):
    q_stat = q if q_stat is None else q_stat
    p_stat = p if p_stat is None else p_stat
    return get_target(method)(q, p, q_stat, p_stat, jnp.float32(alpha), jnp.float32(beta))


@pytest.mark.parametrize("method", MIXTURES + TOKEN_RULES + ["specdecode"])
@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.4, 0.9])
def test_cascade_targets_are_distributions(method, alpha):
    q, p = random_dists(0)
    pi, defer = apply(method, q, p, alpha)
    assert np.all(np.asarray(pi) >= 0)
    np.testing.assert_allclose(np.asarray(pi.sum(-1)), 1.0, atol=1e-5)
    assert np.all((np.asarray(defer) >= 0) & (np.asarray(defer) <= 1 + 1e-6))


# alpha per rule chosen so each defers on some rows and not on others.
LEMMA3_ALPHA = {"bild": 2.0, "chow": 0.3, "diff": 0.1, "opt": 0.3, "difflog": 0.3,
                "optlog": 0.3}


@pytest.mark.parametrize("method", MIXTURES)
def test_lemma3_rejection_rate_is_defer_times_tv(method):
    """P(reject a draft x ~ q under pi) = sum_x (q - pi)_+ = delta * D_TV(p, q)."""
    q, p = random_dists(1)
    pi, defer = apply(method, q, p, LEMMA3_ALPHA[method])
    rejection = jnp.sum(q * (1 - jnp.minimum(1.0, pi / q)), axis=-1)
    np.testing.assert_allclose(np.asarray(rejection),
                               np.asarray(defer * target_functions.total_variation(p, q)),
                               atol=1e-5)
    assert 0 < float(defer.mean()) < 1, "pick alpha so the rule sometimes defers"


def test_lossy_alpha0_beta1_is_specdecode():
    q, p = random_dists(2)
    lossy, _ = apply("lossy", q, p, 0.0, 1.0)
    exact, _ = apply("specdecode", q, p, 0.0)
    np.testing.assert_allclose(np.asarray(lossy), np.asarray(exact), atol=1e-7)


@pytest.mark.parametrize("method, alpha", [
    ("chow", 1.0), ("diff", 1.0), ("opt", 1.0), ("bild", 10.0), ("difflog", 10.0),
    ("optlog", 10.0), ("token-v1", 1.0), ("token-v2", 1.0), ("token-v3", 1.0)])
def test_never_defer_end_reproduces_drafter(method, alpha):
    q, p = random_dists(3, concentration=2.0)  # keeps cross-entropies below 10 nats
    pi, defer = apply(method, q, p, alpha)
    np.testing.assert_allclose(np.asarray(pi), np.asarray(q), atol=1e-6)
    assert float(defer.max()) == 0


@pytest.mark.parametrize("method", ["chow", "bild"])
def test_always_defer_end_reproduces_target(method):
    q, p = random_dists(4)
    pi, defer = apply(method, q, p, 0.0)
    np.testing.assert_allclose(np.asarray(pi), np.asarray(p), atol=1e-6)
    assert float(defer.min()) == 1


def test_opt_equals_diff_under_greedy():
    """Lemma 8 of Narasimhan et al. (speculative cascades):
    with one-hot q~, p~ OPT and Diff emit the same tokens."""
    rng = np.random.default_rng(5)
    logits_q = jnp.asarray(rng.normal(size=(2000, V)) * 2, jnp.float32)
    logits_p = jnp.asarray(rng.normal(size=(2000, V)) * 2, jnp.float32)
    zero, one = jnp.float32(0.0), jnp.float32(1.0)
    dq = sampling.distributions(logits_q, zero, one)
    dp = sampling.distributions(logits_p, zero, one)
    for alpha in (0.0, 0.2, 0.5):
        opt, _ = apply("opt", dq.probs, dp.probs, alpha, q_stat=dq.stats, p_stat=dp.stats)
        diff, _ = apply("diff", dq.probs, dp.probs, alpha, q_stat=dq.stats, p_stat=dp.stats)
        np.testing.assert_array_equal(np.asarray(opt), np.asarray(diff))


def test_greedy_stats_are_unscaled_softmax():
    logits = jnp.asarray([[2.0, 1.0, 0.0]])
    d = sampling.distributions(logits, jnp.float32(0.0), jnp.float32(1.0))
    np.testing.assert_array_equal(np.asarray(d.probs), [[1.0, 0.0, 0.0]])
    np.testing.assert_allclose(np.asarray(d.stats), np.asarray(jax.nn.softmax(logits)))


def test_top_k_and_top_p():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    one = jnp.float32(1.0)
    top2 = sampling.distributions(logits, one, one, sampling.SamplingConfig(top_k=2)).probs
    np.testing.assert_allclose(np.asarray(top2), [[0.625, 0.375, 0, 0]], atol=1e-6)
    nucleus = sampling.distributions(logits, one, jnp.float32(0.7)).probs  # 0.5 + 0.3 >= 0.7
    np.testing.assert_allclose(np.asarray(nucleus), [[0.625, 0.375, 0, 0]], atol=1e-6)


def sorted_top_p_mask(probs, top_p):
    """The nucleus by its definition: sort, keep while the mass before a token
    is below top_p, and every token tied with the least likely one kept."""
    desc = -np.sort(-probs, axis=-1)
    before = np.cumsum(desc, axis=-1) - desc
    threshold = np.min(np.where(before < top_p, desc, np.inf), axis=-1, keepdims=True)
    return probs >= threshold


def test_top_p_keeps_what_a_sort_keeps_ties_included():
    """The sort-free nucleus (a bisection on the threshold) against the sort's,
    on rows with ties, zeros and every scale of logits. Rows whose boundary
    mass is within float rounding of top_p are skipped (either side is the
    rule there)."""
    rng = np.random.default_rng(0)
    compared = 0
    for trial in range(60):
        vocab = int(rng.integers(2, 2000))
        logits = rng.normal(size=(4, vocab)) * rng.uniform(0.1, 8.0)
        if trial % 2:
            logits = np.round(logits)  # many exact ties
        probs = np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1))
        top_p = np.float32(rng.uniform(0.01, 1.0))
        got = np.asarray(sampling._top_p_mask(jnp.asarray(probs), jnp.float32(top_p)))
        for row, mask in zip(probs, got, strict=True):
            larger = np.array([row[row > v].sum(dtype=np.float64) for v in row])
            if np.min(np.abs(larger - top_p)) < 1e-6:
                continue
            np.testing.assert_array_equal(mask, sorted_top_p_mask(row, top_p))
            compared += 1
    assert compared > 200
    uniform = jnp.full((1, 4), 0.25)  # ties at the boundary are all kept
    assert np.asarray(sampling._top_p_mask(uniform, jnp.float32(0.5))).all()


@pytest.mark.parametrize("method, alpha, beta", [
    ("chow", 1.5, 1.0), ("bild", -0.1, 1.0), ("lossy", 1.0, 1.0), ("lossy", 0.5, 0.4)])
def test_out_of_range_hyperparameters_are_named(method, alpha, beta):
    with pytest.raises(ValueError, match="alpha|beta"):
        get_target(method).validate(alpha, beta)


def test_unknown_method_lists_choices():
    with pytest.raises(ValueError, match="token-v3"):
        get_target("tokenv3")
