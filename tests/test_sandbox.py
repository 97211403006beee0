"""The pass@1 sandbox scores honest samples and contains hostile ones.

Hostile samples run with short limits; each is scored as not passed, leaves
the machine as it found it, and does not stop the samples after it. The
hostile corpus (``HOSTILE``) runs twice: under every layer, and under the
kernel layers alone (no audit hook), which must hold by themselves.
"""

from __future__ import annotations

import os
import platform
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from specdec_jax import sandbox
from specdec_jax.data import humaneval, metrics

psutil = pytest.importorskip("psutil")

ADD = {
    "task_id": "Toy/0",
    "prompt": 'def add(a, b):\n    """Return the sum of a and b."""\n',
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"
            "    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}
GOOD = "    return a + b\n"
FAST = sandbox.Limits(wall_s=3.0, cpu_s=5, memory_mb=512)
DECOY_TEXT = "precious"
GONE_TIMEOUT_S = 10.0  # init reaps killed namespace processes within a few seconds
ACCEPT_TIMEOUT_S = 0.5


@pytest.fixture
def decoy(tmp_path):
    """A file outside any sandbox that hostile samples try to destroy."""
    path = tmp_path / "victim" / "decoy.txt"
    path.parent.mkdir()
    path.write_text(DECOY_TEXT)
    yield path
    assert path.read_text() == DECOY_TEXT
    assert stat.S_IMODE(path.stat().st_mode) != 0
    assert sorted(os.listdir(path.parent)) == ["decoy.txt"]


@pytest.fixture
def listener():
    """A listening socket that no sample may ever reach."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        yield server
        server.settimeout(ACCEPT_TIMEOUT_S)
        with pytest.raises(TimeoutError):
            server.accept()


@pytest.fixture
def groups(monkeypatch):
    """Process group ids of the sandboxes started during the test."""
    started = []

    class Recording(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self.pid)

    sandbox.namespace_command()  # probe before recording
    monkeypatch.setattr(subprocess, "Popen", Recording)
    yield started
    for pgid in started:  # nothing lives on, and the groups disappear
        assert not _live_members(pgid)
    deadline = time.monotonic() + GONE_TIMEOUT_S
    for pgid in started:
        while True:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, f"process group {pgid} still exists"
            time.sleep(0.1)
    assert not [p for p in psutil.process_iter(["cwd"])
                if sandbox.SANDBOX_PREFIX in (p.info["cwd"] or "")]


def _live_members(pgid: int) -> list[int]:
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return members


def _decoy_attack(decoy) -> str:
    """A completion that tries every way it knows to damage the decoy; it
    passes only if one of them works."""
    return f"""    import os, shutil
    decoy = {str(decoy)!r}
    folder = os.path.dirname(decoy)
    attacks = [
        lambda: os.remove(decoy),
        lambda: open(decoy, "w").write("pwned"),
        lambda: shutil.rmtree(folder),
        lambda: os.unlink(os.path.basename(decoy), dir_fd=os.open(folder, os.O_RDONLY)),
        lambda: os.symlink(decoy, "link") or open("link", "w").write("pwned"),
        lambda: os.rename(decoy, "stolen"),
        lambda: os.chmod(decoy, 0),
        lambda: os.truncate(decoy, 0),
        lambda: open(os.path.join(folder, "new.txt"), "x"),
    ]
    worked = 0
    for attack in attacks:
        try:
            attack()
            worked += 1
        except OSError:
            pass
    return a + b if worked else None
"""


def _network_attack(port: int) -> str:
    return f"""    import socket
    connected = []
    for address in [("127.0.0.1", {port}), ("8.8.8.8", 53)]:
        try:
            socket.create_connection(address, timeout=1).close()
            connected.append(address)
        except OSError:
            pass
    return a + b if connected else None
"""


def test_correct_solution_passes():
    assert humaneval.check_humaneval(ADD, GOOD, FAST) == sandbox.Outcome(True, "passed", "")


def test_wrong_solution_fails():
    outcome = humaneval.check_humaneval(ADD, "    return a - b\n", FAST)
    assert (outcome.passed, outcome.status) == (False, "failed")
    assert "AssertionError" in outcome.detail


@pytest.mark.parametrize("ending", ["import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n",
                                    "raise SystemExit\n"])
def test_exiting_before_the_tests_end_is_not_a_pass(ending):
    outcome = humaneval.check_humaneval(ADD, GOOD + "\n" + ending, FAST)
    assert (outcome.passed, outcome.status) == (False, "failed")


def test_main_guard_does_not_run_like_the_reference_harness():
    demo = GOOD + '\n\nif __name__ == "__main__":\n    input()\n'  # stdin is closed
    assert humaneval.check_humaneval(ADD, demo, FAST).passed


def test_runs_in_a_fresh_directory_that_is_deleted():
    program = ("import os, tempfile\nopen('scratch.txt', 'w').write('ok')\n"
               "os.makedirs('a/b')\nfd, name = tempfile.mkstemp()\nos.close(fd)\n"
               "raise RuntimeError('|'.join([os.getcwd(), os.environ['HOME'], "
               "os.environ['TMPDIR'], name]))\n")
    outcome = sandbox.run_program(program, FAST)
    cwd, home, tmpdir, temp_file = re.search(r"RuntimeError: (.*)", outcome.detail)[1].split("|")
    assert os.path.basename(cwd).startswith(sandbox.SANDBOX_PREFIX)
    assert home == cwd and tmpdir.startswith(cwd + os.sep) and temp_file.startswith(tmpdir)
    assert not os.path.exists(cwd)


def test_hostile_samples_are_contained_and_the_run_goes_on(decoy, listener, groups):
    hostile = {
        "infinite loop": "    while True:\n        pass\n",
        "huge allocation": "    x = bytearray(10**11)\n    return a + b\n",
        "fork bomb": "    import os\n    while True:\n        os.fork()\n",
        "decoy": _decoy_attack(decoy),
        "network": _network_attack(listener.getsockname()[1]),
    }
    completions = [*hostile.values(), GOOD]
    outcomes = humaneval.check_humaneval_many([ADD] * len(completions), completions, FAST,
                                              progress=False)
    by_name = dict(zip([*hostile, "good"], outcomes))
    assert not any(o.passed for name, o in by_name.items() if name != "good"), by_name
    assert by_name["infinite loop"].status in ("timeout", "killed")
    assert by_name["huge allocation"].status == "killed"
    assert by_name["fork bomb"].status == "failed"
    assert by_name["good"] == sandbox.Outcome(True, "passed", "")
    assert len(groups) == len(completions)


def test_a_growing_sample_is_stopped_by_the_memory_limit_not_the_clock():
    """Its own run with a generous clock: under a loaded CI machine the 3 s clock of
    ``FAST`` can run out before 512 MiB are touched, and then the clock, not the
    address-space limit, would be what the test saw."""
    growing = "    xs = []\n    while True:\n        xs.append(bytearray(10**7))\n"
    limits = sandbox.Limits(wall_s=30.0, cpu_s=30, memory_mb=512)
    outcome, = humaneval.check_humaneval_many([ADD], [growing], limits, progress=False)
    assert outcome.status == "killed" and "512 MiB address-space" in outcome.detail, outcome


def test_fork_bomb_is_reaped_without_the_audit_hook(groups):
    """The hook refuses os.fork; without it the namespace / group kill must still reap
    every process (root ignores RLIMIT_NPROC). A short bomb: it loads the machine."""
    bomb = "import os\nwhile True:\n    os.fork()\n"
    outcome = sandbox.run_with_layers(bomb, sandbox.Limits(wall_s=1.0, memory_mb=256),
                                      audit_hook=False)
    assert not outcome.passed and outcome.status in ("timeout", "killed", "failed")


@pytest.mark.skipif(not sandbox.namespace_command(), reason="unshare -rn does not work here")
def test_network_namespace_alone_blocks_connections(listener):
    program = humaneval.humaneval_program(ADD, _network_attack(listener.getsockname()[1]))
    assert not sandbox.run_with_layers(program, FAST, audit_hook=False).passed


ESCAPES = {
    "subprocess": "import subprocess\nsubprocess.run(['rm', DECOY])\n",
    "os.system": "import os\nos.system('rm ' + DECOY)\n",
    "exec": "import os\nos.execv('/bin/rm', ['rm', DECOY])\n",
    "ctypes": "import ctypes\nctypes.CDLL(None).unlink(DECOY.encode())\n",
    "signal": "import os\nos.kill(os.getppid(), 0)\n",
    "rlimit": "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (-1, -1))\n",
    "rebound builtins": "import builtins, os\nbuiltins.isinstance = lambda *a: True\n"
                        "os.path.realpath = os.fsdecode = lambda p: os.getcwd()\n"
                        "open(DECOY, 'w').write('pwned')\n",
    "rebound harness": "import __main__\n__main__.audit.BLOCKED = frozenset()\n"
                       "__main__.audit.PATH_EVENTS = {}\nimport os\nos.remove(DECOY)\n",
    "hook frame": "try:\n    open(DECOY, 'w')\nexcept PermissionError as e:\n"
                  "    tb = e.__traceback__\n    print(tb.tb_next.tb_frame.f_locals)\n",
    "gc": "import gc\nprint(len(gc.get_objects()))\n",
    "trace": "import sys\nsys.settrace(lambda *a: None)\n",
}


@pytest.mark.parametrize("name", ESCAPES)
def test_audit_hook_refuses_escapes(name, decoy):
    outcome = sandbox.run_program(f"DECOY = {str(decoy)!r}\n" + ESCAPES[name], FAST)
    assert (outcome.passed, outcome.status) == (False, "failed"), outcome
    assert "sandbox:" in outcome.detail


def test_resource_limits():
    cpu = sandbox.run_program("while True:\n    pass\n", sandbox.Limits(wall_s=5, cpu_s=1))
    assert (cpu.status, cpu.passed) == ("killed", False) and "SIGKILL" in cpu.detail
    big = sandbox.run_program("open('big', 'w').write('x' * 2 * 2**20)\n",
                              sandbox.Limits(file_size_mb=1))
    assert (big.status, big.passed) == ("killed", False)


def test_numpy_still_imports_although_ctypes_is_refused():
    pytest.importorskip("numpy")
    assert sandbox.run_program("import numpy as np\nassert np.arange(4).sum() == 6\n",
                               FAST).passed


def test_samples_run_single_threaded_numeric_libraries():
    """Whatever the host's core count, a sample's BLAS starts one thread (its
    per-thread buffers would not fit the memory limit on a many-core host)."""
    check = ("import os\n" + "".join(f"assert os.environ[{k!r}] == '1'\n"
                                     for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                               "MKL_NUM_THREADS")))
    assert sandbox.run_program(check, FAST).passed


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="one completion per problem"):
        humaneval.check_humaneval_many([ADD, ADD], [GOOD], FAST, progress=False)
    broken = {k: v for k, v in ADD.items() if k != "entry_point"}
    with pytest.raises(ValueError, match=r"Toy/0.*entry_point"):
        humaneval.check_humaneval_many([ADD, broken], [GOOD, GOOD], FAST, progress=False)
    with pytest.raises(ValueError, match="as a str"):
        humaneval.check_humaneval(ADD, None, FAST)
    with pytest.raises(ValueError, match="wall_s"):
        sandbox.Limits(wall_s=0)


def test_kernel_limits_reach_the_sample():
    """The sample runs under the Limits it was given (set by prlimit before exec)."""
    limits = sandbox.Limits(wall_s=5.0, cpu_s=7, memory_mb=900, file_size_mb=3)
    source = ("import resource\n"
              "assert resource.getrlimit(resource.RLIMIT_CPU) == (7, 7)\n"
              "assert resource.getrlimit(resource.RLIMIT_AS)[0] == 900 * 2 ** 20\n"
              "assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == 3 * 2 ** 20\n")
    assert sandbox.run_program(source, limits).passed
    wrong = source.replace("(7, 7)", "(8, 8)")
    assert not sandbox.run_program(wrong, limits).passed



# --- The hostile corpus -----------------------------------------------------------------
# Each entry is the body of ``_attack()``; the completion returns ``a + b`` only
# when the attack returns True, so a sample passes only if its attack worked (or
# was not stopped: resource hogs and early exits must not pass either). Targets:
# {out} a directory outside the box that the sample can see (read-only),
# {tmp} and {shm} random names under /tmp and /dev/shm, {fifo}, {unix},
# {abstract} listeners the test holds, {port}/{udp} loopback listeners,
# {victim} a process of the test's, {test_pid} the test process itself.
SPAWNED = "import os\n    return os.path.exists({out!r} + '/spawned')"  # after the child ended
HOSTILE = {
    # open / creat
    "open create": "open({out!r} + '/new', 'w').write('x')\n    return True",
    "open truncate": "open({out!r} + '/decoy.txt', 'w')\n    return True",
    "open append": "open({out!r} + '/decoy.txt', 'a').write('x')\n    return True",
    "os.open creat": "import os\n    os.open({out!r} + '/new', os.O_CREAT | os.O_WRONLY)\n"
                     "    return True",
    "open via /proc/1/root": "open('/proc/1/root' + {out!r} + '/new', 'w')\n    return True",
    "write /proc/1/mem": "open('/proc/1/mem', 'wb')\n    return True",
    "open a device": "import os\n    os.open('/dev/kmsg', os.O_WRONLY)\n    return True",
    "write into a fifo": "import os\n    fd = os.open({fifo!r}, os.O_WRONLY | os.O_NONBLOCK)\n"
                         "    return os.write(fd, b'pwned') > 0",
    # mkdir, mknod, mkfifo
    "mkdir": "import os\n    os.mkdir({out!r} + '/dir')\n    return True",
    "makedirs in /tmp": "import os\n    os.makedirs({tmp!r} + '/a/b')\n    return True",
    "mknod in /tmp": "import os, stat\n    os.mknod({tmp!r}, stat.S_IFREG | 0o600)\n"
                     "    return True",
    "mknod outside": "import os, stat\n    os.mknod({out!r} + '/node', stat.S_IFREG | 0o600)\n"
                     "    return True",
    "mknod a device": "import os, stat\n    os.mknod('dev', stat.S_IFCHR | 0o600, "
                      "os.makedev(1, 3))\n    return True",
    "mkfifo in /tmp": "import os\n    os.mkfifo({tmp!r})\n    return True",
    "mkfifo outside": "import os\n    os.mkfifo({out!r} + '/fifo2')\n    return True",
    "mkfifo in /dev/shm": "import os\n    os.mkfifo({shm!r})\n    return True",
    # link, symlink, rename, unlink, rmdir
    "link": "import os\n    os.link({out!r} + '/decoy.txt', {out!r} + '/hard')\n    return True",
    "link into the box": "import os\n    os.link({out!r} + '/decoy.txt', 'alias')\n"
                         "    open('alias', 'w').write('pwned')\n    return True",
    "symlink": "import os\n    os.symlink('/etc/passwd', {out!r} + '/link')\n    return True",
    "rename": "import os\n    os.rename({out!r} + '/decoy.txt', {out!r} + '/moved')\n"
              "    return True",
    "rename into the box": "import os\n    os.rename({out!r} + '/decoy.txt', 'stolen')\n"
                           "    return True",
    "unlink": "import os\n    os.unlink({out!r} + '/decoy.txt')\n    return True",
    "rmdir": "import os\n    os.rmdir({out!r} + '/sub')\n    return True",
    # truncate, chmod, chown, utime, xattrs
    "truncate": "import os\n    os.truncate({out!r} + '/decoy.txt', 0)\n    return True",
    "chmod": "import os\n    os.chmod({out!r} + '/decoy.txt', 0)\n    return True",
    "fchmod": "import os\n    os.fchmod(os.open({out!r} + '/decoy.txt', os.O_RDONLY), 0)\n"
              "    return True",
    "chown": "import os\n    os.chown({out!r} + '/decoy.txt', os.getuid(), os.getgid())\n"
             "    return True",
    "utime": "import os\n    os.utime({out!r} + '/decoy.txt', (0, 0))\n    return True",
    "setxattr": "import os\n    os.setxattr({out!r} + '/decoy.txt', 'user.pwned', b'1')\n"
                "    return True",
    "removexattr": "import os\n    os.removexattr({out!r} + '/decoy.txt', 'user.keep')\n"
                   "    return True",
    # *at variants, with a directory fd opened outside
    "openat": "import os\n    d = os.open({out!r}, os.O_RDONLY)\n"
              "    os.open('new', os.O_CREAT | os.O_WRONLY, dir_fd=d)\n    return True",
    "mkdirat": "import os\n    os.mkdir('dir', dir_fd=os.open({out!r}, os.O_RDONLY))\n"
               "    return True",
    "mknodat": "import os, stat\n    os.mknod('node', stat.S_IFREG | 0o600, "
               "dir_fd=os.open({out!r}, os.O_RDONLY))\n    return True",
    "mkfifoat": "import os\n    os.mkfifo('fifo2', dir_fd=os.open({out!r}, os.O_RDONLY))\n"
                "    return True",
    "unlinkat": "import os\n    os.unlink('decoy.txt', dir_fd=os.open({out!r}, os.O_RDONLY))\n"
                "    return True",
    "renameat": "import os\n    d = os.open({out!r}, os.O_RDONLY)\n"
                "    os.rename('decoy.txt', 'moved', src_dir_fd=d, dst_dir_fd=d)\n    return True",
    "symlinkat": "import os\n    os.symlink('/etc', 'link', dir_fd=os.open({out!r}, os.O_RDONLY))\n"
                 "    return True",
    # mounting
    "mount syscall": "import ctypes\n    libc = ctypes.CDLL(None, use_errno=True)\n"
                     "    return libc.mount(b'tmpfs', {out!r}.encode(), b'tmpfs', 0, None) == 0",
    "remount / writable": "import ctypes\n    libc = ctypes.CDLL(None, use_errno=True)\n"
                          "    libc.mount(None, b'/', None, 32 | 4096, None)  # REMOUNT | BIND\n"
                          "    open({out!r} + '/new', 'w')\n    return True",
    "mount binary": "import subprocess\n    subprocess.run(['mount', '-t', 'tmpfs', 'tmpfs', "
                    "{out!r}], check=True)\n    return True",
    # a user+mount namespace of its own (full capabilities in it), then remount / and
    # the target writable, and unmount the empty /tmp
    "nested namespace remount": "import ctypes\n    libc = ctypes.CDLL(None, use_errno=True)\n"
                                "    if libc.unshare(0x10000000 | 0x20000):\n"
                                "        raise OSError(ctypes.get_errno(), 'unshare')\n"
                                "    for target in (b'/', {out!r}.encode()):\n"
                                "        libc.mount(None, target, None, 32 | 4096, None)\n"
                                "    libc.umount2(b'/tmp', 2)\n"
                                "    open({out!r} + '/new', 'w')\n    return True",
    # spawning
    "fork": "import os\n    pid = os.fork()\n    if pid == 0:\n"
            "        open({out!r} + '/spawned', 'w')\n        os._exit(0)\n"
            "    os.waitpid(pid, 0)\n    " + SPAWNED,
    "exec": "import os\n    os.execv('/bin/sh', ['sh', '-c', 'touch ' + {out!r} + '/spawned'])",
    "posix_spawn": "import os\n    os.waitpid(os.posix_spawn('/bin/sh', ['sh', '-c', 'touch ' + "
                   "{out!r} + '/spawned'], {{}}), 0)\n    " + SPAWNED,
    "_posixsubprocess": "import _posixsubprocess, os\n    r, w = os.pipe()\n"
                        "    args = [[b'/bin/sh', b'-c', b'touch ' + {out!r}.encode() + "
                        "b'/spawned'], [b'/bin/sh'], True, (w,), None, None, -1, -1, -1, -1, "
                        "-1, -1, r, w, True, False, -1, None, None, None, -1, None]\n"
                        "    for extra in ([], [False], [False, False]):  # the arity varies\n"
                        "        try:\n            os.waitpid(_posixsubprocess.fork_exec("
                        "*args, *extra), 0)\n"
                        "            break\n        except TypeError:\n            pass\n"
                        "    " + SPAWNED,
    "os.system": "import os\n    os.system('touch ' + {out!r} + '/spawned')\n    " + SPAWNED,
    "subprocess": "import subprocess\n    subprocess.run(['touch', {out!r} + '/spawned'])\n"
                  "    " + SPAWNED,
    # sockets
    "tcp loopback": "import socket\n    socket.create_connection(('127.0.0.1', {port}), 1)\n"
                    "    return True",
    "udp loopback": "import socket\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                    "    return s.sendto(b'pwned', ('127.0.0.1', {udp})) > 0",
    "unix socket": "import socket\n    socket.socket(socket.AF_UNIX).connect({unix!r})\n"
                   "    return True",
    "abstract unix socket": "import socket\n    socket.socket(socket.AF_UNIX).connect("
                            "{abstract!r})\n    return True",
    # signals
    "signal the parent": "import os, signal\n    os.kill(os.getppid(), signal.SIGKILL)\n"
                         "    return True",
    "signal the test": "import os, signal\n    os.kill({test_pid}, signal.SIGUSR1)\n"
                       "    return True",
    "kill a host process": "import os, signal\n    os.kill({victim}, signal.SIGKILL)\n"
                           "    return True",
    # resource hogs
    "cpu": "while True:\n        pass",
    "memory": "x = bytearray(10 ** 11)\n    return True",
    "file size": "open('big', 'wb').write(b'x' * 2 ** 22)\n    return True",
    "stdout flood": "while True:\n        print('x' * 65536)",
    "thread that outlives": "import os, threading, time\n    def late():\n"
                            "        while True:\n            try:\n"
                            "                open({out!r} + '/late', 'w')\n"
                            "            except OSError:\n                time.sleep(0.01)\n"
                            "    threading.Thread(target=late).start()\n    time.sleep(0.2)\n"
                            "    return os.path.exists({out!r} + '/late')",
    # early exits (the attack is the whole completion: see _completion)
    "os._exit before the tests": None,
    "sys.exit before the tests": None,
    "SystemExit inside check": None,
    "atexit": None,
    "rebound exit": None,
}
EARLY_EXITS = {
    "os._exit before the tests": "    return a + b\n\nimport os\nos._exit(0)\n",
    "sys.exit before the tests": "    return a + b\n\nimport sys\nsys.exit(0)\n",
    "SystemExit inside check": "    raise SystemExit(0)\n",
    "atexit": "    return a + b\n\nimport atexit, os\natexit.register(os._exit, 0)\n"
              "atexit.register(print, 'ok')\nraise SystemExit(0)\n",
    "rebound exit": "    return a + b\n\nimport os, sys\nos._exit = sys.exit = lambda *a: None\n"
                    "os.write = lambda *a: 0\nraise AssertionError('tests skipped')\n",
}
# The kernel layer that stops each attack without the audit hook, where the
# read-only root alone does not (a kernel-only run skips an attack whose layer
# this kernel lacks; the isolation level says so). Landlock alone (the
# fallback without namespaces) does not cover metadata: "read_only_root".
NEEDS = {"write into a fifo": "landlock", "unix socket": "seccomp",
         "signal the parent": "landlock_signals", "signal the test": "landlock_signals",
         "kill a host process": "landlock_signals",
         **dict.fromkeys(["chmod", "fchmod", "chown", "utime", "setxattr", "removexattr"],
                         "read_only_root")}
BUDGET = sandbox.Limits(wall_s=2.0, cpu_s=1, memory_mb=512, file_size_mb=1)
HOSTILE_RUNTIME_S = 60.0  # the whole corpus, per layer set, on 2 cores


def _completion(name: str, targets: dict) -> str:
    if name in EARLY_EXITS:
        return EARLY_EXITS[name]
    body = HOSTILE[name].format(**targets)  # runs once, before check() calls add twice
    return (f"    return a + b if WORKED else None\n\n\ndef _attack():\n    {body}\n\n\n"
            f"WORKED = _attack()\n")


def _snapshot(root) -> dict:
    """Everything about a tree a sample could change: names, types, modes,
    owners, sizes, times, contents, link targets, xattrs."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in ["", *dirs, *files]:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            content = None
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    content = f.read()
            elif stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            xattrs = (sorted((k, os.getxattr(path, k)) for k in os.listxattr(path))
                      if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode) else [])
            seen[os.path.relpath(path, root)] = (
                info.st_mode, info.st_uid, info.st_gid, info.st_size, info.st_mtime_ns,
                info.st_ctime_ns, content, xattrs)
    return seen


