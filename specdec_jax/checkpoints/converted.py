"""A cache of converted GGUF checkpoints: dequantise once, then read arrays.

Dequantising a GGUF file (K-quants, Q5_0, ...) into float32 takes about a
minute for the 1.5B model on 2 CPU cores, every time. The first load writes
the converted tree with orbax next to the downloads,

    <cache>/converted/<source sha256[:24]>-<dtype>/
        params/        orbax checkpoint of the parameter tree
        meta.json      format version, source sha256, dtype, the GGUF metadata
                       (tokenizer included) and a checksum per tensor

and later loads read it back. A copy is used only when its format version,
source hash and dtype match and every tensor's shape and checksum agree;
anything else (a half-written copy, a truncated or edited file, an older
format) is reported on stderr and rebuilt from the GGUF file.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

FORMAT_VERSION = 1
SUBDIR = "converted"
META_FILE = "meta.json"
PARAMS_DIR = "params"


def converted_dir(source_sha256: str, dtype: str) -> pathlib.Path:
    from specdec_jax.checkpoints import fetch  # noqa: PLC0415

    return fetch.cache_dir() / SUBDIR / f"{source_sha256[:24]}-{dtype}"


def tensor_checksum(array: np.ndarray) -> int:
    """Sum of the tensor's bytes read as unsigned words (mod 2**64): one pass
    at memory speed, and any changed, zeroed or missing value changes it."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    pad = (-raw.size) % 4
    words = np.concatenate([raw, np.zeros(pad, np.uint8)]).view(np.uint32) if pad else \
        raw.view(np.uint32)
    return int(words.sum(dtype=np.uint64))


def _checksums(params: Any) -> dict[str, list]:
    return {jax.tree_util.keystr(path): [list(np.shape(leaf)), tensor_checksum(np.asarray(leaf))]
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(f"cannot store {type(value).__name__} in {META_FILE}")


def _read(directory: pathlib.Path, source_sha256: str, dtype: str) -> tuple[Any, dict]:
    """(params, stored record) of a valid copy; ValueError saying what is wrong."""
    from specdec_jax.checkpoints import orbax_io  # noqa: PLC0415

    meta_path = directory / META_FILE
    if not meta_path.exists():
        raise ValueError(f"{META_FILE} is missing (an interrupted conversion)")
    record = json.loads(meta_path.read_text())
    wanted = {"format": FORMAT_VERSION, "source_sha256": source_sha256, "dtype": dtype}
    stored = {key: record.get(key) for key in wanted}
    if stored != wanted:
        raise ValueError(f"it was written as {stored}, not {wanted}")
    try:
        params = orbax_io.restore_params(directory / PARAMS_DIR)
    except Exception as err:  # noqa: BLE001 (orbax/tensorstore raise many types)
        raise ValueError(f"orbax cannot read it ({type(err).__name__}: {err})") from err
    got = _checksums(params)
    if got != record["checksums"]:
        bad = sorted(k for k in set(got) | set(record["checksums"])
                     if got.get(k) != record["checksums"].get(k))
        raise ValueError(f"tensor(s) {bad[:3]} differ from the checksums written with it")
    return params, record


def load_or_convert(source: pathlib.Path, source_sha256: str, dtype: str,
                    convert: Callable[[], tuple[Any, dict, bool]]
                    ) -> tuple[Any, dict, bool]:
    """(params, GGUF metadata, has_output) of ``source``: from the converted
    copy when it is valid, else from ``convert()`` (then written for next time)."""
    directory = converted_dir(source_sha256, dtype)
    if directory.exists():
        try:
            params, record = _read(directory, source_sha256, dtype)
            return params, record["gguf_metadata"], record["has_output"]
        except ValueError as err:
            print(f"specdec_jax: the converted copy of {source.name} at {directory} is not "
                  f"usable ({err}); rebuilding it from the GGUF file.", file=sys.stderr)
            shutil.rmtree(directory)
    params, metadata, has_output = convert()
    _write(directory, params, metadata, has_output, source_sha256, dtype)
    return params, metadata, has_output


def _write(directory: pathlib.Path, params, metadata: dict, has_output: bool,
           source_sha256: str, dtype: str) -> None:
    """Writes into a scratch directory and renames it: a copy is complete or absent."""
    from specdec_jax.checkpoints import orbax_io  # noqa: PLC0415

    scratch = directory.with_name(directory.name + f".partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        orbax_io.save_params(scratch / PARAMS_DIR, params)
        record = {"format": FORMAT_VERSION, "source_sha256": source_sha256, "dtype": dtype,
                  "has_output": has_output, "checksums": _checksums(params),
                  "gguf_metadata": metadata}
        (scratch / META_FILE).write_text(json.dumps(record, default=_jsonable))
        os.replace(scratch, directory)
    except OSError as err:  # a full disk or a read-only cache: loading still works
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"specdec_jax: could not keep a converted copy at {directory} ({err}); the next "
              "load converts the GGUF file again.", file=sys.stderr)
