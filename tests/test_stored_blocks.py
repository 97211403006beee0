"""Weights kept in their GGUF file's blocks (native/stored_blocks.py) and the
block kernel that multiplies them (native/small_m_matmul.cc).

Dequantisation must equal the ``gguf`` package's bit for bit (per format, on
blocks with random codes, scales and minimums, and on every kept type of the
registry's files under ``-m slow``), also for ``q4_k_x16``, q4_k's blocks
interleaved by 16 output rows. The block kernel quantises each row of
activations to int8 and must be one function of that row: a row's products
are the same bits alone or among 16. A decoder holding stored matrices is the
float model of its file through XLA, and speculative decoding with a stored
target is exact: greedy equals autoregressive here, and the chi-square suite
(``-m long``) checks token, block and tree verification at T = 1.
"""

from __future__ import annotations

import dataclasses
import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import specdec_jax as sj
from specdec_jax.models.decoder_only import DecoderConfig, DecoderOnlyLM
from specdec_jax.models.layers import OUT_IN
from specdec_jax.native import matmul as native_matmul
from specdec_jax.native import stored_blocks
from specdec_jax.runtime import cpu_kernels
from tests import exactness, registry_blocks

gguf = pytest.importorskip("gguf")

FORMATS = tuple(stored_blocks.FORMATS)
# The file format each layout holds (q4_k_x16: q4_k's blocks, interleaved).
FILE_FORMAT = {"q4_k_x16": "q4_k", "q6_k_x16": "q6_k", "q5_0_x16": "q5_0"}
# Offsets of each format's float16 fields inside a block (scales, minimums).
F16_FIELDS = {"q8_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q4_k": (0, 2), "q6_k": (208,)}