def _visible_outside_dir() -> str:
    """A directory outside any box that samples can see: /var/tmp where it
    exists (the sandbox hides /tmp, so a target there would prove nothing
    about the read-only root), else the system temp dir."""
    base = "/var/tmp" if os.path.isdir("/var/tmp") and os.access("/var/tmp", os.W_OK) else None
    return tempfile.mkdtemp(prefix="specdec_hostile_", dir=base)


@pytest.fixture
def targets(tmp_path, listener):
    """The targets of HOSTILE, and after the run, proof that none changed."""
    out = _visible_outside_dir()
    token = secrets.token_hex(8)
    with open(os.path.join(out, "decoy.txt"), "w") as f:
        f.write(DECOY_TEXT)
    try:
        os.setxattr(os.path.join(out, "decoy.txt"), "user.keep", b"1")
    except OSError:  # no user xattrs on this filesystem
        pass
    os.mkdir(os.path.join(out, "sub"))
    fifo = os.path.join(out, "fifo")
    os.mkfifo(fifo)
    fifo_reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(os.path.join(out, "sock"))
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0specdec_hostile_" + token)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    for server in (unix, abstract):
        server.listen(1)
        server.settimeout(ACCEPT_TIMEOUT_S / 5)
    udp.settimeout(ACCEPT_TIMEOUT_S / 5)
    victim = subprocess.Popen(["sleep", "600"])
    signalled = []
    previous = signal.signal(signal.SIGUSR1, lambda *a: signalled.append(a))
    before = _snapshot(out)
    found = {"out": out, "tmp": f"/tmp/specdec_hostile_{token}",
             "shm": f"/dev/shm/specdec_hostile_{token}", "fifo": fifo,
             "unix": os.path.join(out, "sock"), "abstract": "\0specdec_hostile_" + token,
             "port": listener.getsockname()[1], "udp": udp.getsockname()[1],
             "victim": victim.pid, "test_pid": os.getpid()}
    try:
        yield found
        assert _snapshot(out) == before
        assert not os.path.lexists(found["tmp"]) and not os.path.lexists(found["shm"])
        for server in (unix, abstract):
            with pytest.raises(TimeoutError):
                server.accept()
        with pytest.raises(TimeoutError):
            udp.recv(16)
        assert os.read(fifo_reader, 16) == b""  # no writer ever wrote
        assert victim.poll() is None and not signalled
    finally:
        signal.signal(signal.SIGUSR1, previous)
        victim.kill()
        victim.wait()
        for closable in (unix, abstract, udp):
            closable.close()
        os.close(fifo_reader)
        shutil.rmtree(out)


