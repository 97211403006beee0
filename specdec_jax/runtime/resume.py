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
from typing import Any


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
