"""Reading the decoding loop's condition once every R rounds
(``rounds_per_sync``, ``decoding.loop_until_done``) changes nothing but the
number of host reads: tokens, lengths and every statistic are the same as the
plain loop's, for each decoder family, greedy and sampled, in ragged batches."""

import jax
import numpy as np
import pytest

from specdec_jax import api
from specdec_jax.decoding import loop_until_done
from specdec_jax.drafting import MaxGramDrafter, VerticalCascade
from specdec_jax.models.interface import make_prompt
from tests.exactness import DRAFTER, DRAFTER_PARAMS, TARGET, TARGET_PARAMS

PROMPTS = [[1, 2], [3, 0, 1], [2, 2, 2, 3]]  # ragged: rows finish in different rounds
NEW_TOKENS = 13


def generate(method, rounds_per_sync, temperature, drafter=DRAFTER,
             drafter_params=DRAFTER_PARAMS, **kwargs):
    fn = api.make_generate_fn(target=TARGET, drafter=drafter, method=method,
                              max_new_tokens=NEW_TOKENS, eos_ids=(3,),
                              rounds_per_sync=rounds_per_sync, **kwargs)
    return fn(TARGET_PARAMS, drafter_params, make_prompt(PROMPTS), jax.random.PRNGKey(7),
              api.sampling_params(temperature=temperature, alpha=0.3))


def assert_same(a, b):
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# Sampled (T = 1: every round draws keys, so a skipped or extra round would show)
# for each decoder family; greedy once.
@pytest.mark.parametrize("method, kwargs, temperature", [
    ("autoregressive", {}, 1.0),
    ("specdecode", dict(gamma=3), 1.0),
    ("specdecode", dict(gamma=3), 0.0),
    ("specdecode", dict(gamma=3, verifier="block-seed"), 1.0),
    ("chow", dict(gamma=2), 1.0),
    ("token-cascade", dict(gamma=4), 1.0),
])
def test_outputs_do_not_depend_on_rounds_per_sync(method, kwargs, temperature):
    plain = generate(method, 1, temperature, **kwargs)
    if temperature:
        assert len(set(np.asarray(plain.lengths).tolist())) > 1, "rows must end apart"
    assert_same(plain, generate(method, 3, temperature, **kwargs))


def test_a_drafting_strategy_with_rounds_per_sync():
    """A CS Drafting cascade (model over Max-Gram): same output either way."""
    vocab = TARGET.vocab_size
    drafter = VerticalCascade(DRAFTER, MaxGramDrafter(vocab, name="mag"), inner_gamma=2,
                              name="big")
    params = drafter.select_params({"big": DRAFTER_PARAMS,
                                    "mag": jax.random.randint(jax.random.PRNGKey(14), (vocab,),
                                                              0, vocab)})
    plain = generate("specdecode", 1, 1.0, drafter=drafter, drafter_params=params, gamma=3)
    assert_same(plain, generate("specdecode", 4, 1.0, drafter=drafter, drafter_params=params,
                                gamma=3))


def test_loop_until_done_counts_iterations_and_skips_after_the_end():
    """23 iterations with R = 8: the body runs exactly 23 times (the 24th
    slot of the third chunk is skipped on the device)."""
    import flax.struct  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    @flax.struct.dataclass
    class Count:
        steps: jax.Array
        done: jax.Array

    def body(s):
        steps = s.steps + 1
        return Count(steps=steps, done=steps >= jnp.array([23, 5]))

    start = Count(steps=jnp.int32(0), done=jnp.array([False, False]))
    for rounds in (1, 8, 30):
        assert int(jax.jit(lambda s, r=rounds: loop_until_done(body, s, r))(start).steps) == 23


@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_rounds_per_sync_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="rounds_per_sync must be an integer >= 1"):
        api.make_decoder(target=TARGET, drafter=DRAFTER, method="specdecode",
                         rounds_per_sync=bad)
