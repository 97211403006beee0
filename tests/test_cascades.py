"""The cascade baselines (docs/algorithms.md, 'Cascade baselines outside the round'),
each against its defining property.

Greedy tests compare every emitted token and every target call with a
host-side, token-by-token reference written straight from the paper's
algorithm (on the enumerable TableLM toys, whose distributions vary enough
that every rule both defers and does not). Sampling tests check the law of
emitted sequences with the chi-square machinery of ``tests/exactness.py``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import api, target_functions
from specdec_jax.decode.cascade_baselines import DraftUntilDecoder, sequence_cascade
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
    chi_square_pvalue,
    exact_sequence_probs,
)
from tests.table_lm import TableLM

PROMPTS = [[1, 2], [3, 0, 1], [2, 2, 2, 3]]
NEW_TOKENS = 24


def q_of(context):
    return DRAFTER.next_probs(DRAFTER_PARAMS, tuple(context))


def p_of(context):
    return TARGET.next_probs(TARGET_PARAMS, tuple(context))


def run(method, alpha, temperature=0.0, gamma=None, prompts=PROMPTS, new_tokens=NEW_TOKENS,
        seed=0, **kwargs):
    decoder = api.make_decoder(target=TARGET, drafter=DRAFTER, method=method, gamma=gamma,
                               max_new_tokens=new_tokens, **kwargs)
    out = jax.jit(decoder.generate)(TARGET_PARAMS, DRAFTER_PARAMS, make_prompt(prompts),
                                    jax.random.PRNGKey(seed),
                                    api.sampling_params(temperature=temperature, alpha=alpha))
    return out


def rows(out):
    tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
    return [tokens[b, :lengths[b]].tolist() for b in range(len(lengths))]


def reference_token_cascade(prompt, alpha, cap, n):
    """Alg. 2 with the App. E.1 cap: per position, the drafter's token unless
    Chow defers (then the target's); the target is called at a deferral or
    after ``cap`` drafter tokens. Returns (tokens, target calls)."""
    seq, out, run_length, calls = list(prompt), [], 0, 0
    while len(out) < n:
        q = q_of(seq)
        defer = q.max() < 1 - alpha
        if defer or run_length == cap:
            calls, run_length = calls + 1, 0
            token = int(np.argmax(p_of(seq))) if defer else int(np.argmax(q))
            if not defer:
                run_length = 0
        else:
            token, run_length = int(np.argmax(q)), run_length + 1
        seq.append(token)
        out.append(token)
    return out, calls


# One case in the default suite; the other caps and thresholds under -m long (heavy).
LONG = pytest.mark.long


@pytest.mark.parametrize("alpha, cap", [(0.45, 10), pytest.param(0.45, 3, marks=LONG),
                                        pytest.param(0.0, 10, marks=LONG),
                                        pytest.param(1.0, 4, marks=LONG)])
def test_token_cascade_matches_the_sequential_algorithm(alpha, cap):
    """Greedy tokens and target calls equal the token-by-token Alg. 2; the
    drafter never emits more than ``cap`` tokens without the target."""
    out = run("token-cascade", alpha, gamma=cap)
    hist = np.asarray(out.stats.accepted_histogram)
    assert hist.shape[1] == cap + 1  # at most cap drafts per target call
    for b, prompt in enumerate(PROMPTS):
        tokens, calls = reference_token_cascade(prompt, alpha, cap, NEW_TOKENS)
        assert rows(out)[b] == tokens
        # The last call may be cut by max_new_tokens; the counts agree up to it.
        assert abs(int(out.stats.target_calls[b]) - calls) <= 1
    if alpha == 0.0:  # Chow at alpha 0 defers everywhere: the target's greedy output
        ar = run("autoregressive", 0.0)
        assert rows(out) == rows(ar)


def test_token_cascade_rejects_rules_that_read_the_target():
    with pytest.raises(ValueError, match="reads the target"):
        DraftUntilDecoder(target=TARGET, drafter=DRAFTER, mode="token-cascade",
                          max_new_tokens=4, rule=target_functions.Diff())


def reference_bild(prompt, alpha, fallback, cap, n):
    """App. E.5: fallback (draft while max q >= 1 - alpha_f, at most cap), then
    a deterministic rollback at the first D = -log p(d_i) > alpha."""
    seq, out, calls, rollbacks = list(prompt), [], 0, 0
    while len(out) < n:
        drafts, ctx = [], list(seq)
        while len(drafts) < cap and q_of(ctx).max() >= 1 - fallback:
            drafts.append(int(np.argmax(q_of(ctx))))
            ctx.append(drafts[-1])
        calls += 1
        kept, ctx = [], list(seq)
        for d in drafts:
            if -np.log(p_of(ctx)[d]) > alpha:
                rollbacks += 1
                break
            kept.append(d)
            ctx.append(d)
        kept.append(int(np.argmax(p_of(ctx))))
        seq += kept
        out += kept
    return out[:n], calls, rollbacks


@pytest.mark.parametrize("alpha, fallback", [(0.7, 0.5), pytest.param(2.0, 0.6, marks=LONG),
                                             pytest.param(0.0, 0.5, marks=LONG)])
def test_bild_original_matches_fallback_and_rollback(alpha, fallback):
    out = run("bild-original", alpha, gamma=4, fallback_alpha=fallback)
    total_rollbacks = 0
    for b, prompt in enumerate(PROMPTS):
        tokens, calls, rollbacks = reference_bild(prompt, alpha, fallback, 4, NEW_TOKENS)
        assert rows(out)[b] == tokens
        assert abs(int(out.stats.target_calls[b]) - calls) <= 1
        total_rollbacks += rollbacks
    if alpha == 0.7:
        assert total_rollbacks > 0, "the setting must exercise the rollback"
        assert int(np.asarray(out.stats.rejections).sum()) > 0


def test_oracle_defers_per_position_with_both_models():
    """Alg. 3 (greedy): both models at every position; the target's token iff
    Diff defers. One target and one drafter call per token."""
    alpha = 0.05
    out = run("oracle", alpha)
    for b, prompt in enumerate(PROMPTS):
        seq, want = list(prompt), []
        for _ in range(NEW_TOKENS):
            q, p = q_of(seq), p_of(seq)
            token = int(np.argmax(p if q.max() < p.max() - alpha else q))
            seq.append(token)
            want.append(token)
        assert rows(out)[b] == want
    np.testing.assert_array_equal(out.stats.target_calls, NEW_TOKENS)
    np.testing.assert_array_equal(out.stats.drafter_calls, NEW_TOKENS)


def sample(method, alpha):
    out = run(method, alpha, temperature=1.0, prompts=[list(PROMPT)] * ROWS,
              new_tokens=LENGTH, seed=3)
    return np.asarray(out.tokens)


def pi_of(rule, alpha):
    def next_dist(context):
        q, p = jnp.asarray(q_of(context), jnp.float32), jnp.asarray(p_of(context), jnp.float32)
        return np.asarray(rule(q, p, q, p, jnp.float32(alpha), jnp.float32(1.0))[0], np.float64)
    return next_dist


@pytest.mark.long
@pytest.mark.parametrize("method, rule, alpha", [("oracle", target_functions.Diff(), 0.05),
                                                 ("token-cascade", target_functions.Chow(), 0.45)])
def test_sampled_cascade_tokens_follow_pi(method, rule, alpha):
    """At T = 1 every emitted token follows pi = T_delta(q, p): sequences follow
    the product of pi (chi-square, 64 cells). The drafter's own law is rejected
    by the same statistic (p < 1e-12), so the test has power."""
    expected = exact_sequence_probs(pi_of(rule, alpha))
    tokens = sample(method, alpha)
    assert chi_square_pvalue(tokens, expected) > P_MIN
    drafter_law = exact_sequence_probs(q_of)
    assert chi_square_pvalue(tokens, drafter_law) < 1e-12


def test_tuned_beta_solves_the_balance_equation():
    """App. E.6: sum (q - p/(1-a))_+ = sum (p/beta - q)_+ to 1e-6, beta >= 1 - a,
    and the resulting pi is a distribution. beta = 1 (the heuristic) does not
    balance, so the check can fail."""
    key_q, key_p = jax.random.split(jax.random.PRNGKey(0))
    q = jax.nn.softmax(2.0 * jax.random.normal(key_q, (64, 50)))
    p = jax.nn.softmax(2.0 * jax.random.normal(key_p, (64, 50)))
    for alpha in (0.1, 0.3, 0.6, 0.9):
        beta = target_functions.tuned_beta(q, p, jnp.float32(alpha))
        left = jnp.sum(jnp.maximum(q - p / (1 - alpha), 0.0), axis=-1)
        right = jnp.sum(jnp.maximum(p / beta[:, None] - q, 0.0), axis=-1)
        assert float(jnp.max(jnp.abs(left - right))) < 1e-6
        assert float(jnp.min(beta)) >= 1 - alpha - 1e-6
        pi, _ = target_functions.LossyTuned()(q, p, q, p, jnp.float32(alpha), None)
        np.testing.assert_allclose(jnp.sum(pi, axis=-1), 1.0, atol=1e-5)
        heuristic = jnp.sum(jnp.maximum(p - q, 0.0), axis=-1)
        assert float(jnp.max(jnp.abs(left - heuristic))) > 1e-3


@pytest.mark.parametrize("method", ["lossy", "lossy-tuned"])
def test_lossy_is_lossless_under_greedy(method):
    """With one-hot q and p, pi(argmax q) = 0 unless the argmaxes agree."""
    assert rows(run(method, 0.6)) == rows(run("autoregressive", 0.0))


def test_sequence_cascade_defers_on_the_drafters_sequence_probability():
    """SeqCascade: the target's response iff q(response) < 1 - alpha, with
    q(response) the product of the drafter's probabilities of its tokens."""
    drafter = api.make_decoder(target=DRAFTER, method="autoregressive", max_new_tokens=6)
    target = api.make_decoder(target=TARGET, method="autoregressive", max_new_tokens=6)
    sp, key = api.sampling_params(), jax.random.PRNGKey(0)
    d_out = jax.jit(drafter.generate)(DRAFTER_PARAMS, None, make_prompt(PROMPTS), key, sp)
    t_out = jax.jit(target.generate)(TARGET_PARAMS, None, make_prompt(PROMPTS), key, sp)
    probs = []
    for prompt, tokens in zip(PROMPTS, rows(d_out), strict=True):
        seq, prob = list(prompt), 1.0
        for token in tokens:
            prob *= q_of(seq)[token]
            seq.append(token)
        probs.append(prob)
    alpha = 1 - float(np.median(probs))  # defers on some rows, not all
    out, defers = sequence_cascade(d_out, t_out, alpha + 1e-6)
    np.testing.assert_array_equal(defers, np.asarray(probs) < 1 - alpha - 1e-6)
    assert 0 < int(np.sum(defers)) < len(PROMPTS)
    for b, defer in enumerate(np.asarray(defers)):
        assert rows(out)[b] == (rows(t_out) if defer else rows(d_out))[b]
        assert int(out.stats.target_calls[b]) == (int(t_out.stats.target_calls[b]) if defer
                                                  else 0)
    normalised, _ = sequence_cascade(d_out, t_out, 0.5, length_normalised=True)
    assert normalised.tokens.shape == out.tokens.shape
    with pytest.raises(ValueError, match="outside"):
        sequence_cascade(d_out, t_out, 1.5)


def test_table_toys_are_varied_enough():
    """The rules above need contexts where the drafter is sure and unsure."""
    maxima = [q_of((a, b)).max() for a in range(4) for b in range(4)]
    assert min(maxima) < 0.55 < max(maxima)
    assert isinstance(TARGET, TableLM)
