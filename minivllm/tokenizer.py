"""Tokenizer loading (vLLM: vllm/transformers_utils/tokenizer.py)."""
from __future__ import annotations

import os
from functools import lru_cache


@lru_cache(maxsize=8)
def get_tokenizer(path: str):
    """A fast HF tokenizer from a local model folder (the hub only when a network exists)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer

    from minivllm.model_executor.model_loader import resolve_model_path
    tok = AutoTokenizer.from_pretrained(resolve_model_path(path))
    if not tok.is_fast:
        raise ValueError(f"{path}: minivllm needs a fast (tokenizers) tokenizer")
    return tok


def encode_truncated(tokenizer, text: str, max_length: int, add_special_tokens: bool = True) -> list[int]:
    """`text`'s ids cut to max_length as vLLM's tokenizer cuts them: vLLM passes truncation=True, max_length to
    the HF tokenizer (TokenizeParams.get_encode_kwargs, vllm/renderers/params.py:316-337), which it loads with
    truncation_side "left" (vllm/tokenizers/registry.py:133-137), so the special tokens stay and the last text
    tokens fill the rest: "ROMEO:" cut to 2 is [BOS, ":"]. Computed here rather than by the HF call, whose
    truncation is state on the shared Rust tokenizer (a concurrent encode would see it, or reset it)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    full = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if len(full) <= max_length:
        return full
    head = next((i for i in range(len(full) - len(ids) + 1) if full[i:i + len(ids)] == ids), None)
    if head is None:  # the special tokens changed how the text tokenizes: keep the last ids
        return full[-max_length:]
    prefix, suffix = full[:head], full[head + len(ids):]
    keep = max(max_length - len(prefix) - len(suffix), 0)
    return prefix + (ids[-keep:] if keep else []) + suffix
