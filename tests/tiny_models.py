"""Tiny random HF checkpoints built offline, for checking minivllm's models against transformers.

Each variant stresses one thing: odd head counts (GQA 6:2 and 6:3), explicit head_dim != hidden/heads,
llama3 rope scaling, tied embeddings, a sharded save. The default model's tokenizer is copied in, so the
vocab is the same and the engine can tokenize prompts for any of them.
"""
from __future__ import annotations

import json
from pathlib import Path

from autograder.vllm_oracle.models import SHIPPED as DEFAULT_MODEL
from autograder.vllm_oracle.models import save_tiny

_COMMON = dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=6,
               num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
               initializer_range=0.1, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
               pad_token_id=3)
_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
# variant -> (HF architecture, config overrides, save_pretrained kwargs)
TINY_VARIANTS: dict[str, tuple[str, dict, dict]] = {
    "llama": ("LlamaForCausalLM", {}, {}),
    "llama3-rope": ("LlamaForCausalLM", {"rope_parameters": _LLAMA3_ROPE, "num_hidden_layers": 3}, {}),
    "llama-tied": ("LlamaForCausalLM", {"tie_word_embeddings": True, "num_key_value_heads": 3}, {}),
    "llama-sharded": ("LlamaForCausalLM", {"num_hidden_layers": 3}, {"max_shard_size": "600KB"}),
    "qwen2": ("Qwen2ForCausalLM", {"num_key_value_heads": 3}, {}),
    "qwen3": ("Qwen3ForCausalLM", {"hidden_size": 64, "head_dim": 16}, {}),
}


def default_vocab_size() -> int:
    return json.loads((DEFAULT_MODEL / "config.json").read_text())["vocab_size"]


def make_tiny_model(arch: str, path: str | Path, *, seed: int = 0, max_shard_size: str | None = None,
                    **overrides) -> str:
    """Save a random float32 checkpoint for a variant name (TINY_VARIANTS) or an HF architecture name
    (transformers' own init; the oracle's one factory, autograder/vllm_oracle/models.py)."""
    arch_name, variant_overrides, save_kwargs = TINY_VARIANTS.get(arch, (arch, {}, {}))
    model_type = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
    if arch_name not in model_type:
        raise ValueError(f"no tiny model for {arch!r}; choose from {sorted(TINY_VARIANTS)} or {sorted(model_type)}")
    kwargs = _COMMON | {"vocab_size": default_vocab_size()} | variant_overrides | overrides
    if max_shard_size:
        save_kwargs = save_kwargs | {"max_shard_size": max_shard_size}
    return str(save_tiny(Path(path), arch_name, model_type[arch_name], kwargs, seed=seed, own_init=False,
                         **save_kwargs))
