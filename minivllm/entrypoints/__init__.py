"""User-facing entry points: the offline LLM API, the OpenAI-compatible server, the CLI."""
