"""Results of long jobs kept as they finish, so a rerun resumes where it stopped.

A ``ResumeLog`` is a JSON-lines file: the first line records the settings the
results were made under, each further line one finished unit of work
(``{"key": ..., "value": ...}``). A rerun under the same settings reads the
finished units back; under other settings it is an error, never a silent mix
of two experiments. A line cut off by a crash mid-write is dropped and its
unit is done again.

    log = ResumeLog(out_dir / "teacher_samples.jsonl", settings)
    for start, batch in batches:
        if start not in log.done:
            log.add(start, generate(batch))
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

# A value longer than this (a weight fingerprint) shows its first characters only.
LONG_VALUE = 40
SHOWN_CHARS = 16


def as_json(value: Any) -> Any:
    """``value`` as it reads back from a JSON file (tuples become lists), so
    that fresh settings compare equal to their stored copy."""
    return json.loads(json.dumps(value))


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict's leaves by dotted path (``pair.drafter_fingerprint``);
    an empty dict is a leaf (so that it differs from an absent one)."""
    if not isinstance(value, Mapping) or not value:
        return {prefix: value}
    found: dict[str, Any] = {}
    for key, item in value.items():
        found.update(_leaves(item, f"{prefix}.{key}" if prefix else str(key)))
    return found


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= LONG_VALUE else text[:SHOWN_CHARS] + "..."


class _Absent:
    """The value of a leaf one side lacks (unequal to any JSON value)."""

    def __repr__(self) -> str:
        return "<absent>"


def differences(stored: Mapping, wanted: Mapping) -> list[str]:
    """``"path: <stored> here, <wanted> asked"`` for every leaf that differs
    between two nested dicts (a missing leaf shows as ``<absent>``): what a
    job says when it refuses to resume results made under other settings."""
    here, asked = _leaves(stored), _leaves(wanted)
    absent = _Absent()
    return [f"{path}: {_shown(here.get(path, absent))} here, "
            f"{_shown(asked.get(path, absent))} asked"
            for path in sorted(set(here) | set(asked))
            if here.get(path, absent) != asked.get(path, absent)]


class ResumeLog:
    def __init__(self, path: str | pathlib.Path, settings: dict):
        self.path = pathlib.Path(path)
        self.done: dict[Any, Any] = {}
        header = json.dumps({"settings": settings}, sort_keys=True)
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(header + "\n")
            return
        lines = self.path.read_text().splitlines()
        if not lines or lines[0] != header:
            raise ValueError(f"{self.path} holds results made under other settings; delete it "
                             "or choose another output path. Stored: "
                             f"{lines[0][:300] if lines else '(empty file)'}")
        kept = [header]
        for line in lines[1:]:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # cut off mid-write: that unit is done again
                continue
            self.done[_hashable(record["key"])] = record["value"]
            kept.append(line)
        self.path.write_text("\n".join(kept) + "\n")

    def add(self, key, value) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"key": key, "value": value}) + "\n")
        self.done[_hashable(key)] = value


def _hashable(key):
    """JSON turns tuples into lists; keys come back as tuples."""
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key
