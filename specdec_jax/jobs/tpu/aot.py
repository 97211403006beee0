"""Ahead-of-time compilation for TPU topologies on any machine (docs/tpu.md).

With ``libtpu`` installed (``pip install -e ".[tpu]"``), a CPU-only machine can
describe the chips of a TPU topology (``v5e:2x2``, ``v4:2x2x1``, ...) and run
the real XLA TPU compiler on a program whose arguments are shapes with
shardings over those chips. Nothing runs on a TPU: what comes back is the
compiler's view of the program (memory, cost estimate, optimised HLO), which
says before anyone books TPUs whether a job compiles, fits in HBM, keeps its
loops on the device and runs the collectives it should.

Here: the chips' published HBM sizes and bandwidths, the topology's devices
(libtpu's start-up warnings about TPU worker hostnames, harmless on a machine
that is not a TPU VM, kept out of the job's output), abstract arguments, and
one compile turned into a record of plain numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import importlib.metadata
import os
import tempfile
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from specdec_jax.jobs.tpu import hlo_stats
from specdec_jax.runtime import sharding

GIB = 1024 ** 3
ESTIMATE = "TPU compiler estimate"  # the label of every time figure from the compiler
# A value a decoding loop writes every iteration is "weight-sized" from this share
# of the program's weights (issue 55: a loop that copies a head re-reads it per round).
LOOP_VALUE_FRACTION = 0.05
INSTALL_HINT = 'pip install -e ".[tpu]"  (libtpu, the TPU compiler; runs on CPU-only machines)'


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation's published per-chip HBM size and bandwidth."""

    name: str
    hbm_bytes: int
    hbm_bytes_per_s: float


CHIPS = {
    "v4": Chip("TPU v4", 32 * GIB, 1.2e12),
    "v5e": Chip("TPU v5e", 16 * GIB, 0.82e12),
    "v5p": Chip("TPU v5p", 95 * GIB, 2.76e12),
    "v6e": Chip("TPU v6e", 32 * GIB, 1.64e12),
}


@dataclasses.dataclass(frozen=True)
class Program:
    """A function, its abstract arguments and what a roofline reads per call."""

    fn: Callable
    args: tuple
    donate_argnums: tuple[int, ...] = ()
    weight_bytes: int = 0
    cache_bytes: int = 0
    note: str = ""


# libtpu's compile-only description of a v4 topology lists each TensorCore as a device
# (8 for v4:2x2x1) unless asked for megacore chips, the one device per chip a v4 VM
# shows JAX; v5p's default is already megacore (and v5e / v6e have one core per chip).
CHIP_CONFIGS = {"v4": "megacore"}


def chip_config(topology: str) -> str | None:
    """The chip configuration a topology is described with (``CHIP_CONFIGS``)."""
    return CHIP_CONFIGS.get(topology.partition(":")[0])


class TpuUnavailable(RuntimeError):
    """libtpu is missing or cannot describe the topology."""


def chip_of(topology: str) -> Chip:
    """The chip a topology name (``"<generation>:<shape>"``) is made of."""
    generation = topology.partition(":")[0]
    if generation not in CHIPS or ":" not in topology:
        raise ValueError(f"topology {topology!r}: write '<generation>:<shape>' with generation "
                         f"one of {', '.join(CHIPS)}, e.g. 'v5e:2x2' or 'v4:2x2x1'.")
    return CHIPS[generation]


def libtpu_version() -> str | None:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


def _allow_compile_only_load() -> None:
    """libtpu takes a machine-wide lock (``/tmp/libtpu_lockfile``) so that two
    processes never drive the same chips. A machine with no TPU chips has
    nothing to protect, and several compile-only processes (tests, jobs) may
    run at once there: let them share. On a TPU VM (chips under ``/dev``) the
    lock stays."""
    if not glob.glob("/dev/accel*") and not glob.glob("/dev/vfio/[0-9]*"):
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


@contextlib.contextmanager
def captured_stderr():
    """Collects what native code writes to file descriptor 2 (libtpu logs there,
    not through Python); yields a list that holds the text afterwards."""
    captured: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode(errors="replace"))


