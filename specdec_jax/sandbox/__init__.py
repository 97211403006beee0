"""Run untrusted generated programs (HumanEval pass@1) in a sandbox.

pass@1 executes code a language model wrote. It is usually harmless, but it can
be wrong in destructive ways (``shutil.rmtree``, an endless loop, a fork), so
every sample runs inside layers that each catch what the others miss:

1. A fresh ``python -I`` subprocess per sample, in a new session, with a new
   temporary directory (the box) as its cwd, HOME and TMPDIR, deleted
   afterwards. Its process group is SIGKILLed when it ends or overruns.
2. Kernel resource limits (``setrlimit`` before exec): CPU seconds, address
   space, file size, no core dumps, and a process budget. Root is exempt from
   RLIMIT_NPROC, which is why layers 3 and 5 also stop and reap processes.
3. Where unprivileged user namespaces work (probed once), new user, mount,
   network and PID namespaces. The harness builds a new root in the mount
   namespace: the host's tree bound read-only (recursively, by the kernel),
   the box bound writable, an empty read-only /tmp (other boxes, other users'
   files are out of sight; only the sample's own Python environment, when it
   lives there, is bound in read-only) and a /proc of the new PID namespace; it pivots
   into it and detaches the old root. The sample then drops every capability
   (no_new_privs, locked securebits, an empty bounding set), so it cannot
   mount, remount or unmount its way out. No network but a downed loopback,
   and every process the sample starts dies with the namespace.
4. Where the kernel offers Landlock, the sample also confines itself with it:
   creating, removing, renaming, writing or truncating paths is refused
   outside the box, as are TCP and (ABI 6+) signals to processes outside it.
   Without namespaces this is the only kernel layer over the filesystem; it
   does not cover chmod, chown, utime or xattrs, so it is reported as partial.
5. An audit hook (``sys.addaudithook``; it cannot be removed) installed in the
   child before the sample runs. It refuses sockets, ctypes, starting programs
   or processes, signalling processes, raising limits, the introspection that
   could reach the hook's own state, and writes, renames, deletions or mode
   changes of paths outside the sandbox directory. It is a deny-list of Python
   functions: a syscall without an audit event (``os.mkfifo``, ``os.mknod``)
   passes it, which is why layers 3 and 4 exist.

``isolation_level()`` says which of these this machine has, as measured from
inside a probe sample; ``SPECDEC_SANDBOX_REQUIRE_KERNEL=1`` (or
``require_kernel_isolation=True``) refuses to score without layer 3. The
sample runs as module ``__sample__``, not ``__main__``, as in the reference
HumanEval harness: a completion's ``if __name__ == "__main__":`` demo does not
run. This guards against accidents and hostility; it is not a boundary against
code that exploits the kernel itself.

Modules, one concern each. In this process: ``run`` (run_program,
run_programs), ``process`` (layer 1: the box, the subprocess, the group kill),
``limits`` (layer 2), ``outcome`` (exit status -> score), ``probe`` (which of
layers 3 and 4 work here), ``procfs``. In the child (``child/``, run by path,
standard library only): ``harness`` (the entry point and the supervisor),
``mounts`` (layer 3's read-only root), ``privileges`` (capabilities, seccomp,
Landlock), ``audit`` (layer 5), ``libc``. HumanEval's programs are assembled
in ``specdec_jax.data.humaneval``.
"""

from __future__ import annotations

from specdec_jax.sandbox.limits import Limits
from specdec_jax.sandbox.outcome import Outcome
from specdec_jax.sandbox.probe import (
    KERNEL_LEVEL_PREFIX,
    NAMESPACE_FLAGS,
    REQUIRE_KERNEL_ENV,
    Isolation,
    IsolationError,
    isolation,
    isolation_level,
    namespace_command,
)
from specdec_jax.sandbox.process import SANDBOX_PREFIX, SandboxError
from specdec_jax.sandbox.run import run_program, run_programs, run_with_layers

__all__ = [
    "KERNEL_LEVEL_PREFIX", "NAMESPACE_FLAGS", "REQUIRE_KERNEL_ENV", "SANDBOX_PREFIX", "Isolation",
    "IsolationError", "Limits", "Outcome", "SandboxError", "isolation", "isolation_level",
    "namespace_command", "run_program", "run_programs", "run_with_layers",
]
