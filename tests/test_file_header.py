"""``checkpoints.file_header``: the GGUF header read in one pass gives what
``gguf.GGUFReader`` gives (key/values, tensors' descriptions and data), and a
file that is not GGUF or is cut short is refused with its name and the fix."""

from __future__ import annotations

import gguf as gg
import numpy as np
import pytest

from specdec_jax.checkpoints import file_header

ALIGNMENT = 64  # not the default 32: the data section's start must follow the key


def write_every_kind(path) -> None:
    """A GGUF file with a key/value of every scalar type, arrays of numbers,
    booleans and strings (non-ASCII among them), and tensors of float,
    integer and quantised types."""
    rng = np.random.default_rng(0)
    writer = gg.GGUFWriter(str(path), "llama")
    writer.add_custom_alignment(ALIGNMENT)
    writer.add_uint8("t.u8", 250)
    writer.add_int8("t.i8", -7)
    writer.add_uint16("t.u16", 65000)
    writer.add_int16("t.i16", -300)
    writer.add_int32("t.i32", -123456)
    writer.add_float32("t.f32", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_string("t.string", "héllo ✓")
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**40))
    writer.add_float64("t.f64", 1e-300)
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.25])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.strings", ["a", "", "Ġdef", "日本"])
    writer.add_array("t.empty", [])
    writer.add_tensor("f32", rng.normal(size=(3, 5)).astype(np.float32))
    writer.add_tensor("f16", rng.normal(size=(2, 4)).astype(np.float16))
    writer.add_tensor("i32", rng.integers(-9, 9, size=(7,)).astype(np.int32))
    q8 = gg.quants.quantize(rng.normal(size=(4, 64)).astype(np.float32),
                            gg.GGMLQuantizationType.Q8_0)
    writer.add_tensor("q8_0", q8, raw_dtype=gg.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def assert_same_as_reader(path) -> None:
    reader = gg.GGUFReader(str(path))
    header = file_header.read_header(path)
    assert header.metadata == {key: field.contents() for key, field in reader.fields.items()}
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(header.tensors, reader.tensors, strict=True):
        assert (ours.tensor_type, ours.shape, ours.n_elements, ours.n_bytes, ours.data_offset) == (
            theirs.tensor_type, tuple(int(d) for d in theirs.shape), theirs.n_elements,
            theirs.n_bytes, theirs.data_offset), ours.name
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape
        np.testing.assert_array_equal(np.asarray(ours.data), np.asarray(theirs.data))


def test_every_kind_of_value_and_tensor_reads_as_the_gguf_reader_reads_it(tmp_path):
    path = tmp_path / "every.gguf"
    write_every_kind(path)
    assert_same_as_reader(path)
    header = file_header.read_header(path)
    assert header.version == 3 and header.metadata["t.string"] == "héllo ✓"
    assert header.metadata["t.strings"] == ["a", "", "Ġdef", "日本"]
    assert all(t.data_offset % ALIGNMENT == 0 for t in header.tensors)


@pytest.mark.parametrize("content,message", [
    (b"", "not a GGUF file"),
    (b"PK\x03\x04" + bytes(64), "not a GGUF file"),
    (b"GGUF" + (3).to_bytes(4, "big") + bytes(16), "big-endian"),
    (b"GGUF" + (9).to_bytes(4, "little") + bytes(16), "version 9"),
])
def test_a_file_that_is_not_a_gguf_file_of_a_known_version_is_named(tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"bad.gguf: .*{message}"):
        file_header.read_header(path)


@pytest.mark.parametrize("where,message", [
    ("key/values", "header ends early|runs past the end"),
    ("last tensor", "tensor 'q8_0' runs past the end"),
])
def test_a_file_cut_short_is_named_with_the_fix(tmp_path, where, message):
    path = tmp_path / "cut.gguf"
    write_every_kind(path)
    last = file_header.read_header(path).tensors[-1]
    keep = 40 if where == "key/values" else last.data_offset + last.n_bytes - 1
    path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(ValueError, match=f"cut.gguf: .*({message})") as raised:
        file_header.read_header(path)
    assert "truncated" in str(raised.value)
