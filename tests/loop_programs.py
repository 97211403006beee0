"""Generate programs at the Qwen pair's layer widths, for the tests that read
their compiled text for weight-sized buffers (``test_loop_buffers.py`` on a
TPU compiler, ``test_cpu_loop_buffers.py`` on this CPU): the 1.5B's and the
0.5B's hidden and MLP sizes, two and one layers, a 2,048-token vocabulary,
batch 1, a 512-token prompt."""

from specdec_jax.jobs.tpu import aot as tpu_aot
from specdec_jax.jobs.tpu import hlo_stats
from specdec_jax.jobs.tpu import programs as tpu_programs
from specdec_jax.models.decoder_only import DecoderConfig, DecoderOnlyLM

SHAPES = tpu_programs.Shapes(target="qwen-widths-2", drafter="qwen-widths-1",
                             cache_length=1024, prompt_len=512, max_new_tokens=16, gamma=5)


def qwen_width_models(dtype: str, param_dtype: str) -> dict:
    """``{"target", "drafter": (model, abstract params)}`` in the decode layout."""

    def model(hidden, intermediate, layers, heads):
        config = DecoderConfig(vocab_size=2048, hidden_size=hidden,
                               intermediate_size=intermediate, num_layers=layers,
                               num_heads=heads, num_kv_heads=2, dtype=dtype,
                               param_dtype=param_dtype)
        return tpu_programs.abstract_decoder(DecoderOnlyLM(config))

    return {"target": model(1536, 8960, 2, 12), "drafter": model(896, 4864, 1, 14)}


def figures(executable, program) -> dict:
    """``{"temp", "weights", "loop_values"}`` of a compiled program."""
    return {"temp": executable.memory_analysis().temp_size_in_bytes,
            "weights": program.weight_bytes,
            "loop_values": hlo_stats.loop_values(
                executable.as_text(), tpu_aot.LOOP_VALUE_FRACTION * program.weight_bytes)}
