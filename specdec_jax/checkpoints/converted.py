"""A cache of converted GGUF checkpoints: dequantise once, then read arrays.

Dequantising a GGUF file (K-quants, Q5_0, ...) into float32 takes about a
minute for the 1.5B model on 2 CPU cores, every time. The first load writes
the converted tree next to the downloads,

    <cache>/converted/<source sha256[:24]>-<dtype>[-<layout>]/
        params/model.safetensors   every tensor, named by its "/"-joined tree path
        meta.json      format version, source sha256, dtype, layout, the GGUF
                       metadata (tokenizer included) and a checksum per tensor

and later loads map it into memory and check it. Every tensor starts on a
64-byte boundary of the file (explicit ``__pad_*`` tensors fill the gaps, so
it stays a valid safetensors file), which is what XLA's CPU client needs to
use a host buffer in place: ``jax.device_put`` of a mapped tensor copies
nothing. The checksums are computed by reading the file, not the mapping, so
a load adds nothing to the process's resident memory: a tensor's pages come
in as the model first reads them (an embedding's looked-up rows only, a head
it never multiplies by not at all). The mapping is private (copy-on-write):
nothing written through an array reaches the file.

A copy may be kept in another tree ``Layout`` than the checkpoint's (the
fused ``out_in`` decode layout: ``-out_in_fused_v2``), converted entry by entry
as it is written: decoding then maps the layout it runs in, where
converting after loading held the mapped tree and its converted copy at once
(15.4 GB peak for the first command, whose weights are 9.6 GB). The first
conversion says where the copy went and its size on disk; ``specdec-jax
cache`` lists the cache.

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

import dataclasses
import json
import os
import pathlib
import shutil
import sys
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from specdec_jax.checkpoints import fetch
from specdec_jax.checkpoints.tree_paths import Deferred, made
from specdec_jax.runtime import sharding

FORMAT_VERSION = 3  # 1: orbax params; 2: unaligned safetensors (both rebuilt on first use)
SUBDIR = "converted"
META_FILE = "meta.json"
PARAMS_DIR = "params"
PARAMS_FILE = "model.safetensors"
ALIGNMENT = 64  # bytes: XLA's CPU client aliases host buffers aligned to this
PAD_PREFIX = "__pad_"


def converted_dir(source_sha256: str, dtype: str, layout: str = "") -> pathlib.Path:
    """The copy of one source file in one dtype; ``layout`` (a name such as
    ``out_in_fused_v2``) for a copy stored in another tree layout than the
    checkpoint's own."""
    return fetch.cache_dir() / SUBDIR / "-".join(
        part for part in (source_sha256[:24], dtype, layout) if part)


@dataclasses.dataclass(frozen=True)
class Layout:
    """A tree layout a copy is stored in: its ``name`` (part of the copy's
    directory) and ``convert_entry(name, entry) -> entry``, which turns one
    top-level entry of the converted checkpoint's tree into it (e.g. the
    decode layout of ``models.decoder.kernel_layout_converter``). A copy in
    the layout a model decodes with is used in place on CPU, where converting
    after loading would hold the mapped tree and its converted copy at once."""

    name: str
    # (GGUF metadata, has_output) -> convert_entry(name, entry) -> entry
    converter: Callable[[dict, bool], Callable[[str, Any], Any]]


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
        flat["/".join(keys)] = leaf if isinstance(leaf, jax.ShapeDtypeStruct) else \
            np.asarray(leaf)
    return flat


_SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
                       "int32": "I32", "int64": "I64", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


