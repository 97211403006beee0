"""Every Python code block of README.md and docs/*.md runs as written.

A block is run alone, in a fresh namespace, and must not raise. A block
whose first line says ``# needs the real weights`` downloads the real models
and runs under ``-m slow``; the others run on toy or random weights in
seconds each (``-m long``: each compiles one to three small programs).
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
REAL_WEIGHTS = "# needs the real weights"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks():
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"```python\n(.*?)```", text, flags=re.S):
            line = text[:match.start()].count("\n") + 1
            code = match.group(1)
            marks = [pytest.mark.slow if code.startswith(REAL_WEIGHTS) else pytest.mark.long]
            yield pytest.param(code, id=f"{page.relative_to(ROOT)}:{line}", marks=marks)


BLOCKS = list(python_blocks())


def test_the_pages_hold_runnable_examples():
    """The README's JAX example and the tree example are found (the collector
    cannot silently find nothing)."""
    ids = [block.id for block in BLOCKS]
    assert any(i.startswith("README.md:") for i in ids)
    assert any(i.startswith("docs/jax.md:") for i in ids), ids


@pytest.mark.parametrize("code", BLOCKS)
def test_the_example_runs(code, capsys):
    exec(compile(code, "<docs example>", "exec"), {"__name__": "__docs_example__"})
    assert capsys.readouterr().out.strip(), "every example prints what it shows"
