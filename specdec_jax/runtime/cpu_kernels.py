"""Builds, loads and registers the project's CPU kernel (``native/small_m_matmul.cc``:
few-row products, block products and each query's attention, ``native/cache_attention.h``).

The kernel is compiled on the machine that runs it (``-march=native``: the
vector instructions of this CPU), once, into the cache; the library's name
carries a hash of the sources (the ``.cc`` and the ``native/*.h`` it
includes), the compiler flags, jaxlib's version and the CPU's feature flags,
so a change in any of them builds a new one. Nothing here is needed for
correctness: without a C++ compiler, on another platform, or after
``enable(False)``, every product runs as XLA's dot.

The block kernel (products with weights kept in their GGUF blocks,
``native/block_dot.h``) runs the widest path the build targets:
``avx512vnni``, ``avxvnni``, ``avx2`` (x86-64 with AVX2, FMA and F16C) or
``neon-dotprod`` (AArch64 with the dot-product extension), each bit for bit
the scalar reference; ``block_kernel_isa()`` names it. A build with none of
them has only the ``scalar`` reference, which is not registered as a kernel
(``SpecdecHasBlockKernel`` is 0): it measured 8x slower than XLA's float32
dot of the dequantised matrix, so stored matrices are dequantised there and
``--target-weights auto`` keeps float32 weights.

``SPECDEC_JAX_CPU_MARCH``: builds for ``-march=<value>`` instead of
``-march=native`` (its own library: the flags are part of the hash), to run
this machine as an older CPU, e.g. ``SPECDEC_JAX_CPU_MARCH=haswell`` for the
AVX2 path on an AVX-512 machine, ``x86-64`` for no SIMD path at all. Read
when the library is built and loaded (``enable``): set it before a process's
first ``enable``. The value must be one the CPU can run (``-march=`` of a
newer CPU builds, then dies on an illegal instruction).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import warnings

import jax

from specdec_jax.native import attention as native_attention
from specdec_jax.native import matmul as native_matmul

NATIVE = pathlib.Path(__file__).resolve().parent.parent / "native"
SOURCE = NATIVE / "small_m_matmul.cc"
CACHE_ENV = "SPECDEC_JAX_CACHE"  # the cache root every job uses (checkpoints.fetch)
CXX_ENV = "CXX"
MARCH_ENV = "SPECDEC_JAX_CPU_MARCH"  # -march=<value> instead of -march=native (module docstring)
# -ffp-contract=off: a * b + c is never fused into one rounding behind the
# code's back, so every path of the block kernel keeps the reference's float
# operations (native/block_dot.h).
FLAGS = ("-O3", "-march=native", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC", "-w")

_LOADED: dict[str, ctypes.CDLL] = {}  # kept alive: XLA calls into it
_ISA: dict[str, str] = {}  # "loaded": the block kernel's path in the library registered


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def flags(extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The compiler flags of this process's build: ``FLAGS``, with ``-march``
    from ``$SPECDEC_JAX_CPU_MARCH`` where set, then ``extra`` (tests build the
    library with ``-DSPECDEC_BLOCKS_REFERENCE``: the reference as its block kernel)."""
    march = os.environ.get(MARCH_ENV, "").strip()
    if not march:
        return FLAGS + tuple(extra)
    if not all(c.isalnum() or c in "-_.+" for c in march):
        raise RuntimeError(f"${MARCH_ENV}={march!r} is not a -march value (e.g. haswell, "
                           "x86-64-v3, armv8.2-a+dotprod)")
    return tuple(f"-march={march}" if flag == "-march=native" else flag
                 for flag in FLAGS) + tuple(extra)


def sources() -> list[pathlib.Path]:
    """The kernel's source and the headers it includes (all hashed)."""
    return [SOURCE, *sorted(NATIVE.glob("*.h"))]


