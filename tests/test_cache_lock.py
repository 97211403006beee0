"""Processes that fill the same cache entry at once take turns (``fetch.cache_lock``).

The default suite runs in two worker processes, and users run jobs side by
side: two processes that unpack one Debian package into an empty cache used to
race (one failed to move its tree over the other's, ENOTEMPTY).
"""

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import textwrap
import time

from specdec_jax.data import corpora

WORKER = textwrap.dedent("""
    import pathlib, sys, time
    from specdec_jax.data import corpora
    pin = corpora.DebPin(package="fake-corpus", version="1.0", sha256=sys.argv[1],
                         pool="main/f/fake-corpus", licence="none")
    go = pathlib.Path(sys.argv[2])
    pathlib.Path(sys.argv[3]).touch()  # imported: ready
    while not go.exists():  # all start unpacking together
        time.sleep(0.01)
    root = corpora.fetch_deb(pin)
    print((root / "usr/share/fake/words.txt").read_text().strip())
""")


def _ar_member(name: str, body: bytes) -> bytes:
    header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode()
    return header + body + (b"\n" if len(body) % 2 else b"")


def _tar_gz(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


def fake_deb(files: dict[str, bytes]) -> bytes:
    """A Debian package (an ar archive: version, control and data members)."""
    control = _tar_gz({"./control": b"Package: fake-corpus\nVersion: 1.0\nArchitecture: all\n"
                                    b"Maintainer: none\nDescription: test\n"})
    return (b"!<arch>\n" + _ar_member("debian-binary", b"2.0\n")
            + _ar_member("control.tar.gz", control) + _ar_member("data.tar.gz", _tar_gz(files)))


def test_two_processes_unpacking_one_package_both_get_its_tree(tmp_path):
    # Many files make the unpacking long enough for the two to overlap.
    files = {f"./usr/share/fake/part{i}.txt": os.urandom(2048) for i in range(300)}
    files["./usr/share/fake/words.txt"] = b"hallo welt\n"
    deb = fake_deb(files)
    cache = tmp_path / "cache"
    debs = cache / "data" / corpora.DEB_SUBDIR
    debs.mkdir(parents=True)
    (debs / "fake-corpus_1.0_all.deb").write_bytes(deb)  # no apt: the .deb is there
    env = {**os.environ, "SPECDEC_JAX_CACHE": str(cache), "JAX_PLATFORMS": "cpu"}
    go = tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(3)]
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, hashlib.sha256(deb).hexdigest(),
                                 str(go), str(flag)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for flag in ready]
    deadline = time.monotonic() + 120
    while not all(flag.exists() for flag in ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    results = [worker.communicate(timeout=120) for worker in workers]
    for worker, (out, err) in zip(workers, results):
        assert worker.returncode == 0, err[-2000:]
        assert out.strip() == "hallo welt"
    tree = cache / "data" / "fake-corpus-1.0"
    assert len(list((tree / "usr/share/fake").iterdir())) == 301
    assert not [p for p in (cache / "data").iterdir() if p.name.startswith("tmp")]
