"""A cache of converted GGUF checkpoints: dequantise once, then read arrays.

Dequantising a GGUF file (K-quants, Q5_0, ...) into float32 takes about a
minute for the 1.5B model on 2 CPU cores, every time. The first load writes
the converted tree next to the downloads,

    <cache>/converted/<source sha256[:24]>-<dtype>/
        params/model.safetensors   every tensor, named by its "/"-joined tree path
        meta.json      format version, source sha256, dtype, the GGUF metadata
                       (tokenizer included) and a checksum per tensor

and later loads map it into memory and check it. Every tensor starts on a
64-byte boundary of the file (explicit ``__pad_*`` tensors fill the gaps, so
it stays a valid safetensors file), which is what XLA's CPU client needs to
use a host buffer in place: ``jax.device_put`` of a mapped tensor copies
nothing, and a load costs one checksum pass over the page cache. The mapping
is private (copy-on-write): nothing written through an array reaches the file.
safetensors rather than orbax here: the copy
is one host's private cache of a whole tree, and a flat file reads at disk
speed (the 1.5B model's 6 GB in seconds), where orbax/tensorstore took ~20 s;
sharded checkpoints that processes share stay orbax (``orbax_io``).
A copy is used only when its format version,
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

from specdec_jax import sharding
from specdec_jax.checkpoints import fetch

FORMAT_VERSION = 3  # 1: orbax params; 2: unaligned safetensors (both rebuilt on first use)
SUBDIR = "converted"
META_FILE = "meta.json"
PARAMS_DIR = "params"
PARAMS_FILE = "model.safetensors"
ALIGNMENT = 64  # bytes: XLA's CPU client aliases host buffers aligned to this
PAD_PREFIX = "__pad_"


def converted_dir(source_sha256: str, dtype: str) -> pathlib.Path:
    return fetch.cache_dir() / SUBDIR / f"{source_sha256[:24]}-{dtype}"


def tensor_checksum(array: np.ndarray) -> int:
    """Sum of the tensor's bytes read as 64-bit words (mod 2**64): one pass
    at memory speed, and any changed, zeroed or missing value changes it."""
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    pad = (-raw.size) % 8
    words = np.concatenate([raw, np.zeros(pad, np.uint8)]).view(np.uint64) if pad else \
        raw.view(np.uint64)
    return int(words.sum(dtype=np.uint64))


def _flat(params: Any) -> dict[str, np.ndarray]:
    """{"a/b/c": array} of a tree of nested string-keyed dicts."""
    flat = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = [getattr(k, "key", None) for k in path]
        if not all(isinstance(k, str) and "/" not in k for k in keys):
            raise TypeError(f"converted copies hold trees of string-keyed dicts; "
                            f"{jax.tree_util.keystr(path)} is not one.")
        flat["/".join(keys)] = np.asarray(leaf)
    return flat


_SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
                       "int32": "I32", "int64": "I64", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def _save_safetensors(flat: dict[str, np.ndarray], path: pathlib.Path) -> None:
    """Writes the safetensors format (an 8-byte header length, a JSON header of
    dtypes, shapes and byte offsets, then the raw tensors) one tensor at a
    time: ``safetensors.numpy.save_file`` builds the whole file in memory
    first, twice the model's size on top of the model (OOM for the 1.5B).
    Each tensor starts ``ALIGNMENT``-aligned in the file; the format allows no
    holes, so a gap is a zero-filled uint8 tensor named ``__pad_<i>``."""
    header, offset, pieces = {}, 0, []
    for name, array in flat.items():
        if array.dtype.name not in _SAFETENSORS_DTYPES:
            raise TypeError(f"{name}: dtype {array.dtype} has no safetensors code.")
        if name.startswith(PAD_PREFIX):
            raise ValueError(f"{name}: names starting with {PAD_PREFIX!r} are reserved.")
        gap = (-offset) % ALIGNMENT
        if gap:
            pad = np.zeros(gap, np.uint8)
            header[f"{PAD_PREFIX}{len(pieces)}"] = {"dtype": "U8", "shape": [gap],
                                                    "data_offsets": [offset, offset + gap]}
            pieces.append(pad)
            offset += gap
        header[name] = {"dtype": _SAFETENSORS_DTYPES[array.dtype.name],
                        "shape": list(array.shape), "data_offsets": [offset,
                                                                     offset + array.nbytes]}
        pieces.append(array)
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-8 - len(text)) % ALIGNMENT)  # the data starts aligned
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for array in pieces:
            f.write(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8)))


def _nested(flat: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for name, array in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = array
    return tree


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


def _check_record(directory: pathlib.Path, source_sha256: str, dtype: str) -> dict:
    meta_path = directory / META_FILE
    if not meta_path.exists():
        raise ValueError(f"{META_FILE} is missing (an interrupted conversion)")
    record = json.loads(meta_path.read_text())
    wanted = {"format": FORMAT_VERSION, "source_sha256": source_sha256, "dtype": dtype}
    stored = {key: record.get(key) for key in wanted}
    if stored != wanted:
        raise ValueError(f"it was written as {stored}, not {wanted}")
    return record


def _read(directory: pathlib.Path, source_sha256: str, dtype: str) -> tuple[Any, dict]:
    """(params as memory-mapped numpy arrays, stored record) of a valid copy;
    ValueError saying what is wrong. Checksumming every tensor is the one
    pass over the data a load makes."""
    record = _check_record(directory, source_sha256, dtype)
    try:
        params = _nested(_mapped_tensors(directory / PARAMS_DIR / PARAMS_FILE))
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"its header cannot be read ({type(err).__name__}: {err})") from err
    got = _checksums(params)
    if got != record["checksums"]:
        bad = sorted(k for k in set(got) | set(record["checksums"])
                     if got.get(k) != record["checksums"].get(k))
        raise ValueError(f"tensor(s) {bad[:3]} differ from the checksums written with it")
    return params, record


def _mapped_tensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file (padding left out) as a view of one
    private, copy-on-write mapping: indexing one reads only the bytes of that
    slice from disk, and writes never reach the file."""
    import ml_dtypes  # noqa: PLC0415 (a jax dependency: numpy's bfloat16)

    codes = {code: name for name, code in _SAFETENSORS_DTYPES.items()}
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    data = np.memmap(path, np.uint8, mode="c", offset=8 + size)
    end = max((info["data_offsets"][1] for info in header.values()), default=0)
    if data.size != end:
        raise ValueError(f"its data is {data.size} bytes where the header places {end} "
                         "(a truncated or padded file)")
    views = {}
    for name, info in header.items():
        if name.startswith(PAD_PREFIX):
            continue
        start, stop = info["data_offsets"]
        code = codes[info["dtype"]]
        dtype = ml_dtypes.bfloat16 if code == "bfloat16" else np.dtype(code)
        views[name] = data[start:stop].view(dtype).reshape(info["shape"])
    return views


