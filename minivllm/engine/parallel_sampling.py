"""Parallel sampling, n > 1 (vLLM: v1/engine/parallel_sampling.py ParentRequest).

A request asking for n samples fans out into n child requests that the engine runs independently
(they share the prompt's KV blocks through the prefix cache). Each child is an ordinary request with
n=1; a seeded parent gives child i the seed `seed + i`, so every sample is reproducible on its own and
the children differ from one another.
"""
from __future__ import annotations

import msgspec

from minivllm.sampling_params import SamplingParams


class ParentRequest:
    """The parent of n children: their request ids and sampling params."""

    def __init__(self, request_id: str, sampling_params: SamplingParams) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params

    @property
    def n(self) -> int:
        return self.sampling_params.n

    def _get_child_sampling_params(self, index: int) -> SamplingParams:
        seed = self.sampling_params.seed
        return msgspec.structs.replace(self.sampling_params, n=1, seed=None if seed is None else seed + index)

    def get_child_info(self, index: int) -> tuple[str, SamplingParams]:
        """(child request id, child sampling params), named as vLLM names them."""
        return f"{index}_{self.request_id}", self._get_child_sampling_params(index)
