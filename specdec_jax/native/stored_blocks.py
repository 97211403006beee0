"""Weights kept in the block quantisation of their GGUF file.

A GGUF file stores each weight matrix ``[out, in]`` as rows of blocks along
``in``: a block is a few bytes of scales and minimums followed by small integer
codes, and a weight is ``scale * code (- minimum)``. ``StoredMatrix`` keeps
those bytes exactly as the file has them (``blocks``: uint8 ``[out, bytes per
row]``), so a 1.5B model quantised to 4-5 bits takes its file's 1 GiB in
memory instead of a 6 GB float32 copy, and a decode step reads 6x fewer bytes.

The float model of the file is the dequantised matrix: ``dequantize`` computes
it with the same float32 operations, in the same order, as the ``gguf``
package (llama.cpp's reference), so every value equals ``gguf``'s bit for bit
(tested per format). Products with a stored matrix go through
``native.matmul`` (the CPU kernel reads the blocks directly) or, elsewhere,
through XLA after ``dequantize``.

The formats (llama.cpp's names; ``block`` weights in ``type_size`` bytes):

=======  =====  =========  ====================================================
format   block  type_size  weight
=======  =====  =========  ====================================================
q8_0     32     34         ``d * q``, q int8, d float16
q4_1     32     20         ``d * q + m``, q 0..15, d and m float16
q5_0     32     22         ``d * (q - 16)``, q 0..31 (a fifth bit kept apart)
q4_k     256    144        ``(d * sc_j) * q - (dmin * m_j)``, 8 sub-blocks of 32
                           with 6-bit sc_j and m_j, q 0..15
q6_k     256    210        ``(d * sc_j) * (q - 32)``, 16 sub-blocks of 16 with
                           int8 sc_j, q 0..63
=======  =====  =========  ====================================================

Three layouts are not the file's: ``q4_k_x16`` holds a q4_k matrix's codes,
scales and minimums unchanged but interleaved by 16 output rows
(``interleave``), so that the CPU kernel gives each output row a lane of
its own (why and the byte layout: ``small_m_matmul.cc``, "q4_k interleaved by
16 output rows"). It takes 148 bytes per row and 256 weights where the file
takes 144. ``q6_k_x16`` and ``q5_0_x16`` do the same for q6_k and q5_0
(``interleave``; as many bytes as the file). All
dequantise to the file's values, bit for bit. The GGUF loader keeps a model's
q4_k, q6_k and q5_0 matrices in them on CPU (``INTERLEAVE``); an embedding,
read by rows, stays in the file's, and an interleaved head cannot be cut to a
token subset (``decoder_only.with_head_vocab`` refuses it).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class BlockFormat:
    name: str
    block: int      # weights per block
    type_size: int  # bytes per block (interleaved: per output row)
    interleave: int = 1  # output rows whose blocks are interleaved


FORMATS = {f.name: f for f in (BlockFormat("q8_0", 32, 34), BlockFormat("q4_1", 32, 20),
                               BlockFormat("q5_0", 32, 22), BlockFormat("q4_k", 256, 144),
                               BlockFormat("q6_k", 256, 210),
                               BlockFormat("q4_k_x16", 256, 148, interleave=16),
                               BlockFormat("q6_k_x16", 256, 210, interleave=16),
                               BlockFormat("q5_0_x16", 32, 22, interleave=16))}
# Per 16 output rows and 256 weights in q4_k_x16: d[16] and dmin[16] (float16),
# scales[8][16] and minimums[8][16] (a byte each), codes[8][4][64].
X16_ROWS = FORMATS["q4_k_x16"].interleave
X16_GROUP_BYTES = X16_ROWS * FORMATS["q4_k_x16"].type_size


def block_format(name: str) -> BlockFormat:
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"block format {name!r} is not supported; supported: "
                         f"{', '.join(FORMATS)} (other GGUF types are loaded as float32 "
                         "with --target-weights f32).") from None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class StoredMatrix:
    """A ``[out, in]`` weight matrix as its file's blocks (uint8 ``[out, row_bytes]``).

    Reads like the float matrix it stands for where the decoder needs it to:
    ``shape`` and ``ndim`` are the float matrix's, ``reshape`` keeps it when the
    shape does not change, ``dtype`` is float32 (the dtype of its products).
    """

    blocks: Array
    format: str = dataclasses.field(metadata=dict(static=True))
    in_features: int = dataclasses.field(metadata=dict(static=True))

    def __post_init__(self):
        fmt = block_format(self.format)
        if self.in_features % fmt.block:
            raise ValueError(f"a {self.format} matrix needs rows of a multiple of {fmt.block} "
                             f"weights, got {self.in_features}.")
        row_bytes = self.in_features // fmt.block * fmt.type_size
        shape = getattr(self.blocks, "shape", None)
        if shape is not None and (len(shape) != 2 or shape[-1] != row_bytes):
            raise ValueError(f"{self.format} blocks of rows of {self.in_features} weights "
                             f"must be [out, {row_bytes}] bytes, got {tuple(shape)}.")
        if shape is not None and shape[0] % fmt.interleave:
            raise ValueError(f"a {self.format} matrix needs a multiple of {fmt.interleave} "
                             f"output rows, got {shape[0]}.")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.blocks.shape[0], self.in_features)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self):
        return jnp.dtype(jnp.float32)

    @property
    def nbytes(self) -> int:
        return self.blocks.size

    def reshape(self, *shape) -> StoredMatrix:
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if tuple(shape) != self.shape:
            raise ValueError(f"a stored {self.format} matrix {self.shape} cannot be reshaped "
                             f"to {tuple(shape)}.")
        return self

    @classmethod
    def of_blocks(cls, blocks: Array, fmt: str) -> StoredMatrix:
        """The matrix whose rows are ``blocks`` (uint8 ``[out, row_bytes]``)."""
        spec = block_format(fmt)
        if blocks.ndim != 2 or blocks.shape[-1] % spec.type_size:
            raise ValueError(f"{fmt} blocks must be uint8 [out, a multiple of "
                             f"{spec.type_size} bytes], got {tuple(blocks.shape)}.")
        return cls(blocks, fmt, blocks.shape[-1] // spec.type_size * spec.block)

    def take_rows(self, ids: Array) -> Array:
        """float32 ``[*ids.shape, in]``: the dequantised rows ``ids`` (an embedding lookup)."""
        if block_format(self.format).interleave > 1:
            raise ValueError(f"a {self.format} matrix interleaves its rows' blocks and is "
                             "not read by rows; keep an embedding in its file's format.")
        rows = jnp.take(self.blocks, ids.reshape(-1), axis=0)
        return dequantize_blocks(rows, self.format, self.in_features).reshape(
            (*ids.shape, self.in_features))


def dequantize(matrix: StoredMatrix) -> Array:
    """float32 ``[out, in]``: the matrix the blocks encode, bit for bit ``gguf``'s."""
    return dequantize_blocks(matrix.blocks, matrix.format, matrix.in_features)


