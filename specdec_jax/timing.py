"""Wall-clock measurement of jitted generations, compile time kept apart.

Every figure the project reports is a ratio measured in one process run
(method vs autoregressive target, ours vs a peer), so the machine's speed
cancels out; the helpers here make sure compilation never leaks into them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax


@dataclasses.dataclass
class Timed:
    compile_s: float
    run_s: list[float]
    output: Any

    @property
    def median_s(self) -> float:
        return statistics.median(self.run_s)


class Compiled:
    """A jitted function compiled ahead of time for one set of argument shapes.

    ``fn`` must be a ``jax.jit`` function. Calls with other values of the same
    shapes reuse the executable; the timed calls block until the outputs are
    ready, so asynchronous dispatch cannot hide work.
    """

    def __init__(self, fn: Callable, *example_args):
        start = time.perf_counter()
        self.executable = fn.lower(*example_args).compile()
        self.compile_s = time.perf_counter() - start

    def time(self, *args, repeats: int = 1) -> Timed:
        runs, output = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            output = jax.block_until_ready(self.executable(*args))
            runs.append(time.perf_counter() - start)
        return Timed(compile_s=self.compile_s, run_s=runs, output=output)


def environment() -> dict[str, str]:
    """Machine, precision and versions, recorded with every figure."""
    import flax  # noqa: PLC0415

    device = jax.devices()[0]
    return {
        "machine": f"{platform.processor() or platform.machine()} ({jax.device_count()} "
                   f"{device.platform} device(s): {device.device_kind})",
        "cpu_count": str(os.cpu_count()),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "flax": flax.__version__,
    }


def write_report(report: dict, path: str) -> None:
    """Writes a benchmark's JSON report (figures plus ``environment()``), making
    the directory; benchmarks call it after every section so a long run that
    is stopped early keeps what it measured."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