def _save_safetensors(flat: dict[str, Any], path: pathlib.Path,
                      tensors=None) -> dict[str, list]:
    """Writes the safetensors format (an 8-byte header length, a JSON header of
    dtypes, shapes and byte offsets, then the raw tensors) one tensor at a
    time: ``safetensors.numpy.save_file`` builds the whole file in memory
    first, twice the model's size on top of the model (OOM for the 1.5B).
    Each tensor starts ``ALIGNMENT``-aligned in the file; the format allows no
    holes, so a gap is a zero-filled uint8 tensor named ``__pad_<i>``.

    ``flat`` names the tensors in order, as arrays or as anything with a
    ``shape`` and ``dtype`` (``jax.ShapeDtypeStruct``) when ``tensors``
    yields the arrays, ``(name, array)`` in the same order, one at a time (so
    a caller can make each array just before it is written and drop it
    after). Returns ``{name: [shape, tensor_checksum]}`` of what it wrote."""
    header, offset, gaps = {}, 0, {}
    for name, array in flat.items():
        dtype = np.dtype(array.dtype)
        if dtype.name not in _SAFETENSORS_DTYPES:
            raise TypeError(f"{name}: dtype {dtype} has no safetensors code.")
        if name.startswith(PAD_PREFIX):
            raise ValueError(f"{name}: names starting with {PAD_PREFIX!r} are reserved.")
        gap = (-offset) % ALIGNMENT
        if gap:
            pad_name = f"{PAD_PREFIX}{len(header)}"
            header[pad_name] = {"dtype": "U8", "shape": [gap],
                                "data_offsets": [offset, offset + gap]}
            gaps[name] = gap
            offset += gap
        nbytes = int(np.prod(array.shape, dtype=np.int64)) * dtype.itemsize
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype.name],
                        "shape": list(array.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-8 - len(text)) % ALIGNMENT)  # the data starts aligned
    checksums = {}
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name, array in (flat.items() if tensors is None else tensors):
            want = header.get(name)
            array = np.ascontiguousarray(array)
            if (want is None or name.startswith(PAD_PREFIX)
                    or list(array.shape) != want["shape"]
                    or _SAFETENSORS_DTYPES.get(array.dtype.name) != want["dtype"]):
                raise ValueError(f"{name}: {array.dtype}{list(array.shape)} is not a tensor "
                                 "the header was written for.")
            if f.tell() - 8 - len(text) != want["data_offsets"][0] - gaps.get(name, 0):
                raise ValueError(f"{name}: tensors came in another order than named.")
            f.write(bytes(gaps.get(name, 0)))
            f.write(memoryview(array.reshape(-1).view(np.uint8)))
            key = "".join(f"[{part!r}]" for part in name.split("/"))  # jax's keystr
            checksums[key] = [list(array.shape), tensor_checksum(array)]
            del array
        if f.tell() - 8 - len(text) != offset:
            raise ValueError("fewer tensors came than were named.")
    return checksums


def _nested(flat: dict[str, np.ndarray]) -> dict:
    tree: dict = {}
    for name, array in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = array
    return tree


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(f"cannot store {type(value).__name__} in {META_FILE}")


def _check_record(directory: pathlib.Path, source_sha256: str, dtype: str,
                  layout: str = "") -> dict:
    meta_path = directory / META_FILE
    if not meta_path.exists():
        raise ValueError(f"{META_FILE} is missing (an interrupted conversion)")
    record = json.loads(meta_path.read_text())
    wanted = {"format": FORMAT_VERSION, "source_sha256": source_sha256, "dtype": dtype}
    if layout:  # copies in the checkpoint's own layout carry no name for it
        wanted["layout"] = layout
    stored = {key: record.get(key) for key in wanted}
    if stored != wanted:
        raise ValueError(f"it was written as {stored}, not {wanted}")
    return record


def _read(directory: pathlib.Path, source_sha256: str, dtype: str,
          layout: str = "") -> tuple[Any, dict]:
    """(params as memory-mapped numpy arrays, stored record) of a valid copy;
    ValueError saying what is wrong. Checksumming every tensor is the one
    pass over the data a load makes; it reads the file, not the mapping, so
    a tensor enters this process's resident memory only when something reads
    it (an embedding's rows as they are looked up; a head the model never
    multiplies by, never)."""
    record = _check_record(directory, source_sha256, dtype, layout)
    path = directory / PARAMS_DIR / PARAMS_FILE
    try:
        params = _nested(_mapped_tensors(path))
        got = _file_checksums(path)
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"its header cannot be read ({type(err).__name__}: {err})") from err
    if got != record["checksums"]:
        bad = sorted(k for k in set(got) | set(record["checksums"])
                     if got.get(k) != record["checksums"].get(k))
        raise ValueError(f"tensor(s) {bad[:3]} differ from the checksums written with it")
    return params, record