@functools.lru_cache(maxsize=None)
def topology_devices(topology: str) -> tuple[jax.Device, ...]:
    """The compile-only devices of a TPU topology, one per chip as on a TPU VM,
    e.g. ``"v5e:2x2"`` (4 chips) or ``"v4:2x2x4"`` (16 megacore chips)."""
    chip_of(topology)
    config = chip_config(topology)
    if libtpu_version() is None:
        raise TpuUnavailable(f"libtpu is not installed; {INSTALL_HINT}.")
    _allow_compile_only_load()
    from jax.experimental import topologies  # noqa: PLC0415 - only with libtpu

    with captured_stderr() as log:
        try:
            description = topologies.get_topology_desc(
                platform="tpu", topology_name=topology,
                **({"chip_config_name": config} if config else {}))
        except Exception as error:  # noqa: BLE001 - any failure means: no such topology here
            raise TpuUnavailable(f"libtpu {libtpu_version()} cannot describe {topology!r}: "
                                 f"{type(error).__name__}: {error}") from error
    del log  # start-up warnings about TPU worker hostnames: harmless off a TPU VM
    return tuple(description.devices)


def make_mesh(topology: str, *, data: int = 1, model: int = 1) -> Mesh:
    """A (data, model) mesh over the first ``data * model`` chips of a topology."""
    devices = topology_devices(topology)
    if data * model > len(devices):
        raise ValueError(f"a {data} x {model} mesh needs {data * model} chips; {topology} "
                         f"has {len(devices)}.")
    return sharding.make_mesh(data, model, devices=devices[:data * model])


def replicated(tree, mesh: Mesh):
    """Abstract arguments (``ShapeDtypeStruct``) replicated over ``mesh``."""
    spec = NamedSharding(mesh, PartitionSpec())
    return jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=spec), tree)


def batch_sharded(tree, mesh: Mesh):
    """Abstract arguments split along their first axis over ``data`` (where it
    divides), the rest replicated."""

    def place(x):
        shape = np.shape(x)
        split = shape and shape[0] % mesh.shape[sharding.DATA] == 0
        spec = PartitionSpec(sharding.DATA) if split else PartitionSpec()
        return jax.ShapeDtypeStruct(shape, x.dtype, sharding=NamedSharding(mesh, spec))

    return jax.tree_util.tree_map(place, tree)


def kv_sharded(tree, mesh: Mesh):
    """Abstract KV-cache buffers ``[B, H_kv, S, D]`` split by rows over ``data``
    and by heads over ``model`` (as the attention weights are; where the axes
    divide), other leaves (lengths) by rows."""

    def place(x):
        shape = np.shape(x)
        spec = PartitionSpec(sharding.DATA, sharding.MODEL) if len(shape) == 4 \
            else PartitionSpec(sharding.DATA)
        spec = sharding._spec_fits(spec, shape, mesh)  # noqa: SLF001 - the shared fitting rule
        return jax.ShapeDtypeStruct(shape, x.dtype, sharding=NamedSharding(mesh, spec))

    return jax.tree_util.tree_map(place, tree)


def tree_bytes(tree) -> int:
    """Bytes of every array (or abstract array) in a tree."""
    return int(sum(np.prod(np.shape(x)) * np.dtype(x.dtype).itemsize
                   for x in jax.tree_util.tree_leaves(tree)))


def compile_abstract(fn: Callable, args: Sequence, *, donate_argnums: Sequence[int] = (),
                     compiler_options: dict | None = None):
    """``(compiled, seconds, compiler log)`` of ``jit(fn)`` for abstract ``args``."""
    started = time.perf_counter()
    with captured_stderr() as log:
        lowered = jax.jit(fn, donate_argnums=tuple(donate_argnums)).lower(*args)
        compiled = lowered.compile(compiler_options or None)
    return compiled, time.perf_counter() - started, log[0]


