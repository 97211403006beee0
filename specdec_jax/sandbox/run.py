"""Running programs in the sandbox: one, or many in order, each scored as an ``Outcome``."""

from __future__ import annotations

import secrets

from specdec_jax.runtime.progress import tqdm
from specdec_jax.sandbox import probe
from specdec_jax.sandbox.limits import Limits
from specdec_jax.sandbox.outcome import Outcome, classify
from specdec_jax.sandbox.process import SandboxError, execute


def run_with_layers(source: str, limits: Limits, *, audit_hook: bool = True,
                    layers: probe.Isolation | None = None) -> Outcome:
    """``run_program`` without the isolation check; tests pass ``audit_hook=False``
    to check the kernel layers alone, or ``layers`` to run under other layers
    than ``probe.isolation()``."""
    layers = probe.isolation() if layers is None else layers
    token = secrets.token_hex(16)
    config = {**layers.harness_config(), "token": token, "audit_hook": audit_hook}
    try:
        code, stdout, stderr = execute(source, limits, layers.command, config)
    except SandboxError as exc:
        return Outcome(False, "error", str(exc))
    return classify(code, stdout, stderr, token, limits)


def run_program(source: str, limits: Limits = Limits(), *,
                require_kernel_isolation: bool | None = None) -> Outcome:
    """Runs ``source`` in the sandbox; passed when it runs to its end within the
    limits. Raises IsolationError when kernel isolation is required (None: as
    ``REQUIRE_KERNEL_ENV`` says) and missing."""
    probe.check_isolation(require_kernel_isolation)
    return run_with_layers(source, limits)


def run_programs(sources: list[str], limits: Limits = Limits(), progress: bool = True, *,
                 require_kernel_isolation: bool | None = None) -> list[Outcome]:
    """One sandboxed subprocess per program, in order. The isolation is checked
    (as in ``run_program``) before anything runs; a program that crashes, hangs
    or even breaks the harness is scored as not passed, and the next one still
    runs. ``isolation_level()`` says what they ran under."""
    probe.check_isolation(require_kernel_isolation)
    outcomes = []
    for source in tqdm(sources, desc="pass@1 sandbox", unit="sample", disable=not progress):
        try:
            outcomes.append(run_with_layers(source, limits))
        except Exception as exc:  # one broken sample must not end the run
            outcomes.append(Outcome(False, "error", f"sandbox failure: {exc!r}"))
    return outcomes
