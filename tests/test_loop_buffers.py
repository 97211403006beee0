"""No weight-sized buffer in a decoding program (issue 55), read from the TPU
compiler's output for one v5e chip: every generate family's HBM temporaries
stay near the autoregressive program's, and no loop writes a value of 5% of
the weights or more per iteration (``hlo_stats.loop_values``).

The models have the Qwen pair's layer widths (the 1.5B's and the 0.5B's
hidden and MLP sizes, where the TPU compiler's layout choices are those of
the real pair) but two and one layers and a 2,048-token vocabulary, bf16,
batch 1, a 512-token prompt: at these widths an interleaved gate/up kernel
was re-laid out into a per-layer copy kept through the loop (62 MB of
temporaries against the autoregressive program's 22 MB; 26 MB since the
[2, I, D] layout). ~15-30 s a program, so ``long``; skipped without libtpu.
"""

import functools

import pytest

from specdec_jax.jobs.tpu import aot as tpu_aot
from specdec_jax.jobs.tpu import programs as tpu_programs
from tests import tpu_topology
from tests.loop_programs import SHAPES, figures, qwen_width_models

pytestmark = pytest.mark.long
TOPOLOGY = "v5e:2x2"
tpu_topology.require(TOPOLOGY)

# A family's temporaries may exceed the autoregressive program's by this share of its
# weights (the drafter's caches, logits of G + 1 positions, a tree's buffers).
EXTRA_TEMPORARIES = 0.05
FAMILIES = ["generate_specdecode_token", "generate_tree_dynamic", "generate_cascade_token_v3",
            "generate_feature", "generate_specdecpp", "generate_csd_maxgram",
            "generate_tree_maxgram"]


@functools.lru_cache(maxsize=None)
def compiled(name: str) -> dict:
    """``{"temp", "weights", "loop_values"}`` of one generate program."""
    program = tpu_programs.build(name, SHAPES, tpu_aot.make_mesh(TOPOLOGY),
                                 qwen_width_models("bfloat16", "bfloat16"))
    executable, _, _ = tpu_aot.compile_abstract(program.fn, program.args,
                                                donate_argnums=program.donate_argnums)
    return figures(executable, program)


def test_the_families_cover_every_generate_method():
    methods = {tpu_programs.GENERATE[name][:2] for name in FAMILIES}
    assert methods | {("autoregressive", None)} == {
        (m, kind) for m, kind, _ in tpu_programs.GENERATE.values()}


@pytest.mark.parametrize("name", FAMILIES)
def test_no_weight_sized_buffer_in_a_generate_program(name):
    base, record = compiled("generate_autoregressive"), compiled(name)
    assert base["loop_values"] == []
    assert record["loop_values"] == [], record["loop_values"]
    extra = record["temp"] - base["temp"]
    assert extra <= EXTRA_TEMPORARIES * record["weights"], (
        f"{name}: {extra / 1e6:.1f} MB of temporaries beyond the autoregressive program's "
        f"({record['weights'] / 1e6:.0f} MB of weights)")
