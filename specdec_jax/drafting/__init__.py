"""Drafting strategies behind one interface (``base.py``): a neural model,
Max-Gram, a feature-level head on the target's hidden states (EAGLE-style),
Cascade Speculative Drafting's vertical and horizontal cascades with the
K-matrix composition, and SpecDec++'s adaptive draft length."""

from specdec_jax.drafting.adaptive import AdaptiveDrafter, AdaptiveFeatureDrafter
from specdec_jax.drafting.base import Context, Drafter, Proposal, is_drafter, needs_features
from specdec_jax.drafting.cs_drafting import (
    FeatureVerticalCascade,
    HorizontalCascade,
    VerticalCascade,
    cs_drafter,
    drafter_gamma,
    lenient_law,
    parse_k_matrix,
)
from specdec_jax.drafting.feature import FeatureDrafter
from specdec_jax.drafting.maxgram import MaxGramDrafter
from specdec_jax.drafting.model_drafter import ModelDrafter
from specdec_jax.drafting.spec import feature_path, make_drafter, parse_spec
from specdec_jax.drafting.tree import (
    DynamicTreeDrafter,
    MaxGramTreeDrafter,
    StaticTreeDrafter,
    TreeProposal,
    TreeShape,
)
from specdec_jax.models.feature_head import FeatureHead, FeatureHeadConfig

__all__ = [
    "AdaptiveDrafter", "AdaptiveFeatureDrafter", "Context", "Drafter", "DynamicTreeDrafter",
    "FeatureDrafter", "FeatureHead", "FeatureHeadConfig", "FeatureVerticalCascade",
    "HorizontalCascade", "MaxGramDrafter", "MaxGramTreeDrafter", "ModelDrafter", "Proposal",
    "StaticTreeDrafter", "TreeProposal", "TreeShape", "VerticalCascade", "cs_drafter",
    "drafter_gamma", "feature_path", "is_drafter", "lenient_law", "make_drafter",
    "needs_features", "parse_k_matrix", "parse_spec",
]