def largest_intermediates(fn: Callable, args: Sequence, *, top: int = 8,
                          min_bytes: int = 2 ** 26) -> list[dict]:
    """The largest arrays ``fn`` computes on ``args`` (abstract), read from its
    jaxpr, nested computations included: ``[{"gib", "dtype", "shape", "op",
    "where", "count"}]``, largest first, one entry per (op, dtype, shape, where).
    What a program that runs out of HBM materialises, at most: the compiler's
    own buffer assignment (what lives at once) is not visible before it fits."""
    from jax.extend import core as jax_core  # noqa: PLC0415

    found: dict = {}

    def walk(jaxpr, where: str) -> None:
        for eqn in jaxpr.eqns:
            for var in eqn.outvars:
                aval = var.aval
                if not hasattr(aval, "shape") or jax.dtypes.issubdtype(
                        aval.dtype, jax.dtypes.extended):  # PRNG keys: no numpy dtype
                    continue
                size = int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize
                if size >= min_bytes:
                    key = (eqn.primitive.name, str(aval.dtype), tuple(aval.shape), where)
                    found[key] = found.get(key, 0) + 1
            for inner in jax_core.jaxprs_in_params(eqn.params):
                walk(inner, f"{where}/{eqn.primitive.name}")

    walk(jax.make_jaxpr(fn)(*args).jaxpr, "")
    rows = sorted(found.items(), key=lambda kv: -np.prod(kv[0][2]) * np.dtype(kv[0][1]).itemsize)
    return [{"gib": round(float(np.prod(shape)) * np.dtype(dtype).itemsize / GIB, 3),
             "dtype": dtype, "shape": list(shape), "op": op, "where": where or "/",
             "count": count} for (op, dtype, shape, where), count in rows[:top]]


def _number(value) -> float | None:
    return None if value is None else float(value)


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes each kind of collective produces per call of the program (its
    result arrays; an asynchronous pair counted at its start, whose result is
    the last element of its tuple), every computation outside fusions alike
    (a loop body once). Per chip: the HLO of an SPMD program is one chip's."""
    module = hlo_stats.parse(hlo_text)
    fused = hlo_stats.fused_computations(module)
    out = dict.fromkeys(hlo_stats.COLLECTIVES, 0)
    for name, instructions in module.computations.items():
        if name in fused:
            continue
        for ins in instructions:
            for kind, opcodes in hlo_stats.COLLECTIVES.items():
                if ins.opcode in opcodes:
                    result = ins.type_text
                    if ins.opcode.endswith("-start") and result.startswith("("):
                        result = hlo_stats.tuple_elements(result)[-1]
                    out[kind] += hlo_stats.type_bytes(result)
    return out


def program_record(compiled, chip: Chip, *, data: int = 1, model: int = 1, weight_bytes: int,
                   cache_bytes: int) -> dict:
    """A compiled program's figures (per chip), JSON-ready.

    ``hbm_bytes``: arguments + outputs + temporaries + generated code, less
    what outputs alias (donated) arguments; ``floor_s``: the roofline floor of
    one call on one chip: its share of the weights (split over ``model``
    chips) and of the KV cache (over ``data * model``) read once at the chip's
    HBM bandwidth; ``loop_values``: arrays of at least ``LOOP_VALUE_FRACTION``
    of the weights written to HBM inside a ``while`` loop, once per iteration
    (``hlo_stats.loop_values``: shape, opcode, source line); ``memory.temp``
    holds the HBM temporaries. Every ``*_s`` figure is an estimate (``ESTIMATE``).
    """
    memory = compiled.memory_analysis()
    sizes = {name: int(getattr(memory, f"{name}_size_in_bytes", 0) or 0) for name in (
        "argument", "output", "alias", "temp", "generated_code")}
    hbm = sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"] + \
        sizes["generated_code"]
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
    read = weight_bytes / model + cache_bytes / (data * model)
    accessed = _number(cost.get("bytes accessed"))
    text = compiled.as_text()
    return {
        "memory": sizes, "hbm_bytes": hbm, "hbm_capacity_bytes": chip.hbm_bytes,
        "hbm_fraction": hbm / chip.hbm_bytes, "fits": hbm <= chip.hbm_bytes,
        "flops": _number(cost.get("flops")), "bytes_accessed": accessed,
        "optimal_s": _number(cost.get("optimal_seconds")),
        "weight_bytes": weight_bytes, "cache_bytes": cache_bytes,
        "floor_s": read / chip.hbm_bytes_per_s,
        "bytes_accessed_over_floor_bytes": accessed / read if accessed and read else None,
        "hlo": hlo_stats.summarize(text), "collective_bytes": collective_bytes(text),
        "loop_values": hlo_stats.loop_values(
            text, LOOP_VALUE_FRACTION * weight_bytes) if weight_bytes else [],
    }
