"""Qwen3: Llama with per-head RMSNorm on q and k before RoPE (vLLM: model_executor/models/qwen3.py)."""
from __future__ import annotations

from minivllm.model_executor.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 dense: q_norm/k_norm over each head, explicit head_dim, no qkv bias by default."""

    qk_norm = True
