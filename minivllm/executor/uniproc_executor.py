"""UniProcExecutor (vLLM: v1/executor/uniproc_executor.py): one worker, driven from a thread.

execute_model(non_block=True) returns a Future, so EngineCore's CPU work (grammar, aborts) overlaps
the forward pass: torch releases the GIL inside its kernels, on CPU as well as on CUDA.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from minivllm.config import VllmConfig
from minivllm.core.sched.output import SchedulerOutput
from minivllm.executor.abstract import Executor
from minivllm.tracing import Tracer
from minivllm.worker.gpu_worker import Worker
from minivllm.worker.outputs import ModelRunnerOutput


class UniProcExecutor(Executor):
    """A single Worker in this process; calls run on one dedicated thread, in order."""

    def __init__(self, vllm_config: VllmConfig, tracer: Tracer | None = None) -> None:
        self.vllm_config = vllm_config
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minivllm-worker")
        self.driver_worker = Worker(vllm_config, tracer)
        self.driver_worker.load_model()

    def determine_num_available_blocks(self) -> int:
        return self.driver_worker.determine_num_available_blocks()

    def initialize_cache(self, num_gpu_blocks: int) -> None:
        self.driver_worker.initialize_cache(num_gpu_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput,
                      non_block: bool = False) -> ModelRunnerOutput | None | Future:
        future = self._thread.submit(self.driver_worker.execute_model, scheduler_output)
        return future if non_block else future.result()

    def sample_tokens(self, grammar_output) -> ModelRunnerOutput:
        return self._thread.submit(self.driver_worker.sample_tokens, grammar_output).result()

    def take_draft_token_ids(self) -> tuple[list[str], list[list[int]]] | None:
        return self._thread.submit(self.driver_worker.take_draft_token_ids).result()

    def profile(self, is_start: bool, path: str) -> str | None:
        """Runs on the worker thread: torch.profiler only sees the thread that started it."""
        return self._thread.submit(self.driver_worker.profile, is_start, path).result()

    def collective_rpc(self, method: str, args: tuple = (), timeout: float | None = None):
        return [self._thread.submit(getattr(self.driver_worker, method), *args).result(timeout)]

    def shutdown(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)
