"""Run untrusted generated programs (HumanEval pass@1) in a sandbox.

pass@1 executes code a language model wrote. It is usually harmless, but it can
be wrong in destructive ways (``shutil.rmtree``, an endless loop, a fork), so
every sample runs inside layers that each catch what the others miss:

1. A fresh ``python -I`` subprocess per sample, in a new session, with a new
   temporary directory as its cwd, HOME and TMPDIR, deleted afterwards. Its
   process group is SIGKILLed when it ends or overruns, so nothing outlives it.
2. Kernel resource limits (``setrlimit`` before exec): CPU seconds, address
   space, file size, no core dumps, and a process budget. Root is exempt from
   RLIMIT_NPROC, which is why layers 3 and 4 also stop and reap processes.
3. Where ``unshare -rn`` works (probed once), new user, network and PID
   namespaces: no network but a downed loopback, and every process the sample
   starts dies with the namespace.
4. An audit hook (``sys.addaudithook``; it cannot be removed) installed in the
   child before the sample runs. It refuses sockets, ctypes, starting programs
   or processes, signalling processes, raising limits, the introspection that
   could reach the hook's own state, and writes, renames, deletions or mode
   changes of paths outside the sandbox directory.

The sample runs as module ``__sample__``, not ``__main__``, as in the
reference HumanEval harness: a completion's ``if __name__ == "__main__":``
demo does not run. This guards against accidents and casual hostility; it is
not a security boundary against code that attacks CPython or the kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from specdec_jax.runtime.progress import tqdm

MIB = 1024 * 1024
DETAIL_CHARS = 500  # how much of the sample's stderr an Outcome keeps
STDOUT_TAIL_BYTES = 4096  # where the harness's pass token is looked for
SANDBOX_PREFIX = "specdec_sandbox_"
SAMPLE_FILE = "sample.py"
TMP_SUBDIR = "tmp"
NAMESPACE_FLAGS = ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child")
PROBE_TIMEOUT_S = 10.0
POLL_MIN_S, POLL_MAX_S = 0.001, 0.05  # back-off while waiting for a process
SUPERVISOR_POLL_S = 0.01  # how often the harness checks on the sample
# The harness enforces wall_s itself (it can kill a sample that left the
# process group); the parent kills the group this much later as a backstop.
BACKSTOP_GRACE_S = 2.0
REAP_TIMEOUT_S = 5.0  # how long killed processes get to disappear
# The harness's exit statuses. They avoid 1, which Python or unshare return
# when they themselves fail (scored "error"). A signal N is reported as BASE + N.
FAILED_EXIT, RESOURCE_EXIT, TIMEOUT_EXIT, HARNESS_EXIT = 10, 11, 12, 13
SIGNAL_EXIT_BASE = 128
HUMANEVAL_KEYS = ("prompt", "test", "entry_point")

# Runs in the child as ``python -I -c _HARNESS`` and reads its config from
# stdin. It forks the sample (so the sample is never PID 1 of a namespace,
# which the kernel spares SIGXCPU and the like), then supervises it: exit
# status, wall clock. The sample process installs the audit hook, then runs
# the program; only a program that runs to its end gets the pass token
# printed, so os._exit(0) or sys.exit(0) halfway through is not a pass.
_HARNESS = f"""
FAILED_EXIT, RESOURCE_EXIT, TIMEOUT_EXIT, HARNESS_EXIT = {FAILED_EXIT}, {RESOURCE_EXIT}, \
{TIMEOUT_EXIT}, {HARNESS_EXIT}
SIGNAL_EXIT_BASE, POLL_S = {SIGNAL_EXIT_BASE}, {SUPERVISOR_POLL_S}
""" + r'''
import errno, json, os, signal, stat, sys, time, types

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
BLOCKED = frozenset({
    "os.fork", "os.forkpty", "os.system", "subprocess.Popen", "pty.spawn", "os.kill",
    "os.killpg", "signal.pthread_kill", "resource.setrlimit", "resource.prlimit",
    "cpython.PyInterpreterState_New", "sys.settrace", "sys.setprofile", "sys._current_frames",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sqlite3.enable_load_extension"})
BLOCKED_PREFIXES = ("socket.", "ctypes.", "os.exec", "os.spawn", "os.posix_spawn")
BLOCKED_IMPORTS = frozenset({"_ctypes", "_posixsubprocess", "_xxsubinterpreters", "_testcapi",
                             "_testinternalcapi", "_dbm", "_gdbm"})
# Attribute reads/writes that would reach the hook's frame or rewrite code.
BLOCKED_ATTRIBUTES = frozenset({("object.__getattr__", "tb_frame"),
                                ("object.__setattr__", "__code__")})
# event -> ((index of a path argument, index of its dir_fd argument or None), ...)
PATH_EVENTS = {
    "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.symlink": ((1, 2),),
    "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.utime": ((0, 3),),
    "os.truncate": ((0, None),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, 1),), "shutil.copyfile": ((1, None),), "shutil.move": ((0, None),
    (1, None)), "shutil.copytree": ((1, None),), "sqlite3.connect": ((0, None),)}
MAX_SYMLINKS = 40


def make_hook(box):
    # Everything the hook uses is bound here, in its closure: the sample may
    # later rebind names in builtins, os, posixpath or this module.
    lstat, readlink, getcwd, fspath, decode = os.lstat, os.readlink, os.getcwd, os.fspath, \
        bytes.decode
    is_instance, error, import_error = isinstance, PermissionError, ImportError
    encoding = sys.getfilesystemencoding()
    blocked, prefixes, imports, attributes = BLOCKED, BLOCKED_PREFIXES, BLOCKED_IMPORTS, \
        BLOCKED_ATTRIBUTES
    path_events, write_flags, max_links = PATH_EVENTS, WRITE_FLAGS, MAX_SYMLINKS
    file_type, symlink_type = stat.S_IFMT(0o177777), stat.S_IFLNK
    inside_prefix = box + "/"

    def realpath(path):  # os.path.realpath, on the functions bound above
        todo, parts, links = path.split("/")[::-1], [], 0
        while todo:
            name = todo.pop()
            if name == "..":
                parts = parts[:-1]
            elif name not in ("", "."):
                here = "/" + "/".join(parts + [name])
                try:
                    is_link = (lstat(here)[0] & file_type) == symlink_type
                except OSError:
                    is_link = False
                if not is_link:
                    parts.append(name)
                    continue
                links += 1
                if links > max_links:
                    return None
                target = readlink(here)
                parts = [] if target.startswith("/") else parts
                todo.extend(target.split("/")[::-1])
        return "/" + "/".join(parts)

    def fsdecode(path):
        path = fspath(path)
        return path if is_instance(path, str) else decode(path, encoding, "surrogateescape")

    def inside(path, dir_fd=None):
        try:  # a file descriptor or a dir_fd is resolved through /proc
            if is_instance(path, int):
                path = readlink("/proc/self/fd/%d" % path)
            path = fsdecode(path)
            if not path.startswith("/"):
                base = getcwd() if dir_fd is None or dir_fd < 0 else readlink(
                    "/proc/self/fd/%d" % dir_fd)
                path = base + "/" + path
            path = realpath(path)
        except Exception:  # whatever cannot be resolved is outside
            return False
        return path is not None and (path == box or path.startswith(inside_prefix))

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            if is_instance(path, int) or not flags & write_flags:
                return
            # os.open (mode None) may carry a dir_fd that the event does not show.
            relative = mode is None and not fsdecode(path).startswith("/")
            if relative or not (inside(path) or fsdecode(path) == "/dev/null"):
                raise error("sandbox: writing %r is not allowed" % (path,))
        elif event == "import":
            if args[0] in imports:
                raise import_error("sandbox: importing %s is not allowed" % args[0])
        elif event in blocked or event.startswith(prefixes):
            raise error("sandbox: %s is not allowed" % event)
        elif event in path_events:
            for path_index, fd_index in path_events[event]:
                if not inside(args[path_index], None if fd_index is None else args[fd_index]):
                    raise error("sandbox: %s%r is not allowed" % (event, args))
        elif event.startswith("object.__") and (event, args[1]) in attributes:
            raise error("sandbox: %s %s is not allowed" % (event, args[1]))
    return hook


def run_sample(config, box, filename, source):
    # Bound before the sample runs, which may rebind names in os, sys or builtins.
    exit_now, write, report = os._exit, os.write, sys.__excepthook__  # C: never reads tb_frame
    is_instance, type_of, os_error = isinstance, type, OSError
    try:
        code = compile(source, filename, "exec")
        module = types.ModuleType("__sample__")
        sys.modules["__sample__"] = module
        if config["audit_hook"]:
            sys.addaudithook(make_hook(box))
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
    deadline = time.monotonic() + wall_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            if code < 0:
                os._exit(SIGNAL_EXIT_BASE - code)
            os._exit(code if code in (0, FAILED_EXIT, RESOURCE_EXIT) else FAILED_EXIT)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)  # by pid: it may have left the process group
            os._exit(TIMEOUT_EXIT)
        time.sleep(POLL_S)


def main():
    try:
        config = json.loads(sys.stdin.readline())
        sys.stdin.close()
        box = os.path.realpath(config["box"])
        filename = os.path.join(box, config["sample"])
        with open(filename, encoding="utf-8") as f:
            source = f.read()
        pid = os.fork()
    except BaseException as exc:
        sys.__excepthook__(type(exc), exc, exc.__traceback__)
        os._exit(HARNESS_EXIT)
    if pid == 0:
        run_sample(config, box, filename, source)
    supervise(pid, config["wall_s"])


main()
'''


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


@dataclasses.dataclass(frozen=True)
class Outcome:
    passed: bool
    status: str  # "passed", "failed", "timeout", "killed" or "error"
    detail: str  # the tail of the sample's stderr, or why it was stopped


@functools.lru_cache(maxsize=1)
def namespace_command() -> tuple[str, ...]:
    """The ``unshare`` prefix when user+net+pid namespaces work here, else ()."""
    exe = shutil.which("unshare")
    if exe is None:
        return ()
    probe = [exe, *NAMESPACE_FLAGS, sys.executable, "-I", "-c", "pass"]
    try:
        ok = subprocess.run(probe, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return (exe, *NAMESPACE_FLAGS) if ok else ()


def _pids() -> list[str]:
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:  # no /proc
        return []


def _threads_of_user(uid: int) -> int:
    """Threads the user runs now: RLIMIT_NPROC counts them all, not only ours."""
    total = 0
    for pid in _pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:  # it ended while we looked
            pass
    return total


def _live_group_members(pgid: int) -> list[str]:
    """Processes in group ``pgid`` that are not zombies (from /proc/<pid>/stat)."""
    members = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                state, _, group = f.read().rpartition(")")[2].split()[:3]  # name may hold ")"
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state not in ("Z", "X"):
            members.append(pid)
    return members


_PRLIMIT_FLAGS = {resource.RLIMIT_CPU: "--cpu", resource.RLIMIT_AS: "--as",
                  resource.RLIMIT_NPROC: "--nproc", resource.RLIMIT_FSIZE: "--fsize",
                  resource.RLIMIT_CORE: "--core"}


def _wanted_limits(limits: Limits, nproc: int) -> list[tuple[int, int]]:
    wanted = ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_mb * MIB),
              (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_FSIZE, limits.file_size_mb * MIB),
              (resource.RLIMIT_CORE, 0))
    clamped = []
    for kind, value in wanted:
        hard = resource.getrlimit(kind)[1]  # the child inherits our hard limits
        clamped.append((kind, value if hard == resource.RLIM_INFINITY else min(value, hard)))
    return clamped


def _limit_command(limits: Limits, nproc: int) -> list[str] | None:
    """``prlimit`` sets the limits (soft == hard: they cannot be raised) and execs
    the sample, so no Python runs between fork and exec in our (multithreaded,
    JAX) process: a ``preexec_fn`` there can deadlock on a lock another thread
    held at the fork. None when util-linux's ``prlimit`` is missing."""
    binary = shutil.which("prlimit")
    if binary is None:
        return None
    return [binary, *(f"{_PRLIMIT_FLAGS[kind]}={value}:{value}"
                      for kind, value in _wanted_limits(limits, nproc)), "--"]


