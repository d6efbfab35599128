"""Executor (vLLM: v1/executor/abstract.py): the engine's handle on its workers, whatever their number."""
from __future__ import annotations

from minivllm.config import VllmConfig


class Executor:
    """What EngineCore calls each step; get_class picks the implementation from the parallel config."""

    @staticmethod
    def get_class(vllm_config: VllmConfig) -> type[Executor]:
        """'uni' (tensor_parallel_size=1): one Worker in this process; 'mp': one process per rank."""
        backend = vllm_config.parallel_config.distributed_executor_backend
        if backend == "mp":
            from minivllm.executor.multiproc_executor import MultiprocExecutor
            return MultiprocExecutor
        if backend == "uni":
            from minivllm.executor.uniproc_executor import UniProcExecutor
            return UniProcExecutor
        raise ValueError(f"unknown distributed_executor_backend {backend!r}; choose 'uni' or 'mp'")
