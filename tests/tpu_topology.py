"""Skips a test module when no TPU topology can be made here (libtpu missing)."""

import pytest

from specdec_jax.jobs.tpu import aot as tpu_aot


def require(topology: str) -> None:
    """Called at a module's top: the module is skipped, naming the fix, when
    ``topology`` cannot be made on this machine."""
    try:
        tpu_aot.topology_devices(topology)
    except tpu_aot.TpuUnavailable as error:
        pytest.skip(f"no TPU topology can be made ({error}); install the extra: "
                    f"{tpu_aot.INSTALL_HINT}", allow_module_level=True)
