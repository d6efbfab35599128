"""Worker (vLLM: v1/worker/gpu_worker.py): one device, its model runner, and KV cache sizing.

Under tensor parallelism there is one Worker per rank, each in its own process (MultiprocExecutor); it
joins the TP group before it builds its model, so the parallel layers see their rank and size.
"""
from __future__ import annotations

import torch

from minivllm.config import VllmConfig
from minivllm.core.sched.output import SchedulerOutput
from minivllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
from minivllm.tracing import Tracer
from minivllm.utils import cdiv
from minivllm.worker.gpu_model_runner import GPUModelRunner
from minivllm.worker.outputs import ModelRunnerOutput


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asked for, but torch sees no CUDA device")
    return torch.device(device)


def init_worker_distributed_environment(vllm_config: VllmConfig, rank: int, distributed_init_method: str,
                                        device: torch.device) -> None:
    """Join the TP group: NCCL between GPUs, gloo on CPU."""
    pc = vllm_config.parallel_config
    backend = "nccl" if device.type == "cuda" else "gloo"
    init_distributed_environment(pc.world_size, rank, distributed_init_method, backend)
    initialize_model_parallel(pc.tensor_parallel_size)


class Worker:
    """Owns the device: loads the model, sizes and allocates the KV cache, runs steps."""

    def __init__(self, vllm_config: VllmConfig, tracer: Tracer | None = None, local_rank: int = 0,
                 rank: int = 0, distributed_init_method: str | None = None) -> None:
        self.vllm_config = vllm_config
        self.rank = rank
        self.device = resolve_device(vllm_config.device)
        if self.device.type == "cuda":
            if vllm_config.parallel_config.world_size > 1:
                self.device = torch.device("cuda", local_rank)
            torch.cuda.set_device(self.device)
        if vllm_config.parallel_config.world_size > 1:
            init_worker_distributed_environment(vllm_config, rank, distributed_init_method, self.device)
        torch.manual_seed(vllm_config.model_config.seed)
        self.model_runner = GPUModelRunner(vllm_config, self.device, tracer)

    def load_model(self) -> None:
        self.model_runner.load_model()

    def determine_num_available_blocks(self) -> int:
        """How many KV blocks fit: a byte budget on CPU, a share of free memory on CUDA.

        Capped at what max_num_seqs requests of max_model_len tokens could ever use (+ the null block).
        """
        cc, sc = self.vllm_config.cache_config, self.vllm_config.scheduler_config
        if cc.num_gpu_blocks is not None:
            return cc.num_gpu_blocks
        runner = self.model_runner
        per_block = runner.get_kv_cache_bytes_per_block()
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            cfg = runner.hf_config
            activations = 4 * sc.max_num_batched_tokens * (cfg.vocab_size + 4 * cfg.intermediate_size) * 4
            budget = int(total * cc.gpu_memory_utilization) - (total - free) - activations
            budget -= runner.profile_cudagraph_memory()  # graphs are captured after the cache: keep room
        else:
            budget = cc.kv_cache_memory_bytes
        needed = sc.max_num_seqs * cdiv(sc.max_model_len, cc.block_size) + 1
        num_blocks = min(budget // per_block, needed)
        if num_blocks < 2:
            raise ValueError(f"the KV cache budget ({budget} bytes) holds fewer than 2 blocks of {per_block} bytes")
        return int(num_blocks)

    def initialize_cache(self, num_gpu_blocks: int) -> None:
        """Allocate the KV cache, then capture the CUDA graphs that read it."""
        self.num_gpu_blocks = num_gpu_blocks
        self.model_runner.initialize_kv_cache(num_gpu_blocks)
        self.compile_or_warm_up_model()

    def sleep(self, level: int = 1) -> None:
        """The dev server's /sleep (vLLM: Worker.sleep). Level >= 1 frees the KV cache on CPU: the engine has
        aborted or preempted every request and reset the prefix cache before, so nothing in it is needed.
        The weights stay resident (vLLM offloads them at level 1 and drops them at level 2 on GPU; its CPU
        worker ignores sleep altogether). On CUDA the decode graphs hold the cache's addresses: kept there."""
        if level >= 1 and self.device.type == "cpu":
            self.model_runner.kv_caches = []

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate (zeroed) the KV cache that sleep freed, when tags is None or names "kv_cache"."""
        if (tags is None or "kv_cache" in tags) and not self.model_runner.kv_caches:
            self.model_runner.initialize_kv_cache(self.num_gpu_blocks)

    def check_health(self) -> None:
        """vLLM's WorkerBase.check_health: nothing to check beyond answering (the dev server's /collective_rpc)."""

    def compile_or_warm_up_model(self) -> None:
        """vLLM's name: here it captures the decode CUDA graphs (nothing on CPU or with enforce_eager)."""
        self.model_runner.capture_model()

    def get_kv_cache_spec(self) -> tuple[int, ...]:
        """This rank's KV cache shape per layer (vLLM returns a KVCacheSpec per layer): with TP, its kv heads."""
        return tuple(self.model_runner.kv_caches[0].shape)

    def profile(self, is_start: bool, path: str) -> str | None:
        """Start, or stop and write a Chrome trace of, a torch.profiler run (CPU + CUDA activity).

        Rank r > 0 of a TP group writes PATH.rankR.json beside rank 0's PATH."""
        import torch.profiler as tp
        if is_start:
            activities = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            self._profiler = tp.profile(activities=activities, record_shapes=True)
            self._profiler.__enter__()
            return None
        if getattr(self, "_profiler", None) is None:
            raise RuntimeError("profile(is_start=False) without a running profile")
        self._profiler.__exit__(None, None, None)
        if self.rank:
            path = f"{path.removesuffix('.json')}.rank{self.rank}.json"
        self._profiler.export_chrome_trace(path)
        self._profiler = None
        return path

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        with torch.profiler.record_function("execute_model"):  # a profiled step's extent (the TP benchmark)
            return self.model_runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output) -> ModelRunnerOutput:
        return self.model_runner.sample_tokens(grammar_output)

    def take_draft_token_ids(self) -> tuple[list[str], list[list[int]]] | None:
        return self.model_runner.take_draft_token_ids()
