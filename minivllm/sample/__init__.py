"""Sampling: turn logits into tokens (and logprobs)."""
