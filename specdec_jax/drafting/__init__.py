"""Drafting strategies behind one interface (``base.py``): a neural model,
Max-Gram, Cascade Speculative Drafting's vertical and horizontal cascades
with the K-matrix composition, and SpecDec++'s adaptive draft length."""

from specdec_jax.drafting.adaptive import AdaptiveDrafter
from specdec_jax.drafting.base import Context, Drafter, Proposal, is_drafter
from specdec_jax.drafting.cascade import (
    HorizontalCascade,
    VerticalCascade,
    cs_drafter,
    drafter_gamma,
    lenient_law,
    parse_k_matrix,
)
from specdec_jax.drafting.maxgram import MaxGramDrafter
from specdec_jax.drafting.model import ModelDrafter
from specdec_jax.drafting.spec import make_drafter, parse_spec

__all__ = [
    "AdaptiveDrafter", "Context", "Drafter", "HorizontalCascade", "MaxGramDrafter",
    "ModelDrafter", "Proposal", "VerticalCascade", "cs_drafter", "drafter_gamma",
    "is_drafter", "lenient_law", "make_drafter", "parse_k_matrix", "parse_spec",
]