def _read_placed(directory: pathlib.Path, source_sha256: str, dtype: str, mesh,
                 rules) -> tuple[Any, dict]:
    """(params placed on ``mesh`` by ``rules``, stored record): each process
    reads from disk only the slices its own devices hold, so no host holds
    the whole tree. The header's names and shapes are checked against the
    record; the value checksums are not (they would read every byte on
    every host): a changed value passes here and is caught by a one-process
    load, which rebuilds the copy."""
    record = _check_record(directory, source_sha256, dtype)
    try:
        views = _nested(_mapped_tensors(directory / PARAMS_DIR / PARAMS_FILE))
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"its header cannot be read ({type(err).__name__}: {err})") from err
    shapes = {jax.tree_util.keystr(path): list(view.shape)
              for path, view in jax.tree_util.tree_flatten_with_path(views)[0]}
    if shapes != {key: shape for key, (shape, _) in record["checksums"].items()}:
        raise ValueError("its tensor names or shapes differ from those written with it")

    def read(view, named_sharding):
        return jax.make_array_from_callback(view.shape, named_sharding,
                                            lambda index: np.array(view[index]))

    return jax.tree_util.tree_map(read, views,
                                  sharding.param_specs(views, mesh, rules)), record


def load_or_convert(source: pathlib.Path, source_sha256: str, dtype: str,
                    convert: Callable[[], tuple[Any, dict, bool]], *, mesh=None,
                    rules=None) -> tuple[Any, dict, bool]:
    """(params, GGUF metadata, has_output) of ``source``: from the converted
    copy when it is valid, else from ``convert()`` (then written for next time).

    With a ``mesh``, the params come back as global arrays placed by
    ``rules`` (``sharding.DECODER_RULES`` by default), read from the copy
    slice by slice (``_read_placed``)."""
    directory = converted_dir(source_sha256, dtype)
    if directory.exists():
        try:
            if mesh is not None:
                params, record = _read_placed(directory, source_sha256, dtype, mesh,
                                              rules or sharding.DECODER_RULES)
            else:
                params, record = _read(directory, source_sha256, dtype)
            return params, record["gguf_metadata"], record["has_output"]
        except ValueError as err:
            print(f"specdec_jax: the converted copy of {source.name} at {directory} is not "
                  f"usable ({err}); rebuilding it from the GGUF file.", file=sys.stderr)
            shutil.rmtree(directory)
    params, metadata, has_output = convert()
    _write(directory, params, metadata, has_output, source_sha256, dtype)
    if mesh is not None:
        params = sharding.shard_params(params, mesh, rules or sharding.DECODER_RULES)
    return params, metadata, has_output


def _write(directory: pathlib.Path, params, metadata: dict, has_output: bool,
           source_sha256: str, dtype: str) -> None:
    """Writes into a scratch directory and renames it: a copy is complete or absent."""
    scratch = directory.with_name(directory.name + f".partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / PARAMS_DIR).mkdir(parents=True)
    try:
        _save_safetensors(_flat(params), scratch / PARAMS_DIR / PARAMS_FILE)
        record = {"format": FORMAT_VERSION, "source_sha256": source_sha256, "dtype": dtype,
                  "has_output": has_output, "checksums": _checksums(params),
                  "gguf_metadata": metadata}
        (scratch / META_FILE).write_text(json.dumps(record, default=_jsonable))
        os.replace(scratch, directory)
    except OSError as err:  # a full disk or a read-only cache: loading still works
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"specdec_jax: could not keep a converted copy at {directory} ({err}); the next "
              "load converts the GGUF file again.", file=sys.stderr)
