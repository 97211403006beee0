"""Resumable shard builds: a directory of ``.npz`` shards and the manifest that
tells which model made them, with which settings, and how far the build got.

A training data builder is slow (a model forward per batch) and may be
killed at any point, so a build is resumable: each shard is written under a
temporary name and renamed, then the manifest listing it is (atomically)
rewritten; a rerun skips the shards the manifest lists. A build only means
something for the model and settings that made it, so reopening or loading
it with another identity (names, weight fingerprints) or other settings is
refused, naming what differs. Only a build marked finished loads: training
on part of the data would silently change the experiment.

The manifest is ``{**identity, "settings": ..., "shards": {name: record},
"finished": bool}`` in ``manifest.json``; the identity's entries sit at its
top level, so a builder keeps the manifest layout its readers expect.
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from specdec_jax.runtime.jsonio import read_json, write_json
from specdec_jax.runtime.progress import tqdm
from specdec_jax.runtime.resume import as_json, differences

MANIFEST = "manifest.json"
TEMP_SUFFIX = ".tmp"
RESERVED = ("settings", "shards", "finished")  # manifest keys an identity may not use


def shard_name(index: int) -> str:
    """The file name of shard ``index`` (sorted names are in build order)."""
    return f"shard-{index:05d}.npz"


def check_identity(manifest: Mapping, identity: Mapping, where: Any, what: str) -> None:
    """Refuses a build made for another model (any identity entry differs)."""
    stored = {key: manifest.get(key) for key in identity}
    diff = differences(stored, as_json(identity))
    if diff:
        raise ValueError(f"{where} holds {what} built for another model ({'; '.join(diff)}): "
                         "it serves only the model it was built with. Build into another "
                         f"out_dir, or delete {where} to rebuild it here.")


def check_settings(manifest: Mapping, settings: Mapping, where: Any, what: str) -> None:
    """Refuses to resume a build made with other settings."""
    diff = differences({"settings": manifest.get("settings")}, {"settings": as_json(settings)})
    if diff:
        raise ValueError(f"{where} holds {what} built with other settings ({'; '.join(diff)}); "
                         "a resumed build must continue the same one. Build into another "
                         f"out_dir, or delete {where} to rebuild it with these settings.")


def _remove_temporaries(out: pathlib.Path) -> None:
    """Half-written files a killed run left (never read; a shard's can be large)."""
    for leftover in [*out.glob(f"*.npz{TEMP_SUFFIX}"), out / (MANIFEST + TEMP_SUFFIX)]:
        leftover.unlink(missing_ok=True)


def open_build(out_dir: str | os.PathLike, *, identity: Mapping, settings: Mapping,
               what: str) -> dict:
    """The manifest of the build in ``out_dir``: the stored one when it
    exists (after checking its identity and settings), else a new, empty one
    (written at once, so the directory is claimed for this identity).
    ``what`` names the data in errors ("feature data")."""
    clash = sorted(set(identity) & set(RESERVED))
    if clash:
        raise ValueError(f"identity keys {clash} clash with the manifest's own {RESERVED}.")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _remove_temporaries(out)
    if (out / MANIFEST).exists():
        stored = read_json(out / MANIFEST)
        check_identity(stored, identity, out, what)
        check_settings(stored, settings, out, what)
        return stored
    manifest = {**as_json(identity), "settings": as_json(settings), "shards": {},
                "finished": False}
    write_json(out / MANIFEST, manifest)
    return manifest


def is_written(manifest: Mapping, name: str) -> bool:
    """Whether shard ``name`` was written (by this run or an interrupted one)."""
    return name in manifest["shards"]


def save_arrays(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` under a temporary name, then a rename: a kill never leaves
    half a shard under the real name."""
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + TEMP_SUFFIX)
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def write_shard(out_dir: str | os.PathLike, manifest: Mapping, name: str,
                arrays: Mapping[str, np.ndarray], record: Mapping) -> dict:
    """Writes shard ``name`` (``arrays``), then the manifest listing it with
    ``record`` (its counts, its time); returns that manifest. The shard lands
    before the manifest names it, so a listed shard is always whole."""
    out = pathlib.Path(out_dir)
    save_arrays(out / name, arrays)
    updated = {**manifest, "shards": {**manifest["shards"], name: dict(record)}}
    write_json(out / MANIFEST, updated)
    return updated


def write_missing_shards(out_dir: str | os.PathLike, manifest: Mapping, *, items: int,
                         per_shard: int, make_shard: Callable[[int], tuple[Mapping, Mapping]],
                         desc: str, progress: bool = True) -> dict:
    """Writes every shard of a build not written by an earlier (interrupted)
    run, then finishes it. Shard ``i`` holds items ``i * per_shard ..``;
    ``make_shard(first_item)`` returns its ``(arrays, record)``, and the
    record gets the seconds it took. Returns the finished manifest."""
    for first in tqdm(range(0, items, per_shard), desc=desc, unit="shard",
                      disable=not progress):
        name = shard_name(first // per_shard)
        if is_written(manifest, name):
            continue
        began = time.perf_counter()
        arrays, record = make_shard(first)
        manifest = write_shard(out_dir, manifest, name, arrays,
                               {**record, "seconds": time.perf_counter() - began})
    return finish_build(out_dir, manifest)


def finish_build(out_dir: str | os.PathLike, manifest: Mapping) -> dict:
    """Marks the build finished (every shard written); returns the manifest."""
    finished = {**manifest, "finished": True}
    if not manifest.get("finished"):
        write_json(pathlib.Path(out_dir) / MANIFEST, finished)
    return finished


def load_manifest(out_dir: str | os.PathLike, *, identity: Mapping, what: str,
                  build_hint: str) -> dict:
    """The manifest of a finished build in ``out_dir`` for ``identity``;
    an error if there is none (``build_hint`` says how to make one), if it
    belongs to another model, or if the build did not finish."""
    out = pathlib.Path(out_dir)
    if not (out / MANIFEST).exists():
        raise FileNotFoundError(f"{out} holds no {what} ({MANIFEST} missing); {build_hint}.")
    manifest = read_json(out / MANIFEST)
    check_identity(manifest, identity, out, what)
    if not manifest.get("finished"):
        raise ValueError(f"the build of {what} in {out} did not finish ({len(manifest['shards'])} "
                         "shards written): run the build command again to finish it (it "
                         "resumes, skipping the written shards).")
    return manifest


def read_shards(out_dir: str | os.PathLike, names: Sequence[str], keys: Sequence[str]
                ) -> dict[str, np.ndarray]:
    """The arrays ``keys`` of shards ``names``, each concatenated in that order."""
    out = pathlib.Path(out_dir)
    loaded = [np.load(out / name) for name in names]
    return {key: np.concatenate([shard[key] for shard in loaded]) for key in keys}
