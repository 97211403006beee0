"""Flax models behind one functional interface (see ``interface``)."""

from specdec_jax.models.decoder_only import DecoderCache, DecoderConfig, DecoderOnlyLM
from specdec_jax.models.interface import LanguageModel, Prompt, StepOutput, make_prompt
from specdec_jax.models.t5 import T5Cache, T5Config, T5EncoderDecoderLM

__all__ = ["DecoderCache", "DecoderConfig", "DecoderOnlyLM", "LanguageModel", "Prompt",
           "StepOutput", "T5Cache", "T5Config", "T5EncoderDecoderLM", "make_prompt"]
