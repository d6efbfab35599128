"""Metrics read back in-process (vLLM: vllm/v1/metrics/)."""
