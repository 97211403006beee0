"""Hugging Face safetensors directories: load (Llama/Qwen2) and export.

Export writes our decoder parameters as a directory ``transformers`` can load
(``config.json`` + ``model.safetensors``), so drafters trained here can be run
by the peer implementation.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from specdec_jax.checkpoints.hf_decoder import (
    decoder_config_from_hf,
    decoder_config_to_hf,
    decoder_params_from_hf,
    decoder_params_to_hf,
)
from specdec_jax.models.decoder_only import DecoderConfig


def read_state_dict(directory: os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a (possibly sharded) safetensors checkpoint, as float32 numpy."""
    from safetensors.numpy import load_file  # noqa: PLC0415

    directory = pathlib.Path(directory)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} has no *.safetensors files; is it a Hugging "
                                "Face model directory?")
    state: dict[str, np.ndarray] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except Exception as err:  # safetensors raises its own error types
            raise ValueError(f"{file} is not a readable safetensors file ({err}); it may be "
                             "truncated: download it again.") from err
    return {k: np.asarray(v, np.float32) for k, v in state.items()}


def load_hf_decoder(directory: os.PathLike) -> tuple[DecoderConfig, dict]:
    directory = pathlib.Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory} has no config.json; is it a Hugging Face model "
                                "directory?")
    cfg = decoder_config_from_hf(json.loads(config_path.read_text()))
    return cfg, decoder_params_from_hf(read_state_dict(directory), cfg)


def export_hf_decoder(params, cfg: DecoderConfig, directory: os.PathLike,
                      model_type: str = "llama") -> pathlib.Path:
    """Writes ``config.json`` + ``model.safetensors`` loadable by ``transformers``."""
    from safetensors.numpy import save_file  # noqa: PLC0415

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(decoder_config_to_hf(cfg, model_type),
                                                      indent=2))
    save_file(decoder_params_to_hf(params, cfg), str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    return directory
