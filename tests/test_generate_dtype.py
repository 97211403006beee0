"""``specdec-jax generate --dtype``: the number format the command loads its models in."""

import jax
import jax.numpy as jnp
import pytest

from specdec_jax.jobs import cli
from specdec_jax.jobs.cli import generate as cli_generate

TOYS = ["--target", "toy-bytes-large", "--drafter", "toy-bytes-small",
        "--drafter-head-vocab", "0", "--max-new-tokens", "4", "--prompt", "ab",
        "--no-cost-model", "--no-baseline", "--json"]


def _loaded_dtypes(argv, monkeypatch):
    """Runs the command with generation stubbed out; returns the dtypes of
    every floating leaf of the target's and the drafter's params and their
    configs' dtype."""
    seen = {}

    def fake_make_generate_fn(**kwargs):
        seen["target_config"] = kwargs["target"].config.dtype
        seen["drafter_config"] = kwargs["drafter"].config.dtype
        raise _Stop

    real_load_drafter = cli_generate._load_drafter

    def recording_load_drafter(args, spec, names, target, target_params, tokenizer,
                               drafter_models):
        drafter, drafter_params = real_load_drafter(args, spec, names, target,
                                                    target_params, tokenizer, drafter_models)
        for role, params in (("target", target_params), ("drafter", drafter_params)):
            seen[role] = {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)
                          if jnp.issubdtype(leaf.dtype, jnp.floating)}
        return drafter, drafter_params

    monkeypatch.setattr(cli_generate, "_load_drafter", recording_load_drafter)
    monkeypatch.setattr(cli_generate.api, "make_generate_fn", fake_make_generate_fn)
    with pytest.raises(_Stop):
        cli.main(["generate", *TOYS, *argv])
    return seen


class _Stop(Exception):
    """Ends the command once the models are loaded."""


def test_dtype_bfloat16_loads_bfloat16_params(monkeypatch):
    seen = _loaded_dtypes(["--dtype", "bfloat16"], monkeypatch)
    assert seen["target"] == seen["drafter"] == {jnp.dtype(jnp.bfloat16)}
    assert seen["target_config"] == seen["drafter_config"] == "bfloat16"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="auto is float32 only on CPU")
def test_dtype_auto_on_cpu_loads_float32(monkeypatch):
    seen = _loaded_dtypes([], monkeypatch)  # --dtype auto is the default
    assert seen["target"] == seen["drafter"] == {jnp.dtype(jnp.float32)}
    assert seen["target_config"] == seen["drafter_config"] == "float32"


def test_other_dtypes_are_refused_before_loading(capsys, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before --dtype was checked")

    monkeypatch.setattr(cli_generate.resolver, "resolve", no_loading)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["generate", *TOYS, "--dtype", "float64"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--dtype" in err and "bfloat16" in err


def test_help_describes_dtype(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    out = capsys.readouterr().out
    assert "--dtype {auto,float32,bfloat16}" in out
    assert "float32 on CPU and bfloat16 on GPU/TPU" in " ".join(out.split())
