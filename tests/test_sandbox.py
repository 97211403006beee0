"""The pass@1 sandbox scores honest samples and contains hostile ones.

Hostile samples run with short limits; each is scored as not passed, leaves
the machine as it found it, and does not stop the samples after it.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import time

import pytest

from specdec_jax.data import sandbox

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
    monkeypatch.setattr(sandbox.subprocess, "Popen", Recording)
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
    assert sandbox.check_humaneval(ADD, GOOD, FAST) == sandbox.Outcome(True, "passed", "")


def test_wrong_solution_fails():
    outcome = sandbox.check_humaneval(ADD, "    return a - b\n", FAST)
    assert (outcome.passed, outcome.status) == (False, "failed")
    assert "AssertionError" in outcome.detail


@pytest.mark.parametrize("ending", ["import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n",
                                    "raise SystemExit\n"])
def test_exiting_before_the_tests_end_is_not_a_pass(ending):
    outcome = sandbox.check_humaneval(ADD, GOOD + "\n" + ending, FAST)
    assert (outcome.passed, outcome.status) == (False, "failed")


def test_main_guard_does_not_run_like_the_reference_harness():
    demo = GOOD + '\n\nif __name__ == "__main__":\n    input()\n'  # stdin is closed
    assert sandbox.check_humaneval(ADD, demo, FAST).passed


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
        "growing list": "    xs = []\n    while True:\n        xs.append(bytearray(10**7))\n",
        "fork bomb": "    import os\n    while True:\n        os.fork()\n",
        "decoy": _decoy_attack(decoy),
        "network": _network_attack(listener.getsockname()[1]),
    }
    completions = [*hostile.values(), GOOD]
    outcomes = sandbox.check_humaneval_many([ADD] * len(completions), completions, FAST,
                                            progress=False)
    by_name = dict(zip([*hostile, "good"], outcomes))
    assert not any(o.passed for name, o in by_name.items() if name != "good"), by_name
    assert by_name["infinite loop"].status in ("timeout", "killed")
    assert by_name["huge allocation"].status == "killed"
    assert by_name["growing list"].status == "killed"
    assert by_name["fork bomb"].status == "failed"
    assert by_name["good"] == sandbox.Outcome(True, "passed", "")
    assert len(groups) == len(completions)


def test_fork_bomb_is_reaped_without_the_audit_hook(groups):
    """The hook refuses os.fork; without it the namespace / group kill must still reap
    every process (root ignores RLIMIT_NPROC). A short bomb: it loads the machine."""
    bomb = "import os\nwhile True:\n    os.fork()\n"
    outcome = sandbox._run(bomb, sandbox.Limits(wall_s=1.0, memory_mb=256), audit_hook=False)
    assert not outcome.passed and outcome.status in ("timeout", "killed", "failed")


@pytest.mark.skipif(not sandbox.namespace_command(), reason="unshare -rn does not work here")
def test_network_namespace_alone_blocks_connections(listener):
    program = sandbox.humaneval_program(ADD, _network_attack(listener.getsockname()[1]))
    assert not sandbox._run(program, FAST, audit_hook=False).passed


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
    "rebound harness": "import __main__\n__main__.BLOCKED = frozenset()\n"
                       "__main__.PATH_EVENTS = {}\nimport os\nos.remove(DECOY)\n",
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


def test_bad_input_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="one completion per problem"):
        sandbox.check_humaneval_many([ADD, ADD], [GOOD], FAST, progress=False)
    broken = {k: v for k, v in ADD.items() if k != "entry_point"}
    with pytest.raises(ValueError, match=r"Toy/0.*entry_point"):
        sandbox.check_humaneval_many([ADD, broken], [GOOD, GOOD], FAST, progress=False)
    with pytest.raises(ValueError, match="as a str"):
        sandbox.check_humaneval(ADD, None, FAST)
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
