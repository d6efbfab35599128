"""Speculative decoding proposers (vLLM: v1/spec_decode/)."""
