"""Fused projections in the decode layout (``models.decoder.with_kernel_layout``):
q/k/v in one ``[H_kv, G + 2, D_head, D]`` kernel and gate/up in one ``[2, I, D]``.
Same logits as the separate kernels, an exact round trip, the same weight
fingerprint, three dot products per layer fewer in the compiled step, and
shards that hold whole kv groups (never part of a head)."""

import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax.checkpoints.tree_paths import params_fingerprint
from specdec_jax.models.decoder_only import split_projections, with_kernel_layout
from tests.simulated_devices import run_on_devices

# Grouped-query attention with 3 query heads per kv head and Qwen2's q/k/v bias.
CFG = sj.DecoderConfig(vocab_size=64, hidden_size=48, intermediate_size=40, num_layers=2,
                       num_heads=6, num_kv_heads=2, qkv_bias=True)
MODEL = sj.DecoderOnlyLM(CFG)
PARAMS = jax.tree_util.tree_map(  # non-zero biases, so a misplaced bias shows
    lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(3), x.shape),
    MODEL.init_params(jax.random.PRNGKey(0)))
TOKENS = [3, 17, 42, 5, 9, 60, 1, 33]


def logits_with_rollback(model, params):
    first = model.extend(params, jnp.asarray([TOKENS[:5]]), model.init_cache(1, 16))
    rolled = first.cache.replace(lengths=first.cache.lengths - 2)
    second = model.extend(params, jnp.asarray([TOKENS[3:]]), rolled)
    return np.concatenate([np.asarray(first.logits[0, :3]), np.asarray(second.logits[0])])


def test_fused_logits_equal_the_separate_kernels():
    separate = logits_with_rollback(*with_kernel_layout(MODEL, PARAMS, "out_in", fused=False))
    fused_model, fused = sj.decode_layout(MODEL, PARAMS)
    assert fused_model.config.fused_projections
    np.testing.assert_allclose(logits_with_rollback(fused_model, fused), separate, atol=2e-5,
                               rtol=0)


def test_a_wrong_slot_order_is_caught():
    """Not vacuous: swapping the key and value slots of the fused kernel (a
    plausible layout bug) moves the logits."""
    fused_model, fused = sj.decode_layout(MODEL, PARAMS)
    groups = CFG.num_heads // CFG.num_kv_heads
    order = list(range(groups)) + [groups + 1, groups]
    swapped = jax.tree_util.tree_map(lambda x: x, fused)
    for i in range(CFG.num_layers):
        qkv = swapped[f"layers_{i}"]["attention"]["qkv"]
        for field in qkv:
            qkv[field] = qkv[field][:, order]
    right = logits_with_rollback(fused_model, fused)
    assert np.abs(logits_with_rollback(fused_model, swapped) - right).max() > 1e-3


def test_round_trip_and_fingerprint():
    fused_model, fused = sj.decode_layout(MODEL, PARAMS)
    _, separate = with_kernel_layout(MODEL, PARAMS, "out_in", fused=False)
    jax.tree_util.tree_map(np.testing.assert_array_equal, split_projections(fused), separate)
    back_model, back = with_kernel_layout(fused_model, fused, "in_out")
    assert back_model == MODEL
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, PARAMS)
    # The fingerprint names the weights, not the layout (stored sweeps and heads keep it).
    assert params_fingerprint(fused, "out_in") == params_fingerprint(separate, "out_in") == \
        params_fingerprint(PARAMS)
    assert params_fingerprint(fused) == params_fingerprint(separate)  # hashed as stored
    other = jax.tree_util.tree_map(lambda x: x, fused)
    other["layers_1"]["mlp"]["wi"]["kernel"] = other["layers_1"]["mlp"]["wi"]["kernel"] * 2
    assert params_fingerprint(other, "out_in") != params_fingerprint(fused, "out_in")


def test_fused_projections_belong_to_the_decode_layout():
    with pytest.raises(ValueError, match="fused_projections is part of the decode layout"):
        sj.DecoderConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
                         num_heads=2, num_kv_heads=1, fused_projections=True)
    with pytest.raises(ValueError, match="fused=False with the in_out layout"):
        with_kernel_layout(MODEL, PARAMS, "in_out", fused=True)


def dots(model, params) -> int:
    """Dot products in the compiled program of one decode step."""
    step = jax.jit(lambda p, c: model.extend(p, jnp.ones((1, 1), jnp.int32), c).logits)
    text = step.lower(params, model.init_cache(1, 16)).compile().as_text()
    return len(re.findall(r"\bdot\(", text))


def test_the_fused_step_runs_three_products_per_layer_fewer():
    separate = dots(*with_kernel_layout(MODEL, PARAMS, "out_in", fused=False))
    fused = dots(*sj.decode_layout(MODEL, PARAMS))
    assert separate - fused == 3 * CFG.num_layers, (separate, fused)


def test_on_cpu_a_fused_kernel_is_multiplied_as_the_flat_matrix_it_is():
    """XLA's CPU dot of one row with a 3-D kernel transposes a copy of it
    first (the 1.5B float32 step took 836 ms instead of 213): on CPU the
    product reads ``[*N, K]`` as ``[prod N, K]``, whatever the kernel's state."""
    from specdec_jax.native import matmul as native_matmul  # noqa: PLC0415

    x, w = jnp.ones((1, 1, 16), jnp.float32), jnp.ones((2, 6, 16), jnp.float32)
    text = jax.jit(native_matmul.matmul_out_in).lower(x, w).compile().as_text()
    dots = [line for line in text.splitlines() if re.search(r"= \S+ dot\(", line)]
    # The 3-D form compiles to a dot of a transposed copy of the kernel
    # ("copy_bitcast_fusion", contracting its dim 0): the weights copied every step.
    assert dots and all("copy" not in line and "rhs_contracting_dims={1}" in line
                        for line in dots), dots
    y = native_matmul.matmul_out_in(x, w)
    assert y.shape == (1, 1, 2, 6) and np.allclose(y, 16.0)


SHARD_SCRIPT = textwrap.dedent("""
    import jax, numpy as np
    import specdec_jax as sj
    from specdec_jax.runtime import sharding
    mesh = sharding.make_mesh(data=2, model=4)
    for kv_heads, sharded in ((4, True), (2, False)):
        cfg = sj.DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                               num_layers=1, num_heads=8, num_kv_heads=kv_heads)
        model, params = sj.decode_layout(*(lambda m: (m, m.init_params(jax.random.PRNGKey(0))))(
            sj.DecoderOnlyLM(cfg)))
        placed = sharding.shard_params(params, mesh, sharding.rules_for(model))
        qkv = placed["layers_0"]["attention"]["qkv"]["kernel"]
        shard = qkv.addressable_shards[0].data.shape
        # a whole kv group (its query heads, key and value) or the whole kernel, never less
        assert shard == ((1,) + qkv.shape[1:] if sharded else qkv.shape), (kv_heads, shard)
        wi = placed["layers_0"]["mlp"]["wi"]["kernel"]
        assert wi.addressable_shards[0].data.shape == (2, 48 // 4, 32)  # gate and up of 12 units
    print("WHOLE GROUPS")
""")


def test_fused_shards_hold_whole_kv_groups():
    assert "WHOLE GROUPS" in run_on_devices(SHARD_SCRIPT).stdout
