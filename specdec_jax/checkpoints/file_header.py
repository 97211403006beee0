"""A GGUF file's header, read in one pass: its key/values and tensor descriptions.

``gguf.GGUFReader`` makes a numpy view of every part of every key/value; a
Qwen2.5 file's tokenizer alone holds ~300,000 strings (its tokens and BPE
merges), so opening the 0.5B or the 1.5B took ~10 s each on a 2-core CPU,
twice in the first command (the drafter and the target). This walks the same
bytes with ``struct`` and keeps Python values, offsets and sizes; tensor data
stay on disk, read by offset (``gguf._file_bytes``) or through a memory map
made for a tensor when its ``data`` is asked for. Same values as the reader
(``tests/test_file_header.py`` compares them on written and real files).

The format (llama.cpp's ``docs/gguf.md``, versions 2 and 3, little-endian):
``GGUF``, version u32, tensor count u64, key/value count u64; each key/value
a string key, a value type u32 and the value (an array: element type u32,
count u64, elements); each tensor a string name, dimension count u32, the
dimensions u64 (innermost first), its ``GGMLQuantizationType`` u32 and its
offset u64 from the data section, which starts at the header's end rounded
up to ``general.alignment`` (default 32). A string is a u64 length and UTF-8.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import mmap
import os
import struct
from typing import Any

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types: struct format of each scalar (8 string, 9 array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9
_STRUCTS = {fmt: struct.Struct("<" + fmt) for fmt in (*_SCALARS.values(), "I", "Q")}
# numpy element types for the scalars, to read a numeric array in one call.
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
          11: "<i8", 12: "<f8"}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """A tensor's description (``gguf.ReaderTensor``'s fields but ``field``);
    ``data`` maps its bytes when first asked for, as the reader presents them:
    float and integer types in their dtype, quantised ones as uint8 rows."""

    path: str
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # as stored: innermost dimension first
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file

    @functools.cached_property
    def data(self) -> np.ndarray:
        from gguf import GGMLQuantizationType as Q  # noqa: PLC0415 (heavy import)
        from gguf import quant_shape_to_byte_shape  # noqa: PLC0415

        dims = tuple(reversed(self.shape))
        dtype = {Q.F16: np.float16, Q.F32: np.float32, Q.F64: np.float64, Q.I8: np.int8,
                 Q.I16: np.int16, Q.I32: np.int32, Q.I64: np.int64}.get(self.tensor_type)
        if dtype is None:
            dtype, dims = np.uint8, quant_shape_to_byte_shape(dims, self.tensor_type)
        return np.memmap(self.path, dtype, "r", offset=self.data_offset, shape=dims)


@dataclasses.dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    metadata: dict[str, Any]  # every key/value as Python values (arrays as lists)
    # and the header's counts (GGUF.version, GGUF.tensor_count, GGUF.kv_count)
    tensors: list[TensorInfo]


class _Cursor:
    """Reads little-endian values from ``buffer`` onwards from ``offset``."""

    def __init__(self, buffer, path: str):
        self.buffer, self.offset, self.path = buffer, 0, path

    def unpack(self, fmt: str) -> Any:
        layout = _STRUCTS[fmt]
        if self.offset + layout.size > len(self.buffer):
            raise ValueError(f"{self.path}: the header ends early at byte {self.offset}; the "
                             "file is truncated: delete it and fetch again.")
        (value,) = layout.unpack_from(self.buffer, self.offset)
        self.offset += layout.size
        return value

    def string(self) -> str:
        length = self.unpack("Q")
        end = self.offset + length
        if end > len(self.buffer):
            raise ValueError(f"{self.path}: a string of {length} bytes runs past the end of "
                             "the file; it is truncated or not a GGUF file.")
        try:
            text = self.buffer[self.offset:end].decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{self.path}: a string at byte {self.offset} is not UTF-8 "
                             f"({err.reason}); the file is damaged.") from err
        self.offset = end
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            element, count = self.unpack("I"), self.unpack("Q")
            if element in _NUMPY:  # numbers: one read, not one per element
                dtype = np.dtype(_NUMPY[element])
                end = self.offset + count * dtype.itemsize
                if end > len(self.buffer):
                    raise ValueError(f"{self.path}: an array of {count} values runs past the "
                                     "end of the file; it is truncated.")
                values = np.frombuffer(self.buffer, dtype, count, self.offset).tolist()
                self.offset = end
                return values
            return [self.value(element) for _ in range(count)]
        raise ValueError(f"{self.path}: unknown GGUF value type {kind} at byte {self.offset}; "
                         "the file is damaged or of a newer GGUF version than this reader.")


def read_header(path: os.PathLike) -> GGUFHeader:
    """The key/values and tensor descriptions of the GGUF file at ``path``.
    Raises ValueError naming the problem for a file that is not GGUF, of an
    unsupported version or byte order, or cut short."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: PLC0415

    path = os.fspath(path)
    with open(path, "rb") as file:
        # A memory map reads only the pages the header spans, however big the file.
        buffer = (mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
                  if os.path.getsize(path) else b"")
    cursor = _Cursor(buffer, path)
    if buffer[:4] != MAGIC:
        raise ValueError(f"{path}: not a GGUF file (it does not start with b'GGUF').")
    cursor.offset = 4
    version = cursor.unpack("I")
    if version & 0xFFFF == 0:
        raise ValueError(f"{path}: a big-endian GGUF file; convert it to little-endian "
                         "(llama.cpp's gguf-py/gguf/scripts/gguf_convert_endian.py).")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}; versions 2 and 3 are supported.")
    n_tensors, n_values = cursor.unpack("Q"), cursor.unpack("Q")
    # The three counts first, under the names gguf.GGUFReader gives them.
    metadata = {"GGUF.version": version, "GGUF.tensor_count": n_tensors,
                "GGUF.kv_count": n_values}
    for _ in range(n_values):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.unpack("I"))
    described = []
    for _ in range(n_tensors):
        name = cursor.string()
        shape = tuple(cursor.unpack("Q") for _ in range(cursor.unpack("I")))
        described.append((name, shape, cursor.unpack("I"), cursor.unpack("Q")))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cursor.offset // alignment) * alignment
    tensors, names = [], set()
    for name, shape, kind, offset in described:
        if name in names:
            raise ValueError(f"{path}: tensor {name!r} is described twice.")
        names.add(name)
        try:
            tensor_type = GGMLQuantizationType(kind)
        except ValueError as err:
            raise ValueError(f"{path}: tensor {name!r} has tensor type {kind}, unknown to the "
                             "installed gguf package; upgrade gguf.") from err
        block, type_size = GGML_QUANT_SIZES[tensor_type]
        n_elements = math.prod(shape)
        n_bytes = n_elements * type_size // block
        if data_start + offset + n_bytes > len(buffer):
            raise ValueError(f"{path}: tensor {name!r} runs past the end of the file; it is "
                             "truncated: delete it and fetch again.")
        tensors.append(TensorInfo(path, name, tensor_type, shape, n_elements, n_bytes,
                                  data_start + offset))
    return GGUFHeader(path, version, metadata, tensors)