def _file_checksums(path: pathlib.Path, chunk: int = 1 << 24) -> dict[str, list]:
    """``{name: [shape, tensor_checksum]}`` of a safetensors file's tensors (padding left out),
    computed by reading the file in ``chunk``-byte pieces into one buffer
    rather than through a mapping: the page cache holds the data afterwards,
    this process's resident memory does not."""
    data_start, header = _header(path)
    buffer = np.empty(chunk // 8, np.uint64)
    out = {}
    with open(path, "rb", buffering=0) as f:
        for name, info in header.items():
            if name.startswith(PAD_PREFIX):
                continue
            start, stop = info["data_offsets"]
            f.seek(data_start + start)
            left, total = stop - start, 0
            while left:
                size = min(left, chunk)
                raw = buffer.view(np.uint8)[:size]
                if f.readinto(raw) != size:
                    raise OSError(f"the file ends inside tensor {name}")
                padded = buffer.view(np.uint8)[: size + (-size) % 8]
                padded[size:] = 0
                total += int(padded.view(np.uint64).sum(dtype=np.uint64))
                left -= size
            key = "".join(f"[{part!r}]" for part in name.split("/"))  # jax's keystr
            out[key] = [info["shape"], total % 2**64]
    return out


def _header(path: pathlib.Path) -> tuple[int, dict]:
    """(where the data starts, the header's tensors) of a safetensors file."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return 8 + size, header


def _mapped_tensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file (padding left out), each in a
    private, copy-on-write mapping of its own: indexing one reads only the
    bytes of that slice from disk, writes never reach the file, and a
    tensor's pages leave the process's resident memory as soon as nothing
    refers to it (one mapping for the whole file kept every page ever read
    resident while any tensor, say a norm scale, was alive)."""
    import ml_dtypes  # noqa: PLC0415 (a jax dependency: numpy's bfloat16)

    codes = {code: name for name, code in _SAFETENSORS_DTYPES.items()}
    data_start, header = _header(path)
    size = os.path.getsize(path) - data_start
    end = max((info["data_offsets"][1] for info in header.values()), default=0)
    if size != end:
        raise ValueError(f"its data is {size} bytes where the header places {end} "
                         "(a truncated or padded file)")
    views = {}
    for name, info in header.items():
        if name.startswith(PAD_PREFIX):
            continue
        start, stop = info["data_offsets"]
        code = codes[info["dtype"]]
        dtype = ml_dtypes.bfloat16 if code == "bfloat16" else np.dtype(code)
        shape = tuple(info["shape"])
        if stop - start != int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize:
            raise ValueError(f"tensor {name} spans {stop - start} bytes, not its shape's")
        views[name] = (np.memmap(path, dtype, mode="c", offset=data_start + start, shape=shape)
                       if stop > start else np.zeros(shape, dtype))
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


def read_copy(source_sha256: str, dtype: str, layout: str = "") -> tuple[Any, dict, bool] | None:
    """(params mapped, GGUF metadata, has_output) of a valid copy, or None
    (absent or unusable; nothing is reported or removed)."""
    directory = converted_dir(source_sha256, dtype, layout)
    try:
        params, record = _read(directory, source_sha256, dtype, layout)
    except (ValueError, OSError):
        return None
    return params, record["gguf_metadata"], record["has_output"]


def load_or_convert(source: pathlib.Path, source_sha256: str, dtype: str,
                    convert: Callable[[], tuple[Any, dict, bool]], *, mesh=None,
                    rules=None, layout: Layout | None = None) -> tuple[Any, dict, bool]:
    """(params, GGUF metadata, has_output) of ``source``: from the converted
    copy when it is valid, else from ``convert()`` (then written for next time).

    With a ``mesh``, the params come back as global arrays placed by
    ``rules`` (``sharding.DECODER_RULES`` by default), read from the copy
    slice by slice (``_read_placed``). With a ``layout`` (no mesh), the copy
    holds ``convert()``'s tree in that layout, written entry by entry, and
    the params come back mapped from it: the converted tree in memory is
    dropped once the copy is written."""
    if layout is not None and mesh is not None:
        raise ValueError("a converted copy in another layout is read without a mesh; "
                         "convert after placing the params instead.")
    name = layout.name if layout is not None else ""
    directory = converted_dir(source_sha256, dtype, name)
    if directory.exists():
        try:
            if mesh is not None:
                params, record = _read_placed(directory, source_sha256, dtype, mesh,
                                              rules or sharding.DECODER_RULES)
            else:
                params, record = _read(directory, source_sha256, dtype, name)
            return params, record["gguf_metadata"], record["has_output"]
        except ValueError as err:
            print(f"specdec_jax: the converted copy of {source.name} at {directory} is not "
                  f"usable ({err}); rebuilding it from the GGUF file.", file=sys.stderr)
            shutil.rmtree(directory)
    params, metadata, has_output = convert()
    convert_entry = None if layout is None else layout.converter(metadata, has_output)
    # With a layout the tree is consumed as it is written: each entry's source
    # is freed once its converted entry is on disk.
    written = _write(directory, params, metadata, has_output, source_sha256, dtype, layout,
                     convert_entry, consume=layout is not None)
    _release_freed_memory()
    if written:
        print(f"specdec_jax: converted {source.name} once into {directory} "
              f"({_gb(_size(directory))} on disk; the cache {fetch.cache_dir()} now holds "
              f"{_gb(_size(fetch.cache_dir()))}; `specdec-jax cache` lists it).",
              file=sys.stderr)
    if layout is not None:
        if written:  # the copy, mapped: the converted tree in memory goes
            del params
            params, record = _read(directory, source_sha256, dtype, name)
            return params, metadata, has_output
        params, metadata, has_output = convert()  # the failed write consumed it
        params = {key: convert_entry(key, made(params.pop(key))) for key in sorted(params)}
    if mesh is not None:
        params = sharding.shard_params(params, mesh, rules or sharding.DECODER_RULES)
    return params, metadata, has_output


def listing(names: dict[str, str] | None = None) -> str:
    """What the cache holds: its root, each top-level folder's size, and each
    converted copy (its directory, size, dtype, layout and, when ``names``
    maps a source sha256 to a name, the model it came from)."""
    root = fetch.cache_dir()
    lines = [f"{root}: {_gb(_size(root))}"]
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        lines.append(f"  {folder.name + '/':14s} {_gb(_size(folder)):>9s}")
        if folder.name != SUBDIR:
            continue
        for copy in sorted(p for p in folder.iterdir() if p.is_dir()):
            try:
                record = json.loads((copy / META_FILE).read_text())
                what = f"{record['dtype']}, {record.get('layout', 'in_out')}"
                what += f", {(names or {}).get(record['source_sha256'], 'from a local file')}"
            except (OSError, ValueError, KeyError):
                what = "incomplete (rebuilt on next use)"
            lines.append(f"    {copy.name:40s} {_gb(_size(copy)):>9s}  {what}")
    return "\n".join(lines)


def _release_freed_memory() -> None:
    """Hands the C heap's free pages back to the system (glibc's
    ``malloc_trim``): freed conversion buffers otherwise stay in the
    process's resident memory (~0.9 GB after converting the 1.5B model)."""
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _size(path: pathlib.Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _gb(nbytes: int) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def _write(directory: pathlib.Path, params: dict, metadata: dict, has_output: bool,
           source_sha256: str, dtype: str, layout: Layout | None = None,
           convert_entry=None, consume: bool = False) -> bool:
    """Writes into a scratch directory and renames it: a copy is complete or
    absent. With a ``layout``, each top-level entry of ``params`` is converted
    to it by ``convert_entry`` as it is written (and dropped after); with
    ``consume``, each entry is also taken out of ``params`` as it is written,
    so its source is freed (a dequantised tree, or the mapped pages of
    another copy) before the next one is converted. False when
    the copy could not be written (loading goes on without it)."""
    scratch = directory.with_name(directory.name + f".partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    convert_entry = convert_entry or (lambda _, entry: entry)
    try:
        (scratch / PARAMS_DIR).mkdir(parents=True)
        specs = _flat({key: jax.eval_shape(lambda e, key=key: convert_entry(key, e),
                                           entry.shapes if isinstance(entry, Deferred) else entry)
                       for key, entry in params.items()})

        def tensors():
            for key in sorted(params):  # the order of _flat's (jax's) flattening
                entry = made(params.pop(key) if consume else params[key])
                flat = _flat({key: convert_entry(key, entry)})
                del entry
                yield from flat.items()

        checksums = _save_safetensors(specs, scratch / PARAMS_DIR / PARAMS_FILE, tensors())
        record = {"format": FORMAT_VERSION, "source_sha256": source_sha256, "dtype": dtype,
                  "has_output": has_output, "checksums": checksums,
                  "gguf_metadata": metadata}
        if layout is not None:
            record["layout"] = layout.name
        (scratch / META_FILE).write_text(json.dumps(record, default=_jsonable))
        os.replace(scratch, directory)
        return True
    except OSError as err:  # a full disk or a read-only cache: loading still works
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"specdec_jax: could not keep a converted copy at {directory} ({err}); the next "
              "load converts the GGUF file again.", file=sys.stderr)
        return False
