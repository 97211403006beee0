"""Builds, loads and registers the project's CPU kernel (``native/small_m_matmul.cc``).

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
the scalar reference. A build with none of them has only
the reference, which is not registered (``SpecdecHasBlockKernel`` is 0): it
measured 8x slower than XLA's float32 dot of the dequantised matrix, so
stored matrices are dequantised there.
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

from specdec_jax.native import matmul as native_matmul

NATIVE = pathlib.Path(__file__).resolve().parent.parent / "native"
SOURCE = NATIVE / "small_m_matmul.cc"
CACHE_ENV = "SPECDEC_JAX_CACHE"  # the cache root every job uses (checkpoints.fetch)
CXX_ENV = "CXX"
# -ffp-contract=off: a * b + c is never fused into one rounding behind the
# code's back, so every path of the block kernel keeps the reference's float
# operations (native/block_dot.h).
FLAGS = ("-O3", "-march=native", "-std=c++17", "-ffp-contract=off", "-shared", "-fPIC", "-w")

_LOADED: dict[str, ctypes.CDLL] = {}  # kept alive: XLA calls into it


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def sources() -> list[pathlib.Path]:
    """The kernel's source and the headers it includes (all hashed)."""
    return [SOURCE, *sorted(NATIVE.glob("*.h"))]


def default_build_dir() -> pathlib.Path:
    root = os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "specdec_jax"
    return pathlib.Path(root).expanduser() / "kernels"


def library_path(build_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Where this machine's build of the kernel lives (built or not)."""
    digest = hashlib.sha256()
    for part in (*(path.read_bytes() for path in sources()), " ".join(FLAGS).encode(),
                 jax.lib.__version__.encode(), _cpu_flags().encode(), platform.machine().encode()):
        digest.update(part)
    return (build_dir or default_build_dir()) / f"small_m_matmul-{digest.hexdigest()[:16]}.so"


def build(build_dir: pathlib.Path | None = None) -> pathlib.Path:
    """Compiles the kernel unless this machine's build exists; returns its path.

    Raises ``RuntimeError`` naming the compiler command when it fails or no
    compiler is found (set ``$CXX``, or install g++: ``apt-get install g++``).
    """
    target = library_path(build_dir)
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
    command = [compiler, *FLAGS, "-I", jax.ffi.include_dir(), str(SOURCE), "-o", partial]
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
    for symbol in native_matmul.SYMBOLS.values():
        jax.ffi.register_ffi_target(native_matmul.TARGET_PREFIX + symbol,
                                    jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    blocks = bool(library.SpecdecHasBlockKernel())
    if blocks:  # a SIMD path (not the scalar reference: module docstring)
        jax.ffi.register_ffi_target(native_matmul.TARGET_PREFIX + native_matmul.BLOCK_SYMBOL,
                                    jax.ffi.pycapsule(getattr(library,
                                                              native_matmul.BLOCK_SYMBOL)),
                                    platform="cpu")
    _LOADED[str(path)] = library
    native_matmul.mark_registered(blocks)


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
