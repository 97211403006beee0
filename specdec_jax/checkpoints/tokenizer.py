"""Tokenizers rebuilt from checkpoint metadata (GGUF) or loaded from files.

GGUF files of the Llama/Qwen2 families carry a GPT-2 style byte-level BPE:
the token strings, the merges, token types (3 = control tokens such as
``<|im_start|>``) and a chat template. We rebuild it with ``tokenizers``; the
pre-tokenizer depends on the family (``tokenizer.ggml.pre``), as in
llama.cpp.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

# Qwen2's split pattern (the GPT-4 style regex with single digits).
_QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CONTROL, _USER_DEFINED = 3, 4
_END_OF_TEXT = ("<|endoftext|>", "<|im_end|>")


class TextTokenizer:
    """encode / decode / apply_chat_template over a ``tokenizers.Tokenizer``."""

    def __init__(self, tokenizer, eos_token_ids: Sequence[int], bos_token_id: int | None,
                 add_bos: bool, chat_template: str | None, fingerprint: str):
        self._tokenizer = tokenizer
        self.eos_token_ids = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.fingerprint = fingerprint  # equal fingerprints <=> identical vocabularies

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode([int(i) for i in ids],
                                      skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """Renders the model's own chat template (jinja2, sandboxed)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template; pass raw prompts "
                             "(drop --chat).")
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

        def raise_exception(message):
            raise ValueError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, tools=None,
            bos_token="", eos_token="")


class ByteTokenizer:
    """UTF-8 bytes as token ids (the toy models' vocabulary): 256 tokens, no
    end-of-sequence token; invalid byte sequences decode to U+FFFD."""

    VOCAB_SIZE = 256
    vocab_size = VOCAB_SIZE
    eos_token_ids: tuple[int, ...] = ()
    fingerprint = "utf-8-bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def tokenizer_from_gguf_metadata(meta: dict[str, Any]) -> TextTokenizer:
    from tokenizers import (  # noqa: PLC0415
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level "
                         "BPE, 'gpt2').")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                     fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif pre in ("smollm", "starcoder", "refact"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, kind in zip(tokens, types) if kind in (_CONTROL, _USER_DEFINED)]
    tok.add_special_tokens(specials)
    eos = [meta["tokenizer.ggml.eos_token_id"]] if "tokenizer.ggml.eos_token_id" in meta else []
    eos += [tokens.index(t) for t in _END_OF_TEXT if t in tokens]
    fingerprint = hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()[:16]
    return TextTokenizer(tok, eos, meta.get("tokenizer.ggml.bos_token_id"),
                         bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                         meta.get("tokenizer.chat_template"), fingerprint)


def tokenizer_from_hf_dir(path) -> TextTokenizer:
    """A Hugging Face ``tokenizer.json`` (+ ``tokenizer_config.json``) directory."""

    from tokenizers import Tokenizer  # noqa: PLC0415

    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    config_path = os.path.join(path, "tokenizer_config.json")
    config = json.load(open(config_path)) if os.path.exists(config_path) else {}
    eos = [tok.token_to_id(t) for t in (config.get("eos_token"), *_END_OF_TEXT)
           if isinstance(t, str) and tok.token_to_id(t) is not None]
    vocab = tok.get_vocab(with_added_tokens=True)
    fingerprint = hashlib.sha256("\n".join(sorted(vocab, key=vocab.get)).encode()).hexdigest()
    return TextTokenizer(tok, eos, None, False, config.get("chat_template"), fingerprint[:16])
