"""The feature draft head (drafting/feature.py): its bookkeeping, greedy
identity with the target, and exactness under every verifier and a cascade
target function.

The enumerable target is ``TableLM`` (tests/exactness.py), whose hidden state
is the one-hot of its context index: a feature head over it has its own
random embedding and output head rows (TableLM has neither). Its drafts are
far from the target's, so rejections, corrections and bonus tokens all occur.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax import sampling, target_functions
from specdec_jax.api import sampling_params
from specdec_jax.decode.autoregressive import AutoregressiveDecoder
from specdec_jax.decode.chain import SpeculativeDecoder
from specdec_jax.drafting import feature
from specdec_jax.drafting.base import Context, needs_features
from specdec_jax.models import feature_head
from specdec_jax.models.interface import make_prompt
from specdec_jax.verify.block import BlockVerifier, SeedBlockVerifier
from specdec_jax.verify.token import TokenVerifier
from tests.exactness import (
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

GAMMA = 2
T1 = sampling_params(temperature=1.0)
CONFIG = sampling.SamplingConfig()


def toy_feature_drafter(target: TableLM, seed: int = 5, scale: float = 2.0):
    """A feature head over a TableLM target (feature size V ** order)."""
    cfg = feature_head.FeatureHeadConfig(vocab_size=target.vocab_size,
                                    feature_size=target.vocab_size ** target.order,
                                    embed_size=8, num_heads=2, num_kv_heads=1,
                                    intermediate_size=32, head_dim=8)
    head = feature_head.FeatureHead(cfg)
    k_net, k_emb, k_rows = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = {"net": head.init_net(k_net),
              "embedding": jax.random.normal(k_emb, (cfg.vocab_size, cfg.embed_size)),
              "head": {"rows": scale * jax.random.normal(k_rows, (cfg.vocab_size,
                                                                   cfg.feature_size))}}
    return feature.FeatureDrafter(head), params


DRAFTER, DRAFTER_PARAMS = toy_feature_drafter(TARGET)
# Jitted once for the module: eagerly, every small op compiles on its own for every new shape
# (hundreds of compilations, most of these tests' time).
_HEAD_STEP = jax.jit(DRAFTER.head.step)
_HEAD_LOGITS = jax.jit(DRAFTER.head.logits)
_PROPOSE = jax.jit(DRAFTER.propose, static_argnums=(3, 4, 7))
_LAW_WIDTH = 16  # cache positions of drafter_law: the longest round it is asked for


def target_features(tokens: tuple[int, ...]) -> np.ndarray:
    """[len, D]: the target's hidden state after each token (one-hot context)."""
    prompt = make_prompt([list(tokens)])
    cache = TARGET.init_cache(1, len(tokens))
    out = TARGET.prefill(TARGET_PARAMS, prompt, cache, all_hidden=True)
    return np.asarray(out.hidden[0])


@functools.lru_cache(maxsize=None)
def drafter_law(round_start: tuple[int, ...], drafts: tuple[int, ...]) -> np.ndarray:
    """The law of the draft after ``drafts`` in a round that starts at
    ``round_start`` (its last token pending), computed from scratch: the
    prefix is fed on the target's real features, the drafts on the head's own
    predictions (the module docstring's definition, independent of the
    decoding loop's caches and windows)."""
    head, params = DRAFTER.head, DRAFTER_PARAMS
    real = target_features(round_start[:-1]) if len(round_start) > 1 else \
        np.zeros((0, head.config.feature_size))
    previous = np.concatenate([np.zeros((1, real.shape[-1])), real])  # f_{s-1}
    # One cache width for every law (the tail past the fed positions is masked, as it already
    # is between steps), so the jitted step compiles once per prefix length, not per call.
    assert len(round_start) + len(drafts) + 1 <= _LAW_WIDTH
    cache = head.init_cache(1, _LAW_WIDTH)
    predicted, cache = _HEAD_STEP(params, jnp.asarray([round_start], jnp.int32),
                                  jnp.asarray(previous[None], jnp.float32), cache)
    last = predicted[:, -1:]
    for token in drafts:
        last, cache = _HEAD_STEP(params, jnp.asarray([[token]], jnp.int32), last, cache)
    return np.asarray(jax.nn.softmax(_HEAD_LOGITS(params, last[0, 0])), np.float64)


def target_law(context: tuple[int, ...]) -> np.ndarray:
    return TARGET.next_probs(TARGET_PARAMS, context)


