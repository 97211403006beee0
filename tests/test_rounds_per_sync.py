"""Reading a loop's condition once every R iterations (``loops.checked_while_loop``:
the decoders' ``rounds_per_sync``, SpecDec++'s ``steps_per_check``, a vertical
cascade's ``reviews_per_check``) changes nothing but the number of host reads:
tokens, lengths and every statistic are the same as the plain loop's, for each
decoder family and both inner draft loops, greedy and sampled, in ragged batches."""

import jax
import numpy as np
import pytest

from specdec_jax import api
from specdec_jax.decode.round import loop_until_done
from specdec_jax.drafting import AdaptiveDrafter, MaxGramDrafter, VerticalCascade
from specdec_jax.drafting.acceptance_head import AcceptanceHead, HeadConfig
from specdec_jax.models.interface import make_prompt
from tests.exactness import DRAFTER, DRAFTER_PARAMS, TARGET, TARGET_PARAMS

PROMPTS = [[1, 2], [3, 0, 1], [2, 2, 2, 3]]  # ragged: rows finish in different rounds
NEW_TOKENS = 13


def generate(method, rounds_per_sync, temperature, drafter=DRAFTER,
             drafter_params=DRAFTER_PARAMS, **kwargs):
    """Tokens, lengths and statistics of one generation of the ragged batch."""
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


def cascade(reviews_per_check: int) -> tuple[VerticalCascade, dict]:
    vocab = TARGET.vocab_size
    drafter = VerticalCascade(DRAFTER, MaxGramDrafter(vocab, name="mag"), inner_gamma=2,
                              name="big", reviews_per_check=reviews_per_check)
    return drafter, drafter.select_params({
        "big": DRAFTER_PARAMS,
        "mag": jax.random.randint(jax.random.PRNGKey(14), (vocab,), 0, vocab)})


def adaptive(steps_per_check: int) -> tuple[AdaptiveDrafter, tuple]:
    """SpecDec++ on the toy drafter, with a random acceptance head whose
    predictions differ by context (rows stop drafting at different steps)."""
    vocab = TARGET.vocab_size
    head = AcceptanceHead(HeadConfig(hidden_size=vocab, depth=1))
    head_params = {**head.init_params(jax.random.PRNGKey(21)),
                   "output": {"kernel": 2.0 * jax.random.normal(jax.random.PRNGKey(22),
                                                                (vocab, 1)),
                              "bias": np.full((1,), 0.5, np.float32)}}
    drafter = AdaptiveDrafter(DRAFTER, head, steps_per_check=steps_per_check)
    return drafter, drafter.select_params({drafter.name: DRAFTER_PARAMS,
                                           drafter.head_name: head_params})


@pytest.mark.parametrize("make, every", [(cascade, 2), (adaptive, 3)])
def test_inner_draft_loops_checked_less_often_draft_the_same(make, every):
    """The inner draft loops (a vertical cascade's reviews, SpecDec++'s draft
    steps), their condition read every ``every`` iterations, with R = 4 rounds
    per sync as well: the same output as every loop read each time."""
    plain = generate("specdecode", 1, 1.0, *make(1), gamma=4)
    assert_same(plain, generate("specdecode", 4, 1.0, *make(every), gamma=4))


def test_inner_loop_settings_must_be_positive_integers():
    with pytest.raises(ValueError, match="reviews_per_check must be an integer >= 1"):
        cascade(0)
    with pytest.raises(ValueError, match="steps_per_check must be an integer >= 1"):
        adaptive(True)


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
