"""One benchmark function in a fresh Python process, its result back as JSON.

Benchmarks that need a clean process per measurement (XLA reads its flags once
per process; resident memory is only comparable from a fresh start) call
``run_in_child``; the child is ``python -m benchmarks.child
<module:function> <kwargs JSON> <result path>``, with the environment it was
given set before Python starts (``XLA_FLAGS`` included)::

    result = child.run_in_child("benchmarks.scoring:measure",
                                {"model": "random:tiny-drafter", ...},
                                env={"XLA_FLAGS": "--xla_cpu_use_xnnpack=true"})

The child's output and errors go to this process's terminal.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

PACKAGE = "benchmarks."  # the only functions a child runs
# The repository root: holds the specdec_jax package and benchmarks/ (the child imports
# both from there).
PACKAGE_ROOT = str(pathlib.Path(__file__).resolve().parents[1])


def run_in_child(function: str, kwargs: Mapping, *, env: Mapping[str, str] | None = None
                 ) -> dict:
    """``function(**kwargs)`` (``"module:function"``, a module of this package)
    in a fresh process whose environment is this one's updated with ``env``;
    returns what it returned (a JSON-serialisable dict, through JSON)."""
    _check(function)
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (PACKAGE_ROOT, child_env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="specdec_jax_bench_") as tmp:
        result = pathlib.Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.child", function,
                   json.dumps(dict(kwargs)), str(result)]
        done = subprocess.run(command, env=child_env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{function} failed in its own process (exit status "
                               f"{done.returncode}); its error is printed above.")
        return json.loads(result.read_text())


def rss() -> int:
    """This process's resident memory in bytes (what a fresh process's load adds)."""
    import psutil  # noqa: PLC0415 (a dev dependency; the launcher imports every job)

    return psutil.Process().memory_info().rss


def _check(function: str) -> None:
    module, _, name = function.partition(":")
    if not module.startswith(PACKAGE) or not name:
        raise ValueError(f"a child process runs a benchmark function, "
                         f"'{PACKAGE}<module>:<function>'; got {function!r}.")


def main(argv: Sequence[str]) -> int:
    function, kwargs, out = argv
    _check(function)
    module, _, name = function.partition(":")
    result = getattr(importlib.import_module(module), name)(**json.loads(kwargs))
    pathlib.Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
