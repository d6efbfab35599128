"""Qwen2: Llama with a bias on the q/k/v projections (vLLM: model_executor/models/qwen2.py)."""
from __future__ import annotations

from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend
from minivllm.model_executor.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5: the Llama graph with qkv bias (o_proj has none)."""

    def __init__(self, config: PretrainedConfig, attn_backend: type[AttentionBackend]) -> None:
        if getattr(config, "use_sliding_window", False):
            raise ValueError("Qwen2 with use_sliding_window=True is not supported by minivllm")
        super().__init__(config, attn_backend)

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        return True, False
