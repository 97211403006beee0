"""SpecDec++ (seed 004; ALGORITHMS.md §6): an acceptance head on the drafter's
hidden state decides, token by token, when to stop drafting.

``head``: the head module, its parameters saved with the drafter they belong to.
The adaptive drafter itself is ``specdec_jax.drafting.adaptive``.
"""

from specdec_jax.specdecpp.head import (
    AcceptanceHead,
    HeadConfig,
    drafter_fingerprint,
    load_head,
    save_head,
)

__all__ = ["AcceptanceHead", "HeadConfig", "drafter_fingerprint", "load_head", "save_head"]
