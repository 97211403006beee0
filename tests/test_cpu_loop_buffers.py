"""No weight-sized buffer in a decoding program on the CPU: the generate
programs of the Qwen pair's layer widths (two and one layers, a 2,048-token
vocabulary, bfloat16 weights, float32 activations, batch 1, a 512-token
prompt), compiled for this machine with the CPU kernel, hold no widened copy
of the weights and write no value of 5% of the weights or more per loop
iteration (``hlo_stats.loop_values``), read from the compiled text (~30 s).

XLA's own CPU dot widens a bfloat16 weight to float32 first: without the
kernel these programs hold a float32 copy of every weight (570 MB of
temporaries against 200 MB of weights, made once per call, outside the loop).
The TPU programs' check is ``test_loop_buffers.py``."""

import functools

import jax
import pytest

from specdec_jax.jobs.tpu import programs as tpu_programs
from specdec_jax.native import matmul as native_matmul
from specdec_jax.runtime import cpu_kernels, sharding
from tests.loop_programs import SHAPES, figures, qwen_width_models

FAMILIES = ["generate_autoregressive", "generate_specdecode_token", "generate_tree_dynamic",
            "generate_feature"]
# Temporaries a program may hold, as a share of its weights (activations of the
# 512-token prefill, logits, caches' scratch): a float32 copy of bf16 weights is 200%.
MAX_TEMPORARIES = 0.5


@pytest.fixture(scope="module")
def kernel():
    was_enabled = native_matmul._STATE.enabled  # noqa: SLF001 - restored as found
    if not cpu_kernels.enable():
        pytest.skip("the CPU kernel could not be built here (no C++ compiler?)")
    yield
    native_matmul.set_enabled(was_enabled)


@functools.lru_cache(maxsize=None)
def compiled(name: str) -> dict:
    mesh = sharding.make_mesh(1, 1, devices=jax.devices("cpu")[:1])
    program = tpu_programs.build(name, SHAPES, mesh,
                                 qwen_width_models("float32", "bfloat16"))
    executable = jax.jit(program.fn, donate_argnums=program.donate_argnums).lower(
        *program.args).compile()
    return figures(executable, program)


@pytest.mark.parametrize("name", FAMILIES)
def test_no_weight_sized_buffer_in_a_cpu_generate_program(kernel, name):
    record = compiled(name)
    assert record["loop_values"] == [], record["loop_values"]
    assert record["temp"] <= MAX_TEMPORARIES * record["weights"], (
        f"{name}: {record['temp'] / 1e6:.0f} MB of temporaries against "
        f"{record['weights'] / 1e6:.0f} MB of weights")
