"""Many processes, one program: JAX's multi-controller runtime, nothing home-made.

Every process runs the same script. ``initialize`` joins them into one JAX
runtime (``jax.distributed.initialize``); then ``jax.devices()`` lists every
device of every process, a ``sharding.make_mesh`` spans them all, and jitted
code runs as one SPMD program. What each process must do by hand:

* place host data on the global mesh: ``sharding.shard_params`` and
  ``sharding.shard_prompt`` build global arrays from the copy every process
  holds (``jax.make_array_from_callback``: each process fills only the shards
  its own devices hold);
* read outputs: ``gather`` brings a global array to every process as numpy;
* split work it reads from disk: ``process_slice`` (deterministic by process
  index), and let process 0 alone write reports (``is_writer``).

Settings come from arguments, else from the environment
(``SPECDEC_JAX_COORDINATOR``, ``SPECDEC_JAX_NUM_PROCESSES``,
``SPECDEC_JAX_PROCESS_ID``), else from JAX's own cluster detection (TPU pods,
Slurm, Open MPI, Kubernetes), so a TPU pod slice needs no flags at all.
"""

from __future__ import annotations

import collections
import os
import socket
import sys
import time
from collections.abc import Sequence

import jax
import numpy as np

ENV_COORDINATOR = "SPECDEC_JAX_COORDINATOR"
ENV_NUM_PROCESSES = "SPECDEC_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "SPECDEC_JAX_PROCESS_ID"
DEFAULT_TIMEOUT_S = 120
# Process 0's one-off work (training a vocabulary on 2 cores takes minutes).
WRITER_FIRST_TIMEOUT_S = 3600
_BARRIER_USES: collections.Counter = collections.Counter()  # name -> times met


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, timeout_s: int = DEFAULT_TIMEOUT_S) -> bool:
    """Joins the multi-process runtime; returns False (and does nothing) for a
    single-process run. Call it before anything touches a device.

    A process that cannot reach the coordinator, or a coordinator that does
    not hear from every process, fails after ``timeout_s`` seconds with an
    error that names the settings, instead of hanging.
    """
    coordinator_address = coordinator_address or os.environ.get(ENV_COORDINATOR)
    num_processes = num_processes if num_processes is not None else _env_int(ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(ENV_PROCESS_ID)
    explicit = (coordinator_address, num_processes, process_id)
    if all(v is None for v in explicit):
        return False  # one process; on a managed cluster use initialize_auto()
    if any(v is None for v in explicit):
        raise ValueError(
            "multi-process settings are incomplete: coordinator address "
            f"{coordinator_address!r}, process count {num_processes!r}, process id "
            f"{process_id!r}; give all three (flags --coordinator_address, --num_processes, "
            f"--process_id or ${ENV_COORDINATOR}, ${ENV_NUM_PROCESSES}, ${ENV_PROCESS_ID}).")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process id {process_id} is outside 0..{num_processes - 1}; each "
                         "process needs its own id below the process count.")
    _enable_cpu_collectives()
    advice = ("check that every process was started with the same coordinator address and "
              "process count and its own process id, and that process 0 runs and its port is "
              "reachable from this host")
    # The runtime aborts the process (a C++ check failure, no Python exception)
    # when registration times out, so say beforehand what is being attempted.
    print(f"specdec_jax: process {process_id} of {num_processes} joining the coordinator at "
          f"{coordinator_address} (timeout {timeout_s} s; on DEADLINE_EXCEEDED, {advice}).",
          file=sys.stderr, flush=True)
    if process_id != 0:
        _wait_for_coordinator(coordinator_address, timeout_s, advice)
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               initialization_timeout=timeout_s)
    return True


