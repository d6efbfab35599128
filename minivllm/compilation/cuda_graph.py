"""CUDA graphs for decode batches: which padded size a batch runs at, and capture / replay per size.

vLLM splits this over three files; the names are kept: BatchDescriptor (vllm/forward_context.py), the
CudagraphDispatcher that maps a batch to a captured size (vllm/v1/cudagraph_dispatcher.py) and the
CUDAGraphWrapper that captures a runnable once per descriptor and replays it
(vllm/compilation/cuda_graph.py). minivllm captures the whole model forward for uniform decode batches
only (vLLM's FULL_DECODE_ONLY mode); every other batch runs eagerly. The static input buffers the
graphs read live in the runner (GPUModelRunner), which alone owns device tensors.

Without CUDA (or for tests) the wrapper's "replay" is an eager call on the same static buffers, so the
padding path runs everywhere and only the capture itself needs a GPU.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

PAD_SLOT_ID = -1  # slot_mapping value of a padded row: the KV cache write skips it


@dataclass(frozen=True)
class BatchDescriptor:
    """The key of one captured graph: the padded token count (== requests, one token each)."""

    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False


class CudagraphDispatcher:
    """Maps a batch to the smallest capture size that holds it, or to None (run eagerly)."""

    def __init__(self, capture_sizes: list[int]) -> None:
        self.capture_sizes = sorted(set(capture_sizes))

    def padded_size(self, num_tokens: int) -> int | None:
        i = bisect.bisect_left(self.capture_sizes, num_tokens)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def dispatch(self, num_tokens: int, uniform_decode: bool) -> BatchDescriptor | None:
        """A descriptor for a uniform decode batch that fits a capture size; None for anything else."""
        if not uniform_decode or num_tokens == 0:
            return None
        size = self.padded_size(num_tokens)
        return None if size is None else BatchDescriptor(size, size, True)

    def get_capture_descs(self) -> list[BatchDescriptor]:
        """Largest first, as vLLM captures: the smaller graphs then reuse the memory pool's blocks."""
        return [BatchDescriptor(s, s, True) for s in reversed(self.capture_sizes)]


@dataclass
class CUDAGraphEntry:
    batch_descriptor: BatchDescriptor
    cudagraph: torch.cuda.CUDAGraph | None = None
    output: Any = None
    input_addresses: list[int] | None = None


class CUDAGraphWrapper:
    """Captures `runnable` once per BatchDescriptor and replays it; eager when use_cuda_graph is False.

    As in vLLM the wrapper keeps no input buffers: the caller must pass the same static tensors at every
    call for a descriptor (checked by address) and refill them in place before calling.
    """

    def __init__(self, runnable: Callable[..., Any], use_cuda_graph: bool, graph_pool=None) -> None:
        self.runnable = runnable
        self.use_cuda_graph = use_cuda_graph
        self.graph_pool = graph_pool if graph_pool is not None or not use_cuda_graph else torch.cuda.graph_pool_handle()
        self.concrete_cudagraph_entries: dict[BatchDescriptor, CUDAGraphEntry] = {}

    def capture(self, desc: BatchDescriptor, *args, num_warmups: int = 1) -> None:
        """Warm up eagerly (Triton compiles, cuBLAS picks kernels), then record one graph for desc."""
        if not self.use_cuda_graph:
            return
        for _ in range(num_warmups):
            self.runnable(*args)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graph_pool):
            output = self.runnable(*args)
        torch.cuda.synchronize()
        self.concrete_cudagraph_entries[desc] = CUDAGraphEntry(
            desc, graph, output, [a.data_ptr() for a in args if isinstance(a, torch.Tensor)])

    def __call__(self, desc: BatchDescriptor, *args) -> Any:
        if not self.use_cuda_graph:
            return self.runnable(*args)
        entry = self.concrete_cudagraph_entries.get(desc)
        if entry is None:
            raise RuntimeError(f"no CUDA graph captured for {desc}; capture_model() must run first")
        assert entry.input_addresses == [a.data_ptr() for a in args if isinstance(a, torch.Tensor)], \
            "a CUDA graph replays on the static buffers it was captured with"
        entry.cudagraph.replay()
        return entry.output

    def clear_graphs(self) -> None:
        self.concrete_cudagraph_entries.clear()
