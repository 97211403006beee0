"""HLO text counts (specdec_jax.jobs.tpu.hlo_stats) on hand-written modules: no compiler needed."""

from specdec_jax.jobs.tpu import hlo_stats

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
    slice={[0:8], [0:1024]}
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

    from specdec_jax.jobs.tpu import aot as tpu_aot  # noqa: PLC0415

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


def test_called_computations_end_at_the_next_attribute():
    """A while's condition and body (real names, not the word ``body``) and a
    braced list of branches; the loop's computations are found from them."""
    ins = hlo_stats.Instruction("w", "while", "(s32[])",
                                "while(%t), condition=%region_4.2.clone, "
                                "body=%region_3.1.sunk, metadata={op_name=\"x\"}")
    assert hlo_stats.called_computations(ins) == [("condition", "region_4.2.clone"),
                                                  ("body", "region_3.1.sunk")]
    branches = hlo_stats.Instruction("c", "conditional", "f32[]",
                                     "conditional(%p, %a, %b), branch_computations={%b0, %b1}")
    assert hlo_stats.called_computations(branches) == [("branch_computations", "b0"),
                                                       ("branch_computations", "b1")]


# A decoding loop over a weight w (bf16[512,1024], 1 MiB) that writes, per iteration of
# the inner loop: a float32 copy of w (2 MiB: weight-sized), a fusion that widens w
# only inside itself (its output, [1, 512] logits, is all it writes), an in-place update
# of a cache, and a prefetch of w into on-chip memory (S(1)). The outer loop's body
# calls the inner loop.
LOOPS = """HloModule jit_generate, is_scheduled=true

FileNames
1 "/src/specdec_jax/models/decoder_only.py"

FunctionNames
1 "_DecoderNet.__call__"

FileLocations
1 {file_name_id=1 function_name_id=1 line=321 end_line=321 column=4 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}

%widen_inside (p0: bf16[512,1024], p1: f32[1,1024]) -> f32[1,512] {
  %p0 = bf16[512,1024]{1,0} parameter(0)
  %w32 = f32[512,1024]{1,0} convert(%p0)
  %p1 = f32[1,1024]{1,0} parameter(1)
  ROOT %d = f32[1,512]{1,0} dot(%p1, %w32), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

%widen (p0: bf16[512,1024]) -> f32[512,1024] {
  %p0 = bf16[512,1024]{1,0} parameter(0)
  ROOT %c = f32[512,1024]{1,0} convert(%p0)
}

%update (p0: f32[4096,8], p1: f32[1,8], p2: s32[]) -> f32[4096,8] {
  %p0 = f32[4096,8]{1,0} parameter(0)
  %p1 = f32[1,8]{1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = f32[4096,8]{1,0} dynamic-update-slice(%p0, %p1, %p2, %z)
}

%ic (c: (s32[], bf16[512,1024], f32[4096,8])) -> pred[] {
  %c = (s32[], bf16[512,1024]{1,0}, f32[4096,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%ib.7 (b: (s32[], bf16[512,1024], f32[4096,8])) -> (s32[], bf16[512,1024], f32[4096,8]) {
  %b = (s32[], bf16[512,1024]{1,0}, f32[4096,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%b), index=0
  %w = bf16[512,1024]{1,0} get-tuple-element(%b), index=1
  %cache = f32[4096,8]{1,0} get-tuple-element(%b), index=2
  %copy32 = f32[512,1024] fusion(%w), calls=%widen, metadata={op_name="c" stack_frame_id=1}
  %x = f32[1,1024]{1,0} slice(%copy32), slice={[0:1], [0:1024]}
  %logits = f32[1,512]{1,0} fusion(%w, %x), kind=kOutput, calls=%widen_inside
  %row = f32[1,8]{1,0} slice(%logits), slice={[0:1], [0:8]}
  %cache2 = f32[4096,8]{1,0} fusion(%cache, %row, %i), kind=kLoop, calls=%update
  %cs = (bf16[512,1024]{1,0:S(1)}, bf16[512,1024]{1,0}, u32[]{:S(2)}) copy-start(%w)
  %cd = bf16[512,1024]{1,0:S(1)} copy-done(%cs)
  %one = s32[] constant(1)
  %j = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[512,1024]{1,0}, f32[4096,8]{1,0}) tuple(%j, %w, %cache2)
}

%oc (c: (s32[], bf16[512,1024], f32[4096,8])) -> pred[] {
  %c = (s32[], bf16[512,1024]{1,0}, f32[4096,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%ob (b: (s32[], bf16[512,1024], f32[4096,8])) -> (s32[], bf16[512,1024], f32[4096,8]) {
  %b = (s32[], bf16[512,1024]{1,0}, f32[4096,8]{1,0}) parameter(0)
  %w = bf16[512,1024]{1,0} get-tuple-element(%b), index=1
  %scaled = f32[512,1024] multiply(%w, %w), metadata={source_file="/src/l.py" source_line=136}
  ROOT %inner = (s32[], bf16[512,1024], f32[4096,8]) while(%b), condition=%ic, body=%ib.7
}

ENTRY %main (w: bf16[512,1024], cache: f32[4096,8]) -> f32[4096,8] {
  %w = bf16[512,1024]{1,0} parameter(0)
  %once = f32[512,1024]{1,0} fusion(%w), kind=kLoop, calls=%widen
  %cache = f32[4096,8]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %t = (s32[], bf16[512,1024]{1,0}, f32[4096,8]{1,0}) tuple(%zero, %w, %cache)
  %loop = (s32[], bf16[512,1024], f32[4096,8]) while(%t), condition=%oc, body=%ob
  ROOT %r = f32[4096,8]{1,0} get-tuple-element(%loop), index=2
}
"""
WEIGHT_BYTES = 512 * 1024 * 2