def _f16(two_bytes: Array) -> Array:
    return lax.bitcast_convert_type(two_bytes, jnp.float16).astype(jnp.float32)


def _nibbles(packed: Array) -> Array:
    """uint8 ``[..., n]`` -> ``[..., 2n]``: low nibbles first, then high nibbles."""
    return jnp.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def dequantize_blocks(rows: Array, name: str, in_features: int) -> Array:
    """float32 ``[R, in]`` from uint8 block rows ``[R, row_bytes]``.

    Each formula is the ``gguf`` package's, operation for operation (float32
    products rounded one at a time, never fused into one rounding), which is
    what makes the values equal to its bit for bit.
    """
    fmt = block_format(name)
    if name == "q4_k_x16":
        return _dequantize_x16(rows, in_features)
    if name == "q6_k_x16":
        return _dequantize_q6_k_x16(rows, in_features)
    if name == "q5_0_x16":
        return _dequantize_q5_0_x16(rows, in_features)
    b = rows.reshape(rows.shape[0], in_features // fmt.block, fmt.type_size)
    if name == "q8_0":
        q = lax.bitcast_convert_type(b[..., 2:], jnp.int8).astype(jnp.float32)
        out = q * _f16(b[..., 0:2])[..., None]
    elif name == "q4_1":
        q = _nibbles(b[..., 4:]).astype(jnp.float32)
        out = _f16(b[..., 0:2])[..., None] * q + _f16(b[..., 2:4])[..., None]
    elif name == "q5_0":
        high = lax.bitcast_convert_type(b[..., 2:6], jnp.uint32)[..., None]
        bits = ((high >> jnp.arange(32, dtype=jnp.uint32)) & 1).astype(jnp.uint8)
        q = (_nibbles(b[..., 6:]) | (bits << 4)).astype(jnp.int32) - 16
        out = _f16(b[..., 0:2])[..., None] * q.astype(jnp.float32)
    elif name == "q4_k":
        sc, mn = q4_k_scales(b[..., 4:16])
        d = _f16(b[..., 0:2])[..., None] * sc.astype(jnp.float32)       # [R, nb, 8]
        dm = _f16(b[..., 2:4])[..., None] * mn.astype(jnp.float32)
        chunks = b[..., 16:].reshape(*b.shape[:2], 4, 32)              # 32 bytes: 2 sub-blocks
        q = jnp.stack([chunks & 0x0F, chunks >> 4], axis=-2).reshape(*b.shape[:2], 8, 32)
        out = d[..., None] * q.astype(jnp.float32) - dm[..., None]
    elif name == "q6_k":
        q = _q6_k_codes(b).astype(jnp.int32) - 32
        scales = lax.bitcast_convert_type(b[..., 192:208], jnp.int8).astype(jnp.float32)
        d = _f16(b[..., 208:210])[..., None] * scales                    # [R, nb, 16]
        out = d[..., None] * q.reshape(*b.shape[:2], 16, 16).astype(jnp.float32)
    else:  # pragma: no cover (block_format raised)
        raise AssertionError(name)
    return out.reshape(rows.shape[0], in_features)


def q4_k_scales(packed: Array) -> tuple[Array, Array]:
    """The eight 6-bit scales and minimums of a q4_k block from its 12 bytes
    (numpy in, numpy out: the loader interleaves on the host)."""
    xp = np if isinstance(packed, np.ndarray) else jnp
    d, m, md = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = xp.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    minimums = xp.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return scales, minimums


def _dequantize_x16(rows: Array, in_features: int) -> Array:
    """``dequantize_blocks`` of ``q4_k_x16``: q4_k's formula on the interleaved bytes."""
    groups, supers = rows.shape[0] // X16_ROWS, in_features // 256
    b = rows.reshape(groups, supers, X16_GROUP_BYTES)
    d = _f16(b[..., 0:32].reshape(groups, supers, 16, 2))             # [G, U, lane]
    dmin = _f16(b[..., 32:64].reshape(groups, supers, 16, 2))
    sc = b[..., 64:192].reshape(groups, supers, 8, 16).astype(jnp.float32)  # [G, U, j, lane]
    mn = b[..., 192:320].reshape(groups, supers, 8, 16).astype(jnp.float32)
    scale = d[:, :, None, :] * sc
    minimum = dmin[:, :, None, :] * mn
    lines = b[..., 320:].reshape(groups, supers, 8, 4, 16, 4)           # [G, U, j, t, lane, b]
    q = jnp.stack([lines & 0x0F, lines >> 4], axis=4)                  # [G, U, j, t, half, lane, b]
    out = (scale[:, :, :, None, None, :, None] * q.astype(jnp.float32)
           - minimum[:, :, :, None, None, :, None])
    # weight 32 j + 8 t + 4 half + b of output row 16 g + lane
    out = out.transpose(0, 5, 1, 2, 3, 4, 6)
    return out.reshape(rows.shape[0], in_features)


# Rows interleaved per numpy pass: the passes' temporaries are a few times the
# chunk's bytes, so a 196 MB head needs no whole-matrix copies (peak RSS).
INTERLEAVE_CHUNK_ROWS = 1024


def interleave(blocks: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 ``[out, row bytes]`` in ``fmt``'s ``_x16`` layout from a ``fmt``
    matrix's file blocks (``fmt`` in ``INTERLEAVE``, ``out`` a multiple of 16):
    the same codes, scales and minimums, laid out for the CPU kernel (module
    docstring; ``small_m_matmul.cc``). Arranged in chunks of
    ``INTERLEAVE_CHUNK_ROWS`` rows, into one new array."""
    if fmt not in INTERLEAVE:
        raise ValueError(f"interleave: {fmt!r} has no interleaved layout; "
                         f"formats that have one: {', '.join(INTERLEAVE)}.")
    arrange = _ARRANGE[fmt]
    blocks = np.asarray(blocks, np.uint8)
    out, row_bytes = blocks.shape
    size = FORMATS[fmt].type_size
    if out % X16_ROWS or row_bytes % size:
        raise ValueError(f"{fmt} blocks to interleave must be [a multiple of {X16_ROWS}, a "
                         f"multiple of {size}] bytes, got {blocks.shape}.")
    supers = row_bytes // size
    packed = np.empty((out, supers * FORMATS[f"{fmt}_x16"].type_size), np.uint8)
    for first in range(0, out, INTERLEAVE_CHUNK_ROWS):
        chunk = blocks[first:first + INTERLEAVE_CHUNK_ROWS]
        packed[first:first + len(chunk)] = arrange(chunk, len(chunk) // X16_ROWS, supers)
    return packed


def _arrange_q4_k(blocks: np.ndarray, groups: int, supers: int) -> np.ndarray:
    size = FORMATS["q4_k"].type_size
    b = blocks.reshape(groups, X16_ROWS, supers, size).transpose(0, 2, 1, 3)  # [G, U, lane, 144]
    sc, mn = q4_k_scales(b[..., 4:16])                                      # [G, U, lane, 8]
    codes = b[..., 16:].reshape(groups, supers, X16_ROWS, 4, 32)             # [.., pair, 32]
    q = np.stack([codes & 0x0F, codes >> 4], axis=-2)                       # [.., pair, 2, 32]
    q = q.reshape(groups, supers, X16_ROWS, 8, 4, 2, 4)                      # [.., j, t, half, b]
    lines = q[..., 0, :] | (q[..., 1, :] << 4)                             # [G, U, lane, j, t, b]
    packed = np.concatenate([
        b[..., 0:2].reshape(groups, supers, 32), b[..., 2:4].reshape(groups, supers, 32),
        sc.transpose(0, 1, 3, 2).reshape(groups, supers, 128),
        mn.transpose(0, 1, 3, 2).reshape(groups, supers, 128),
        lines.transpose(0, 1, 3, 4, 2, 5).reshape(groups, supers, 2048)], axis=-1)
    return packed.reshape(groups * X16_ROWS, supers * X16_GROUP_BYTES // X16_ROWS)


def _q6_k_codes(b):
    """The 256 codes (0..63, weight order) of q6_k blocks ``[..., 210]`` (numpy
    in, numpy out; jax in, jax out)."""
    xp = np if isinstance(b, np.ndarray) else jnp
    lead = b.shape[:-1]
    low = b[..., :128].reshape(*lead, 2, 1, 64) >> xp.array([0, 4], xp.uint8)[:, None]
    low = (low & 0x0F).reshape(*lead, 8, 32)
    high = b[..., 128:192].reshape(*lead, 2, 1, 32) >> xp.array([0, 2, 4, 6], xp.uint8)[:, None]
    high = (high & 0x03).reshape(*lead, 8, 32)
    return (low | (high << 4)).reshape(*lead, 256)


def _x16_split_codes(lines: Array, high: Array, bits: int) -> Array:
    """int32 codes ``[..., k, lane, b]`` of the x16 layouts that split a code in
    two (q6_k_x16, q5_0_x16): its low nibble in ``lines [..., t, lane, b]``
    (weights k = 2t, 2t + 1 share a byte, low nibble first), its top ``bits``
    bits at bit ``bits * k`` of ``high [..., 1, lane, b]``'s byte."""
    low = jnp.stack([lines & 0x0F, lines >> 4], axis=-3)                    # [.., t, half, lane, b]
    low = low.reshape(*low.shape[:-4], -1, *low.shape[-2:])                 # [.., k, lane, b]
    shifts = (bits * jnp.arange(low.shape[-3])).astype(jnp.uint8)[:, None, None]
    return (low | (((high >> shifts) & ((1 << bits) - 1)) << 4)).astype(jnp.int32)


def _dequantize_q6_k_x16(rows: Array, in_features: int) -> Array:
    """``dequantize_blocks`` of ``q6_k_x16``: q6_k's formula on the interleaved bytes."""
    groups, supers = rows.shape[0] // X16_ROWS, in_features // 256
    b = rows.reshape(groups, supers, 16 * 210)
    d = _f16(b[..., 0:32].reshape(groups, supers, 16, 2))                    # [G, U, lane]
    scales = lax.bitcast_convert_type(b[..., 32:288], jnp.int8).astype(jnp.float32)
    scale = d[:, :, None, :] * scales.reshape(groups, supers, 16, 16)  # [G, U, j, lane]
    q = _x16_split_codes(b[..., 288:2336].reshape(groups, supers, 16, 2, 16, 4),
                         b[..., 2336:].reshape(groups, supers, 16, 1, 16, 4), 2) - 32
    out = scale[:, :, :, None, :, None] * q.astype(jnp.float32)
    # weight 16 j + 4 k + b of output row 16 g + lane
    return out.transpose(0, 4, 1, 2, 3, 5).reshape(rows.shape[0], in_features)


def _x16_split(codes: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``_x16_split_codes``' inverse (numpy): uint8 codes ``[..., k, b]`` as their
    low nibbles in lines ``[..., k / 2, b]`` (weights 2t, 2t + 1 in one byte, low
    nibble first) and their top ``bits`` bits at bit ``bits * k`` of ``[..., b]``."""
    low, high = codes & 0x0F, codes >> 4
    lines = low[..., 0::2, :] | (low[..., 1::2, :] << 4)
    shifts = (bits * np.arange(codes.shape[-2])).astype(np.uint8)[:, None]
    return lines, np.bitwise_or.reduce(high << shifts, axis=-2)


def _arrange_q6_k(blocks: np.ndarray, groups: int, supers: int) -> np.ndarray:
    b = blocks.reshape(groups, X16_ROWS, supers, 210).transpose(0, 2, 1, 3)  # [G, U, lane, 210]
    q = _q6_k_codes(b).reshape(groups, supers, X16_ROWS, 16, 4, 4)          # [.., lane, j, k, b]
    low_lines, high_lines = _x16_split(q, 2)             # [.., lane, j, t, b], [.., lane, j, b]
    packed = np.concatenate([
        b[..., 208:210].reshape(groups, supers, 32),
        b[..., 192:208].transpose(0, 1, 3, 2).reshape(groups, supers, 256),
        low_lines.transpose(0, 1, 3, 4, 2, 5).reshape(groups, supers, 2048),
        high_lines.transpose(0, 1, 3, 2, 4).reshape(groups, supers, 1024)], axis=-1)
    return packed.reshape(groups * X16_ROWS, supers * 210)


def _q5_0_codes(b):
    """The 32 codes (0..31, weight order) of q5_0 blocks ``[..., 22]`` (numpy)."""
    high = b[..., 2:6].copy().view(np.uint32)                    # [..., 1]: bit j, weight j's
    bits = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
    low = np.concatenate([b[..., 6:] & 0x0F, b[..., 6:] >> 4], axis=-1)
    return low | (bits << 4)


def _dequantize_q5_0_x16(rows: Array, in_features: int) -> Array:
    """``dequantize_blocks`` of ``q5_0_x16``: q5_0's formula on the interleaved bytes."""
    groups, blocks = rows.shape[0] // X16_ROWS, in_features // 32
    b = rows.reshape(groups, blocks, 16 * 22)
    d = _f16(b[..., 0:32].reshape(groups, blocks, 16, 2))                   # [G, B, lane]
    q = _x16_split_codes(b[..., 32:288].reshape(groups, blocks, 4, 16, 4),
                         b[..., 288:].reshape(groups, blocks, 1, 16, 4), 1) - 16  # [.., k, lane, b]
    out = d[:, :, None, :, None] * q.astype(jnp.float32)
    # weight 4 k + b of output row 16 g + lane
    return out.transpose(0, 3, 1, 2, 4).reshape(rows.shape[0], in_features)


def _arrange_q5_0(blocks: np.ndarray, groups: int, nblocks: int) -> np.ndarray:
    b = blocks.reshape(groups, X16_ROWS, nblocks, 22).transpose(0, 2, 1, 3)  # [G, B, lane, 22]
    q = _q5_0_codes(b).reshape(groups, nblocks, X16_ROWS, 8, 4)             # [.., lane, k, b]
    lines, fifth = _x16_split(q, 1)                          # [.., lane, t, b], [.., lane, b]
    packed = np.concatenate([
        b[..., 0:2].reshape(groups, nblocks, 32),
        lines.transpose(0, 1, 3, 2, 4).reshape(groups, nblocks, 256),
        fifth.reshape(groups, nblocks, 64)], axis=-1)
    return packed.reshape(groups * X16_ROWS, nblocks * 22)


_ARRANGE = {"q4_k": _arrange_q4_k, "q6_k": _arrange_q6_k, "q5_0": _arrange_q5_0}
INTERLEAVE = {fmt: f"{fmt}_x16" for fmt in _ARRANGE}  # file format -> its layout for the kernel
