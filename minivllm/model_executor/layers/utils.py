"""CPU GEMM dispatch (vLLM: model_executor/layers/utils.py dispatch_cpu_unquantized_gemm).

On CPU vLLM does not call F.linear: after loading, each linear layer's weight is reordered once into oneDNN's
blocked layout (vLLM's ops.create_onednn_mm(weight.t(), 32)), and every forward runs oneDNN's matmul on it.
F.linear hands the [N, K] weight to MKL's sgemm, which re-packs it on every call; at decode sizes (a few rows
of activations against megabytes of weights) that packing costs as much as the multiply. torch ships the same
oneDNN primitives (torch.ops.mkldnn), so minivllm prepacks with them: 1.3-4.5x faster GEMMs here, results within
float32 rounding of F.linear (checked in tests/test_models.py).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

PACK_BATCH_HINT = 32  # vLLM's hint to oneDNN for the activation rows it will see (create_onednn_mm(..., 32))


def onednn_available(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dim() == 2 and weight.dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def dispatch_cpu_unquantized_gemm(layer: nn.Module) -> None:
    """Give `layer` its cpu_linear(x, weight, bias): oneDNN on a prepacked copy of layer.weight where it can.

    The copy is taken now: call this after the weights are loaded (get_model's process_weights_after_loading).
    layer.weight stays (the loaders, tensor-parallel slicing and lessons read it); the copy doubles weight memory.
    """
    weight = layer.weight
    if not onednn_available(weight):
        layer.cpu_linear = F.linear
        return
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
    pointwise = torch.ops.mkldnn._linear_pointwise

    def cpu_linear(x: torch.Tensor, _weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return pointwise(x, packed, bias, "none", [], "")

    layer.cpu_linear = cpu_linear


def unquantized_gemm(layer: nn.Module) -> Callable[..., torch.Tensor]:
    """layer.cpu_linear once dispatched, else F.linear (CUDA, or a layer built without the model loader)."""
    return getattr(layer, "cpu_linear", F.linear)


def process_weights_after_loading(model: nn.Module) -> None:
    """vLLM: model_loader/utils.py process_weights_after_loading — each layer's post-load step (here: packing)."""
    for module in model.modules():
        hook = getattr(type(module), "process_weights_after_loading", None)
        if hook is not None:
            hook(module)
