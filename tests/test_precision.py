"""The dtype switch and the matmul precision each backend gets."""

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
