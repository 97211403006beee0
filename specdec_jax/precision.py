"""Number formats per backend: one ``dtype`` switch, exact float32 everywhere.

``dtype="auto"`` (the default of ``load_model`` and the jobs) means float32 on
CPU, where bfloat16 buys nothing and float32 is the reference, and bfloat16 on
accelerators, where decoding is bound by the bytes of the weights. An explicit
``"float32"``, ``"bfloat16"`` or ``"float16"`` is taken as given.

float32 on a GPU is not float32 by default: JAX runs float32 matmuls as TF32
(10-bit mantissas), and logits then differ from a float32 reference by ~1e-2.
So a float32 model on an accelerator computes every matmul at
``Precision.HIGHEST`` (``matmul_precision``), and parity holds on every
backend; ``$SPECDEC_JAX_MATMUL_PRECISION`` (``default``, ``high``,
``highest``) opts into faster passes knowingly. A model config's
``matmul_precision`` (default None: decided here) is resolved where the model
runs (``resolve_matmul_precision``), so a model built from a config gets the
same treatment as one that came through the loader.
"""

from __future__ import annotations

import os

import jax

DTYPES = ("float32", "bfloat16", "float16")
AUTO = "auto"
ENV_MATMUL_PRECISION = "SPECDEC_JAX_MATMUL_PRECISION"
PRECISIONS = ("default", "high", "highest")


def resolve_dtype(dtype: str | None = AUTO, backend: str | None = None) -> str:
    """The concrete dtype name for ``dtype`` on ``backend`` (default: JAX's)."""
    if dtype in (None, AUTO):
        backend = backend or jax.default_backend()
        return "float32" if backend == "cpu" else "bfloat16"
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {AUTO!r}, {', '.join(map(repr, DTYPES))}"
                         " (auto: float32 on CPU, bfloat16 on accelerators).")
    return dtype


def resolve_matmul_precision(choice: str | None, dtype: str,
                             backend: str | None = None) -> str | None:
    """A model config's ``matmul_precision`` as its matmuls run: None (the
    default) or ``"auto"`` is ``matmul_precision(dtype, backend)`` (so the
    environment's opt-out applies); ``"default"`` is the backend's default;
    ``"high"`` and ``"highest"`` are taken as given."""
    if choice in (None, AUTO):
        return matmul_precision(dtype, backend)
    if choice is not None and choice not in PRECISIONS:
        raise ValueError(f"matmul_precision={choice!r} is not one of None, {AUTO!r}, "
                         f"{', '.join(map(repr, PRECISIONS))}.")
    return None if choice == "default" else choice


def matmul_precision(dtype: str, backend: str | None = None) -> str | None:
    """The matmul precision a model of ``dtype`` runs at on ``backend``: the
    environment's choice if set, else ``"highest"`` for float32 off CPU,
    else None (the backend's default, already exact for float32 on CPU)."""
    chosen = os.environ.get(ENV_MATMUL_PRECISION)
    if chosen:
        if chosen not in PRECISIONS:
            raise ValueError(f"${ENV_MATMUL_PRECISION}={chosen!r} is not one of "
                             f"{', '.join(PRECISIONS)}.")
        return None if chosen == "default" else chosen
    backend = backend or jax.default_backend()
    return "highest" if resolve_dtype(dtype, backend) == "float32" and backend != "cpu" else None
