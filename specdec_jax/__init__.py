"""specdec_jax: speculative decoding, speculative cascades and drafter training in JAX.

Import is cheap: no model is built and nothing is compiled at import time.
"""

from specdec_jax.api import (
    decode_layout,
    generate,
    make_decoder,
    make_generate_fn,
    sampling_params,
)
from specdec_jax.decode.methods import METHOD_NAMES as METHODS
from specdec_jax.decode.stats import GenerationOutput, GenerationStats
from specdec_jax.decode.tree import TreeSpec
from specdec_jax.drafting import (
    HorizontalCascade,
    MaxGramDrafter,
    ModelDrafter,
    VerticalCascade,
    cs_drafter,
    make_drafter,
)
from specdec_jax.drafting.tree import DynamicTreeDrafter, StaticTreeDrafter, TreeShape
from specdec_jax.models import (
    DecoderCache,
    DecoderConfig,
    DecoderOnlyLM,
    LanguageModel,
    Prompt,
    StepOutput,
    T5Config,
    T5EncoderDecoderLM,
    make_prompt,
)
from specdec_jax.sampling import SamplingParams
from specdec_jax.verify import TREE_VERIFIERS, VERIFIERS, get_verifier

__version__ = "0.1.0"

__all__ = [
    "METHODS", "TREE_VERIFIERS", "VERIFIERS", "DecoderCache", "DecoderConfig",
    "DecoderOnlyLM", "DynamicTreeDrafter", "GenerationOutput", "GenerationStats",
    "HorizontalCascade", "LanguageModel", "MaxGramDrafter", "ModelDrafter", "Prompt",
    "SamplingParams", "StaticTreeDrafter", "StepOutput", "T5Config", "T5EncoderDecoderLM",
    "TreeShape", "TreeSpec", "VerticalCascade", "cs_drafter", "decode_layout", "generate",
    "get_verifier", "make_decoder", "make_drafter", "make_generate_fn", "make_prompt",
    "sampling_params",
]
