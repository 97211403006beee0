"""Which platforms a run starts: on a machine with libtpu installed (the
``tpu`` extra, e.g. to compile for TPU topologies) but no TPU chips, jax
would start libtpu's runtime on first use, which prints errors about TPU
worker hostnames before any output and takes a machine-wide lock. There the
command line and the gin launcher run on the CPU (``run_on_cpu_without_chips``);
compiling for a TPU topology needs no runtime (``jobs.tpu.aot``). A
``JAX_PLATFORMS`` the user set, a TPU VM (chips under ``/dev``) and a machine
with a CUDA plugin are left alone.
"""

from __future__ import annotations

import glob
import importlib.util
import os

import jax

CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")


def has_tpu_chips() -> bool:
    """TPU chips under ``/dev`` (a TPU VM's accelerators or VFIO groups)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def tpu_runtime_without_chips() -> bool:
    """libtpu is installed, there are no TPU chips, no CUDA plugin is
    installed, and ``JAX_PLATFORMS`` does not choose the platforms."""
    if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
        return False
    if has_tpu_chips():
        return False
    return not any(importlib.util.find_spec(plugin) for plugin in CUDA_PLUGINS)


def run_on_cpu_without_chips() -> bool:
    """Keeps this process (and the processes it starts) on the CPU where
    ``tpu_runtime_without_chips``; returns whether it did. Call it before
    anything runs on a device."""
    if not tpu_runtime_without_chips():
        return False
    os.environ["JAX_PLATFORMS"] = "cpu"  # what subprocesses read
    jax.config.update("jax_platforms", "cpu")  # this process imported jax already
    return True
