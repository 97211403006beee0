"""Layer 2: the kernel resource limits of a sample (``setrlimit`` before exec).

CPU seconds, address space, file size, no core dumps, and a process budget.
Root is exempt from RLIMIT_NPROC, which is why the namespaces and the process
group kill (``process``) also stop and reap processes.
"""

from __future__ import annotations

import dataclasses
import resource
import shutil

MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-sample limits; a sample that exceeds one is not passed."""

    wall_s: float = 10.0  # wall-clock seconds before the sample is killed
    cpu_s: int = 10  # RLIMIT_CPU: CPU seconds (SIGKILL when reached)
    memory_mb: int = 1024  # RLIMIT_AS: address space per process
    # Processes/threads the sample may add to those its user already runs
    # (RLIMIT_NPROC). Root is exempt from it, so the audit hook also forbids
    # fork and exec, and the PID namespace and group kill reap what remains.
    processes: int = 64
    file_size_mb: int = 10  # RLIMIT_FSIZE: largest file it may write, stdout included

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(f"Limits.{field.name} must be positive, got "
                                 f"{getattr(self, field.name)!r}.")



_PRLIMIT_FLAGS = {resource.RLIMIT_CPU: "--cpu", resource.RLIMIT_AS: "--as",
                  resource.RLIMIT_NPROC: "--nproc", resource.RLIMIT_FSIZE: "--fsize",
                  resource.RLIMIT_CORE: "--core"}


def wanted_limits(limits: Limits, nproc: int) -> list[tuple[int, int]]:
    """(resource, value) pairs: ``limits`` with ``nproc`` processes, clamped to our hard limits."""
    wanted = ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_mb * MIB),
              (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_FSIZE, limits.file_size_mb * MIB),
              (resource.RLIMIT_CORE, 0))
    clamped = []
    for kind, value in wanted:
        hard = resource.getrlimit(kind)[1]  # the child inherits our hard limits
        clamped.append((kind, value if hard == resource.RLIM_INFINITY else min(value, hard)))
    return clamped


def limit_command(limits: Limits, nproc: int) -> list[str] | None:
    """``prlimit`` sets the limits (soft == hard: they cannot be raised) and execs
    the sample, so no Python runs between fork and exec in our (multithreaded,
    JAX) process: a ``preexec_fn`` there can deadlock on a lock another thread
    held at the fork. None when util-linux's ``prlimit`` is missing."""
    binary = shutil.which("prlimit")
    if binary is None:
        return None
    return [binary, *(f"{_PRLIMIT_FLAGS[kind]}={value}:{value}"
                      for kind, value in wanted_limits(limits, nproc)), "--"]


def set_limits(limits: Limits, nproc: int):
    """The preexec fallback (no ``prlimit``): runs in the child between fork and exec."""
    wanted = wanted_limits(limits, nproc)

    def apply():
        for kind, value in wanted:
            resource.setrlimit(kind, (value, value))  # soft == hard: cannot be raised
    return apply

