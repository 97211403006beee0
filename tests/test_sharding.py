"""Sharded and unsharded generation give identical tokens (8 simulated CPU devices)."""

import textwrap

import pytest

from tests.simulated_devices import run_on_devices

SCRIPT = textwrap.dedent("""
    import jax, numpy as np
    import specdec_jax as sj
    from specdec_jax.runtime import sharding
    assert jax.device_count() == 8, jax.devices()
    cfg = sj.DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                           num_heads=4, num_kv_heads=2)
    model = sj.DecoderOnlyLM(cfg)
    drafter = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=64, hidden_size=16,
        intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=2))
    tp = jax.tree_util.tree_map(lambda x: 4 * x, model.init_params(jax.random.PRNGKey(0)))
    dp = jax.tree_util.tree_map(lambda x: 4 * x, drafter.init_params(jax.random.PRNGKey(1)))
    prompt = sj.make_prompt([[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]] * 2)
    fn = sj.make_generate_fn(target=model, drafter=drafter, method="specdecode", gamma=3,
                             max_new_tokens=12)
    sp = sj.sampling_params(temperature=0.0)
    plain = fn(tp, dp, prompt, jax.random.PRNGKey(0), sp)
    mesh = sharding.make_mesh(data=4, model=2)
    sharded = fn(sharding.shard_params(tp, mesh), sharding.shard_params(dp, mesh),
                 sharding.shard_prompt(prompt, mesh), jax.random.PRNGKey(0), sp)
    assert len(sharded.tokens.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(plain.tokens), np.asarray(sharded.tokens))
    np.testing.assert_array_equal(np.asarray(plain.lengths), np.asarray(sharded.lengths))
    assert np.asarray(plain.stats.rejections).sum() > 0, "drafter must disagree sometimes"
    # The decode layout ([out, in] kernels), sharded by its own rules.
    (lm, ltp), (ld, ldp) = sj.decode_layout(model, tp), sj.decode_layout(drafter, dp)
    laid_fn = sj.make_generate_fn(target=lm, drafter=ld, method="specdecode", gamma=3,
                                  max_new_tokens=12)
    laid = laid_fn(sharding.shard_params(ltp, mesh, sharding.rules_for(lm)),
                   sharding.shard_params(ldp, mesh, sharding.rules_for(ld)),
                   sharding.shard_prompt(prompt, mesh), jax.random.PRNGKey(0), sp)
    np.testing.assert_array_equal(np.asarray(plain.tokens), np.asarray(laid.tokens))
    print("IDENTICAL")
""")


def test_sharded_generation_is_identical():
    assert "IDENTICAL" in run_on_devices(SCRIPT).stdout


NO_GATHER_SCRIPT = textwrap.dedent("""
    import re
    import jax, numpy as np
    import specdec_jax as sj
    from specdec_jax.runtime import sharding
    # Dimensions chosen distinct, so a gathered weight is recognisable by shape.
    cfg = sj.DecoderConfig(vocab_size=96, hidden_size=48, intermediate_size=80, num_layers=2,
                           num_heads=4, num_kv_heads=4)
    target = sj.DecoderOnlyLM(cfg)
    drafter = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=96, hidden_size=16,
        intermediate_size=32, num_layers=1, num_heads=2, num_kv_heads=2))
    tp = target.init_params(jax.random.PRNGKey(0))
    dp = drafter.init_params(jax.random.PRNGKey(1))
    if LAYOUT == "out_in":
        (target, tp), (drafter, dp) = sj.decode_layout(target, tp), sj.decode_layout(drafter, dp)
    mesh = sharding.make_mesh(data=2, model=4)
    prompt = sharding.shard_prompt(sj.make_prompt([[1, 2, 3]] * 8), mesh)
    fn = sj.make_generate_fn(target=target, drafter=drafter, gamma=3, max_new_tokens=16)
    text = fn.lower(sharding.shard_params(tp, mesh, sharding.rules_for(target)),
                    sharding.shard_params(dp, mesh, sharding.rules_for(drafter)), prompt,
                    jax.random.PRNGKey(0), sj.sampling_params(temperature=1.0)
                    ).compile().as_text()
    gathered = [tuple(int(d) for d in dims.split(",") if d)
                for dims in re.findall(r"= [a-z0-9]+\\[([0-9,]*)\\]\\S* all-gather\\(", text)]
    assert gathered, "expected some all-gathers (the sampled distributions)"
    weights = {tuple(x.shape) for x in jax.tree_util.tree_leaves(tp) if np.ndim(x) > 1}
    # One data shard's cache of one layer (keys or values) at the loop's length.
    from specdec_jax.decode.round import required_cache_length
    cache = target.init_cache(8 // 2, required_cache_length(3, 16, 3))
    smallest_cache = min(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(cache)
                         if np.ndim(x) > 2)
    bad = [g for g in gathered if g in weights or int(np.prod(g)) >= smallest_cache]
    assert not bad, f"all-gathers of weights or of the whole cache: {bad}"
    print("NO FULL GATHERS", len(gathered))
""")


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_model_sharded_loop_gathers_no_weight_and_no_cache(layout):
    """The compiled program of a target sharded over ``model`` (2 x 4 mesh)
    never all-gathers a full weight matrix or a layer's whole KV cache: only
    per-step activations and the sampled distributions move. In both kernel
    layouts, each sharded by its own rules."""
    script = NO_GATHER_SCRIPT.replace("LAYOUT ==", f"{layout!r} ==")
    assert "NO FULL GATHERS" in run_on_devices(script).stdout
