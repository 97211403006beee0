"""Wall-clock measurement of jitted generations, compile time kept apart.

Every figure the project reports is a ratio measured in one process run
(method vs autoregressive target, ours vs a peer), so the machine's speed
cancels out; the helpers here make sure compilation never leaks into them.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import jaxlib

from specdec_jax.models.interface import start_token_and_prefill
from specdec_jax.runtime import jsonio
from specdec_jax.sampling import first_argmax


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


def device_limits(dtype: str = "float32", nbytes: int = 2**30, matmul_n: int = 2048) -> dict:
    """This device's read rate (a reduction over ``nbytes``), copy rate
    (``nbytes`` in, ``nbytes`` out) and matmul FLOP rate (``matmul_n``
    cubed in ``dtype``), each the median of 5 runs: the limits a decoder
    step is compared with."""

    big = jnp.ones((nbytes // 4,), jnp.float32)
    read = Compiled(jax.jit(jnp.sum), big).time(big, repeats=5).median_s
    copy = Compiled(jax.jit(lambda x: x * 2.0), big).time(big, repeats=5).median_s
    del big
    a = jnp.ones((matmul_n, matmul_n), dtype)
    matmul = Compiled(jax.jit(jnp.matmul), a, a).time(a, a, repeats=5).median_s
    return {"read_gb_s": nbytes / read / 1e9, "copy_gb_s": 2 * nbytes / copy / 1e9,
            "matmul_gflop_s": 2 * matmul_n**3 / matmul / 1e9, "matmul_dtype": dtype}


def in_loop(body: Callable, params, carry, *, steps: int, repeats: int,
            warmup: int = 1) -> Timed:
    """Seconds per ``body(params, carry) -> carry`` call, timed as ``steps``
    calls inside one jitted fixed-trip loop: ``warmup`` untimed runs, then the
    median of ``repeats`` timed runs (``Timed.median_s`` and ``run_s`` are per
    step). The one in-loop timer every step cost is measured with.

    Why in a loop: a host-dispatched single call carries the dispatch (1-2 ms
    on a GPU) that the decoding loop, itself one jitted program, never pays.
    Why a fixed trip count: a ``while_loop`` with an unknown one copies its
    condition to the host every iteration on a GPU. Why the warm-up: the first
    runs on a GPU read high while its clocks settle. ``body`` should make each
    step depend on the previous one (feed its output back) at a fixed state,
    so every step costs the same and none is dead code."""

    compiled = _warm_loop(body, params, carry, steps=steps, warmup=warmup)
    timed = compiled.time(params, carry, repeats=repeats)
    timed.run_s = [s / steps for s in timed.run_s]
    return timed


def _warm_loop(body: Callable, params, carry, *, steps: int, warmup: int) -> Compiled:
    """``steps`` calls of ``body`` in one jitted fixed-trip loop, compiled and
    run ``warmup`` times (``in_loop``)."""

    def run(params, carry):
        return jax.lax.fori_loop(0, steps, lambda _, c: body(params, c), carry)

    compiled = Compiled(jax.jit(run), params, carry)
    for _ in range(warmup):
        jax.block_until_ready(compiled.executable(params, carry))
    return compiled


def in_loop_step(model, params, k: int, batch: int = 1, fill: int = 128, steps: int = 32,
                 repeats: int = 5, head_rows: int | None = None) -> Timed:
    """Seconds of one ``extend`` of ``k`` tokens per row (``in_loop``; each step
    feeds the previous step's argmax, a real data dependency, at a fixed cache
    fill of ``fill`` tokens, so every step costs the same). With ``head_rows``
    only the last that many positions get logits (``logits_at``: a drafter's
    catch-up call needs one)."""
    body, carry = _step_loop(model, k, batch, fill, head_rows)
    return in_loop(body, params, carry, steps=steps, repeats=repeats)


def in_loop_steps_in_turn(calls, *, batch: int = 1, fill: int = 128, steps: int = 32,
                          repeats: int = 5) -> list[Timed]:
    """``in_loop_step`` of several calls ``(model, params, k, head_rows)``: all
    compiled and warmed up first, then timed in turn, one run of each per
    repeat. A machine whose speed changes from one phase to the next (a shared
    2-core CPU) then slows every call of a phase alike, and the ratios between
    calls, which choose a draft length, hold better. Timed one after the
    other, the 1.5B's 9-token call read 2.7x its step at the start of one
    fresh-clone first command and 1.46x in a benchmark the same hour."""
    programs = []
    for model, params, k, head_rows in calls:
        body, carry = _step_loop(model, k, batch, fill, head_rows)
        programs.append((_warm_loop(body, params, carry, steps=steps, warmup=1), params, carry))
    runs: list[list[float]] = [[] for _ in programs]
    outputs: list[Any] = [None] * len(programs)
    for _ in range(repeats):
        for i, (compiled, params, carry) in enumerate(programs):
            timed = compiled.time(params, carry)
            runs[i].append(timed.run_s[0] / steps)
            outputs[i] = timed.output
    return [Timed(compile_s=compiled.compile_s, run_s=run_s, output=output)
            for (compiled, _, _), run_s, output in zip(programs, runs, outputs, strict=True)]


def _step_loop(model, k: int, batch: int, fill: int, head_rows: int | None):
    """``(body, carry)`` of ``in_loop_step``'s loop."""
    cache = model.init_cache(batch, fill + k).replace(
        lengths=jnp.full((batch,), fill, jnp.int32))
    at = None if head_rows is None else jnp.broadcast_to(
        jnp.arange(k - head_rows, k), (batch, head_rows))

    def body(params, carry):
        tokens, cache = carry
        out = model.extend(params, tokens, cache, logits_at=at)
        chosen = first_argmax(out.logits)
        return (jnp.broadcast_to(chosen[:, -1:], (batch, k)),
                out.cache.replace(lengths=cache.lengths))

    return body, (jnp.ones((batch, k), jnp.int32), cache)