def default_build_dir() -> pathlib.Path:
    root = os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "specdec_jax"
    return pathlib.Path(root).expanduser() / "kernels"


def library_path(build_dir: pathlib.Path | None = None, extra_flags: tuple[str, ...] = ()
                 ) -> pathlib.Path:
    """Where this machine's build of the kernel lives (built or not)."""
    digest = hashlib.sha256()
    for part in (*(path.read_bytes() for path in sources()), " ".join(flags(extra_flags)).encode(),
                 jax.lib.__version__.encode(), _cpu_flags().encode(), platform.machine().encode()):
        digest.update(part)
    return (build_dir or default_build_dir()) / f"small_m_matmul-{digest.hexdigest()[:16]}.so"


def build(build_dir: pathlib.Path | None = None, extra_flags: tuple[str, ...] = ()
          ) -> pathlib.Path:
    """Compiles the kernel unless this machine's build exists; returns its path.

    Raises ``RuntimeError`` naming the compiler command when it fails or no
    compiler is found (set ``$CXX``, or install g++: ``apt-get install g++``).
    """
    target = library_path(build_dir, extra_flags)
    if target.exists():
        return target
    compiler = os.environ.get(CXX_ENV) or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise RuntimeError("no C++ compiler found for the CPU kernel: install one "
                           "(apt-get install g++) or set $CXX")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: processes starting together never
    # load a half-written library.
    fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".so.partial")
    os.close(fd)
    command = [compiler, *flags(extra_flags), "-I", jax.ffi.include_dir(), str(SOURCE), "-o",
               partial]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        os.unlink(partial)
        raise RuntimeError(f"building the CPU kernel failed ({' '.join(command)}):\n"
                           f"{result.stderr[-2000:]}")
    os.replace(partial, target)
    return target


def register(path: pathlib.Path) -> None:
    """Loads a built library and registers its handlers with ``jax.ffi``."""
    if str(path) in _LOADED:
        return
    library = ctypes.cdll.LoadLibrary(str(path))
    for symbol in (*native_matmul.SYMBOLS.values(), native_attention.SYMBOL):
        jax.ffi.register_ffi_target(native_matmul.TARGET_PREFIX + symbol,
                                    jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    blocks = bool(library.SpecdecHasBlockKernel())
    library.SpecdecBlockKernelIsa.restype = ctypes.c_char_p
    isa = library.SpecdecBlockKernelIsa()
    if blocks:  # a SIMD path (not the scalar reference: module docstring)
        jax.ffi.register_ffi_target(native_matmul.TARGET_PREFIX + native_matmul.BLOCK_SYMBOL,
                                    jax.ffi.pycapsule(getattr(library,
                                                              native_matmul.BLOCK_SYMBOL)),
                                    platform="cpu")
    _LOADED[str(path)] = library
    _ISA["loaded"] = isa.decode()
    native_matmul.mark_registered(blocks)


def block_kernel_isa() -> str | None:
    """The block kernel's path in the loaded library (``avx512vnni``,
    ``avxvnni``, ``avx2``, ``neon-dotprod``, or ``scalar``: the reference,
    not registered), or None before a library is loaded (``enable``)."""
    return _ISA.get("loaded")


def enable(enabled: bool = True, build_dir: pathlib.Path | None = None) -> bool:
    """Lets products traced from now on use the CPU kernel; returns whether they will.

    Builds it on first use (a few seconds). On a machine where it cannot be
    built or loaded, warns once with the reason and keeps XLA's dot. Only
    the CPU backend is served: on other platforms this does nothing.
    """
    native_matmul.set_enabled(enabled)
    if not enabled or jax.default_backend() != "cpu":
        return False
    try:
        register(build(build_dir))
    except (OSError, RuntimeError, AttributeError) as error:
        warnings.warn(f"the CPU kernel is unavailable, products run as XLA's dot: {error}",
                      RuntimeWarning, stacklevel=2)
        return False
    return native_matmul.active()