def round_aware_probs(target_fn, alpha: float, gamma: int) -> dict[tuple[int, ...], float]:
    """Exact law of LENGTH emitted tokens under ``target_fn`` with the token
    verifier, tracking each position's role in its round: at the ``i``-th
    draft position the token is an accepted draft with probability
    ``min(q_i, pi_i)`` (the round goes on) or a correction with ``(pi_i -
    q_i)_+`` (a new round starts); after ``gamma`` accepted drafts the bonus
    follows ``pi_{gamma+1}``."""

    def pi(q, p):
        out, _ = target_fn(jnp.asarray(q, jnp.float32), jnp.asarray(p, jnp.float32),
                           jnp.asarray(q, jnp.float32), jnp.asarray(p, jnp.float32),
                           jnp.float32(alpha), jnp.float32(1.0))
        return np.asarray(out, np.float64)

    probs: dict[tuple[int, ...], float] = {}

    def walk(emitted: tuple[int, ...], round_start: int, prob: float):
        if len(emitted) == LENGTH:
            probs[emitted] = probs.get(emitted, 0.0) + prob
            return
        context = PROMPT + emitted
        start = PROMPT + emitted[:round_start]
        drafts = emitted[round_start:]
        q = drafter_law(start, drafts)
        law = pi(q, target_law(context))
        for token in range(V):
            if len(drafts) == gamma:  # bonus
                walk(emitted + (token,), len(emitted) + 1, prob * law[token])
                continue
            kept = min(q[token], law[token])
            walk(emitted + (token,), round_start, prob * kept)
            walk(emitted + (token,), len(emitted) + 1, prob * max(law[token] - q[token], 0))

    walk((), 0, 1.0)
    return probs


def sample(target_fn=target_functions.SpecDecode(), verifier=TokenVerifier(), alpha=0.0, seed=0,
           gamma=GAMMA):
    decoder = SpeculativeDecoder(target=TARGET, drafter=DRAFTER, target_fn=target_fn,
                                 gamma=gamma, max_new_tokens=LENGTH, verifier=verifier)
    out = jax.jit(decoder.generate)(TARGET_PARAMS, DRAFTER_PARAMS,
                                    make_prompt([list(PROMPT)] * ROWS),
                                    jax.random.PRNGKey(seed),
                                    sampling_params(temperature=1.0, alpha=alpha))
    assert np.all(np.asarray(out.lengths) == LENGTH)
    return np.asarray(out.tokens), out.stats


# ---------------------------------------------------------------------------
# Bookkeeping (default suite)
# ---------------------------------------------------------------------------

def test_the_decoder_keeps_features_only_for_drafters_that_read_them():
    assert needs_features(DRAFTER)
    assert not needs_features(sj.drafting.MaxGramDrafter(V))
    decoder = SpeculativeDecoder(target=TARGET, drafter=DRAFTER,
                                 target_fn=target_functions.SpecDecode(), gamma=GAMMA,
                                 max_new_tokens=LENGTH)
    prefilled = decoder.prefill(TARGET_PARAMS, DRAFTER_PARAMS, make_prompt([[1, 2, 3]]))
    assert prefilled.features.shape == (1, prefilled.history.shape[1], V ** TARGET.order)
    # Fed prompt positions (all but the pending token) hold the target's features.
    np.testing.assert_array_equal(prefilled.features[0, :2], target_features((1, 2)))


def test_first_draft_reads_real_features_and_later_ones_its_predictions():
    """propose's q equals the from-scratch law (``drafter_law``) for a round
    at a new prefix, after a rewind that kept some drafts, and in a context
    longer than the target's features (a cascade's inner level)."""
    seq = (1, 2, 3, 0, 2, 1, 3, 3, 0)
    width = 16
    history = jnp.asarray([list(seq) + [0] * (width - len(seq))], jnp.int32)
    features = np.zeros((1, width, V ** TARGET.order), np.float32)
    features[0, :len(seq)] = target_features(seq)

    def context(length, known):
        return Context(history=history, length=jnp.asarray([length]),
                       features=jnp.asarray(features),
                       feature_length=jnp.asarray([known]))

    state = DRAFTER.init(DRAFTER_PARAMS, make_prompt([list(seq[:3])]), width, False)
    key = jax.random.PRNGKey(0)

    def check(state, length, known, num=3):
        prop, state = _PROPOSE(DRAFTER_PARAMS, state, context(length, known), num, True, key,
                               T1, CONFIG)
        start, drafts = seq[:known + 1], seq[known + 1:length]
        tokens = tuple(int(t) for t in prop.tokens[0])
        for i in range(num + 1):
            want = drafter_law(start, drafts + tokens[:i])
            np.testing.assert_allclose(np.asarray(prop.q[0, i]), want, atol=2e-5)
        return prop, state

    _, state = check(state, 3, 2)  # the prompt's round
    state = DRAFTER.rewind(state, jnp.asarray([4]))  # kept the pending token and one draft
    _, state = check(state, 6, 5)  # the target now knows 5 tokens: real features re-fed
    state = DRAFTER.rewind(state, jnp.asarray([6]))
    _, state = check(state, 8, 5)  # two history tokens past the target's: fed on predictions
    state = DRAFTER.rewind(state, jnp.asarray([8]))
    check(state, 9, 8)  # and re-fed on real ones once the target has them