def test_loop_values_are_what_each_iteration_writes_to_hbm():
    values = hlo_stats.loop_values(LOOPS, 0.05 * WEIGHT_BYTES)
    assert [(v["name"], v["loop"], v["loop_depth"]) for v in values] == [
        ("copy32", "inner", 2), ("scaled", "loop", 1)]  # not once (entry), logits, cache, S(1)
    copy32, scaled = values
    assert copy32["bytes"] == 2 * WEIGHT_BYTES and copy32["type"] == "f32[512,1024]"
    assert copy32["opcode"] == "fusion"
    # the source from the stack-frame tables, or from older metadata
    assert copy32["source"] == "/src/specdec_jax/models/decoder_only.py:321 (_DecoderNet.__call__)"
    assert scaled["source"] == "/src/l.py:136"
    assert copy32["op_name"] == "c"
    # the cache's in-place update (128 KiB) is no new buffer; a lower bar admits the logits
    assert [v["name"] for v in hlo_stats.loop_values(LOOPS, 1024)] == [
        "copy32", "scaled", "x", "logits"]


ASSIGNMENT = """BufferAssignment:
allocation 0: size 1048576, parameter 0, shape |bf16[512,1024]| at ShapeIndex {}:
 value: <1 w @0> (size=1048576,offset=0): bf16[512,1024]{1,0}
allocation 1: size 131072, maybe-live-out:
 value: <2 r @0> (size=131072,offset=0): f32[4096,8]{1,0}
allocation 2: size 2097152, preallocated-temp:
 value: <3 once @0> (size=2097152,offset=0): f32[512,1024]{1,0}
 value: <4 copy32 @0> (size=2097152,offset=0): f32[512,1024]{1,0}
 value: <5 logits @0> (size=2048,offset=0): f32[1,512]{1,0}
allocation 3: size 1048576, color 1, preallocated-temp:
 value: <6 cd @1> (size=1048576,offset=0): bf16[512,1024]{1,0:S(1)}
allocation 4: size 4, constant:
 value: <7 zero @0> (size=4,offset=0): s32[]
allocation 5: size 512, thread-local:
 value: <8 j @0> (size=4,offset=0): s32[]
"""


def test_temp_buffers_read_the_hbm_temporaries_of_a_buffer_assignment():
    values = hlo_stats.temp_buffers(ASSIGNMENT, LOOPS)
    # HBM temporaries only: no parameter, output, constant, thread-local or on-chip value
    assert [(v["name"], v["bytes"]) for v in values] == [
        ("copy32", 2097152), ("once", 2097152), ("logits", 2048)]
    assert values[0]["type"] == "f32[512,1024]" and values[0]["opcode"] == "fusion"
    assert values[0]["source"] == ("/src/specdec_jax/models/decoder_only.py:321 "
                                   "(_DecoderNet.__call__)")
    assert [v["name"] for v in hlo_stats.temp_buffers(ASSIGNMENT, LOOPS, top=1)] == ["copy32"]


def test_hbm_temporaries_sum_the_hbm_space_and_find_the_small_values_at_its_top():
    assignment = ASSIGNMENT.replace(
        " value: <5 logits @0> (size=2048,offset=0): f32[1,512]{1,0}\n",
        " value: <5 logits @0> (size=2048,offset=0): f32[1,512]{1,0}\n"
        " value: <9 d1 @0> (size=512,offset=2097152): (s32[])\n"
        " value: <10 d2 @0> (size=512,offset=2113536): (s32[])\n").replace(
        "allocation 2: size 2097152, preallocated-temp:",
        "allocation 2: size 2114048, preallocated-temp:")
    # allocations 2 (temporaries) and 5 (thread-local); not the parameter, output,
    # constant or on-chip ones
    assert hlo_stats.hbm_temporaries(assignment) == {
        "bytes": 2114048 + 512, "small_values": 2, "small_span_bytes": 2113536 + 512 - 2097152}
    assert hlo_stats.hbm_temporaries(ASSIGNMENT)["small_values"] == 0
