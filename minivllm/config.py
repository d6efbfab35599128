"""Engine configuration: one dataclass per concern, as in vLLM's vllm/config, flattened by EngineArgs."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MODEL = str(Path(__file__).resolve().parent.parent / "data" / "models" / "shakespeare-llama")


def default_model() -> str:
    """The tiny model shipped in data/, overridable with MINIVLLM_MODEL."""
    return os.environ.get("MINIVLLM_MODEL", DEFAULT_MODEL)


@dataclass
class ModelConfig:
    """Which checkpoint to run and how: dtype, maximum context, seed."""

    model: str = field(default_factory=default_model)
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.tokenizer is None:
            self.tokenizer = self.model


@dataclass
class CacheConfig:
    """Paged KV cache: block size, how many blocks (or the memory that decides it), prefix caching."""

    block_size: int = 16
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int = 256 << 20
    enable_prefix_caching: bool = True
    cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be >= 2 (block 0 is the null block), got {self.num_gpu_blocks}")


@dataclass
class SchedulerConfig:
    """The unified token-budget scheduler's limits."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 2048
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 (0 disables it)")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                f">= max_model_len ({self.max_model_len}), or a long prompt could never be scheduled")


@dataclass
class ParallelConfig:
    """Tensor parallelism: how many ranks, and where they meet (vLLM: ParallelConfig).

    tensor_parallel_size > 1 starts one worker process per rank (MultiprocExecutor) that rendezvous over
    TCP at master_addr:master_port (0: any free port); only a single host is tested.
    """

    tensor_parallel_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    distributed_executor_backend: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tensor_parallel_size, bool) or not isinstance(self.tensor_parallel_size, int) \
                or self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be a positive int, got {self.tensor_parallel_size!r}")
        if not 0 <= self.master_port < 65536:
            raise ValueError(f"master_port must be in [0, 65535], got {self.master_port}")
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "mp" if self.tensor_parallel_size > 1 else "uni"
        if self.distributed_executor_backend not in ("uni", "mp"):
            raise ValueError(f"distributed_executor_backend must be 'uni' or 'mp', got "
                             f"{self.distributed_executor_backend!r}")
        if self.distributed_executor_backend == "uni" and self.tensor_parallel_size > 1:
            raise ValueError("distributed_executor_backend='uni' runs one worker: it cannot hold "
                             f"tensor_parallel_size={self.tensor_parallel_size}")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size

    def verify_with_model(self, hf_config) -> None:
        """Heads, kv heads, the MLP width split evenly over the ranks, or a clear error now."""
        tp = self.tensor_parallel_size
        heads = hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
        problems = []
        if heads % tp:
            problems.append(f"num_attention_heads ({heads}) is not divisible by tensor_parallel_size ({tp})")
        if kv_heads % tp and tp % kv_heads:
            problems.append(f"num_key_value_heads ({kv_heads}) must divide or be divisible by "
                            f"tensor_parallel_size ({tp})")
        if hf_config.intermediate_size % tp:
            problems.append(f"intermediate_size ({hf_config.intermediate_size}) is not divisible by "
                            f"tensor_parallel_size ({tp})")
        if problems:
            raise ValueError("unsupported tensor_parallel_size: " + "; ".join(problems))


@dataclass
class VllmConfig:
    """Everything the engine needs, handed down to every layer (scheduler, worker) as one object."""

    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "auto"
    attention_backend: str = "auto"
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    enforce_eager: bool = True
    trace: bool = False


@dataclass
class EngineArgs:
    """Flat keyword arguments (what LLM(...) and the CLI take), split into the config dataclasses."""

    model: str = field(default_factory=default_model)
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0
    block_size: int = 16
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int = 256 << 20
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 128
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    device: str = "auto"
    attention_backend: str = "auto"
    tensor_parallel_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    distributed_executor_backend: str | None = None
    enforce_eager: bool = True
    trace: bool = False

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine argument(s) {unknown}; valid ones are {sorted(names)}")
        return cls(**kwargs)

    def create_engine_config(self, max_position_embeddings: int | None = None) -> VllmConfig:
        """max_position_embeddings comes from the checkpoint and caps max_model_len."""
        max_len = self.max_model_len or max_position_embeddings or 2048
        if max_position_embeddings and max_len > max_position_embeddings:
            raise ValueError(f"max_model_len={max_len} exceeds the model's max_position_embeddings "
                             f"({max_position_embeddings})")
        batched = self.max_num_batched_tokens or max(2048, max_len if not self.enable_chunked_prefill else 0)
        return VllmConfig(
            model_config=ModelConfig(self.model, self.tokenizer, self.dtype, max_len, self.seed),
            cache_config=CacheConfig(self.block_size, self.num_gpu_blocks, self.gpu_memory_utilization,
                                     self.kv_cache_memory_bytes, self.enable_prefix_caching),
            scheduler_config=SchedulerConfig(batched, self.max_num_seqs, max_len,
                                             self.long_prefill_token_threshold, self.enable_chunked_prefill),
            device=self.device, attention_backend=self.attention_backend,
            parallel_config=ParallelConfig(self.tensor_parallel_size, self.master_addr, self.master_port,
                                           self.distributed_executor_backend),
            enforce_eager=self.enforce_eager, trace=self.trace)
