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

    # ------------------------------------------------------------------ sleep mode (vLLM: abstract.py:318-356)
    is_sleeping = False
    sleeping_tags: frozenset[str] = frozenset()

    def sleep(self, level: int = 1) -> None:
        """Every worker sleeps (Worker.sleep); both tags stay asleep until woken. Sleeping again is a no-op."""
        if self.is_sleeping:
            return
        self.collective_rpc("sleep", (level,))
        self.sleeping_tags, self.is_sleeping = frozenset({"weights", "kv_cache"}), True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Wake the given tags (None: all); a tag that is not asleep makes the call a no-op, as in vLLM."""
        if not self.is_sleeping or (tags and any(t not in self.sleeping_tags for t in tags)):
            return
        self.collective_rpc("wake_up", (tags,))
        self.sleeping_tags = self.sleeping_tags - set(tags) if tags else frozenset()
        self.is_sleeping = bool(self.sleeping_tags)