def _set_limits(limits: Limits, nproc: int):
    """The preexec fallback (no ``prlimit``): runs in the child between fork and exec."""
    wanted = _wanted_limits(limits, nproc)

    def apply():
        for kind, value in wanted:
            resource.setrlimit(kind, (value, value))  # soft == hard: cannot be raised
    return apply


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
    while _live_group_members(proc.pid) and time.monotonic() < deadline:
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
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - limit))
    return f.read()


def _classify(code: int | None, stdout: bytes, stderr: bytes, token: str,
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


def _run(source: str, limits: Limits, *, audit_hook: bool = True) -> Outcome:
    """run_program; tests pass ``audit_hook=False`` to check the other layers alone."""
    token = secrets.token_hex(16)
    try:
        box = tempfile.mkdtemp(prefix=SANDBOX_PREFIX)
    except OSError as exc:
        return Outcome(False, "error", f"sandbox could not make its directory: {exc!r}")
    try:
        with open(os.path.join(box, SAMPLE_FILE), "w", encoding="utf-8") as f:
            f.write(source)
        os.mkdir(os.path.join(box, TMP_SUBDIR))
        env = {"HOME": box, "TMPDIR": os.path.join(box, TMP_SUBDIR), "PATH": os.defpath,
               "LANG": "C.UTF-8"}
        config = {"box": box, "sample": SAMPLE_FILE, "token": token, "audit_hook": audit_hook,
                  "wall_s": limits.wall_s}
        nproc = limits.processes + (_threads_of_user(os.getuid()) if os.getuid() else 0)
        command = [*namespace_command(), sys.executable, "-I", "-c", _HARNESS]
        prlimit = _limit_command(limits, nproc)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                command if prlimit is None else prlimit + command, cwd=box, env=env,
                stdin=subprocess.PIPE, stdout=out, stderr=err, start_new_session=True,
                preexec_fn=_set_limits(limits, nproc) if prlimit is None else None)
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
            stdout, stderr = _tail(out, STDOUT_TAIL_BYTES), _tail(err, 4 * DETAIL_CHARS)
    except (OSError, subprocess.SubprocessError) as exc:
        return Outcome(False, "error", f"sandbox could not run the sample: {exc!r}")
    finally:
        _remove_tree(box)
    return _classify(code, stdout, stderr, token, limits)