def _needs_met(name: str, layers: sandbox.Isolation) -> bool:
    need = NEEDS.get(name)
    return (need is None or (need == "landlock" and layers.landlock_abi >= 1)
            or (need == "landlock_signals" and (layers.landlock_abi >= 6 or
                                                "pid" in layers.namespaces))
            or (need == "seccomp" and layers.seccomp)
            or (need == "read_only_root" and layers.read_only_root))


def _kernel_layers(mode: str) -> sandbox.Isolation:
    """The layers a corpus run uses: this machine's, or only its Landlock and
    seccomp (the partial level of a machine without user namespaces)."""
    found = sandbox.isolation()
    if mode == "landlock only":
        if not found.landlock_abi:
            pytest.skip(f"no Landlock here: {sandbox.isolation_level()}")
        return sandbox.Isolation(landlock_abi=found.landlock_abi, seccomp=found.seccomp)
    if mode == "kernel only" and not found.kernel:
        pytest.skip(f"no kernel filesystem layer here: {sandbox.isolation_level()}")
    return found


@pytest.mark.parametrize("mode", ["all", "kernel only", "landlock only"])
def test_hostile_corpus_is_contained(mode, targets, decoy, groups):
    """No hostile sample passes and nothing outside the box changes (the
    fixtures check): under every layer, under the kernel's alone (no audit
    hook), and under Landlock and seccomp alone, the fallback without
    namespaces; the honest sample, last, still passes."""
    layers = _kernel_layers(mode)
    names = [n for n in HOSTILE if mode == "all" or _needs_met(n, layers)]
    completions = [_completion(n, targets) for n in names]
    if mode == "all" or layers.read_only_root:  # it chmods too
        names, completions = [*names, "decoy in tmp_path"], [*completions, _decoy_attack(decoy)]
    names, completions = [*names, "good"], [*completions, GOOD]
    started = time.monotonic()
    if mode == "all":  # the pass@1 entry point
        outcomes = humaneval.check_humaneval_many([ADD] * len(completions), completions,
                                                  BUDGET, progress=False)
    else:
        outcomes = [sandbox.run_with_layers(humaneval.humaneval_program(ADD, c), BUDGET,
                                            audit_hook=False, layers=layers)
                    for c in completions]
    elapsed = time.monotonic() - started
    by_name = dict(zip(names, outcomes))
    print(f"{len(names)} samples, {mode} ({layers.describe()}): {elapsed:.1f} s")
    assert by_name.pop("good") == sandbox.Outcome(True, "passed", ""), outcomes[-1]
    passed = {name: o for name, o in by_name.items() if o.passed}
    assert not passed, passed
    assert not [n for n, o in by_name.items() if o.status == "error"], by_name
    assert by_name["cpu"].status in ("timeout", "killed")
    assert by_name["memory"].status == "killed"
    assert by_name["file size"].status == "killed"
    assert by_name["stdout flood"].status in ("killed", "timeout")
    assert len(names) >= 30 and elapsed < HOSTILE_RUNTIME_S


