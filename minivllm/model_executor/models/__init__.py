"""The model registry: config.architectures[0] -> class (vLLM: model_executor/models/registry.py)."""
from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

from minivllm.model_executor.models.llama import LlamaForCausalLM
from minivllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from minivllm.model_executor.models.qwen3 import Qwen3ForCausalLM

_MODELS: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def get_model_architecture(config: PretrainedConfig) -> type[nn.Module]:
    """The minivllm class for an HF config, or a ValueError naming what is supported."""
    archs = getattr(config, "architectures", None) or []
    for arch in archs:
        if arch in _MODELS:
            return _MODELS[arch]
    raise ValueError(f"model architecture {archs or '(none in config.json)'} is not supported; "
                     f"minivllm supports {sorted(_MODELS)}")


__all__ = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "get_model_architecture"]
