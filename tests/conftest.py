"""The suite runs jax on the CPU wherever the ``tpu`` extra (libtpu) is installed on a
machine without TPU chips, as CI's is.

There jax would otherwise try libtpu's TPU runtime in every process that touches a
device (start-up warnings, and libtpu's machine-wide lock file). The TPU compile
tests need no TPU runtime: ``jax.experimental.topologies`` describes a TPU
topology and compiles for it under ``JAX_PLATFORMS=cpu`` too. Set here, before any
test imports jax; subprocesses the tests start inherit it. A ``JAX_PLATFORMS``
already set is kept, and so is everything on a TPU VM (chips under ``/dev``, the
same test as ``jobs.tpu_aot``'s) or where a CUDA plugin is installed (the GPU check
runs this suite on a GPU).
"""

import glob
import importlib.util
import os
import sys

import pytest


def _cpu_only_suite() -> bool:
    if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
        return False
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return False
    return not any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13))


if _cpu_only_suite():
    os.environ["JAX_PLATFORMS"] = "cpu"


@pytest.fixture
def cpu_kernel():
    """Skips a test that asks for the project's CPU kernel where it cannot be
    built (no C++ compiler); builds it once per machine otherwise."""
    from specdec_jax.runtime import cpu_kernels
    if not cpu_kernels.enable():
        pytest.skip("the CPU kernel could not be built here (no C++ compiler: apt-get install "
                    "g++ or set $CXX)")


LONG_BY_DURATION = os.path.join(os.path.dirname(__file__), "long_by_duration.txt")


@pytest.hookimpl(tryfirst=True)  # before `-m "not long"` deselects by marker
def pytest_collection_modifyitems(config, items):
    """Marks ``long`` the default-suite tests listed in ``long_by_duration.txt``
    (the slowest by measured time; the file says when and how measured)."""
    del config
    with open(LONG_BY_DURATION) as listing:
        node_ids = {line.split("#")[0].strip() for line in listing} - {""}
    for item in items:
        if item.nodeid in node_ids:
            item.add_marker(pytest.mark.long)


# Mappings past which the next module boundary drops jax's compiled programs;
# below it they stay, so modules that share a model's programs compile them once.
MAPPINGS_BEFORE_CLEARING = 30_000


def _memory_mappings() -> int:
    try:
        with open("/proc/self/maps") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux: no limit to watch
        return 0


@pytest.fixture(autouse=True, scope="module")
def _compiled_programs_freed_when_mappings_pile_up():
    """Drops jax's compiled programs after a test module once the process holds
    ``MAPPINGS_BEFORE_CLEARING`` memory mappings. Every CPU executable holds ~3
    until jax's caches let it go; one process running the long suites held
    55,001 of the kernel's 65,530 (``vm.max_map_count``) by its 189th test and
    9.5 GB, and CI's run of it aborted inside an XLA compile at its 226th."""
    yield
    if "jax" in sys.modules and _memory_mappings() > MAPPINGS_BEFORE_CLEARING:
        sys.modules["jax"].clear_caches()