def random_blocks(fmt: str, rows: int, k: int, rng, *, scale: float = 0.05) -> np.ndarray:
    """uint8 [rows, row bytes]: random codes and sub-scales, float16 fields
    drawn around ``scale`` with random signs (a few exact zeros included).
    ``q4_k_x16``: random q4_k blocks, interleaved."""
    if fmt in FILE_FORMAT:
        return stored_blocks.interleave(random_blocks(FILE_FORMAT[fmt], rows, k, rng, scale=scale),
                                        FILE_FORMAT[fmt])
    spec = stored_blocks.FORMATS[fmt]
    blocks = rng.integers(0, 256, (rows, k // spec.block, spec.type_size), dtype=np.uint8)
    for offset in F16_FIELDS[fmt]:
        values = (rng.standard_normal(blocks.shape[:2]) * scale).astype(np.float16)
        values.flat[::17] = 0
        blocks[..., offset:offset + 2] = values.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


def gguf_dequantize(blocks: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "q4_k_x16":  # the file's blocks back from the interleaved layout
        blocks = deinterleave_q4_k(blocks)
    if fmt == "q6_k_x16":
        blocks = deinterleave_q6_k(blocks)
    if fmt == "q5_0_x16":
        blocks = deinterleave_q5_0(blocks)
    fmt = FILE_FORMAT.get(fmt, fmt)
    return gguf.quants.dequantize(blocks, getattr(gguf.GGMLQuantizationType, fmt.upper()))


def deinterleave_q5_0(x16: np.ndarray) -> np.ndarray:
    """q5_0 file blocks from ``q5_0_x16`` bytes, from the layout's description
    (small_m_matmul.cc) and llama.cpp's q5_0 block: d, qh (bit j: weight j's
    fifth bit), qs[16] (weight j's low bits, then weight j + 16's)."""
    rows, nblocks = x16.shape[0], x16.shape[1] // 22
    out = np.zeros((rows, nblocks, 22), np.uint8)
    groups = x16.reshape(rows // 16, nblocks, 16 * 22)
    for g, n, lane in np.ndindex(rows // 16, nblocks, 16):
        p, block = groups[g, n], out[16 * g + lane, n]
        block[0:2] = p[2 * lane:2 * lane + 2]
        q = np.zeros(32, np.uint32)
        for t, b in np.ndindex(4, 4):
            byte = p[32 + 64 * t + 4 * lane + b]
            q[8 * t + b], q[8 * t + 4 + b] = byte & 15, byte >> 4
        for k, b in np.ndindex(8, 4):
            q[4 * k + b] |= ((p[288 + 4 * lane + b] >> k) & 1) << 4
        block[2:6] = np.array([np.sum((q >> 4) << np.arange(32, dtype=np.uint32))],
                              np.uint32).view(np.uint8)
        block[6:] = (q[:16] & 15) | ((q[16:] & 15) << 4)
    return out.reshape(rows, -1)


def deinterleave_q4_k(x16: np.ndarray) -> np.ndarray:
    """q4_k file blocks from ``q4_k_x16`` bytes, written from the layout's
    description (stored_blocks), apart from ``interleave``'s code."""
    rows, supers = x16.shape[0], x16.shape[1] // 148
    out = np.zeros((rows, supers, 144), np.uint8)
    groups = x16.reshape(rows // 16, supers, 16 * 148)
    for g, u, lane in np.ndindex(rows // 16, supers, 16):
        p, block = groups[g, u], out[16 * g + lane, u]
        block[0:2], block[2:4] = p[2 * lane:2 * lane + 2], p[32 + 2 * lane:34 + 2 * lane]
        sc, mn = p[64 + lane:192:16], p[192 + lane:320:16]
        block[4:8] = (sc[:4] & 63) | ((sc[4:] >> 4) << 6)
        block[8:12] = (mn[:4] & 63) | ((mn[4:] >> 4) << 6)
        block[12:16] = (sc[4:] & 15) | ((mn[4:] & 15) << 4)
        codes = np.zeros((8, 32), np.uint8)
        for j, t, b in np.ndindex(8, 4, 4):
            byte = p[320 + (4 * j + t) * 64 + 4 * lane + b]
            codes[j, 8 * t + b], codes[j, 8 * t + 4 + b] = byte & 15, byte >> 4
        block[16:] = (codes[0::2] | (codes[1::2] << 4)).reshape(-1)
    return out.reshape(rows, -1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantisation_equals_gguf_bit_for_bit(fmt):
    blocks = random_blocks(fmt, 48, 512, np.random.default_rng(zlib.crc32(fmt.encode())))
    want = gguf_dequantize(blocks, fmt)
    matrix = stored_blocks.StoredMatrix(jnp.asarray(blocks), fmt, 512)
    got = np.asarray(jax.jit(stored_blocks.dequantize)(matrix))
    assert got.shape == want.shape == (48, 512)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    if fmt in FILE_FORMAT:
        with pytest.raises(ValueError, match="not read by rows"):
            matrix.take_rows(jnp.asarray([0]))
        return
    rows = np.asarray(matrix.take_rows(jnp.asarray([[3, 0], [47, 3]])))
    np.testing.assert_array_equal(rows.view(np.uint32), want[[[3, 0], [47, 3]]].view(np.uint32))


def test_stored_matrix_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="q4_0.*not supported"):
        stored_blocks.block_format("q4_0")
    with pytest.raises(ValueError, match="multiple of 256"):
        stored_blocks.StoredMatrix(jnp.zeros((2, 144), jnp.uint8), "q4_k", 200)
    with pytest.raises(ValueError, match=r"\[out, 144\]"):
        stored_blocks.StoredMatrix(jnp.zeros((2, 150), jnp.uint8), "q4_k", 256)
    matrix = stored_blocks.StoredMatrix(jnp.zeros((3, 34), jnp.uint8), "q8_0", 32)
    assert matrix.shape == (3, 32) and matrix.reshape(3, 32) is matrix
    with pytest.raises(ValueError, match="cannot be reshaped"):
        matrix.reshape(32, 3)
    with pytest.raises(ValueError, match="multiple of 16 output rows"):
        stored_blocks.StoredMatrix(jnp.zeros((8, 148), jnp.uint8), "q4_k_x16", 256)
    with pytest.raises(ValueError, match="multiple of 16"):
        stored_blocks.interleave(np.zeros((8, 144), np.uint8), "q4_k")
    with pytest.raises(ValueError, match="'q8_0' has no interleaved layout; formats that have"):
        stored_blocks.interleave(np.zeros((16, 34), np.uint8), "q8_0")


def deinterleave_q6_k(x16: np.ndarray) -> np.ndarray:
    """q6_k file blocks from ``q6_k_x16`` bytes, from the layout's description
    (small_m_matmul.cc) and llama.cpp's q6_k block: ql[128], qh[64], scales[16], d."""
    rows, supers = x16.shape[0], x16.shape[1] // 210
    out = np.zeros((rows, supers, 210), np.uint8)
    groups = x16.reshape(rows // 16, supers, 16 * 210)
    for g, u, lane in np.ndindex(rows // 16, supers, 16):
        p, block = groups[g, u], out[16 * g + lane, u]
        block[208:210] = p[2 * lane:2 * lane + 2]
        block[192:208] = p[32 + lane:288:16]
        q = np.zeros(256, np.uint8)
        for j, t, b in np.ndindex(16, 2, 4):
            byte = p[288 + (2 * j + t) * 64 + 4 * lane + b]
            q[16 * j + 8 * t + b], q[16 * j + 8 * t + 4 + b] = byte & 15, byte >> 4
        for j, k, b in np.ndindex(16, 4, 4):
            q[16 * j + 4 * k + b] |= ((p[2336 + 64 * j + 4 * lane + b] >> (2 * k)) & 3) << 4
        for w in range(256):  # weight w = 128 n + 32 s + i: ql/qh as llama.cpp packs them
            n, s, i = w // 128, (w % 128) // 32, w % 32
            block[64 * n + i + 32 * (s % 2)] |= (q[w] & 15) << (4 * (s // 2))
            block[128 + 32 * n + i] |= (q[w] >> 4) << (2 * s)
    return out.reshape(rows, -1)


def test_interleaving_keeps_every_byte_of_the_file():
    """``interleave`` against a deinterleaver written from the layout's
    description: the file's blocks come back byte for byte."""
    blocks = random_blocks("q4_k", 32, 512, np.random.default_rng(8))
    x16 = stored_blocks.interleave(blocks, "q4_k")
    assert x16.shape == (32, 2 * 148)
    np.testing.assert_array_equal(deinterleave_q4_k(x16), blocks)
    blocks = random_blocks("q6_k", 32, 512, np.random.default_rng(9))
    np.testing.assert_array_equal(deinterleave_q6_k(stored_blocks.interleave(blocks, "q6_k")),
                                  blocks)
    blocks = random_blocks("q5_0", 32, 96, np.random.default_rng(11))
    np.testing.assert_array_equal(deinterleave_q5_0(stored_blocks.interleave(blocks, "q5_0")),
                                  blocks)


@pytest.mark.parametrize("fmt", sorted(stored_blocks.INTERLEAVE))
def test_interleaving_in_chunks_changes_no_byte(fmt, monkeypatch):
    """The loader interleaves a matrix a chunk of rows at a time (peak memory):
    chunks of 16 rows, a remainder among them, give the whole matrix's bytes."""
    blocks = random_blocks(fmt, 80, 512, np.random.default_rng(10))
    whole = stored_blocks.interleave(blocks, fmt)
    monkeypatch.setattr(stored_blocks, "INTERLEAVE_CHUNK_ROWS", 32)
    np.testing.assert_array_equal(stored_blocks.interleave(blocks, fmt), whole)
    np.testing.assert_array_equal(stored_blocks.interleave(blocks, fmt)[:16],
                                  stored_blocks.interleave(blocks[:16], fmt))


@pytest.fixture(scope="module")
def block_kernel():
    was_enabled = native_matmul._STATE.enabled
    if not cpu_kernels.enable() or not native_matmul.blocks_active():
        pytest.skip("the block kernel needs a C++ compiler and a CPU with a SIMD path for it "
                    "(AVX2, AVX-VNNI, AVX-512 VNNI or NEON dotprod)")
    yield
    native_matmul.set_enabled(was_enabled)


def _product(fmt: str, k: int):
    return jax.jit(lambda x, blocks: native_matmul.block_product(
        x, stored_blocks.StoredMatrix(blocks, fmt, k)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_block_kernel_is_one_function_of_each_row(block_kernel, fmt):
    """Rows multiplied 1, 9 and 17 at a time give the same bits, and the
    products are within int8 activations' rounding of the float model's."""
    rng = np.random.default_rng(zlib.crc32(fmt.encode()) + 1)
    k, n = 768, 48  # 48: a multiple of q4_k_x16's 16 rows
    blocks = random_blocks(fmt, n, k, rng)
    x = jnp.asarray(rng.standard_normal((17, k)), jnp.float32)
    product = _product(fmt, k)
    assert "SmallMBlockMatmulI8" in product.lower(x, blocks).as_text()
    together = np.asarray(product(x, blocks))
    nine = np.asarray(product(x[4:13], blocks))
    alone = np.stack([np.asarray(product(x[i:i + 1], blocks))[0] for i in range(17)])
    np.testing.assert_array_equal(together.view(np.uint32), alone.view(np.uint32))
    np.testing.assert_array_equal(nine.view(np.uint32), alone[4:13].view(np.uint32))
    exact = np.asarray(x, np.float64) @ gguf_dequantize(blocks, fmt).astype(np.float64).T
    # int8 activations (per 64 or 256 values) round each product by ~1/254 of
    # the largest activation of its chunk: measured 0.4-0.9% of the largest output.
    assert np.abs(together - exact).max() < 0.02 * np.abs(exact).max()


def test_without_the_kernel_a_stored_product_is_the_float_model():
    rng = np.random.default_rng(5)
    blocks = random_blocks("q4_k", 8, 256, rng)
    x = jnp.asarray(rng.standard_normal((3, 256)), jnp.float32)
    was = native_matmul._STATE.enabled
    native_matmul.set_enabled(False)
    try:
        product = _product("q4_k", 256)
        assert "SmallMBlockMatmulI8" not in product.lower(x, blocks).as_text()
        got = np.asarray(product(x, blocks))
    finally:
        native_matmul.set_enabled(was)
    exact = np.asarray(x, np.float64) @ gguf_dequantize(blocks, "q4_k").astype(np.float64).T
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-4)


# A decoder whose matrices are stored, every format used once: V = 4 so the
# chi-square suite can enumerate its law (tests/exactness.py).
CONFIG = DecoderConfig(vocab_size=exactness.V, hidden_size=256, intermediate_size=256,
                       num_layers=1, num_heads=2, num_kv_heads=1, qkv_bias=True,
                       kernel_layout=OUT_IN, row_independent=True)  # as gguf.load_stored
LAYOUT = {("attention", "query"): "q4_k", ("attention", "key"): "q8_0",
          ("attention", "value"): "q5_0", ("attention", "out"): "q4_1",
          ("mlp", "wi_0"): "q6_k_x16", ("mlp", "wi_1"): "q4_k_x16", ("mlp", "wo"): "q5_0_x16"}


# Scales that keep each stored embedding and head's values of order 0.1.
HEAD_SCALE = {"q8_0": 0.002, "q6_k": 1e-4}


def stored_decoder(seed: int = 0) -> tuple[DecoderOnlyLM, dict, dict]:
    """(model, stored params, the same model's float params): random blocks
    with scales small enough that the logits are of order one."""
    rng = np.random.default_rng(seed)
    model = DecoderOnlyLM(CONFIG)
    floats = jax.tree.map(np.asarray, model.init_params(jax.random.key(seed)))
    stored = jax.tree.map(lambda x: x, floats)
    for (module, proj), fmt in LAYOUT.items():
        entry = stored["layers_0"][module][proj]
        rows, k = entry.pop("kernel").shape
        entry[f"kernel_{fmt}"] = random_blocks(fmt, rows, k, rng, scale=0.002)
        floats["layers_0"][module][proj]["kernel"] = gguf_dequantize(entry[f"kernel_{fmt}"], fmt)
    for name, key, fmt in (("embedder", "embedding", "q8_0"), ("logits_dense", "kernel", "q6_k")):
        rows, k = stored[name].pop(key).shape
        stored[name][f"{key}_{fmt}"] = random_blocks(fmt, rows, k, rng, scale=HEAD_SCALE[fmt])
        floats[name][key] = gguf_dequantize(stored[name][f"{key}_{fmt}"], fmt)
    return model, jax.tree.map(jnp.asarray, stored), jax.tree.map(jnp.asarray, floats)


@functools.lru_cache(maxsize=None)
def _jitted_extend(model):
    return jax.jit(model.extend)


def _logits(model, params, tokens):
    return np.asarray(_jitted_extend(model)(params, jnp.asarray(tokens),
                                            model.init_cache(1, 16)).logits)


def test_a_stored_decoder_is_its_files_float_model_through_xla():
    model, stored, floats = stored_decoder()
    tokens = [[1, 2, 3, 0, 2]]
    was = native_matmul._STATE.enabled
    native_matmul.set_enabled(False)
    try:
        got, want = _logits(model, stored, tokens), _logits(model, floats, tokens)
    finally:
        native_matmul.set_enabled(was)
    assert np.abs(want).max() > 0.3  # not a degenerate model
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_stored_decoder_with_the_kernel_stays_near_its_float_model(block_kernel):
    model, stored, floats = stored_decoder()
    tokens = [[1, 2, 3, 0, 2]]
    got, want = _logits(model, stored, tokens), _logits(model, floats, tokens)
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())


def test_a_scoring_calls_rows_are_the_bits_of_one_token_steps(block_kernel):
    """The stored target is one function of each row: the logits of a 9-token
    call equal those of 9 one-token steps bit for bit (row-independent block
    products, attention and norms computed row by row). With the queries
    scored together, 5 of these 36 logits differed (by 2.4e-7) on the machine
    this was written on; on the real 1.5B, whose norms also summed 9 rows in
    another order than one, by up to 0.45 (benchmarks/scripts/stored_weights.py)."""
    model, stored, _ = stored_decoder(seed=3)
    extend = jax.jit(model.extend)
    prompt, fed = [[1, 2]], [3, 0, 2, 1, 1, 3, 0, 2, 3]
    start = extend(stored, jnp.asarray(prompt), model.init_cache(1, 32)).cache
    call = np.asarray(extend(stored, jnp.asarray([fed]), start).logits)[0]
    cache, steps = start, []
    for token in fed:
        out = extend(stored, jnp.asarray([[token]]), cache)
        cache = out.cache
        steps.append(np.asarray(out.logits)[0, 0])
    np.testing.assert_array_equal(call, np.stack(steps))


@pytest.mark.parametrize("tree", [None, "2,2"])
def test_greedy_speculative_equals_autoregressive_with_a_stored_target(block_kernel, tree):
    model, stored, _ = stored_decoder(seed=3)
    prompts = [[1, 2], [3, 0, 1], [2]]
    kwargs = dict(target=model, target_params=stored, prompts=prompts, max_new_tokens=12,
                  temperature=0.0)
    alone = sj.generate(method="autoregressive", **kwargs)
    ours = sj.generate(drafter=exactness.DRAFTER, drafter_params=exactness.DRAFTER_PARAMS,
                       gamma=None if tree else 3, tree=tree, **kwargs)
    np.testing.assert_array_equal(np.asarray(ours.tokens), np.asarray(alone.tokens))
    assert int(np.asarray(ours.stats.target_calls).sum()) < int(
        np.asarray(alone.stats.target_calls).sum())


@dataclasses.dataclass(frozen=True)
class _Law:
    """The stored target's next-token law, computed by the same function."""

    model: DecoderOnlyLM
    params: dict

    def __call__(self, context):  # context: the prompt and the tokens after it
        logits = _logits(self.model, self.params, [list(context)])[0, -1]
        return np.asarray(jax.nn.softmax(jnp.asarray(logits, jnp.float32)), np.float64)


@pytest.mark.long
@pytest.mark.parametrize("verifier, tree", [("token", None), ("block", None),
                                            ("traversal", "2,2"), ("rrs", "2,1")])
def test_a_stored_target_is_decoded_exactly(block_kernel, verifier, tree):
    """20 000 rows of 3 tokens at T = 1 against the stored target's law
    (64 cells, chi-square p >= 1e-3); the drafter alone fails (p = 0 measured)."""
    model, stored, _ = stored_decoder(seed=3)
    expected = exactness.exact_sequence_probs(_Law(model, stored))
    out = sj.generate(target=model, target_params=stored, drafter=exactness.DRAFTER,
                      drafter_params=exactness.DRAFTER_PARAMS,
                      prompts=[list(exactness.PROMPT)] * 20_000, temperature=1.0,
                      max_new_tokens=exactness.LENGTH, seed=zlib.crc32(verifier.encode()),
                      verifier=verifier, tree=tree, gamma=None if tree else 3)
    assert exactness.chi_square_pvalue(np.asarray(out.tokens), expected) > exactness.P_MIN
    drafter_law = exactness.exact_sequence_probs(
        lambda c: exactness.DRAFTER.next_probs(exactness.DRAFTER_PARAMS, c))
    assert exactness.chi_square_pvalue(np.asarray(out.tokens), drafter_law) < 1e-9


@pytest.mark.slow
def test_every_kept_type_of_the_registry_files_equals_gguf():
    seen = set()
    for _, fmt, blocks in registry_blocks.first_rows_of_each_type():
        seen.add(fmt)
        got = np.asarray(stored_blocks.dequantize(stored_blocks.StoredMatrix.of_blocks(
            jnp.asarray(blocks), fmt)))
        np.testing.assert_array_equal(got.view(np.uint32),
                                      gguf_dequantize(blocks, fmt).view(np.uint32))
        if fmt in stored_blocks.INTERLEAVE and len(blocks) % 16 == 0:  # as kept on CPU
            x16 = stored_blocks.StoredMatrix.of_blocks(
                jnp.asarray(stored_blocks.interleave(blocks, fmt)), stored_blocks.INTERLEAVE[fmt])
            np.testing.assert_array_equal(np.asarray(stored_blocks.dequantize(x16)), got)
    assert seen >= registry_blocks.KEPT_TYPES


def test_gate_and_up_of_one_block_type_are_one_product_of_the_same_bits(block_kernel):
    """``gguf.load_stored`` joins gate and up kept in one block type into one
    ``wi`` matrix (``fused_mlp``): one kernel call, the same logits bit for
    bit as the two products apart."""
    from specdec_jax.checkpoints.gguf import _fuse_gate_up  # noqa: PLC0415

    rng = np.random.default_rng(4)
    model, stored, _ = stored_decoder(seed=4)
    params = jax.tree.map(np.asarray, stored)
    mlp = params["layers_0"]["mlp"]
    for proj in ("wi_0", "wi_1"):
        rows, k = CONFIG.intermediate_size, CONFIG.hidden_size
        mlp[proj] = {"kernel_q4_k": random_blocks("q4_k", rows, k, rng, scale=0.002)}
    apart = jax.tree.map(np.copy, params)
    assert _fuse_gate_up(params) and set(params["layers_0"]["mlp"]) == {"wi", "wo"}
    fused = DecoderOnlyLM(dataclasses.replace(CONFIG, fused_mlp=True))
    tokens = [[1, 2, 3, 0, 2, 1, 3]]
    want = _logits(model, jax.tree.map(jnp.asarray, apart), tokens)
    got = _logits(fused, jax.tree.map(jnp.asarray, params), tokens)
    np.testing.assert_array_equal(got, want)

    def kernel_calls(m, p):
        hlo = jax.jit(m.extend).lower(jax.tree.map(jnp.asarray, p), jnp.asarray(tokens),
                                      m.init_cache(1, 16)).as_text()
        return hlo.count("SmallMBlockMatmulI8")

    assert kernel_calls(fused, params) == kernel_calls(model, apart) - 1
    # Gate and up of two block types stay apart.
    assert not _fuse_gate_up(apart | {"layers_0": {**apart["layers_0"], "mlp": {
        **apart["layers_0"]["mlp"], "wi_1": {"kernel_q6_k": random_blocks(
            "q6_k", CONFIG.intermediate_size, CONFIG.hidden_size, rng)}}}})


def test_a_head_kept_interleaved_is_not_cut_to_a_token_subset():
    """Taking byte rows of an interleaved head would give other rows' weights
    (each byte row holds 16 output rows' blocks): refused with the fix named."""
    from specdec_jax.models.decoder_only import with_head_vocab  # noqa: PLC0415

    model = DecoderOnlyLM(dataclasses.replace(CONFIG, vocab_size=32))
    stored = dict(model.init_params(jax.random.key(0)))
    head = random_blocks("q6_k", 32, CONFIG.hidden_size, np.random.default_rng(3),
                         scale=HEAD_SCALE["q6_k"])
    stored["logits_dense"] = {
        "kernel_q6_k_x16": jnp.asarray(stored_blocks.interleave(head, "q6_k"))}
    with pytest.raises(ValueError, match="drafter head vocabulary 0"):
        with_head_vocab(model, stored, np.arange(16))
    cut, params = with_head_vocab(model, {**stored, "logits_dense": {
        "kernel_q6_k": jnp.asarray(head)}}, np.arange(16))  # the file's layout is cut
    assert cut.config.head_vocab == 16 and "rows_q6_k" in params["head_vocab"]
