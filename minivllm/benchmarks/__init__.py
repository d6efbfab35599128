"""Benchmarks shipped with the package (vLLM: vllm/benchmarks/)."""
