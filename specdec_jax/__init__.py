"""specdec_jax: speculative decoding, speculative cascades and drafter training in JAX."""

from specdec_jax.models import (DecoderCache, DecoderConfig, DecoderOnlyLM, LanguageModel,
                                Prompt, StepOutput, make_prompt)

__version__ = "0.1.0"