def run_program(source: str, limits: Limits = Limits()) -> Outcome:
    """Runs ``source`` in the sandbox; passed when it runs to its end within the limits."""
    return _run(source, limits)


def humaneval_program(problem: dict, completion: str) -> str:
    """The program that scores one completion (the reference HumanEval recipe)."""
    if not isinstance(problem, dict):
        raise ValueError(f"a HumanEval problem must be a dict, got {type(problem).__name__}; "
                         f"use specdec_jax.data.humaneval.load_problems().")
    name = problem.get("task_id", "<no task_id>")
    missing = [key for key in HUMANEVAL_KEYS if not isinstance(problem.get(key), str)]
    if missing:
        raise ValueError(f"problem {name!r} lacks the string field(s) {missing}; a HumanEval "
                         f"problem needs {list(HUMANEVAL_KEYS)} (see humaneval.load_problems()).")
    if not isinstance(completion, str):
        raise ValueError(f"the completion for problem {name!r} is a "
                         f"{type(completion).__name__}; pass the generated text as a str.")
    return (problem["prompt"] + completion + "\n\n" + problem["test"]
            + f"\n\ncheck({problem['entry_point']})\n")


def check_humaneval(problem: dict, completion: str, limits: Limits = Limits()) -> Outcome:
    """Runs the problem's tests against ``prompt + completion`` in the sandbox."""
    return run_program(humaneval_program(problem, completion), limits)


def check_humaneval_many(problems: list[dict], completions: list[str],
                         limits: Limits = Limits(), progress: bool = True) -> list[Outcome]:
    """One sandboxed subprocess per sample, in order. All inputs are checked
    before anything runs; a sample that crashes, hangs or even breaks the
    harness is scored as not passed, and the next sample still runs."""
    if len(problems) != len(completions):
        raise ValueError(f"got {len(problems)} problems but {len(completions)} completions; "
                         f"pass exactly one completion per problem, in the same order.")
    programs = [humaneval_program(p, c) for p, c in zip(problems, completions)]
    outcomes = []
    for program in tqdm(programs, desc="pass@1 sandbox", unit="sample", disable=not progress):
        try:
            outcomes.append(run_program(program, limits))
        except Exception as exc:  # one broken sample must not end the run
            outcomes.append(Outcome(False, "error", f"sandbox failure: {exc!r}"))
    return outcomes
