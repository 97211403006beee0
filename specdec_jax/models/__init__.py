"""Flax models behind one functional interface (see ``interface``)."""

from specdec_jax.models.decoder import DecoderCache, DecoderConfig, DecoderOnlyLM
from specdec_jax.models.interface import LanguageModel, Prompt, StepOutput, make_prompt

__all__ = ["DecoderCache", "DecoderConfig", "DecoderOnlyLM", "LanguageModel", "Prompt",
           "StepOutput", "make_prompt"]