def _wait_for_coordinator(address: str, timeout_s: float, advice: str) -> None:
    """Polls the coordinator's port: an unreachable coordinator is a clear
    Python error here instead of an abort inside the runtime."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator address {address!r} must be HOST:PORT.")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return
        except OSError as err:
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not reach the coordinator at {address} within "
                                   f"{timeout_s} s ({err}); {advice}.") from err
            time.sleep(0.5)


def initialize_auto(*, timeout_s: int = DEFAULT_TIMEOUT_S) -> None:
    """Joins using JAX's cluster detection alone (TPU pods, Slurm, Open MPI)."""
    _enable_cpu_collectives()
    jax.distributed.initialize(initialization_timeout=timeout_s)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name}={value!r} is not an integer.") from None


def _enable_cpu_collectives() -> None:
    """CPU devices of different processes talk through gloo (JAX's default
    CPU backend has no cross-process collectives)."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")


def is_writer() -> bool:
    """Only process 0 writes reports, checkpoints metadata and logs."""
    return jax.process_index() == 0


def writer_first(name: str, work) -> None:
    """Runs ``work()`` on process 0 alone while the others wait for it: for
    files every process then reads (a vocabulary trained into the cache), which
    all of them writing at once would race on. One process: just ``work()``."""
    if is_writer():
        work()
    barrier(name, timeout_s=WRITER_FIRST_TIMEOUT_S)


def process_slice(items: Sequence, *, index: int | None = None,
                  count: int | None = None) -> Sequence:
    """This process's contiguous share of ``items`` (the first processes take
    one extra item when the count does not divide): deterministic, disjoint,
    and in order, so gathering the shares by process index restores ``items``."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    base, extra = divmod(len(items), count)
    start = index * base + min(index, extra)
    return items[start:start + base + (1 if index < extra else 0)]


def barrier(name: str, *, timeout_s: int = DEFAULT_TIMEOUT_S) -> None:
    """Waits until every process reaches ``name`` (the coordination service's
    barrier: no device collective, so no 30 s limit); a no-op on one process.

    The same name may be met again: each meeting gets its own barrier id
    (``name/1``, ``name/2``, ...), alike on every process because all of them
    run the same program and so meet their barriers in the same order."""
    if jax.process_count() == 1:
        return
    from jax._src import distributed as jax_distributed  # noqa: PLC0415

    _BARRIER_USES[name] += 1
    unique = f"{name}/{_BARRIER_USES[name]}"
    try:
        jax_distributed.global_state.client.wait_at_barrier(unique, timeout_s * 1000)
    except Exception as err:  # the runtime's own error type is not public
        raise RuntimeError(f"process {jax.process_index()} waited {timeout_s} s at barrier "
                           f"{unique!r} and not every process arrived: another process failed "
                           "or is stuck (read its log).") from err


def in_step(jitted):
    """``jitted`` (a ``jax.jit`` function), called so that every process starts
    each new program together.

    Why: CPU collectives across processes (gloo) meet for the first time inside
    the program, and that rendezvous gives up after a fixed 30 s. Each process
    compiles on its own clock, so under load one can be done compiling more
    than 30 s before the other. Here each new input signature is compiled
    ahead of time (``lower().compile()``), then the processes meet at a
    coordination-service barrier (generous timeout), then it runs. On one
    process this is ``jitted`` itself.
    """
    if jax.process_count() == 1:
        return jitted
    compiled: dict = {}

    def call(*args):
        signature = jax.tree_util.tree_map(
            lambda x: (np.shape(x), getattr(x, "dtype", type(x)), getattr(x, "sharding", None)),
            args)
        key = (jax.tree_util.tree_structure(args), tuple(jax.tree_util.tree_leaves(signature)))
        if key not in compiled:
            compiled[key] = jitted.lower(*args).compile()
            barrier("specdec_jax/in_step")
        return compiled[key](*args)

    return call


def gather(array) -> np.ndarray:
    """A (possibly multi-process) global array as numpy on every process."""
    if getattr(array, "is_fully_addressable", True):
        return np.asarray(array)
    from jax.experimental import multihost_utils  # noqa: PLC0415

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))
