"""RMSNorm with vLLM's fused residual-add form (vLLM: model_executor/layers/layernorm.py)."""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 and cast back exactly as HF's LlamaRMSNorm does."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        orig_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(orig_dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x); with a residual, first x = x + residual and also return that sum as the new residual."""
        if residual is None:
            return self.forward_native(x)
        x = residual + x  # in the model dtype, the same add HF's decoder layer does
        return self.forward_native(x), x
