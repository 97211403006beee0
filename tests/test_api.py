"""Public API: greedy equivalence, ragged batches, statistics, and bad input."""

import jax
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax.decode.round import MIN_SCRATCH
from tests.table_lm import TableLM

V = 16
TARGET = TableLM(V, order=2)
DRAFTER = TableLM(V, order=1)
T_PARAMS = TARGET.init_params(jax.random.PRNGKey(0), scale=3.0)
D_PARAMS = DRAFTER.init_params(jax.random.PRNGKey(1), scale=3.0)
PROMPTS = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]


def run(method="specdecode", **kw):
    args = dict(target=TARGET, target_params=T_PARAMS, drafter=DRAFTER, drafter_params=D_PARAMS,
                prompts=PROMPTS, method=method, gamma=3, max_new_tokens=12)
    args.update(kw)
    return sj.generate(**args)


def rows(out):
    return [list(np.asarray(out.tokens[b, : out.lengths[b]])) for b in range(len(out.lengths))]


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_specdecode_equals_greedy_target(gamma):
    reference = run("autoregressive")
    out = run(gamma=gamma)
    assert rows(out) == rows(reference)
    assert np.asarray(out.stats.rejections).sum() > 0, "drafter must disagree sometimes"


def test_batched_rows_equal_rows_alone():
    batch = run(temperature=0.0)
    for b, prompt in enumerate(PROMPTS):
        assert rows(run(prompts=[prompt]))[0] == rows(batch)[b]


def test_eos_stops_a_row_and_is_kept():
    reference = rows(run("autoregressive"))
    eos = int(reference[0][4])
    out = run(eos_ids=[eos])
    for b, ref in enumerate(reference):
        cut = ref.index(eos) + 1 if eos in ref else len(ref)
        assert rows(out)[b] == ref[:cut]


@pytest.mark.parametrize("method, calls_per_round", [("specdecode", 3), ("token-v3", 4)])
def test_statistics_are_consistent(method, calls_per_round):
    """G = 3: a cascade needs q_{G+1} (G + 1 drafter calls a round); specdecode
    does not, so its drafter skips that step (G calls)."""
    out = run(method, temperature=1.0, seed=3, alpha=0.3 if method != "specdecode" else 0.0)
    s = out.stats
    hist = np.asarray(s.accepted_histogram)
    np.testing.assert_array_equal(hist.sum(-1), np.asarray(s.target_calls))
    np.testing.assert_array_equal(np.asarray(s.drafter_calls),
                                  calls_per_round * np.asarray(s.target_calls))
    np.testing.assert_array_equal(np.asarray(s.drafter_calls_by_model)[:, 0],
                                  np.asarray(s.drafter_calls))
    np.testing.assert_array_equal(np.asarray(s.rejections), hist[:, :3].sum(-1))
    # each round emits accepted + 1 tokens (the last round may be cut at max_new_tokens)
    emitted_upper = (hist * (np.arange(4) + 1)).sum(-1)
    assert np.all(emitted_upper >= np.asarray(out.lengths))
    assert np.all(emitted_upper - 3 <= np.asarray(out.lengths))


def test_sweeping_alpha_and_temperature_does_not_recompile():
    fn = sj.make_generate_fn(target=TARGET, drafter=DRAFTER, method="token-v3", gamma=3,
                             max_new_tokens=8)
    prompt = sj.make_prompt(PROMPTS)
    for alpha, temperature in [(0.1, 0.0), (0.5, 1.0), (0.9, 0.5)]:
        fn(T_PARAMS, D_PARAMS, prompt, jax.random.PRNGKey(0),
           sj.sampling_params(temperature=temperature, alpha=alpha))
    assert fn._cache_size() == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(drafter=TableLM(V + 1, 1), drafter_params=TableLM(V + 1, 1).init_params(
        jax.random.PRNGKey(0))), "vocabulary"),
    (dict(gamma=0), "gamma"),
    (dict(method="chow", alpha=1.5), "alpha"),
    (dict(method="lossy", alpha=0.5, beta=0.2), "beta"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(prompts=[[1, 2], []]), "empty"),
    (dict(prompts=[[1, V]]), "outside the vocabulary"),
    (dict(max_new_tokens=100, max_cache_length=64), "max_cache_length"),
    (dict(method="nope"), "unknown method"),
    (dict(verifier="nope"), "unknown verifier"),
])
def test_bad_input_fails_before_compiling(kwargs, message):
    with pytest.raises(ValueError, match=message):
        run(**kwargs)