def _kernel_layer_expected() -> bool:
    """Whether this machine should give samples the kernel layer, judged
    without the sandbox's own probe: required by the environment, or
    util-linux's unshare makes the namespaces on Linux 5.12+ (mount_setattr)
    on an architecture the harness has syscall numbers for."""
    if os.environ.get(sandbox.REQUIRE_KERNEL_ENV, "") not in ("", "0"):
        return True
    release = tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2])
    unshare = shutil.which("unshare")
    if (sys.platform != "linux" or release < (5, 12) or unshare is None
            or platform.machine() not in ("x86_64", "aarch64")):
        return False
    flags = [f for f in sandbox.NAMESPACE_FLAGS if f != "--kill-child"]
    return subprocess.run([unshare, *flags, "true"], capture_output=True).returncode == 0


def test_isolation_level_is_reported_and_kernel_where_available(record_property):
    level = sandbox.isolation_level()
    record_property("sandbox_isolation", level)
    print(f"sandbox isolation: {level}")
    assert level == sandbox.isolation().describe() and "audit hook" in level
    if _kernel_layer_expected():
        assert level.startswith(sandbox.KERNEL_LEVEL_PREFIX), level
        assert sandbox.isolation().kernel
    else:
        assert not level.startswith(sandbox.KERNEL_LEVEL_PREFIX), level
    assert metrics.execution_isolation(metrics.PASS_AT_1) == level
    assert metrics.execution_isolation(metrics.BLEU) is None


def test_missing_kernel_layer_is_refused_on_request_and_announced(monkeypatch):
    monkeypatch.setattr(sandbox.probe, "isolation", lambda: sandbox.Isolation())
    with pytest.raises(sandbox.IsolationError, match="unprivileged user namespaces"):
        humaneval.check_humaneval(ADD, GOOD, FAST, require_kernel_isolation=True)
    monkeypatch.setenv(sandbox.REQUIRE_KERNEL_ENV, "1")
    with pytest.raises(sandbox.IsolationError, match=sandbox.REQUIRE_KERNEL_ENV):
        humaneval.check_humaneval_many([ADD], [GOOD], FAST, progress=False)
    monkeypatch.delenv(sandbox.REQUIRE_KERNEL_ENV)
    with pytest.warns(UserWarning, match="audit hook only"):
        outcomes = humaneval.check_humaneval_many([ADD], [GOOD], FAST, progress=False)
    assert outcomes == [sandbox.Outcome(True, "passed", "")]
