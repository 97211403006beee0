"""Resumable shard builds (``runtime.shards``): resume, refusal of another
model or other settings, refusal of an unfinished build, atomic writes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from specdec_jax.runtime import data_shards
from specdec_jax.runtime.jsonio import read_json

IDENTITY = {"target": "toy", "target_fingerprint": "a" * 64}
SETTINGS = {"batch_size": 2, "source": {"kind": "test", "files": ["x.py"]}}
WHAT = "test data"


def _build(out_dir, count: int, identity=IDENTITY, settings=SETTINGS, written=None) -> dict:
    """A build of ``count`` shards (shard i holds the row ``[i, i]``), noting
    in ``written`` the shards this call wrote."""
    manifest = data_shards.open_build(out_dir, identity=identity, settings=settings, what=WHAT)
    for index in range(count):
        name = data_shards.shard_name(index)
        if data_shards.is_written(manifest, name):
            continue
        manifest = data_shards.write_shard(out_dir, manifest, name,
                                      {"rows": np.full((1, 2), index)}, {"rows": 1})
        if written is not None:
            written.append(name)
    return data_shards.finish_build(out_dir, manifest)


def _load(out_dir, identity=IDENTITY) -> dict:
    return data_shards.load_manifest(out_dir, identity=identity, what=WHAT, build_hint="build it")


def test_a_finished_build_loads_its_shards_in_order(tmp_path):
    manifest = _build(tmp_path, 3)
    assert manifest == _load(tmp_path) and manifest["finished"]
    assert {k: manifest[k] for k in IDENTITY} == IDENTITY  # the identity sits at the top
    arrays = data_shards.read_shards(tmp_path, sorted(manifest["shards"]), ["rows"])
    np.testing.assert_array_equal(arrays["rows"], [[0, 0], [1, 1], [2, 2]])
    assert _build(tmp_path, 3) == manifest  # nothing left to do


def test_a_resumed_build_skips_the_written_shards(tmp_path):
    manifest = data_shards.open_build(tmp_path, identity=IDENTITY, settings=SETTINGS, what=WHAT)
    data_shards.write_shard(tmp_path, manifest, data_shards.shard_name(0),
                            {"rows": np.zeros((1, 2))}, {"rows": 1})  # then killed
    first = (tmp_path / data_shards.shard_name(0)).stat().st_mtime_ns
    written = []
    _build(tmp_path, 3, written=written)
    assert written == [data_shards.shard_name(1), data_shards.shard_name(2)]
    assert (tmp_path / data_shards.shard_name(0)).stat().st_mtime_ns == first
    assert not list(tmp_path.glob("*.tmp"))


def test_an_unfinished_build_is_refused_on_load_until_it_is_finished(tmp_path):
    manifest = data_shards.open_build(tmp_path, identity=IDENTITY, settings=SETTINGS, what=WHAT)
    with pytest.raises(ValueError, match=r"did not finish \(0 shards written\): run the build "
                                         "command again"):
        _load(tmp_path)
    data_shards.write_shard(tmp_path, manifest, data_shards.shard_name(0),
                            {"rows": np.zeros((1, 2))}, {"rows": 1})
    with pytest.raises(ValueError, match=r"did not finish \(1 shards written\)"):
        _load(tmp_path)
    _build(tmp_path, 2)
    assert len(_load(tmp_path)["shards"]) == 2
    with pytest.raises(FileNotFoundError, match="holds no test data.*build it"):
        _load(tmp_path / "elsewhere")


def test_another_model_is_refused_naming_what_differs(tmp_path):
    _build(tmp_path, 1)
    other = {**IDENTITY, "target_fingerprint": "b" * 64}
    message = (r"built for another model \(target_fingerprint: 'aaaaaaaaaaaaaaa\.\.\. here, "
               r"'bbbbbbbbbbbbbbb\.\.\. asked\).*another out_dir, or delete")
    with pytest.raises(ValueError, match=message):
        _load(tmp_path, other)
    with pytest.raises(ValueError, match=message):
        _build(tmp_path, 1, identity=other)
    with pytest.raises(ValueError, match="target: 'toy' here, 'big' asked"):
        _load(tmp_path, {**IDENTITY, "target": "big"})
    nested = {"pair": {"target": "t", "drafter": "d"}}
    _build(tmp_path / "pair", 1, identity=nested)
    with pytest.raises(ValueError, match="pair.drafter: 'd' here, 'e' asked"):
        _load(tmp_path / "pair", {"pair": {"target": "t", "drafter": "e"}})


def test_other_settings_are_refused_naming_what_differs(tmp_path):
    _build(tmp_path, 1)
    with pytest.raises(ValueError, match=r"other settings \(settings.batch_size: 2 here, 4 "
                                         r"asked\).*another out_dir, or delete"):
        _build(tmp_path, 1, settings={**SETTINGS, "batch_size": 4})
    with pytest.raises(ValueError, match="settings.seed: <absent> here, 0 asked"):
        _build(tmp_path, 1, settings={**SETTINGS, "seed": 0})
    # Settings compare as they read back from JSON: a tuple equals its stored list.
    _build(tmp_path, 1, settings={**SETTINGS, "source": {"kind": "test", "files": ("x.py",)}})


@pytest.mark.parametrize("crash_on", ["shard", "manifest"])
def test_a_crash_mid_write_leaves_the_last_manifest_whole(tmp_path, monkeypatch, crash_on):
    """A kill while the second shard or its manifest is written: the manifest
    still lists the first shard alone, loads as unfinished, and the build
    resumes to the same data."""
    manifest = data_shards.open_build(tmp_path, identity=IDENTITY, settings=SETTINGS, what=WHAT)
    manifest = data_shards.write_shard(tmp_path, manifest, data_shards.shard_name(0),
                                  {"rows": np.full((1, 2), 0)}, {"rows": 1})
    before = (tmp_path / data_shards.MANIFEST).read_text()
    real_replace = os.replace

    class Killed(Exception):
        pass

    def replace(src, dst):
        if str(dst).endswith(".npz" if crash_on == "shard" else data_shards.MANIFEST):
            raise Killed
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Killed):
        data_shards.write_shard(tmp_path, manifest, data_shards.shard_name(1),
                           {"rows": np.full((1, 2), 1)}, {"rows": 1})
    monkeypatch.setattr(os, "replace", real_replace)
    assert (tmp_path / data_shards.MANIFEST).read_text() == before
    assert list(read_json(tmp_path / data_shards.MANIFEST)["shards"]) == [data_shards.shard_name(0)]
    assert list(tmp_path.glob("*.tmp"))  # the half-written file, under its temporary name
    with pytest.raises(ValueError, match="did not finish"):
        _load(tmp_path)
    written = []
    manifest = _build(tmp_path, 2, written=written)
    assert written == [data_shards.shard_name(1)] and not list(tmp_path.glob("*.tmp"))
    arrays = data_shards.read_shards(tmp_path, sorted(_load(tmp_path)["shards"]), ["rows"])
    np.testing.assert_array_equal(arrays["rows"], [[0, 0], [1, 1]])
