"""Which isolation layers samples get on this machine, measured by a probe sample.

Layer 3 (where unprivileged user namespaces work): new user, mount, network,
PID, IPC and UTS namespaces, a read-only root with only the box writable
(``child/mounts.py``), no capabilities and a seccomp filter
(``child/privileges.py``); no network but a downed loopback, and every process
the sample starts dies with the namespace. Layer 4: Landlock, where the kernel
offers it. ``isolation()`` runs a probe sample under each candidate, strongest
first, and keeps what the sample reports from inside: the level is measured,
not what the harness meant to build. ``REQUIRE_KERNEL_ENV`` refuses to score
without layer 3.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import secrets
import shutil
import warnings

from specdec_jax.sandbox.limits import Limits
from specdec_jax.sandbox.process import SandboxError, execute

# unshare's flags: the full set (layer 3), then the set without a mount
# namespace that is tried where the filesystem layer cannot be built.
NAMESPACE_FLAGS = ("--user", "--map-root-user", "--mount", "--net", "--pid", "--ipc", "--uts",
                   "--fork", "--kill-child")
NAMESPACE_FLAGS_WITHOUT_MOUNT = tuple(f for f in NAMESPACE_FLAGS if f != "--mount")
NAMESPACE_KINDS = ("user", "mount", "net", "pid", "ipc", "uts")
PROBE_TIMEOUT_S = 10.0
# A sample's view of /proc/self/mountinfo, capabilities and /proc, printed as
# one JSON line: the isolation level is what a sample measures, not what the
# harness meant to build.
PROBE_PROGRAM = r"""
import json, os, re
def unescape(field):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)
with open("/proc/self/mountinfo") as f:
    fields = [line.split() for line in f]
writable = sorted(unescape(x[4]) for x in fields if "ro" not in x[5].split(","))
with open("/proc/self/status") as f:
    caps = [int(line.split()[1], 16) for line in f if line.startswith("CapEff:")][0]
print(json.dumps({"writable_mounts": writable, "box": os.getcwd(), "capabilities": caps,
                  "own_proc": os.readlink("/proc/self") == str(os.getpid())}))
"""
REQUIRE_KERNEL_ENV = "SPECDEC_SANDBOX_REQUIRE_KERNEL"
KERNEL_LEVEL_PREFIX = "kernel:"


class IsolationError(RuntimeError):
    """Kernel isolation was required (``REQUIRE_KERNEL_ENV``) but is not available."""


@dataclasses.dataclass(frozen=True)
class Isolation:
    """The kernel layers samples run under; ``isolation()`` measures them once."""

    command: tuple[str, ...] = ()  # the unshare prefix; () without namespaces
    read_only_root: bool = False  # layer 3: only the box writable, no capabilities
    own_proc: bool = False  # a /proc of the sample's PID namespace, not the host's
    landlock_abi: int = 0  # layer 4; 0: none
    seccomp: bool = False  # no new sockets, keyrings or io_uring (part of layer 3)

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(flag[2:] for flag in self.command if flag[2:] in NAMESPACE_KINDS)

    @property
    def kernel(self) -> bool:
        """True when the kernel, not only the audit hook, keeps the host read-only."""
        return self.read_only_root

    def harness_config(self) -> dict:
        """What the harness must build (True), or skip (False)."""
        return {"filesystem": self.read_only_root, "proc": self.own_proc,
                "landlock": self.landlock_abi > 0, "seccomp": self.seccomp, "probe": False}

    def describe(self) -> str:
        landlock = f"Landlock ABI {self.landlock_abi}" if self.landlock_abi else "no Landlock"
        filtered = "seccomp (no sockets, keyrings, io_uring)" if self.seccomp else "no seccomp"
        if self.kernel:
            proc = "own /proc" if self.own_proc else "the host's /proc, read-only"
            return (f"{KERNEL_LEVEL_PREFIX} {'+'.join(self.namespaces)} namespaces, read-only "
                    f"root, empty read-only /tmp, only the box writable, minimal /dev, no "
                    f"capabilities, {proc}; {filtered}; {landlock}; audit hook")
        namespaces = (f"{'+'.join(self.namespaces)} namespaces" if self.namespaces
                      else "no namespaces")
        if self.landlock_abi:
            return (f"partial kernel: no read-only root ({namespaces}); {landlock} confines "
                    f"creating, removing and writing paths to the box, not chmod, chown, "
                    f"utime or xattrs; {filtered}; audit hook")
        if self.namespaces or self.seccomp:
            return f"no kernel filesystem isolation: {namespaces}; {filtered}; audit hook"
        return "audit hook only: no namespaces, no seccomp, no Landlock"


def candidates() -> list[Isolation]:
    """Strongest first; optional layers (own /proc, Landlock) are tried by the probe."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return [Isolation()]
    return [Isolation((unshare, *NAMESPACE_FLAGS), read_only_root=True),
            Isolation((unshare, *NAMESPACE_FLAGS_WITHOUT_MOUNT)), Isolation()]


