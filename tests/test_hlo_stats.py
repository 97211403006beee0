"""HLO text counts (jobs.hlo_stats) on hand-written modules: no compiler needed."""

from specdec_jax.jobs import hlo_stats

MODULE = """HloModule jit_f, is_scheduled=true

%fused_add (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  %inner = f32[4]{0} fusion(%p0), kind=kLoop, calls=%bitcast_fusion
  ROOT %add = f32[4]{0} add(%inner, %inner)
}

%cond (c: (s32[], f32[4])) -> pred[] {
  %c = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(8)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (b: (s32[], f32[4])) -> (s32[], f32[4]) {
  %b = (s32[], f32[4]{0}) parameter(0)
  %x = f32[4]{0} get-tuple-element(%b), index=1
  %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_add
  %ar = f32[4]{0} all-reduce(%f), replica_groups={}, to_apply=%sum
  %tok = token[] after-all()
  %out = token[] outfeed(%ar, %tok), outfeed_shape=f32[4]{0}
  %i = s32[] get-tuple-element(%b), index=0
  ROOT %t = (s32[], f32[4]{0}) tuple(%i, %ar)
}

ENTRY %main (w: bf16[1024,1024], x: f32[4]) -> f32[4] {
  %w = bf16[1024,1024]{1,0:T(8,128)(2,1)} parameter(0)
  %cs = (bf16[1024,1024]{1,0:S(1)}, bf16[1024,1024]{1,0}, u32[]{:S(2)}) copy-start(%w)
  %cd = bf16[1024,1024]{1,0:T(8,128)(2,1)S(1)} copy-done(%cs)
  %ss = ((bf16[1024,1024]{1,0}), bf16[256,1024]{1,0:S(1)}, s32[]) slice-start(%w),
    slice={[0:256], [0:1024]}
  %sd = bf16[256,1024]{1,0:T(8,128)(2,1)S(1)} slice-done(%ss)
  %x = f32[4]{0} parameter(1)
  %cb = f32[4]{0} custom-call(%x), custom_call_target="xla_ffi_python_cpu_callback"
  %w0 = (s32[], f32[4]{0}) tuple(%x, %x)
  %loop = (s32[], f32[4]{0}) while(%w0), condition=%cond, body=%body
  ROOT %r = f32[4]{0} get-tuple-element(%loop), index=1
}
"""


def test_counts_of_a_hand_written_module():
    stats = hlo_stats.summarize(MODULE)
    assert stats["fusions"] == 1  # the nested fusion is part of its kernel
    assert stats["while_loops"] == 1
    assert stats["host_ops_in_loops"] == [["outfeed", "out"]]
    assert sorted(op for op, _ in stats["host_ops"]) == ["custom-call", "outfeed"]
    assert stats["collectives"]["all-reduce"] == 1
    assert stats["async_copies"] == {"copy-start": 1, "copy-done": 1, "slice-start": 1,
                                     "slice-done": 1}
    # bytes written by the async copies, by destination memory space (1: on-chip)
    assert stats["copy_start_bytes"] == 2 * 1024 * 1024 + 2 * 256 * 1024
    assert stats["copy_start_to_space"] == {"1": stats["copy_start_bytes"]}


def test_types_and_memory_spaces():
    assert hlo_stats.type_bytes("(bf16[8,128]{1,0}, s32[], pred[3])") == 8 * 128 * 2 + 4 + 3
    assert hlo_stats.memory_spaces("bf16[8]{0:T(8)S(1)}") == {1}
    assert hlo_stats.memory_spaces("f32[2]{0}") == {0}
    assert hlo_stats.tuple_elements("((a[1]), b[2]{0}, c[])") == ["(a[1])", "b[2]{0}", "c[]"]


def test_largest_intermediates_name_what_a_program_materialises():
    """tpu_aot.largest_intermediates (what the compile job records for a program that
    runs out of HBM): the biggest arrays of a jaxpr, nested loops included, largest
    first, counted per (op, dtype, shape, where). Pure jax: no libtpu needed."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from specdec_jax.jobs import tpu_aot  # noqa: PLC0415

    def fn(x_N):
        outer = x_N[:, None] * x_N[None, :]  # [N, N] float32: 4 N^2 bytes

        def body(carry):
            i, acc = carry
            return i + 1, acc + jnp.exp(outer)  # inside a while loop

        _, acc = jax.lax.while_loop(lambda c: c[0] < 2, body, (0, outer))
        keys = jax.random.split(jax.random.key(0), 2 ** 20)  # typed keys: skipped, not fatal
        return acc.sum() + x_N.astype(jnp.float16).sum() + keys.shape[0]

    rows = tpu_aot.largest_intermediates(fn, [jax.ShapeDtypeStruct((1024,), jnp.float32)],
                                         min_bytes=2 ** 20)
    assert rows and rows[0]["shape"] == [1024, 1024] and rows[0]["dtype"] == "float32"
    assert rows[0]["gib"] == round(4 * 1024 ** 2 / 2 ** 30, 3)
    assert any(r["where"] == "/while" and r["op"] == "exp" for r in rows)
    assert all(r["gib"] >= rows[-1]["gib"] for r in rows)
    assert not any(r["shape"] == [1024] for r in rows)  # under min_bytes
