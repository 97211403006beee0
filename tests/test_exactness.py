"""Speculative sampling is exact; cascades follow pi = T(q, p) (docs/algorithms.md,
'What "exact" means, per algorithm').

Each test also runs a known-wrong variant through the same statistic and
asserts that it is rejected, so the test demonstrably has power.
"""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import target_functions
from specdec_jax.api import sampling_params
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.models.interface import make_prompt
from specdec_jax.verify.token import (
    TokenVerifier,
    VerifyOutput,
    correction_or_bonus,
    gather_token_probs,
    leading_accepts,
)
from tests.exactness import (
    DRAFTER,
    DRAFTER_PARAMS,
    LENGTH,
    P_MIN,
    PROMPT,
    ROWS,
    TARGET,
    TARGET_PARAMS,
    chi_square_pvalue,
    exact_sequence_probs,
)

# Chi-square tests on 40 000 samples each: `pytest -m long` (CI runs them after the default suite).
pytestmark = pytest.mark.long

GAMMA = 2


def sample(target_fn, verifier=TokenVerifier(), alpha=0.0, seed=0, rows=ROWS):
    decoder = SpeculativeDecoder(target=TARGET, drafter=DRAFTER, target_fn=target_fn,
                                 gamma=GAMMA, max_new_tokens=LENGTH, verifier=verifier)
    prompt = make_prompt([list(PROMPT)] * rows)
    out = jax.jit(decoder.generate)(TARGET_PARAMS, DRAFTER_PARAMS, prompt,
                                    jax.random.PRNGKey(seed),
                                    sampling_params(temperature=1.0, alpha=alpha))
    assert np.all(np.asarray(out.lengths) == LENGTH)
    return np.asarray(out.tokens), out.stats


def pi_dist(target_fn, alpha):
    """Host-side pi(.|context) = T(q, p) at temperature 1 (stats = probs)."""

    def next_dist(context):
        q = jnp.asarray(DRAFTER.next_probs(DRAFTER_PARAMS, context), jnp.float32)
        p = jnp.asarray(TARGET.next_probs(TARGET_PARAMS, context), jnp.float32)
        pi, _ = target_fn(q, p, q, p, jnp.float32(alpha), jnp.float32(1.0))
        return np.asarray(pi, np.float64)

    return next_dist


@dataclasses.dataclass(frozen=True)
class ResidualFromPi(TokenVerifier):
    """Known-wrong: after a rejection, resample from norm(pi) instead of
    norm((pi - q)_+)."""

    def __call__(self, key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state=None):
        accept_key, sample_key = jax.random.split(key)
        u_BxG = jax.random.uniform(accept_key, drafts_BxG.shape)
        accepted = leading_accepts(u_BxG * gather_token_probs(q_BxGxV, drafts_BxG)
                                   < gather_token_probs(pi_BxGxV, drafts_BxG))
        nxt = correction_or_bonus(sample_key, accepted, q_BxGxV, pi_BxGxV, bonus_BxV,
                                  weights_fn=lambda pi, q: pi)
        return VerifyOutput(num_accepted=accepted, next_token=nxt, state=state)


def test_specdecode_sequences_follow_the_target():
    """Emitted sequences ~ autoregressive sampling from p (chi-square, 64 cells).

    Known-wrong (residual norm(p)): p-value < 1e-12 (asserted below)."""
    expected = exact_sequence_probs(lambda c: TARGET.next_probs(TARGET_PARAMS, c))
    tokens, stats = sample(target_functions.SpecDecode())
    assert chi_square_pvalue(tokens, expected) > P_MIN
    # The test exercises rejections, corrections and bonus tokens alike.
    hist = np.asarray(stats.accepted_histogram).sum(0)
    assert hist[0] > 0 and hist[GAMMA] > 0
    wrong, _ = sample(target_functions.SpecDecode(), verifier=ResidualFromPi())
    assert chi_square_pvalue(wrong, expected) < 1e-12


def test_autoregressive_baseline_follows_the_target():
    from specdec_jax.decode.autoregressive import AutoregressiveDecoder
    decoder = AutoregressiveDecoder(target=TARGET, max_new_tokens=LENGTH)
    out = jax.jit(decoder.generate)(TARGET_PARAMS, None, make_prompt([list(PROMPT)] * ROWS),
                                    jax.random.PRNGKey(1), sampling_params(temperature=1.0))
    expected = exact_sequence_probs(lambda c: TARGET.next_probs(TARGET_PARAMS, c))
    assert chi_square_pvalue(np.asarray(out.tokens), expected) > P_MIN


# alpha per rule: each defers at some of the toy contexts and not at others.
CASCADES = [("chow", 0.4), ("diff", 0.05), ("opt", 0.5), ("bild", 2.2), ("difflog", 0.1),
            ("optlog", 0.2), ("token-v1", 0.1), ("token-v2", 0.2), ("token-v3", 0.5)]