def probe(candidate: Isolation) -> Isolation | None:
    """Runs PROBE_PROGRAM under ``candidate`` and returns what it measured from
    inside; None when it could not run or the read-only root it was meant to
    have is not there."""
    token = secrets.token_hex(16)
    config = {"filesystem": candidate.read_only_root, "proc": None, "landlock": None,
              "seccomp": None, "probe": True, "token": token, "audit_hook": True}
    try:
        code, stdout, _ = execute(PROBE_PROGRAM, Limits(wall_s=PROBE_TIMEOUT_S),
                                  candidate.command, config)
    except SandboxError:
        return None
    if code != 0 or not stdout.rstrip().endswith(token.encode()):
        return None
    facts = {}
    for line in stdout.decode("utf-8", "replace").splitlines():
        if line.startswith("{"):
            facts.update(json.loads(line))  # the harness's line, then the program's
    read_only_root = facts["writable_mounts"] == [facts["box"]] and facts["capabilities"] == 0
    if candidate.read_only_root and not read_only_root:
        return None
    return Isolation(candidate.command, read_only_root, read_only_root and facts["own_proc"],
                     facts["landlock_abi"], facts["seccomp"])


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """The strongest isolation that works here, probed once per process: a probe
    sample runs under each candidate and reports what it can see and do."""
    for candidate in candidates():
        measured = probe(candidate)
        if measured is not None:
            return measured
    return Isolation()


def isolation_level() -> str:
    """One line for reports: which layers samples run under on this machine,
    e.g. "kernel: user+mount+net+pid namespaces, read-only root, ...; audit hook"
    or "audit hook only: ..."; starts with ``KERNEL_LEVEL_PREFIX`` when the
    kernel keeps the host read-only."""
    return isolation().describe()


def namespace_command() -> tuple[str, ...]:
    """The ``unshare`` prefix samples run under, () without namespaces."""
    return isolation().command


def check_isolation(required: bool | None) -> None:
    """Refuses to run without the kernel layer when it is required (None: as
    ``REQUIRE_KERNEL_ENV`` says); otherwise warns, once, that it is missing."""
    if required is None:
        required = os.environ.get(REQUIRE_KERNEL_ENV, "") not in ("", "0")
    if isolation().kernel:
        return
    if required:
        raise IsolationError(
            f"pass@1 must run under kernel isolation ({REQUIRE_KERNEL_ENV}=1 or "
            f"require_kernel_isolation=True), but this machine gives samples only: "
            f"{isolation_level()}. Fix: allow unprivileged user namespaces (sysctl "
            f"user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 on Debian "
            f"kernels; kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 23.10+; in a "
            f"container, a seccomp profile that allows unshare and mount), with util-linux's "
            f"unshare on PATH and Linux 5.12+ (mount_setattr). Or unset {REQUIRE_KERNEL_ENV} "
            f"to accept the weaker isolation.")
    warnings.warn(f"pass@1 sandbox without kernel filesystem isolation: {isolation_level()}. "
                  f"Set {REQUIRE_KERNEL_ENV}=1 to refuse to run like this.", stacklevel=3)
