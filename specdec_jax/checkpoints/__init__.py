"""Checkpoint loaders and exporters: HF safetensors, GGUF, t5x, orbax; model registry."""
