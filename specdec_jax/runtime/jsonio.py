"""JSON files, plain or gzip-compressed by their suffix (``.gz``).

Long sweeps keep every example's counters; committed copies are compressed,
and a job resumes from either form and writes back the form it found.
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
from typing import Any

GZIP_SUFFIX = ".gz"


def read_json(path: str | os.PathLike) -> Any:
    path = pathlib.Path(path)
    if path.suffix == GZIP_SUFFIX:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    return json.loads(path.read_text())


def write_json(path: str | os.PathLike, data: Any, *, indent: int = 1) -> None:
    """Writes ``data`` atomically (a temporary file, then a rename: a kill
    never leaves half a file), compressed when ``path`` ends in ``.gz``."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".tmp")
    text = json.dumps(data, indent=indent)
    if path.suffix == GZIP_SUFFIX:
        # mtime=0: the same data gives the same bytes (no spurious diffs when committed)
        with gzip.GzipFile(tmp, "wb", mtime=0) as f:
            f.write(text.encode("utf-8"))
    else:
        tmp.write_text(text)
    os.replace(tmp, path)


def existing(path: str | os.PathLike) -> pathlib.Path:
    """``path``, or its compressed copy (``path.gz``) where only that exists."""
    plain = pathlib.Path(path)
    packed = plain.with_name(plain.name + GZIP_SUFFIX)
    if plain.exists() or not packed.exists():
        return plain
    return packed


def stem_of(path: str | os.PathLike) -> str:
    """``x`` for ``x.json`` and ``x.json.gz``."""
    name = pathlib.Path(path).name
    for suffix in (".json" + GZIP_SUFFIX, ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return pathlib.Path(path).stem
