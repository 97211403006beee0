"""The package's layers hold (``.importlinter``): imports run downward only in a strict
order (jobs over training over data over checkpoints over runtime over the decoding
core, itself ordered), modules on one line are independent, no two sibling modules
import each other round a cycle, the core does no file, network or job I/O, and the
library never imports the lab (``benchmarks/``). Each test below plants one
forbidden import in a copy of the package and shows ``lint-imports`` rejecting it,
so the contracts are not vacuous. Last, the package's shape: a root of a handful of
modules, and no two module names that differ only by a suffix or a plural."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The ``lint-imports`` command, run through this interpreter: where pip put its
# script differs between a venv and a ``--target`` install (the GPU check's).
LINT = [sys.executable, "-c",
        "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"]


def lint(root: pathlib.Path) -> subprocess.CompletedProcess:
    """``lint-imports`` from ``root`` (a checkout or a copy), whose package
    comes first on the path; what the environment adds to the path (an
    install with ``--target``) stays behind it."""
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return subprocess.run([*LINT, "--no-cache"], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path})


def test_import_linter_contracts_are_kept():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 kept, 0 broken" in result.stdout


def copy_with_import(tmp_path, module: str, imported: str) -> pathlib.Path:
    """A copy of the package in which ``module`` (a path under specdec_jax/)
    also imports ``imported``."""
    shutil.copytree(ROOT / "specdec_jax", tmp_path / "specdec_jax",
                    ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    source = tmp_path / "specdec_jax" / module
    source.write_text(source.read_text() + f"\nimport {imported}  # noqa\n")
    return tmp_path


@pytest.mark.parametrize("module, imported, broken", [
    # upward: the core's loop reaching into I/O and jobs
    ("decode/round.py", "specdec_jax.checkpoints.fetch", "layers"),
    ("decode/round.py", "specdec_jax.jobs.launch", "layers"),
    # the cost model is pure maths: the timing that feeds it lives above, in runtime/
    ("decode/cost.py", "specdec_jax.runtime.timing", "layers"),
    # upward inside the middle layer (checkpoints sit below training) and the core
    ("checkpoints/load.py", "specdec_jax.training.steps", "layers"),
    ("verify/token.py", "specdec_jax.decode.round", "layers"),
    # inside the decode package: the one round reaching up to a decoder built on it
    ("decode/round.py", "specdec_jax.decode.chain", "decode"),
    # sideways between modules the contract declares independent
    ("verify/token.py", "specdec_jax.target_functions", "layers"),
    # inside the verify package: the token verifier reaching up to the block verifier
    ("verify/token.py", "specdec_jax.verify.block", "verify"),
    ("sampling.py", "specdec_jax.verify.token", "layers"),
    # a cycle inside a package: the drafter base importing a drafter built on it
    ("drafting/base.py", "specdec_jax.drafting.model_drafter", "acyclic"),
    # the library reaching into its lab, which is not installed
    ("jobs/launch.py", "benchmarks", "lab"),
])
def test_a_planted_import_breaks_its_contract(module, imported, broken, tmp_path):
    result = lint(copy_with_import(tmp_path, module, imported))
    assert result.returncode != 0, result.stdout
    names = {"layers": "in a strict order BROKEN",
             "acyclic": "No import cycles between sibling modules, at any depth BROKEN",
             "lab": "The library never imports the lab (benchmarks/, not installed) BROKEN",
             "verify": "Verifiers: block and tree over token BROKEN",
             "decode": "Decoders over the chain round over the one round BROKEN"}
    assert names[broken] in result.stdout
    importer = "specdec_jax." + module.removesuffix(".py").replace("/", ".")
    if broken in ("layers", "lab", "verify", "decode"):  # the offending import, by full names
        assert f"{importer} -> {imported}" in result.stdout
    else:  # the cycle's package, and the dependency that would break it
        package, _, base = importer.rpartition(".")
        assert f"in {package}." in result.stdout
        assert f".{imported.rpartition('.')[2]} -> .{base}" in result.stdout


# --- the package's shape -------------------------------------------------------------------

MAX_ROOT_MODULES = 6  # the package root: __init__, api, and a handful of core modules


def module_names(root: pathlib.Path) -> list[pathlib.PurePosixPath]:
    """Every module and package under ``root`` (paths relative to it, no suffix)."""
    names = []
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts:
            continue
        if path.suffix == ".py" and path.name != "__init__.py":
            names.append(pathlib.PurePosixPath(path.relative_to(root).with_suffix("")))
        elif path.is_dir() and (path / "__init__.py").exists():
            names.append(pathlib.PurePosixPath(path.relative_to(root)))
    return names


def _stem(word: str) -> str:
    """A word without its plural or -ing/-er ending: ``verifiers`` and ``verify``,
    ``shards`` and ``sharding``, ``loops`` and ``loop`` share one."""
    word = word.lower()
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    for ending in ("ing", "er"):
        if len(word) > len(ending) + 2 and word.endswith(ending):
            word = word[:-len(ending)]
            break
    if word.endswith(("ie", "y")):
        word = word[:-2] + "i" if word.endswith("ie") else word[:-1] + "i"
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def suffix_twins(names) -> list[tuple[str, str]]:
    """Pairs of module names that differ only by a plural or an ending
    (``verify`` / ``verifiers``) anywhere in the package, or, in one package,
    by a suffix word (``verify`` / ``verify_block``). Equal names in different
    packages (``verify/tree``, ``drafting/tree``) are told apart by the package."""
    pairs = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if a.name == b.name:
                continue
            stems_equal = [_stem(w) for w in a.name.split("_")] == \
                [_stem(w) for w in b.name.split("_")]
            suffixed = a.parent == b.parent and (a.name.startswith(b.name + "_")
                                                 or b.name.startswith(a.name + "_"))
            if stems_equal or suffixed:
                pairs.append((str(a), str(b)))
    return pairs


def test_the_package_root_holds_a_handful_of_modules():
    root = ROOT / "specdec_jax"
    modules = sorted(p.name for p in root.glob("*.py"))
    assert len(modules) <= MAX_ROOT_MODULES, modules


def test_no_two_module_names_differ_only_by_a_suffix_or_a_plural():
    assert suffix_twins(module_names(ROOT / "specdec_jax")) == []


@pytest.mark.parametrize("a, b", [
    ("verify", "verifiers"), ("verify", "verify_block"), ("loops", "training/loop"),
    ("sharding", "runtime/shards"), ("drafting/acceptance_head", "checkpoints/acceptance_heads"),
    ("decode", "models/decoder"), ("checkpoints", "training/checkpointing")])
def test_the_twin_rule_catches_the_twins_the_package_had(a, b):
    """The names the package once had: each pair is refused, so the rule is not vacuous."""
    assert suffix_twins([pathlib.PurePosixPath(a), pathlib.PurePosixPath(b)]) == [(a, b)]


def test_the_twin_rule_lets_different_names_and_packages_be():
    names = [pathlib.PurePosixPath(n) for n in (
        "verify/tree", "drafting/tree", "decode/tree", "data/tasks", "data/text_tasks",
        "models/decoder_only", "decode", "training/train_loop", "loops")]
    assert suffix_twins(names) == []
