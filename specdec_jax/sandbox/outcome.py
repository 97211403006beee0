"""How a sample ended, as a score: the harness's exit status and output become an ``Outcome``."""

from __future__ import annotations

import dataclasses
import signal

from specdec_jax.sandbox.child.harness import (
    FAILED_EXIT,
    RESOURCE_EXIT,
    SIGNAL_EXIT_BASE,
    TIMEOUT_EXIT,
)
from specdec_jax.sandbox.limits import Limits

DETAIL_CHARS = 500  # how much of the sample's stderr an Outcome keeps


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One sample's score, and why."""

    passed: bool
    status: str  # "passed", "failed", "timeout", "killed" or "error"
    detail: str  # the tail of the sample's stderr, or why it was stopped


def classify(code: int | None, stdout: bytes, stderr: bytes, token: str,
             limits: Limits) -> Outcome:
    """Maps how the child ended (None: still running at the backstop) to an Outcome."""
    detail = stderr.decode("utf-8", "replace")[-DETAIL_CHARS:]
    if code is None or code == TIMEOUT_EXIT:
        return Outcome(False, "timeout", f"no result after {limits.wall_s:g} s wall-clock; "
                                         f"killed. {detail}".strip())
    if code == 0 and stdout.rstrip().endswith(token.encode()):
        return Outcome(True, "passed", detail)
    if code == 0:
        return Outcome(False, "failed", f"exited before the tests finished. {detail}".strip())
    if code == FAILED_EXIT:
        return Outcome(False, "failed", detail or "the program failed")
    if code == RESOURCE_EXIT:
        return Outcome(False, "killed", f"over the {limits.memory_mb} MiB address-space or "
                                        f"{limits.file_size_mb} MiB file-size limit. "
                                        f"{detail}".strip())
    if code < 0 or code > SIGNAL_EXIT_BASE:
        number = -code if code < 0 else code - SIGNAL_EXIT_BASE
        name = signal.Signals(number).name if number in signal.valid_signals() else number
        return Outcome(False, "killed", f"killed by signal {name} (a resource limit or a "
                                        f"crash). {detail}".strip())
    return Outcome(False, "error", f"sandbox harness failed (exit status {code}). "
                                   f"{detail}".strip())
