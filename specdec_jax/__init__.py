"""specdec_jax: speculative decoding, speculative cascades and drafter training in JAX.

Import is cheap: no model is built and nothing is compiled at import time.
"""

from specdec_jax.api import (
    VERIFIERS,
    generate,
    get_verifier,
    make_decoder,
    make_generate_fn,
    sampling_params,
)
from specdec_jax.decoding import GenerationOutput, GenerationStats, SamplingParams
from specdec_jax.models import (
                                DecoderCache,
                                DecoderConfig,
                                DecoderOnlyLM,
                                LanguageModel,
                                Prompt,
                                StepOutput,
                                make_prompt,
)
from specdec_jax.targets import METHODS

__version__ = "0.1.0"

__all__ = [
    "METHODS", "VERIFIERS", "DecoderCache", "DecoderConfig", "DecoderOnlyLM",
    "GenerationOutput", "GenerationStats", "LanguageModel", "Prompt", "SamplingParams",
    "StepOutput", "T5Config", "T5EncoderDecoderLM", "generate", "get_verifier",
    "make_decoder", "make_generate_fn", "make_prompt", "sampling_params",
]
