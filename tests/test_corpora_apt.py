"""Debian corpus fetches on a fresh machine: apt's lists are empty until ``apt-get update``.

The subprocess calls are simulated (no network, no root needed): ``apt-get download`` first
answers as apt does with empty lists, and we check that the lists are refreshed exactly once
and the download retried.
"""

import pathlib
import subprocess

import pytest

from specdec_jax.data import corpora

PIN = corpora.DEBS["trans-de-en"]
NOT_FOUND = f"E: Version '{PIN.version}' for '{PIN.package}' was not found\n"


@pytest.fixture
def apt(tmp_path, monkeypatch):
    """A fake apt: records each command; ``apt-get download`` answers from ``answers``."""
    monkeypatch.setenv("SPECDEC_JAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpora.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(corpora, "_is_root", lambda: True)
    corpora._apt_update_outcome.cache_clear()
    calls, answers = [], []

    def run(command, cwd=None, **kwargs):
        calls.append(command[:2])
        if command[:2] == ["apt-get", "download"]:
            returncode, stderr = answers.pop(0)
            if returncode == 0:
                (pathlib.Path(cwd) / PIN.filename).write_bytes(b"deb")
            return subprocess.CompletedProcess(command, returncode, "", stderr)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(corpora.subprocess, "run", run)
    yield calls, answers
    corpora._apt_update_outcome.cache_clear()


def test_empty_lists_are_updated_once_and_the_download_retried(apt, tmp_path):
    calls, answers = apt
    answers += [(100, NOT_FOUND), (0, ""), (100, NOT_FOUND), (0, "")]
    for name in ("first.deb", "second.deb"):
        corpora._apt_download(PIN, tmp_path / name)
        assert (tmp_path / name).read_bytes() == b"deb"
    download, update = ["apt-get", "download"], ["apt-get", "update"]
    # the second fetch in the same process does not update again
    assert calls == [download, update, download, download, download]


def test_a_failure_after_the_update_names_the_package_and_version(apt, tmp_path):
    calls, answers = apt
    answers += [(100, NOT_FOUND), (100, NOT_FOUND)]
    with pytest.raises(ConnectionError) as error:
        corpora._apt_download(PIN, tmp_path / PIN.filename)
    message = str(error.value)
    assert f"apt-get download {PIN.package}={PIN.version} failed (after apt-get update)" in message
    assert NOT_FOUND.strip() in message and PIN.pool in message
    assert calls.count(["apt-get", "update"]) == 1
    assert not (tmp_path / PIN.filename).exists()


def test_without_root_the_error_names_the_update_command(apt, tmp_path, monkeypatch):
    calls, answers = apt
    monkeypatch.setattr(corpora, "_is_root", lambda: False)
    answers += [(100, f"E: Unable to locate package {PIN.package}\n")]
    with pytest.raises(ConnectionError) as error:
        corpora._apt_download(PIN, tmp_path / PIN.filename)
    message = str(error.value)
    assert f"{PIN.package}={PIN.version}" in message
    assert "sudo apt-get update -o Acquire::Languages=en" in message
    assert ["apt-get", "update"] not in calls  # nothing runs without root


def test_other_download_failures_do_not_update(apt, tmp_path):
    calls, answers = apt
    answers += [(100, "E: Failed to fetch ... Temporary failure resolving 'deb.debian.org'\n")]
    with pytest.raises(ConnectionError, match="Temporary failure resolving"):
        corpora._apt_download(PIN, tmp_path / PIN.filename)
    assert calls == [["apt-get", "download"]]
