"""pytest plugin of tools/gpu_check.sh: each test's outcome as one JSON line, as it happens.

Loaded with ``-p tests.gpu_check_plugin`` (the repository root on ``PYTHONPATH``);
writes to the file named by ``$GPU_CHECK_RESULTS`` (nothing when unset). Unlike the
JUnit XML, which pytest writes once at the end, the lines survive a run that is killed
at its time limit. With pytest-xdist only the controller writes (the workers' reports reach it).

Lines: ``{"collected": [nodeid, ...]}`` once; per test ``{"nodeid", "when",
"outcome", "duration", "message", "worker"}`` for its call and for a setup or
teardown that did not pass (outcome: passed, failed, error, skipped, xfailed,
xpassed); ``{"finished": exitstatus}`` last.
"""

from __future__ import annotations

import json
import os
import time

import pytest

ENV = "GPU_CHECK_RESULTS"
_MESSAGE_CHARS = 1500


class _Recorder:
    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self.collected = False

    def write(self, **record) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


_RECORDER: list[_Recorder | None] = [None]  # this process's recorder (the controller's only)


def pytest_configure(config):
    path = os.environ.get(ENV)
    if path and not hasattr(config, "workerinput"):  # xdist workers have workerinput
        _RECORDER[0] = _Recorder(path)
        _RECORDER[0].write(started=time.time(), pid=os.getpid())


def pytest_unconfigure(config):
    del config
    if _RECORDER[0] is not None:
        _RECORDER[0].file.close()
        _RECORDER[0] = None


def _record_collected(ids) -> None:
    recorder = _RECORDER[0]
    if recorder is not None and not recorder.collected and ids:
        recorder.collected = True
        recorder.write(collected=list(ids))


def pytest_collection_finish(session):
    _record_collected([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    del node
    _record_collected(ids)


def _message(report) -> str:
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])[:_MESSAGE_CHARS]
    text = getattr(report, "longreprtext", "") or ""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    # The E lines hold the error, the last line its file:line.
    errors = [line for line in lines if line.startswith("E ")][:8]
    return "\n".join(errors + lines[-2:])[-_MESSAGE_CHARS:]


def pytest_runtest_logreport(report):
    recorder = _RECORDER[0]
    if recorder is None:
        return
    outcome = report.outcome
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    if report.when != "call":
        if outcome == "passed":
            return  # a passing setup or teardown is not an outcome of its own
        if outcome == "failed":
            outcome = "error"
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    recorder.write(nodeid=report.nodeid, when=report.when, outcome=outcome,
                   duration=round(report.duration, 3),
                   message="" if outcome in ("passed", "xpassed") else _message(report),
                   worker=getattr(gateway, "id", None))


def pytest_sessionfinish(session, exitstatus):
    del session
    if _RECORDER[0] is not None:
        _RECORDER[0].write(finished=int(exitstatus), at=time.time())
