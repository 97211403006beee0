"""Layer 1: one sample, one fresh process in a new box, killed with its whole group.

A fresh ``python -I`` subprocess runs the harness (``child/harness.py``, by
path) in a new session, with a new temporary directory (the box) as its cwd,
HOME and TMPDIR, deleted afterwards; under the kernel limits (``limits``) and
the namespace prefix it is given. Its process group is SIGKILLed when it ends
or overruns.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from specdec_jax.sandbox import procfs
from specdec_jax.sandbox.child import harness
from specdec_jax.sandbox.limits import Limits, limit_command, set_limits
from specdec_jax.sandbox.outcome import DETAIL_CHARS

# A sample runs under a memory limit and a process cap, and needs one thread:
# numeric libraries size per-thread buffers by the machine's core count
# (OpenBLAS could not import numpy under 512 MB on a 16-core GPU host).
ONE_THREAD = {name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                     "MKL_NUM_THREADS")}

HARNESS_PATH = os.path.abspath(harness.__file__)
STDOUT_TAIL_BYTES = 4096  # where the harness's pass token is looked for
SANDBOX_PREFIX = "specdec_sandbox_"
SAMPLE_FILE = "sample.py"
TMP_SUBDIR = "tmp"
POLL_MIN_S, POLL_MAX_S = 0.001, 0.05  # back-off while waiting for a process
# The harness enforces wall_s itself (it can kill a sample that left the
# process group); the parent kills the group this much later as a backstop.
BACKSTOP_GRACE_S = 2.0
REAP_TIMEOUT_S = 5.0  # how long killed processes get to disappear


class SandboxError(RuntimeError):
    """The sandbox itself could not run a sample (not the sample's fault)."""


def execute(source: str, limits: Limits, prefix: tuple[str, ...], config: dict
            ) -> tuple[int | None, bytes, bytes]:
    """Runs the harness on ``source`` in a new box under the namespace ``prefix``,
    with ``config`` (the layers to build, the pass token) on its stdin. Returns
    its exit status (None: killed at the backstop) and output tails."""
    try:
        box = tempfile.mkdtemp(prefix=SANDBOX_PREFIX)
    except OSError as exc:
        raise SandboxError(f"sandbox could not make its directory: {exc!r}") from exc
    try:
        with open(os.path.join(box, SAMPLE_FILE), "w", encoding="utf-8") as f:
            f.write(source)
        os.mkdir(os.path.join(box, TMP_SUBDIR))
        env = {"HOME": box, "TMPDIR": os.path.join(box, TMP_SUBDIR), "PATH": os.defpath,
               "LANG": "C.UTF-8", **ONE_THREAD}
        config = {**config, "box": box, "sample": SAMPLE_FILE, "wall_s": limits.wall_s}
        nproc = limits.processes + (procfs.threads_of_user(os.getuid()) if os.getuid() else 0)
        command = [*prefix, sys.executable, "-I", HARNESS_PATH]
        prlimit = limit_command(limits, nproc)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                command if prlimit is None else prlimit + command, cwd=box, env=env,
                stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True,
                preexec_fn=set_limits(limits, nproc) if prlimit is None else None)
            try:
                try:
                    proc.stdin.write((json.dumps(config) + "\n").encode())
                    proc.stdin.close()
                except BrokenPipeError:
                    pass  # it died at once; its exit status says why
                exited = _wait_unreaped(proc.pid, limits.wall_s + BACKSTOP_GRACE_S)
            finally:
                _kill_group(proc)
            code = proc.returncode if exited else None
            return code, _tail(out, STDOUT_TAIL_BYTES), _tail(err, 4 * DETAIL_CHARS)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxError(f"sandbox could not run the sample: {exc!r}") from exc
    finally:
        _remove_tree(box)



def _wait_unreaped(pid: int, timeout: float) -> bool:
    """Waits for the child to exit but leaves it a zombie, so its process group
    id cannot be reused before we kill the group. True when it exited."""
    deadline, delay = time.monotonic() + timeout, POLL_MIN_S
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(2 * delay, POLL_MAX_S)
    return True


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILLs the child's process group (start_new_session made the child
    its leader), reaps the child, then waits (bounded) for the members that
    init reaps instead (the PID namespace's first process, orphans)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # no member left
    proc.wait()
    deadline = time.monotonic() + REAP_TIMEOUT_S
    while procfs.live_group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(POLL_MAX_S)


def _remove_tree(path: str) -> None:
    """Deletes the sandbox even where the sample made parts of it read-only."""
    def make_writable_and_retry(func, failed, _exc_info):
        try:
            os.chmod(os.path.dirname(failed), 0o700)
            func(failed)
        except OSError:
            pass
    shutil.rmtree(path, onerror=make_writable_and_retry)


def _tail(f, limit: int) -> bytes:
    """The last ``limit`` bytes of the file ``f``."""
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - limit))
    return f.read()
