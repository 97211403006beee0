"""Builds Hugging Face reference models (the peer) for parity tests."""

from __future__ import annotations

import numpy as np
import torch
import transformers

from specdec_jax.checkpoints.hf_decoder import decoder_config_from_hf, decoder_params_from_hf


def small_hf_decoder(family: str, seed: int = 0, tie: bool = False):
    """A random small Llama or Qwen2 model (torch, float32, eval) and its config dict."""
    torch.manual_seed(seed)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6,
                  max_position_embeddings=128, tie_word_embeddings=tie)
    if family == "llama":
        config = transformers.LlamaConfig(rope_theta=10000.0, **common)
        model = transformers.LlamaForCausalLM(config)
    elif family == "qwen2":
        config = transformers.Qwen2Config(rope_theta=1e6, **common)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        raise ValueError(family)
    model.eval()
    # HF initialises biases to zero; randomise them so the bias path is exercised.
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                tensor.add_(0.1 * torch.randn_like(tensor))
    return model, config.to_dict()


def ours_from_hf(model, config_dict):
    """Our (config, params) carrying the exact weights of a HF decoder."""
    cfg = decoder_config_from_hf(config_dict)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return cfg, decoder_params_from_hf(state, cfg)


def hf_logits(model, tokens: list[int]) -> np.ndarray:
    """Full-sequence next-token logits [len, V] from the peer."""
    with torch.no_grad():
        out = model(torch.tensor([tokens]))
    return out.logits[0].numpy()
