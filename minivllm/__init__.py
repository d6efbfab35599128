"""minivllm: a compact re-implementation of vLLM V1 for learning how inference engines work."""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineArgs"]


def __getattr__(name: str):
    # Lazy, so that `import minivllm.core...` (scheduler only) stays free of torch and transformers.
    if name == "LLM":
        from minivllm.entrypoints.llm import LLM
        return LLM
    if name == "SamplingParams":
        from minivllm.sampling_params import SamplingParams
        return SamplingParams
    if name in ("RequestOutput", "CompletionOutput"):
        from minivllm import outputs
        return getattr(outputs, name)
    if name == "EngineArgs":
        from minivllm.config import EngineArgs
        return EngineArgs
    raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
