"""Training prompts for the acceptance head on the code pair: functions of
the Python standard library, each as a HumanEval-style prompt (signature and
docstring; the model writes the body).

Disjoint from the evaluation prompts by construction (HumanEval's problems are
not standard-library functions; ``stdlib_prompts`` also drops any prompt that
names a HumanEval entry point). The set depends on the Python that runs it,
so its source, size and a hash are recorded with every data shard.
"""

from __future__ import annotations

import ast
import hashlib
import pathlib
import random
import sys
import sysconfig
from collections.abc import Iterable, Sequence

# Folders of the standard library that are tests, tools or GUI code, not library functions.
SKIPPED_PARTS = {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip",
                 "site-packages", "dist-packages", "__pycache__", "pydoc_data", "venv"}
MIN_DOC_CHARS = 40
MAX_DOC_CHARS = 800


def _stdlib_files(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in root.rglob("*.py")
                  if not SKIPPED_PARTS & set(p.relative_to(root).parts))


def _prompt(node: ast.FunctionDef) -> str | None:
    doc = ast.get_docstring(node, clean=True)
    if node.name.startswith("_") or not doc or not MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS:
        return None
    if '"""' in doc or "\\" in doc:
        return None
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    signature = f"def {node.name}({ast.unparse(node.args)}){returns}:"
    first, *rest = doc.splitlines()
    lines = [f'    """{first}', *(f"    {line}" if line else "" for line in rest), '    """']
    return signature + "\n" + "\n".join(lines) + "\n"


def _body(node: ast.FunctionDef, lines: list[str]) -> str:
    """The function's real implementation after its docstring (corpus responses)."""
    if len(node.body) < 2:
        return ""
    return "\n".join(lines[node.body[1].lineno - 1:node.end_lineno]) + "\n"


def iter_stdlib_prompts(root: pathlib.Path | None = None) -> Iterable[tuple[str, str, str]]:
    """(id ``module:function``, prompt, body) for every public module-level
    function with a docstring of 40-800 characters, in a deterministic order;
    ``body`` is the standard library's own implementation (possibly empty)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    for path in _stdlib_files(root):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, SyntaxError):
            continue  # a few files are deliberately broken or in another encoding
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        lines = source.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                prompt = _prompt(node)
                if prompt:
                    yield f"{module}:{node.name}", prompt, _body(node, lines)


def stdlib_prompts(limit: int | None = None, *, seed: int = 0,
                   exclude_names: Sequence[str] = ()
                   ) -> tuple[list[tuple[str, str, str]], dict]:
    """A seeded sample of ``limit`` standard-library (id, prompt, body) triples
    (all when None), without functions named in ``exclude_names`` (e.g.
    HumanEval entry points), and the record of its source: Python version,
    candidates, size, sha256."""
    excluded = set(exclude_names)
    candidates = [c for c in iter_stdlib_prompts() if c[0].split(":")[1] not in excluded]
    if not candidates:
        raise RuntimeError(f"no documented functions found under "
                           f"{sysconfig.get_paths()['stdlib']}; is the standard library's "
                           "source installed?")
    chosen = list(candidates)
    random.Random(seed).shuffle(chosen)
    if limit is not None:
        if limit > len(chosen):
            raise ValueError(f"asked for {limit} prompts but the standard library of this "
                             f"Python offers {len(chosen)}; lower the count.")
        chosen = chosen[:limit]
    digest = hashlib.sha256("\0".join(f"{i}\0{p}" for i, p, _ in chosen).encode()).hexdigest()
    record = {"source": f"CPython {sys.version.split()[0]} standard library "
                        "(signature + docstring of public module-level functions)",
              "candidates": len(candidates), "size": len(chosen), "seed": seed,
              "sha256": digest}
    return chosen, record
