"""Attention: one interface (backend.py), a torch reference and Triton paged-attention kernels."""
from minivllm.attention.backend import AttentionBackend, AttentionImpl, AttentionMetadata
from minivllm.attention.selector import get_attn_backend

__all__ = ["AttentionBackend", "AttentionImpl", "AttentionMetadata", "get_attn_backend"]
