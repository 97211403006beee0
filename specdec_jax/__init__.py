"""specdec_jax: speculative decoding, speculative cascades and drafter training in JAX."""

from specdec_jax.models import (DecoderCache, DecoderConfig, DecoderOnlyLM, LanguageModel,
                                Prompt, StepOutput, make_prompt)

__version__ = "0.1.0"

from specdec_jax.api import generate, get_verifier, make_generate_fn, sampling_params
from specdec_jax.decoding import GenerationOutput, GenerationStats, SamplingParams
from specdec_jax.targets import METHODS
