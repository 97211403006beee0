"""The block kernel's paths (native/block_dot.h) against its scalar reference, bit for bit.

``native/block_dot_check.cc`` compares every path a build compiles with the
reference, for every format and layout and M = 1..17 rows (hard cases
included), and prints a digest of the reference's outputs. It is built here
for each x86-64 target this CPU can run (``-march=native``, AVX2 as
``-march=haswell``, no SIMD as ``-march=x86-64``) and run; AVX-VNNI and
AVX-512 VNNI are built and run where ``/proc/cpuinfo`` has their flags, and
elsewhere only compiled (``-c``), the run skipped naming the missing flag.
The AArch64 NEON path is cross-compiled and run under ``qemu-aarch64-static``
(``-m long``). The reference's digest is the same in every build, x86-64 and
AArch64: one function of the rows and the file on every CPU.

Through JAX: the block kernel the library loads here (its widest path)
against the same library built with the reference as its block kernel
(``-DSPECDEC_BLOCKS_REFERENCE``), for every format, bit for bit, and a row
alone against the same row among others.

Each binary is cached by a hash of the sources, the flags and the compiler
(``$SPECDEC_JAX_CACHE``/kernels/block_dot_check), so a second run compiles
nothing; a first run compiles for about 40 s on one core.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.native import matmul as native_matmul
from specdec_jax.native import stored_blocks
from specdec_jax.runtime import cpu_kernels
from tests import registry_blocks

CHECK = cpu_kernels.NATIVE / "block_dot_check.cc"
COMMON = ("-std=c++17", "-ffp-contract=off", "-w")
X86 = platform.machine() in ("x86_64", "AMD64")
DIGESTS: dict[str, str] = {}  # build -> the reference outputs' digest it printed


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        pytest.skip("no C++ compiler (apt-get install g++, or set $CXX)")
    return compiler


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return set()
    return set(line.partition(":")[2].split())


def _build(compiler: str, flags: tuple[str, ...], *, compile_only: bool = False,
           source: pathlib.Path = CHECK) -> str:
    """The harness built with ``flags`` (cached by what went into it); its path."""
    digest = hashlib.sha256()
    for path in (source, *sorted(cpu_kernels.NATIVE.glob("block_dot*.h"))):
        digest.update(path.read_bytes())
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest.update(" ".join((compiler, version, *flags, str(compile_only))).encode())
    out_dir = cpu_kernels.default_build_dir() / "block_dot_check"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{source.stem}-{digest.hexdigest()[:16]}{'.o' if compile_only else ''}"
    if not target.exists():
        partial = target.with_name(target.name + f".{os.getpid()}.partial")
        command = [compiler, *flags, *COMMON, *(["-c"] if compile_only else []),
                   "-I", str(cpu_kernels.NATIVE), str(source), "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stderr[-3000:]}"
        os.replace(partial, target)
    return str(target)


def _run(command: list[str], build: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    print(result.stdout)
    assert result.returncode == 0, f"{build}: a path differs from the reference:\n{result.stdout}"
    assert "every compiled path equals the reference bit for bit" in result.stdout
    DIGESTS[build] = re.search(r"reference outputs digest (\w+)", result.stdout).group(1)
    return result.stdout


def _compiled(output: str) -> str:
    return re.search(r"compiled: (.*)", output).group(1)


# x86-64 targets: (name, flags, CPU flags it needs to run, a path its build must hold).
TARGETS = [
    ("native", ("-O3", "-march=native"), (), None),
    ("avx2", ("-O2", "-march=haswell"), ("avx2", "fma", "f16c"), "avx2"),
    ("scalar", ("-O2", "-march=x86-64"), (), None),
    ("avxvnni", ("-O2", "-mavx2", "-mfma", "-mf16c", "-mavxvnni"),
     ("avx2", "fma", "f16c", "avx_vnni"), "avxvnni"),
    # exactly the flags a build for AVX-512 VNNI needs (no F16C, no -march)
    ("avx512vnni", ("-O2", "-mavx512f", "-mavx512bw", "-mavx512vnni", "-mavx512vl"),
     ("avx512f", "avx512bw", "avx512_vnni", "avx512vl"), "avx512vnni"),
]


@pytest.mark.parametrize("name, flags, needs, path", TARGETS, ids=[t[0] for t in TARGETS])
def test_every_path_a_target_builds_equals_the_reference(name, flags, needs, path):
    compiler = _compiler()
    if not X86:
        if name == "native":  # the widest path of this CPU (NEON dotprod on AArch64)
            _run([_build(compiler, flags)], name)
            return
        pytest.skip(f"an x86-64 target; this CPU is {platform.machine()}")
    missing = sorted(set(needs) - _cpu_flags())
    if missing:
        # Compiled only: the build must still succeed (-O0 checks every
        # intrinsic against the target as -O2 does, in a third of the time).
        _build(compiler, ("-O0", *flags[1:]), compile_only=True)
        pytest.skip(f"{name} compiled only: this CPU lacks {', '.join(missing)} "
                    "(/proc/cpuinfo); the run happens on a CPU that has it")
    output = _run([_build(compiler, flags)], name)
    if path:
        assert path in _compiled(output).split(), output
    if name == "scalar":
        assert "best path scalar" in output and _compiled(output).split()[0] == "scalar"


def test_the_reference_is_the_same_function_in_every_build():
    """The reference's outputs have one digest wherever it ran (x86-64 with
    and without SIMD, and AArch64 under ``-m long``)."""
    compiler = _compiler()
    if not X86:
        pytest.skip(f"the x86-64 builds; this CPU is {platform.machine()}")
    for name, flags, needs, _ in TARGETS[:3]:
        if name not in DIGESTS and set(needs) <= _cpu_flags():
            _run([_build(compiler, flags)], name)
    assert len(set(DIGESTS.values())) == 1, DIGESTS


@pytest.mark.long
def test_the_neon_path_equals_the_reference_under_qemu():
    """Cross-compiled for ARMv8.2-A with dotprod (the NEON path) and without
    (the reference alone), run under qemu: every path equal to the
    reference, and the reference's digest the x86-64 builds' own."""
    if platform.machine() in ("aarch64", "arm64"):
        pytest.skip("an AArch64 CPU runs the NEON path natively (the native target)")
    cross = shutil.which("aarch64-linux-gnu-g++")
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if not cross or not qemu:
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64-static: apt-get install "
                    "g++-aarch64-linux-gnu qemu-user-static")
    output = _run([qemu, _build(cross, ("-O2", "-march=armv8.2-a+dotprod", "-static"))],
                  "aarch64 dotprod")
    assert "neon-dotprod" in _compiled(output).split()
    plain = _run([qemu, _build(cross, ("-O2", "-march=armv8-a", "-static"))], "aarch64")
    assert _compiled(plain).split()[0] == "scalar"
    if X86:
        _run([_build(_compiler(), ("-O2", "-march=x86-64"))], "scalar")
    assert len(set(DIGESTS.values())) == 1, DIGESTS


PASS_ROWS = cpu_kernels.NATIVE.parents[1] / "benchmarks" / "scripts" / "x16_pass_rows.cc"


@pytest.mark.long
@pytest.mark.parametrize("fmt, k", [("q4_k_x16", 512), ("q6_k_x16", 512), ("q5_0_x16", 96)])
def test_the_rows_a_pass_takes_never_change_an_output(fmt, k):
    """The timing harness that chose the rows per interleaved pass
    (benchmarks/scripts/x16_pass_rows.cc) builds, runs, and finds this build's
    widest path giving the same bits under every cap (4, 8, 12, 16 rows a
    pass and its own) for M = 1..17: a row's sums never depend on the rows
    beside it in a pass."""
    if not X86 or not {"avx2", "fma", "f16c"} <= _cpu_flags():
        pytest.skip("times the native x86-64 SIMD path: needs AVX2, FMA and F16C")
    if not PASS_ROWS.exists():
        pytest.skip("benchmarks/ is not in this checkout")
    binary = _build(_compiler(), ("-O1", "-march=native"), source=PASS_ROWS)
    result = subprocess.run([binary, fmt, "32", str(k), "--rows", *map(str, range(1, 18)),
                             "--calls", "1", "--rounds", "1", "--bytes", "0"],
                            capture_output=True, text=True, timeout=300)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("\nM=") == 17
    assert "every cap gave the same outputs bit for bit" in result.stdout


@pytest.mark.long
def test_the_kernel_source_builds_for_avx512_vnni():
    """small_m_matmul.cc itself (the FFI handlers and the float kernels beside
    the block kernel) with exactly the AVX-512 VNNI flags, compiled only."""
    if not X86:
        pytest.skip(f"an x86-64 target; this CPU is {platform.machine()}")
    command = [_compiler(), "-O0", "-mavx512f", "-mavx512bw", "-mavx512vnni", "-mavx512vl",
               *COMMON, "-fPIC", "-I", jax.ffi.include_dir(), "-c", str(cpu_kernels.SOURCE),
               "-o", os.devnull]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


# ---------------------------------------------------------------------------
# Through JAX.

REFERENCE_TARGET = native_matmul.TARGET_PREFIX + "reference_block_matmul"


@pytest.fixture(scope="module")
def kernel_and_reference():
    """The loaded library's block kernel, and the reference build's registered
    beside it (the same source with -DSPECDEC_BLOCKS_REFERENCE)."""
    import ctypes  # noqa: PLC0415

    was_enabled = native_matmul._STATE.enabled
    if not cpu_kernels.enable() or not native_matmul.blocks_active():
        pytest.skip(f"no SIMD block kernel here (loaded: {cpu_kernels.block_kernel_isa()}); the "
                    "reference alone is checked by block_dot_check")
    library = ctypes.cdll.LoadLibrary(str(cpu_kernels.build(
        extra_flags=("-DSPECDEC_BLOCKS_REFERENCE",))))
    library.SpecdecBlockKernelIsa.restype = ctypes.c_char_p
    assert library.SpecdecBlockKernelIsa() == b"scalar" and not library.SpecdecHasBlockKernel()
    try:
        jax.ffi.register_ffi_target(REFERENCE_TARGET,
                                    jax.ffi.pycapsule(library.SmallMBlockMatmulI8), platform="cpu")
    except Exception as error:  # registered by an earlier module of this process
        if "already" not in str(error).lower():
            raise
    yield library
    native_matmul.set_enabled(was_enabled)


def _reference(x, blocks, fmt):
    out = jax.ShapeDtypeStruct((x.shape[0], blocks.shape[0]), jnp.float32)
    return jax.ffi.ffi_call(REFERENCE_TARGET, out, vmap_method="sequential")(
        x, blocks, format=np.int32(native_matmul.BLOCK_CODES[fmt]))


@pytest.mark.parametrize("fmt", tuple(stored_blocks.FORMATS))
def test_the_loaded_block_kernel_is_the_reference_through_jax(kernel_and_reference, fmt):
    from tests.test_stored_blocks import random_blocks  # noqa: PLC0415

    rng = np.random.default_rng(zlib.crc32(fmt.encode()) + 73)
    k, n = 768, 48
    blocks = jnp.asarray(random_blocks(fmt, n, k, rng))
    x = jnp.asarray(rng.standard_normal((17, k)) * rng.choice([1e-3, 1.0, 30.0], (17, 1)),
                    jnp.float32).at[3].set(0.0)
    product = jax.jit(lambda x, b: native_matmul.block_product(
        x, stored_blocks.StoredMatrix(b, fmt, k)))
    reference = jax.jit(lambda x, b: _reference(x, b, fmt))
    for rows in (slice(0, 1), slice(2, 11), slice(0, 17)):  # 1, 9 and 17 rows
        got, want = np.asarray(product(x[rows], blocks)), np.asarray(reference(x[rows], blocks))
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    alone = np.asarray(product(x[5:6], blocks))[0]
    np.testing.assert_array_equal(alone.view(np.uint32),
                                  np.asarray(product(x, blocks))[5].view(np.uint32))


def test_block_kernel_isa_names_the_loaded_path(cpu_kernel):
    isa = cpu_kernels.block_kernel_isa()
    assert isa in ("avx512vnni", "avxvnni", "avx2", "neon-dotprod", "scalar")
    assert native_matmul._STATE.blocks == (isa != "scalar")
    flags = _cpu_flags()
    if X86 and {"avx2", "fma", "f16c"} <= flags:  # -march=native: a SIMD path at least
        assert isa != "scalar"


def test_the_march_override_builds_a_library_of_its_own(monkeypatch):
    """``SPECDEC_JAX_CPU_MARCH`` replaces -march=native (and so the hash); a
    value that is not a -march value is refused before any compiler runs."""
    monkeypatch.delenv(cpu_kernels.MARCH_ENV, raising=False)
    native = cpu_kernels.library_path()
    assert "-march=native" in cpu_kernels.flags()
    monkeypatch.setenv(cpu_kernels.MARCH_ENV, "haswell")
    assert "-march=haswell" in cpu_kernels.flags() and "-march=native" not in cpu_kernels.flags()
    assert cpu_kernels.library_path() != native
    monkeypatch.setenv(cpu_kernels.MARCH_ENV, "haswell; rm -rf /")
    with pytest.raises(RuntimeError, match="not a -march value"):
        cpu_kernels.flags()


@pytest.mark.skipif(not X86, reason="-march=x86-64 is an x86-64 target")
def test_a_build_without_simd_keeps_stored_blocks_off_the_kernel(tmp_path):
    """``SPECDEC_JAX_CPU_MARCH=x86-64``: the library's block kernel is the
    scalar reference, not registered, so stored matrices are dequantised and
    ``auto`` keeps float32 weights (a fresh process: the choice is made when
    the library loads)."""
    code = (
        "import argparse\n"
        "from specdec_jax.runtime import cpu_kernels\n"
        "from specdec_jax.native import matmul\n"
        "from specdec_jax.jobs.cli import generate\n"
        "assert cpu_kernels.enable()\n"
        "args = argparse.Namespace(dtype='auto', kernel_layout='out_in')\n"
        "blocks = matmul.blocks_active()\n"
        "print(cpu_kernels.block_kernel_isa(), blocks,\n"
        "      generate.stored_by_default(args, 'qwen2.5-coder-1.5b', blocks))\n")
    env = {**os.environ, cpu_kernels.MARCH_ENV: "x86-64", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["scalar", "False", "False"], result.stdout


@pytest.mark.slow
def test_the_registry_files_tensors_take_the_reference_through_jax(kernel_and_reference):
    """The real files' blocks (every kept type of every registry GGUF file: 64 rows
    of a tensor, and interleaved as kept on CPU where the loader interleaves it)
    times activations of a real model's scale: the loaded kernel is the reference."""
    rng = np.random.default_rng(7)
    seen = set()
    for name, fmt, blocks in registry_blocks.first_rows_of_each_type():
        seen.add(fmt)
        layouts = [(fmt, blocks)]
        if fmt in stored_blocks.INTERLEAVE and len(blocks) % 16 == 0:
            layouts.append((stored_blocks.INTERLEAVE[fmt], stored_blocks.interleave(blocks, fmt)))
        for layout, b in layouts:
            k = stored_blocks.StoredMatrix.of_blocks(jnp.asarray(b), layout).in_features
            x = jnp.asarray(rng.standard_normal((9, k)), jnp.float32)
            got = np.asarray(native_matmul.block_product(
                x, stored_blocks.StoredMatrix(jnp.asarray(b), layout, k)))
            want = np.asarray(_reference(x, jnp.asarray(b), layout))
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32),
                                          err_msg=f"{name} {layout}")
    assert seen >= registry_blocks.KEPT_TYPES