@pytest.mark.parametrize("method, alpha", CASCADES)
def test_cascade_tokens_follow_pi(method, alpha):
    """Every emitted token follows pi = T(q, p) at its position, so sequences
    follow the autoregressive product of pi."""
    target_fn = target_functions.get_target(method)
    next_pi = pi_dist(target_fn, alpha)
    expected = exact_sequence_probs(next_pi)
    contexts = [PROMPT + (a,) for a in range(4)]
    pi_vs_p = max(np.abs(next_pi(c) - TARGET.next_probs(TARGET_PARAMS, c)).max()
                  for c in contexts)
    assert pi_vs_p > 0.05, "alpha must make pi differ from p, or the test cannot tell"
    tokens, stats = sample(target_fn, alpha=alpha)
    assert chi_square_pvalue(tokens, expected) > P_MIN


@dataclasses.dataclass(frozen=True)
class TokenV3BonusFromP(target_functions.TokenV3):
    """Known-wrong: a cascade whose bonus token follows p instead of pi."""

    bonus_from_target: ClassVar[bool] = True


def test_cascade_with_bonus_from_p_is_detected():
    """The wrong bonus rule gives a p-value < 1e-12 under the same test."""
    expected = exact_sequence_probs(pi_dist(target_functions.TokenV3(), 0.5))
    tokens, _ = sample(TokenV3BonusFromP(), alpha=0.5)
    assert chi_square_pvalue(tokens, expected) < 1e-12


@pytest.mark.parametrize("vocab", [5, 151936])
def test_sampler_draws_what_jax_categorical_draws(vocab):
    """sample_from_weights replaces categorical's fused argmax with a
    vectorisable max + first index: the same Gumbel noise, the same index,
    draw for draw (zero weights included), so the output law is untouched."""
    from specdec_jax.sampling import sample_from_weights

    weights = jax.nn.softmax(3 * jax.random.normal(jax.random.PRNGKey(0), (3, vocab)))
    weights = weights.at[:, 1].set(0.0).at[0].multiply(7.0)  # unnormalised row
    keys = jax.random.split(jax.random.PRNGKey(1), 200)
    ours = jax.vmap(lambda k: sample_from_weights(k, weights))(keys)
    logits = jnp.where(weights > 0, jnp.log(weights), -jnp.inf)
    theirs = jax.vmap(lambda k: jax.random.categorical(k, logits, axis=-1))(keys)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert not np.any(np.asarray(ours) == 1)


def test_a_row_with_one_positive_weight_draws_it_without_noise():
    """Where every row has one positive weight the draw skips the Gumbel noise
    (a cond whose taken branch draws no random bits) and returns what
    categorical returns: that index, NaN entries included (``jnp.argmax`` of
    the weights themselves would return the NaN's index 1). A batch with one
    spread row still draws every row with noise, as categorical does."""
    from specdec_jax.sampling import sample_from_weights

    keys = jax.random.split(jax.random.PRNGKey(2), 200)
    single = jnp.array([[0.0, jnp.nan, 0.3, 0.0], [0.0, 0.0, 0.0, 1.0]])
    mixed = jnp.array([[0.0, 0.0, 1.0, 0.0], [0.1, 0.4, 0.2, 0.3]])
    for weights in (single, mixed):
        ours = jax.vmap(lambda k, w=weights: sample_from_weights(k, w))(keys)
        logits = jnp.where(weights > 0, jnp.log(weights), -jnp.inf)
        theirs = jax.vmap(lambda k, x=logits: jax.random.categorical(k, x, axis=-1))(keys)
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert (np.asarray(ours)[:, 1] != 1).any()  # the spread row was sampled
    jaxpr = jax.make_jaxpr(sample_from_weights)(keys[0], single).jaxpr
    (cond,) = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
    draws = ["random_bits" in str(branch) for branch in cond.params["branches"]]
    assert sorted(draws) == [False, True]


def test_first_argmax_takes_the_first_of_tied_maxima():
    from specdec_jax.sampling import first_argmax

    x = jnp.array([[0.0, 2.0, 2.0, 1.0], [-jnp.inf, -jnp.inf, -jnp.inf, -jnp.inf],
                   [3.0, 1.0, 3.0, 3.0], [1.0, jnp.nan, 5.0, jnp.nan]])
    np.testing.assert_array_equal(np.asarray(first_argmax(x)), np.asarray(jnp.argmax(x, -1)))
    np.testing.assert_array_equal(np.asarray(first_argmax(x)), [1, 0, 0, 1])


def test_first_argmax_is_two_plain_reductions_on_cpu_only():
    """On CPU the max-then-min form (XLA vectorises one-operand reductions);
    lowered for TPU, ``jnp.argmax``'s one two-operand reduction, with which
    the TPU compiler keeps less scratch."""
    from specdec_jax.sampling import first_argmax

    def reductions(platform):
        text = jax.jit(first_argmax).trace(jnp.zeros((2, 16))).lower(
            lowering_platforms=(platform,)).as_text()
        return [line for line in text.splitlines() if "stablehlo.reduce(" in line]

    cpu, tpu = reductions("cpu"), reductions("tpu")
    assert len(cpu) == 2 and "maximum" in cpu[0] and "minimum" in cpu[1], cpu
    assert len(tpu) == 1 and tpu[0].lstrip().startswith("%") and ":2 = " in tpu[0], tpu