@functools.cache
def greedy_setup():
    """(target, params, drafter, drafter params, prompt, greedy target output), built and
    compiled once for every gamma of the test below."""
    cfg = sj.DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                           num_heads=4, num_kv_heads=2)
    target = sj.DecoderOnlyLM(cfg)
    params = target.init_params(jax.random.PRNGKey(0))
    head = feature_head.FeatureHead(
        feature_head.FeatureHeadConfig.for_target(target, intermediate_size=16))
    drafter = feature.FeatureDrafter(head)
    d_params = feature_head.drafter_params(target, params, head.init_net(jax.random.PRNGKey(1)),
                                      token_ids=np.arange(0, 64, 2))
    prompt = make_prompt([[1, 2, 3, 4, 5], [7, 8], [9] * 70])  # the last needs chunks
    ar = jax.jit(AutoregressiveDecoder(target=target, max_new_tokens=24).generate)(
        params, None, prompt, jax.random.PRNGKey(0), sampling_params(temperature=0.0))
    return target, params, drafter, d_params, prompt, ar


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_output_is_the_targets(gamma):
    target, params, drafter, d_params, prompt, ar = greedy_setup()
    t0 = sampling_params(temperature=0.0)
    out = jax.jit(SpeculativeDecoder(target=target, drafter=drafter,
                                     target_fn=target_functions.SpecDecode(), gamma=gamma,
                                     max_new_tokens=24).generate)(
        params, d_params, prompt, jax.random.PRNGKey(0), t0)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    stats = out.stats
    assert int(stats.nan_logits.sum()) == 0
    # Per round: one catch-up window of gamma + 1 positions, then gamma - 1 steps
    # (specdecode needs no q_{G+1}); round 1 first feeds 64-wide chunks while a
    # row's prompt is longer than the window.
    rounds = np.asarray(stats.target_calls)

    def chunks(prompt_length):
        lag, count = prompt_length, 0
        while lag > gamma + 1:
            lag, count = lag - feature.CATCH_UP_CHUNK, count + 1
        return count

    want = rounds * gamma + np.array([chunks(5), chunks(2), chunks(70)])
    np.testing.assert_array_equal(stats.drafter_calls, want)


def test_an_encoder_decoder_target_is_refused():
    with pytest.raises(ValueError, match="decoder-only"):
        DRAFTER.init(DRAFTER_PARAMS, make_prompt([[1]]), 8, encoder_decoder=True)


# ---------------------------------------------------------------------------
# Exactness (chi-square, 40 000 rows: `pytest -m long`)
# ---------------------------------------------------------------------------

@pytest.mark.long
@pytest.mark.parametrize("verifier", [TokenVerifier(), BlockVerifier(), SeedBlockVerifier()],
                         ids=["token", "block", "block-seed"])
def test_sequences_follow_the_target(verifier):
    """Emitted sequences ~ the target's autoregressive law under every verifier."""
    expected = exact_sequence_probs(target_law)
    tokens, stats = sample(verifier=verifier)
    assert chi_square_pvalue(tokens, expected) > P_MIN
    hist = np.asarray(stats.accepted_histogram).sum(0)
    assert hist[0] > 0 and hist[GAMMA] > 0  # rejections and full acceptances both occur


@dataclasses.dataclass(frozen=True)
class FirstLawForEveryDraft(feature.FeatureDrafter):
    """Known-wrong: reports the round's first law for every draft, as if the
    head's prediction did not depend on the drafts it fed back."""

    def propose(self, params, state, context, num, with_next, key, sp, config):
        prop, state = super().propose(params, state, context, num, with_next, key, sp, config)
        return prop.replace(q=jnp.broadcast_to(prop.q[:, :1], prop.q.shape)), state


@pytest.mark.long
def test_a_drafter_misreporting_its_law_is_detected():
    """Reporting a law other than the one the drafts came from breaks
    exactness: the same statistic rejects it (p-value < 1e-12 here)."""
    drafter = FirstLawForEveryDraft(DRAFTER.head)
    decoder = SpeculativeDecoder(target=TARGET, drafter=drafter,
                                 target_fn=target_functions.SpecDecode(), gamma=GAMMA,
                                 max_new_tokens=LENGTH)
    out = jax.jit(decoder.generate)(TARGET_PARAMS, DRAFTER_PARAMS,
                                    make_prompt([list(PROMPT)] * ROWS), jax.random.PRNGKey(0), T1)
    assert chi_square_pvalue(np.asarray(out.tokens), exact_sequence_probs(target_law)) < 1e-12


@pytest.mark.long
def test_a_cascade_follows_pi_of_each_positions_round_role():
    """Under a cascade target function the emitted tokens follow ``T(q, p)``
    with the q of each position's role in its round (``round_aware_probs``).
    Known-wrong expectation: the same law with every position treated as a
    round's first draft (the law of a drafter without predicted features) is
    rejected (p-value < 1e-12)."""
    target_fn, alpha = target_functions.get_target("token-v3"), 0.5
    tokens, stats = sample(target_fn=target_fn, alpha=alpha)
    assert float(np.asarray(stats.deferred_mass).sum()) > 0  # the cascade defers somewhere
    assert chi_square_pvalue(tokens, round_aware_probs(target_fn, alpha, GAMMA)) > P_MIN
    first_draft_only = round_aware_probs(target_fn, alpha, gamma=0)
    assert chi_square_pvalue(tokens, first_draft_only) < 1e-12
