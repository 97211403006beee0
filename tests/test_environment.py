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
