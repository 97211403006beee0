"""The sandboxed child: ``python -I harness.py``, its config as one JSON line on stdin.

Inside the namespaces it first builds the read-only root (``mounts``), then
forks the sample (so the sample is never PID 1 of a namespace, which the
kernel spares SIGXCPU and the like) and supervises it: exit status, wall
clock. The sample process drops its capabilities and applies seccomp and
Landlock (``privileges``), installs the audit hook (``audit``), then runs the
program as module ``__sample__``; only a program that runs to its end gets the
pass token printed, so ``os._exit(0)`` or ``sys.exit(0)`` halfway through is
not a pass.

Run by path, with the standard library only: ``python -I`` puts no folder of
the package on ``sys.path`` (nor may it: the sample would import from it), so
the harness loads its sibling modules by path before it confines anything.
The parent (``specdec_jax.sandbox.process``) imports this module for the exit
statuses below; ``main`` runs only as ``__main__``.
"""

import errno
import json
import os
import signal
import sys
import time
import types

# Exit statuses. They avoid 1, which Python or unshare return when they
# themselves fail (scored "error"). A signal N is reported as BASE + N.
FAILED_EXIT, RESOURCE_EXIT, TIMEOUT_EXIT, HARNESS_EXIT = 10, 11, 12, 13
SIGNAL_EXIT_BASE = 128
POLL_S = 0.01  # how often the harness checks on the sample
SIBLINGS = ("libc", "mounts", "privileges", "audit")


def load_sibling(name):
    """This folder's ``<name>.py`` as a new module (not in ``sys.modules``)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    module = types.ModuleType(name)
    module.__file__ = path
    with open(path, encoding="utf-8") as f:
        exec(compile(f.read(), path, "exec"), module.__dict__)
    return module


def run_sample(config, box, filename, source, own_proc):
    """The sample process: its kernel layers, the audit hook, the program. Never returns."""
    # Bound before the sample runs, which may rebind names in os, sys or builtins.
    exit_now, write, report = os._exit, os.write, sys.__excepthook__  # C: never reads tb_frame
    is_instance, type_of, os_error = isinstance, type, OSError
    try:
        applied = privileges.confine_process(libc.load_libc, config, box)
        libc.hide_ctypes()
        if config["probe"]:
            write(1, (json.dumps(dict(applied, own_proc=own_proc)) + "\n").encode())
    except BaseException as exc:
        report(type_of(exc), exc, exc.__traceback__)
        sys.stderr.flush()
        exit_now(HARNESS_EXIT)
    try:
        code = compile(source, filename, "exec")
        module = types.ModuleType("__sample__")
        sys.modules["__sample__"] = module
        if config["audit_hook"]:
            sys.addaudithook(audit.make_hook(box))
        exec(code, module.__dict__)
        sys.stdout.flush()
    except MemoryError:
        exit_now(RESOURCE_EXIT)  # reporting it may need memory too
    except BaseException as exc:  # SystemExit too: a sample that exits early skipped tests
        try:
            report(type_of(exc), exc, exc.__traceback__)
            sys.stderr.flush()
        finally:
            too_big = is_instance(exc, os_error) and exc.errno == errno.EFBIG
            exit_now(RESOURCE_EXIT if too_big else FAILED_EXIT)
    write(1, ("\n" + config["token"] + "\n").encode())
    exit_now(0)


def supervise(pid, wall_s):
    """Waits for the sample and exits with its status (one of ours), or kills it
    at the wall-clock deadline. Never returns."""
    deadline = time.monotonic() + wall_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code < 0:
                os._exit(SIGNAL_EXIT_BASE - code)
            os._exit(code if code in (0, FAILED_EXIT, RESOURCE_EXIT, HARNESS_EXIT) else
                     FAILED_EXIT)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # by pid: it may have left the process group
            os._exit(TIMEOUT_EXIT)
        time.sleep(POLL_S)


def main():
    """Reads the config, confines the filesystem, forks the sample, supervises it."""
    try:
        config = json.loads(sys.stdin.readline())
        sys.stdin.close()
        box = os.path.realpath(config["box"])
        filename = os.path.join(box, config["sample"])
        with open(filename, encoding="utf-8") as f:
            source = f.read()
        own_proc = (mounts.confine_filesystem(libc.load_libc, box, config["proc"])
                    if config["filesystem"] else False)
        pid = os.fork()
    except BaseException as exc:
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
        os._exit(HARNESS_EXIT)
    if pid == 0:
        run_sample(config, box, filename, source, own_proc)
    supervise(pid, config["wall_s"])


if __name__ == "__main__":
    # Module globals of ``__main__``, as the sample can see them: the hook binds
    # what it uses in its closure, so rebinding them later changes nothing.
    libc, mounts, privileges, audit = (load_sibling(name) for name in SIBLINGS)
    main()
