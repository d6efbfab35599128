"""Pick the attention backend: "auto" is Triton on CUDA and the torch reference on CPU."""
from __future__ import annotations

import os

from minivllm.attention.backend import AttentionBackend


def get_attn_backend(name: str, device: str) -> type[AttentionBackend]:
    name = name.lower()
    if name == "auto":
        name = "triton" if device.startswith("cuda") else "torch"
    if name == "torch":
        from minivllm.attention.backends.torch_attn import TorchAttentionBackend
        return TorchAttentionBackend
    if name == "triton":
        if not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError('attention_backend="triton" on CPU needs TRITON_INTERPRET=1 set before triton '
                             "is imported (slow: for tests and lessons)")
        from minivllm.attention.backends.triton_attn import TritonAttentionBackend
        return TritonAttentionBackend
    raise ValueError(f"unknown attention_backend {name!r}; choose auto, torch or triton")
