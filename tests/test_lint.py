"""The code base stays lint-clean (ruff, configured in ruff.toml)."""

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_is_clean():
    venv_bin = str(pathlib.Path(sys.executable).parent)
    ruff = shutil.which("ruff", path=venv_bin) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is in the dev extra: pip install -e '.[dev]')")
    folders = [d for d in ("specdec_jax", "benchmarks", "tests", "eval", "train", "tools")
               if (ROOT / d).is_dir()]
    result = subprocess.run([ruff, "check", *folders], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
