"""The dtype switch and the matmul precision each backend gets."""

import jax
import pytest

from specdec_jax import precision


def test_auto_dtype_per_backend_and_bad_names():
    assert precision.resolve_dtype("auto", backend="cpu") == "float32"
    assert precision.resolve_dtype(None, backend="gpu") == "bfloat16"
    assert precision.resolve_dtype("auto", backend="tpu") == "bfloat16"
    assert precision.resolve_dtype("float32", backend="gpu") == "float32"
    with pytest.raises(ValueError, match="'fp32' is not one of 'auto', 'float32'"):
        precision.resolve_dtype("fp32")


def test_float32_off_cpu_is_full_precision_unless_the_user_opts_out(monkeypatch):
    monkeypatch.delenv(precision.ENV_MATMUL_PRECISION, raising=False)
    assert precision.matmul_precision("float32", backend="gpu") == "highest"
    assert precision.matmul_precision("auto", backend="tpu") is None  # bfloat16 there
    assert precision.matmul_precision("bfloat16", backend="gpu") is None
    assert precision.matmul_precision("float32", backend="cpu") is None  # exact already
    monkeypatch.setenv(precision.ENV_MATMUL_PRECISION, "default")  # TF32, knowingly
    assert precision.matmul_precision("float32", backend="gpu") is None
    monkeypatch.setenv(precision.ENV_MATMUL_PRECISION, "high")
    assert precision.matmul_precision("float32", backend="gpu") == "high"
    monkeypatch.setenv(precision.ENV_MATMUL_PRECISION, "tf32")
    with pytest.raises(ValueError, match="is not one of default, high, highest"):
        precision.matmul_precision("float32", backend="gpu")


@pytest.mark.parametrize("backend, env, expected", [
    ("gpu", None, "Precision.HIGHEST"), ("tpu", None, "Precision.HIGHEST"),
    ("cpu", None, None), ("gpu", "default", None), ("gpu", "high", "Precision.HIGH")])
def test_a_float32_model_built_from_a_config_runs_at_the_resolved_precision(
        backend, env, expected, monkeypatch):
    """Not only the loader's models: a DecoderConfig/T5Config left at its default
    resolves its matmul precision where the model runs (here traced as if on
    ``backend``), so float32 on an accelerator is float32, not TF32."""

    from specdec_jax.models.decoder_only import DecoderConfig, DecoderOnlyLM  # noqa: PLC0415
    from specdec_jax.models.interface import make_prompt  # noqa: PLC0415
    from specdec_jax.models.t5 import T5Config, T5EncoderDecoderLM  # noqa: PLC0415

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    if env:
        monkeypatch.setenv(precision.ENV_MATMUL_PRECISION, env)
    else:
        monkeypatch.delenv(precision.ENV_MATMUL_PRECISION, raising=False)
    decoder = DecoderOnlyLM(DecoderConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                          num_layers=1, num_heads=2, num_kv_heads=1))
    t5 = T5EncoderDecoderLM(T5Config(vocab_size=32, d_model=16, d_kv=8, d_ff=32, num_heads=2,
                                     num_encoder_layers=1, num_decoder_layers=1))
    traces = []
    for model in (decoder, t5):
        # Shapes are all a trace needs: no weights are initialised or compiled.
        params = jax.eval_shape(model.init_params, jax.random.PRNGKey(0))
        cache = jax.eval_shape(lambda m=model: m.init_cache(1, 8))
        traces.append(str(jax.make_jaxpr(
            lambda p, c, m=model: m.prefill(p, make_prompt([[1, 2, 3]]), c).logits)(
                params, cache)))
    for text in traces:
        dots = text.count("dot_general[")
        assert dots > 0
        if expected is None:
            assert "Precision.HIGH" not in text
        else:
            assert text.count(expected) == 2 * dots  # lhs and rhs of every dot
