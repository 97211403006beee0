"""Sharded and unsharded generation give identical tokens (8 simulated CPU devices)."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import jax, numpy as np
    import specdec_jax as sj
    from specdec_jax import sharding
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
    print("IDENTICAL")
""")


def test_sharded_generation_is_identical():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "IDENTICAL" in result.stdout