def round_overhead(round_s: float, drafter_calls_per_round: float, drafter_step_s: float,
                   scoring_step_s: float) -> float:
    """How much a speculative round costs beyond its model calls:
    ``round / (drafter calls x drafter step + target step of G + 1 tokens) - 1``,
    every term an in-loop time (``in_loop_step``); 0 means the loop around
    the models is free."""
    return round_s / (drafter_calls_per_round * drafter_step_s + scoring_step_s) - 1.0


def prefill_fn(model, max_length: int):
    """Jitted prefill of one model alone, as the decoders do it: end-to-end
    times minus its time give decode times. It returns the filled cache: a
    function returning only the pending token (the prompt's last token, no
    compute) would let XLA drop the whole prefill as dead code."""
    return jax.jit(lambda params, prompt: start_token_and_prefill(
        model, params, prompt, max_length)[0])


def seconds(fn, *args) -> tuple[float, Any]:
    """Wall seconds of ``fn(*args)`` until its outputs are ready, and the outputs."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return time.perf_counter() - start, out


def checkout_commit() -> str | None:
    """The commit of the checkout the package runs from (``git rev-parse``),
    with ``+`` when its tree has uncommitted changes; None for an installed
    package or where git cannot answer."""
    root = pathlib.Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=10, check=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head.strip() + ("+" if dirty.strip() else "")


def environment() -> dict[str, str | None]:
    """Machine, versions, date and commit, recorded with every figure."""

    device = jax.devices()[0]
    return {
        "machine": f"{platform.processor() or platform.machine()} ({jax.device_count()} "
                   f"{device.platform} device(s): {device.device_kind})",
        "cpu_count": str(os.cpu_count()),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "flax": flax.__version__,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": checkout_commit(),
    }


def write_report(report: dict, path: str) -> None:
    """Writes a benchmark's JSON report (figures plus ``environment()``), making
    the directory; benchmarks call it after every section so a long run that
    is stopped early keeps what it measured. Atomic, and compressed when the
    path ends in ``.gz`` (as committed reports are)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    jsonio.write_json(path, report, indent=2)


def print_markdown(text: str, path: str | None = None) -> None:
    """Prints a benchmark's Markdown summary and writes it to ``path`` if given."""
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
