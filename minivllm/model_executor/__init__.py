"""Model definitions, their layers and checkpoint loading (vLLM: vllm/model_executor)."""
from minivllm.model_executor.model_loader import get_model, load_hf_config, resolve_model_path

__all__ = ["get_model", "load_hf_config", "resolve_model_path"]
