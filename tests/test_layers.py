"""The package's three layers hold: imports run downward only (``.importlinter``:
jobs over I/O and training over the decoding core, and a core free of file,
network and job I/O), and no two modules import each other, directly or round
a cycle."""

import configparser
import pathlib
import subprocess
import sys

import grimp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept():
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    layers = config["importlinter:contract:layers"]["layers"].split()
    assert [layer for layer in layers if layer != ":"][:2] == ["jobs", "checkpoints"]
    assert "importlinter:contract:core-is-pure" in config
    # The contracts as CI runs them: `lint-imports` from the repository root.
    lint = pathlib.Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of a directed graph: its strongly connected components of two
    or more nodes (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_strongly_connected_finds_cycles_and_only_cycles():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [
        ["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_the_package_import_graph_has_no_cycles():
    graph = grimp.build_graph("specdec_jax")
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    assert strongly_connected(edges) == []


@pytest.mark.parametrize("upward", ["specdec_jax.checkpoints.fetch", "specdec_jax.jobs.cost"])
def test_an_upward_import_breaks_the_contract(upward, tmp_path):
    """Not vacuous: the same check on a copy of the package in which the core's
    decoding loop imports from a layer above it fails, naming the import."""
    import shutil  # noqa: PLC0415

    shutil.copytree(ROOT / "specdec_jax", tmp_path / "specdec_jax",
                    ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    decoding = tmp_path / "specdec_jax" / "decoding.py"
    decoding.write_text(decoding.read_text() + f"\nimport {upward}  # noqa\n")
    lint = pathlib.Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint)], cwd=tmp_path, capture_output=True, text=True,
                            env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert result.returncode != 0
    assert f"specdec_jax.decoding -> {upward}" in result.stdout
