"""The ``specdec-jax`` command line: ``main`` dispatches ``fetch``, ``cache``,
``generate``, ``eval`` and ``train``; ``generate`` runs speculative generation
on real models with the speedup over the target alone measured in the same run."""

from specdec_jax.jobs.cli.main import main

__all__ = ["main"]
