"""A script run on simulated CPU devices, in a process of its own: XLA fixes the
number of host devices when it starts, so a test that needs a mesh of 8 runs
its code in a fresh interpreter."""

import os
import subprocess
import sys


def run_on_devices(script: str, *args: str, devices: int = 8, timeout: int = 600,
                   cwd=None) -> subprocess.CompletedProcess:
    """Runs ``python -c script *args`` with ``devices`` CPU devices; fails the
    test with the script's stderr unless it exits 0."""
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
               JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                            text=True, timeout=timeout, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return result
