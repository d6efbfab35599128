"""OpenAI-compatible HTTP server over AsyncLLM (vLLM: vllm/entrypoints/openai/)."""
