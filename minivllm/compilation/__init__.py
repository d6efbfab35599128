"""CUDA graph capture and replay (vLLM: vllm/compilation/)."""
