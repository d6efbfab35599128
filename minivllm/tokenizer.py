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
    # vLLM loads a generating model's tokenizer with truncation_side "left" (vllm/tokenizers/registry.py:133-137):
    # a prompt truncated by the tokenizer keeps its special tokens and its last text tokens.
    tok = AutoTokenizer.from_pretrained(resolve_model_path(path), truncation_side="left")
    if not tok.is_fast:
        raise ValueError(f"{path}: minivllm needs a fast (tokenizers) tokenizer")
    return tok
