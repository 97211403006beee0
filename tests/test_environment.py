"""Every report's environment: machine, versions, date and the commit it ran from."""

import datetime
import pathlib
import re

from specdec_jax.runtime import timing

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_environment_names_machine_versions_date_and_commit():
    env = timing.environment()
    assert {"machine", "python", "jax", "jaxlib", "flax", "date", "commit"} <= set(env)
    when = datetime.datetime.strptime(env["date"], "%Y-%m-%dT%H:%M:%SZ")
    assert abs((datetime.datetime.now() - when).total_seconds()) < 2 * 86400
    if (ROOT / ".git").exists():  # a checkout: the commit of its HEAD, + when edited
        assert re.fullmatch(r"[0-9a-f]{12}\+?", env["commit"]), env["commit"]
    else:  # a copy without history (the GPU check's) says so
        assert env["commit"] is None


def test_an_installed_package_has_no_commit(tmp_path, monkeypatch):
    """Outside a checkout (a regular install) the commit is None, not a guess."""
    monkeypatch.setattr(timing, "__file__", str(tmp_path / "specdec_jax/runtime/timing.py"))
    assert timing.checkout_commit() is None


def test_a_machine_without_tpu_chips_does_not_start_the_tpu_runtime(monkeypatch):
    """libtpu installed, no chips, no CUDA plugin, JAX_PLATFORMS unset: the CLI and
    the gin launcher stay on the CPU; each of the other cases is left alone."""
    import importlib.util  # noqa: PLC0415

    from specdec_jax.runtime import devices  # noqa: PLC0415

    installed = {"libtpu"}
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: object() if name in installed else None)
    monkeypatch.setattr(devices, "has_tpu_chips", lambda: False)
    assert devices.tpu_runtime_without_chips()
    monkeypatch.setattr(devices, "has_tpu_chips", lambda: True)  # a TPU VM
    assert not devices.tpu_runtime_without_chips()
    monkeypatch.setattr(devices, "has_tpu_chips", lambda: False)
    installed.add("jax_cuda12_plugin")  # a GPU machine
    assert not devices.tpu_runtime_without_chips()
    installed.clear()  # no libtpu: nothing to keep quiet
    assert not devices.tpu_runtime_without_chips()
    installed.add("libtpu")
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")  # the user's choice
    assert not devices.tpu_runtime_without_chips()


def test_the_command_line_prints_no_tpu_runtime_noise_without_chips():
    """Where the tpu extra is installed on a CPU machine (CI's), a generation
    from the command line prints nothing about TPU workers or hostnames."""
    import importlib.util  # noqa: PLC0415
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    import pytest  # noqa: PLC0415

    from specdec_jax.runtime import devices  # noqa: PLC0415

    if importlib.util.find_spec("libtpu") is None or devices.has_tpu_chips():
        pytest.skip("needs libtpu installed on a machine without TPU chips (CI's)")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    result = subprocess.run(
        [sys.executable, "-m", "specdec_jax.jobs.cli", "generate", "--target",
         "toy-bytes-large", "--drafter", "toy-bytes-small", "--drafter-head-vocab", "0",
         "--prompt", "ab", "--max-new-tokens", "4", "--no-cost-model",
         "--no-baseline"], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "TPU" not in result.stderr and "hostname" not in result.stderr, result.stderr[-2000:]


def test_every_script_that_imports_jax_keeps_libtpu_quiet_without_chips():
    """A benchmark or tool script run on a CPU machine with the tpu extra would
    start libtpu's runtime and print its hostname errors before its output;
    each script that imports jax turns that off first, as the command line
    does (``devices.run_on_cpu_without_chips``)."""
    imports_jax = re.compile(r"^\s*(import jax\b|from jax\b)", re.MULTILINE)
    sources = {p: p.read_text(encoding="utf-8")
               for folder in ("benchmarks", "tools") for p in sorted((ROOT / folder).rglob("*.py"))}
    scripts = {p: text for p, text in sources.items() if "__main__" in text}
    noisy = [str(p.relative_to(ROOT)) for p, text in scripts.items()
             if imports_jax.search(text) and "run_on_cpu_without_chips()" not in text]
    assert scripts and not noisy, f"call devices.run_on_cpu_without_chips() in main(): {noisy}"
