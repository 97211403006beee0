"""Block verification (ALGORITHMS.md §3): exactness, optimality, greedy equivalence."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import targets
from specdec_jax.api import sampling_params
from specdec_jax.decoding import SpeculativeDecoder
from specdec_jax.models.interface import make_prompt
from specdec_jax.models.toy import TableLM
from specdec_jax.verify import TokenVerifier, VerifyOutput, correction_or_bonus
from specdec_jax.verify_block import BlockVerifier, block_weights
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
from tests.test_exactness import pi_dist

# The subtle known-wrong variant below differs from the exact one only where
# w_tau < 1; at 40k rows its chi-square p-value is ~1e-2, at 200k rows < 1e-12.
SUBTLE_ROWS = 200_000


def sample(verifier, gamma, target_fn=targets.SpecDecode(), alpha=0.0, seed=0, rows=ROWS):
    decoder = SpeculativeDecoder(target=TARGET, drafter=DRAFTER, target_fn=target_fn,
                                 gamma=gamma, max_new_tokens=LENGTH, verifier=verifier)
    out = jax.jit(decoder.generate)(TARGET_PARAMS, DRAFTER_PARAMS,
                                    make_prompt([list(PROMPT)] * rows),
                                    jax.random.PRNGKey(seed),
                                    sampling_params(temperature=1.0, alpha=alpha))
    return np.asarray(out.tokens), out.stats


@dataclasses.dataclass(frozen=True)
class BlockWithTokenResidual(BlockVerifier):
    """Known-wrong: block acceptance, but the token residual norm((p - q)_+)
    instead of norm((w_tau p - q)_+)."""

    def __call__(self, key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state=None):
        out = super().__call__(key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state)
        nxt = correction_or_bonus(jax.random.split(key)[1], out.num_accepted, q_BxGxV,
                                  pi_BxGxV, bonus_BxV)
        return VerifyOutput(num_accepted=out.num_accepted, next_token=nxt, state=state)


@dataclasses.dataclass(frozen=True)
class BlockWithTargetResidual(BlockVerifier):
    """Known-wrong (the canonical one of ALGORITHMS.md §8): resample from
    norm(p) after a rejection."""

    def __call__(self, key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state=None):
        out = super().__call__(key, drafts_BxG, q_BxGxV, pi_BxGxV, bonus_BxV, state)
        nxt = correction_or_bonus(jax.random.split(key)[1], out.num_accepted, q_BxGxV,
                                  pi_BxGxV, bonus_BxV, weights_fn=lambda pi, q: pi)
        return VerifyOutput(num_accepted=out.num_accepted, next_token=nxt, state=state)


@pytest.mark.parametrize("gamma", [2, 3])
def test_block_verification_is_exact(gamma):
    """Sequences ~ autoregressive sampling from p over many rounds; both wrong
    residuals give p < 1e-12 under the same test (asserted)."""
    expected = exact_sequence_probs(lambda c: TARGET.next_probs(TARGET_PARAMS, c))
    tokens, stats = sample(BlockVerifier(), gamma)
    assert chi_square_pvalue(tokens, expected) > P_MIN
    hist = np.asarray(stats.accepted_histogram).sum(0)
    assert hist[0] > 0 and hist[gamma] > 0
    wrong, _ = sample(BlockWithTargetResidual(), gamma)
    assert chi_square_pvalue(wrong, expected) < 1e-12
    if gamma == 3:
        subtle, _ = sample(BlockWithTokenResidual(), gamma, rows=SUBTLE_ROWS)
        assert chi_square_pvalue(subtle, expected) < 1e-12


def test_block_verified_cascade_follows_pi():
    """Against a cascade target pi = T(q, p) (block-verified speculative cascade)."""
    expected = exact_sequence_probs(pi_dist(targets.TokenV3(), 0.5))
    tokens, _ = sample(BlockVerifier(), 3, targets.TokenV3(), alpha=0.5)
    assert chi_square_pvalue(tokens, expected) > P_MIN
    wrong, _ = sample(BlockWithTargetResidual(), 3, targets.TokenV3(), alpha=0.5)
    assert chi_square_pvalue(wrong, expected) < 1e-12


def _enumerate_expected_tau(q_model, q_params, p_model, p_params, gamma, v, prefix=(1,),
                            pi_fn=None):
    """Exact E[tau] of one fresh round for token and block verification, and the
    Theorem 1 / Theorem 2 values, by enumerating every draft sequence."""
    def q_of(ctx):
        return q_model.next_probs(q_params, ctx)

    def p_of(ctx):
        p = p_model.next_probs(p_params, ctx)
        return p if pi_fn is None else pi_fn(q_of(ctx), p)

    token = block = theorem1 = theorem2 = 0.0
    for seq in itertools.product(range(v), repeat=gamma):
        ctxs = [prefix + seq[:i] for i in range(gamma)]
        q = np.stack([q_of(c) for c in ctxs])  # [G, V]
        p = np.stack([p_of(c) for c in ctxs])
        prob = np.prod([q[i, x] for i, x in enumerate(seq)])
        ratios = [min(1.0, p[i, x] / q[i, x]) for i, x in enumerate(seq)]
        token += prob * sum(np.prod(ratios[:i + 1]) for i in range(gamma))
        _, h = block_weights(jnp.asarray([seq], jnp.int32), jnp.asarray(q[None], jnp.float32),
                             jnp.asarray(p[None], jnp.float32))
        h = np.asarray(h[0], np.float64)
        # tau = max {i : eta_i <= h_i}; P(tau = i) = h_i prod_{j > i} (1 - h_j)
        block += prob * sum(i * h[i] * np.prod(1 - h[i + 1:]) for i in range(1, gamma + 1))
    for length in range(1, gamma + 1):
        for seq in itertools.product(range(v), repeat=length):
            ctxs = [prefix + seq[:i] for i in range(length)]
            m_s = np.prod([q_of(c)[x] for c, x in zip(ctxs, seq)])
            m_b = np.prod([p_of(c)[x] for c, x in zip(ctxs, seq)])
            theorem1 += min(m_s, m_b)
            theorem2 += np.prod([min(q_of(c)[x], p_of(c)[x]) for c, x in zip(ctxs, seq)])
    return token, block, theorem1, theorem2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_expected_accepted_length_between_token_and_optimum(seed):
    v, gamma = 3, 3
    q_model, p_model = TableLM(v, order=2), TableLM(v, order=2)
    q_params = q_model.init_params(jax.random.PRNGKey(100 + seed))
    p_params = p_model.init_params(jax.random.PRNGKey(200 + seed))
    token, block, theorem1, theorem2 = _enumerate_expected_tau(
        q_model, q_params, p_model, p_params, gamma, v)
    np.testing.assert_allclose(token, theorem2, rtol=1e-5)  # Theorem 2 is token verification
    assert theorem2 - 1e-6 <= block <= theorem1 + 1e-6
    assert block > token + 1e-3, "block verification should accept strictly more here"


def test_block_expected_length_with_cascade_target():
    v, gamma = 3, 3
    model = TableLM(v, order=2)
    q_params, p_params = model.init_params(jax.random.PRNGKey(7)), \
        model.init_params(jax.random.PRNGKey(8))

    def pi_fn(q, p):
        pi, _ = targets.TokenV3()(jnp.asarray(q), jnp.asarray(p), jnp.asarray(q),
                                  jnp.asarray(p), jnp.float32(0.5), jnp.float32(1.0))
        return np.asarray(pi, np.float64)

    token, block, theorem1, theorem2 = _enumerate_expected_tau(
        model, q_params, model, p_params, gamma, v, pi_fn=pi_fn)
    assert theorem2 - 1e-6 <= block <= theorem1 + 1e-6


def test_greedy_block_equals_token_verification():
    rng = np.random.default_rng(0)
    batch, gamma, v = 512, 4, 6
    q_idx = rng.integers(0, v, size=(batch, gamma + 1))
    p_idx = np.where(rng.random((batch, gamma + 1)) < 0.7, q_idx, rng.integers(0, v,
                                                                           (batch, gamma + 1)))
    q = jax.nn.one_hot(q_idx, v)
    p = jax.nn.one_hot(p_idx, v)
    drafts = jnp.asarray(q_idx[:, :gamma], jnp.int32)
    key = jax.random.PRNGKey(3)
    tok = TokenVerifier()(key, drafts, q[:, :gamma], p[:, :gamma], p[:, gamma])
    blk = BlockVerifier()(key, drafts, q[:, :gamma], p[:, :gamma], p[:, gamma])
    np.testing.assert_array_equal(np.asarray(tok.num_accepted), np.asarray(blk.num_accepted))
    np.testing.assert_array_equal(np.asarray(tok.next_token), np.asarray(blk.next_token))


def test_block_with_one_draft_is_token_verification():
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.dirichlet(np.ones(5), size=(4096, 1)), jnp.float32)
    p = jnp.asarray(rng.dirichlet(np.ones(5), size=(4096, 1)), jnp.float32)
    drafts = jax.random.categorical(jax.random.PRNGKey(0), jnp.log(q[:, 0]))[:, None]
    key = jax.random.PRNGKey(5)
    tok = TokenVerifier()(key, drafts, q, p, p[:, 0])
    blk = BlockVerifier()(key, drafts, q, p, p[:, 0])
    np.testing.assert_array_equal(np.asarray(tok.num_accepted), np.asarray(blk.num_accepted))
    np.testing.assert_array_equal(np.asarray(tok.next_token), np.asarray(blk.next_token))
