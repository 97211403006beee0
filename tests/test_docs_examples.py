"""Every Python code block of README.md and docs/*.md runs as written.

A block is run alone, in a fresh namespace, and must not raise. A block
whose first line says ``# needs the real weights`` downloads the real models
and runs under ``-m slow``; the others run on toy or random weights in
seconds each (``-m long``: each compiles one to three small programs).
"""

from __future__ import annotations

import pathlib
import re
import sys
import types

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
def test_the_example_runs(code, capsys, monkeypatch):
    # A module of its own, as a script has: a dataclass looks its module up.
    module = types.ModuleType("__docs_example__")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(code, "<docs example>", "exec"), module.__dict__)
    assert capsys.readouterr().out.strip(), "every example prints what it shows"


CODE_LINK = re.compile(r"\[`([^`\]]+)`\]\((\.\./specdec_jax/[^)#]+\.py)#L(\d+)\)")


def test_code_line_references_in_the_docs_point_at_their_code():
    """Every ``[`name`](../specdec_jax/<file>.py#L<n>)`` link of a docs page lands
    on the line that defines ``name`` (its last dotted part), so a page that
    shows the code by line (docs/architecture.md) says where it is now."""
    links = 0
    for page in sorted((ROOT / "docs").glob("*.md")):
        for name, path, line in CODE_LINK.findall(page.read_text()):
            source = (page.parent / path).resolve().read_text().splitlines()
            defined = name.split(".")[-1]
            assert re.match(rf"\s*(def|class) {re.escape(defined)}\b", source[int(line) - 1]), (
                f"{page.name}: {name} -> {path}#L{line} reads {source[int(line) - 1]!r}")
            links += 1
    assert links >= 20, "docs/architecture.md shows the round by line"
