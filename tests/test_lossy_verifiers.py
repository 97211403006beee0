"""Which verifiers the lossy rule (Tran-Thien; the ``lossy`` target functions of
``target_functions.py``) runs under, and what each does with its unnormalised
weights ``pi(v) = max(min(q(v), p(v) / (1 - alpha)), p(v) / beta)``.

- ``token``: the rule as defined (accept with min(1, pi / q), else draw from
  norm((pi - q)_+)).
- ``block`` (stateless): the same formulas on the same weights; with one draft
  it is the token rule draw for draw, and under greedy decoding it is lossless
  like the token rule.
- ``block-seed``: refused. Its carried residual zones are conditionals of a
  normalised law over many rounds, which unnormalised weights do not define.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import api, target_functions
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.models.interface import make_prompt
from specdec_jax.verify.block import BlockVerifier, SeedBlockVerifier
from specdec_jax.verify.token import TokenVerifier
from tests.exactness import DRAFTER, DRAFTER_PARAMS, TARGET, TARGET_PARAMS

PROMPTS = [[1, 2], [3, 0, 1], [2, 2, 2, 3]]


@pytest.mark.parametrize("method", ["lossy", "lossy-tuned"])
def test_block_seed_refuses_the_lossy_rule(method):
    with pytest.raises(ValueError, match="'block-seed'.*unnormalised.*'token' or 'block'"):
        api.make_decoder(target=TARGET, drafter=DRAFTER, method=method, gamma=3,
                         verifier="block-seed", max_new_tokens=8)
    with pytest.raises(ValueError, match="unnormalised"):
        SpeculativeDecoder(target=TARGET, drafter=DRAFTER, target_fn=target_functions.Lossy(),
                           gamma=3, max_new_tokens=8, verifier=SeedBlockVerifier())


def test_every_normalised_target_function_runs_under_block_seed():
    """The refusal is the lossy rule's alone: every other target function's pi
    is a law, and block-seed accepts it."""
    for name, cls in target_functions.TARGETS.items():
        assert cls.normalised == (name not in ("lossy", "lossy-tuned")), name
        if cls.normalised:
            SpeculativeDecoder(target=TARGET, drafter=DRAFTER, target_fn=cls(), gamma=3,
                               max_new_tokens=8, verifier=SeedBlockVerifier())


def test_stateless_block_with_one_draft_is_the_lossy_token_rule():
    """G = 1 with lossy's unnormalised weights: block verification decides and
    draws exactly as token verification, row for row."""
    rng = np.random.default_rng(3)
    rows = 4096
    q = jnp.asarray(rng.dirichlet(np.ones(5), size=(rows, 1)), jnp.float32)
    p = jnp.asarray(rng.dirichlet(np.ones(5), size=(rows, 1)), jnp.float32)
    pi, _ = target_functions.Lossy()(q, p, q, p, jnp.float32(0.4), jnp.float32(0.8))
    assert float(jnp.max(jnp.abs(jnp.sum(pi, -1) - 1.0))) > 0.05  # really unnormalised
    drafts = jax.random.categorical(jax.random.PRNGKey(0), jnp.log(q[:, 0]))[:, None]
    args = (jax.random.PRNGKey(5), drafts, q, pi, p[:, 0])
    token = jax.jit(TokenVerifier().__call__)(*args, None)
    block = jax.jit(BlockVerifier().__call__)(*args, BlockVerifier().init_state(rows))
    accepted = np.asarray(token.num_accepted)
    assert 0 < accepted.mean() < 1  # both outcomes occur
    np.testing.assert_array_equal(accepted, np.asarray(block.num_accepted))
    np.testing.assert_array_equal(np.asarray(token.next_token), np.asarray(block.next_token))


@pytest.mark.parametrize("method", ["lossy", "lossy-tuned"])
def test_lossy_under_block_verification_is_lossless_under_greedy(method):
    """One-hot q and p: pi(argmax q) = 0 unless the argmaxes agree, so the
    block verifier, like the token one, emits the target's greedy tokens."""
    def tokens(method, verifier, gamma):
        decoder = api.make_decoder(target=TARGET, drafter=DRAFTER, method=method, gamma=gamma,
                                   verifier=verifier, max_new_tokens=16)
        out = jax.jit(decoder.generate)(TARGET_PARAMS, DRAFTER_PARAMS, make_prompt(PROMPTS),
                                        jax.random.PRNGKey(0),
                                        api.sampling_params(temperature=0.0, alpha=0.6))
        return np.asarray(out.tokens), np.asarray(out.lengths)

    expected = tokens("autoregressive", None, None)
    got = tokens(method, "block", 3)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