@pytest.mark.parametrize("verifier", sj.VERIFIERS)
def test_one_prefill_serves_decoders_with_smaller_gamma(verifier):
    """A sweep prefills once: decoding from a gamma-5 prefill with gamma 2 gives
    exactly what a plain gamma-2 generation gives (same key, sampled, T=1)."""
    prompt = sj.make_prompt(PROMPTS)
    key, sp = jax.random.PRNGKey(7), sj.sampling_params(temperature=1.0)
    big = sj.make_decoder(target=TARGET, drafter=DRAFTER, gamma=5, max_new_tokens=12)
    prefilled = jax.jit(big.prefill)(T_PARAMS, D_PARAMS, prompt)
    small = dict(target=TARGET, drafter=DRAFTER, gamma=2, verifier=verifier,
                 max_new_tokens=12)
    decoded = jax.jit(sj.make_decoder(**small).decode)(T_PARAMS, D_PARAMS, prefilled, key, sp)
    generated = sj.make_generate_fn(**small)(T_PARAMS, D_PARAMS, prompt, key, sp)
    assert rows(decoded) == rows(generated)
    np.testing.assert_array_equal(decoded.stats.target_calls, generated.stats.target_calls)


def test_decode_rejects_a_prefill_too_small_for_it():
    prompt = sj.make_prompt(PROMPTS)
    small = sj.make_decoder(target=TARGET, drafter=DRAFTER, gamma=2, max_new_tokens=12)
    prefilled = small.prefill(T_PARAMS, D_PARAMS, prompt)
    big = sj.make_decoder(target=TARGET, drafter=DRAFTER, gamma=5, max_new_tokens=15)
    needed = prompt.tokens.shape[1] + 15 + MIN_SCRATCH + 1
    with pytest.raises(ValueError, match=f"prefill with max_length={needed}"):
        big.decode(T_PARAMS, D_PARAMS, prefilled, jax.random.PRNGKey(0),
                   sj.sampling_params())
    with pytest.raises(ValueError, match=f"below the {needed} positions"):
        big.prefill(T_PARAMS, D_PARAMS, prompt, max_length=needed - 1)


def test_every_decoder_of_a_request_holds_caches_of_one_length():
    """The autoregressive target and speculative decoders (G = 1, 5) make the
    target's cache one length for the same prompts and budget: attention
    reduces over the cache's length, so a row-independent target then scores
    each context with the same bits in all of them (greedy outputs equal)."""
    made = []

    class Recording(TableLM):
        def init_cache(self, batch_size, max_length):
            made.append(max_length)
            return super().init_cache(batch_size, max_length)

    target = Recording(V, order=2)
    prompt = sj.make_prompt(PROMPTS)
    key, sp = jax.random.PRNGKey(0), sj.sampling_params()
    lengths = {}
    for gamma in (None, 1, 5):
        made.clear()
        if gamma is None:
            fn = sj.make_generate_fn(target=target, method="autoregressive", max_new_tokens=12)
        else:
            fn = sj.make_generate_fn(target=target, drafter=DRAFTER, gamma=gamma,
                                     max_new_tokens=12)
        jax.eval_shape(fn, T_PARAMS, D_PARAMS, prompt, key, sp)
        lengths[gamma] = set(made)
    want = {prompt.tokens.shape[1] + 12 + MIN_SCRATCH + 1}
    assert lengths == {None: want, 1: want, 5: want}
