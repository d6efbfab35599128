"""Engine configuration: one dataclass per concern, as in vLLM's vllm/config, flattened by EngineArgs."""
from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path

from minivllm import envs

DEFAULT_MODEL = str(Path(__file__).resolve().parent.parent / "data" / "models" / "shakespeare-llama")


def default_model() -> str:
    """The tiny model shipped in data/, overridable with MINIVLLM_MODEL."""
    return envs.MINIVLLM_MODEL or DEFAULT_MODEL


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
    # vLLM's defaults at the pin: admit a waiting request only if its whole prompt fits in the free
    # blocks (not just its first chunk); keep no blocks back (watermark = fraction of all blocks kept
    # free when admitting waiting or preempted requests).
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    # Plan step N+1 while step N executes (AsyncScheduler + EngineCore's batch queue). vLLM turns it on
    # by default; minivllm keeps it off (see EngineArgs.async_scheduling).
    async_scheduling: bool = False

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError("long_prefill_token_threshold must be >= 0 (0 disables it)")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0.0, 1.0), got {self.watermark}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                f">= max_model_len ({self.max_model_len}), or a long prompt could never be scheduled")


@dataclass
class SpeculativeConfig:
    """Speculative decoding (vLLM: config/speculative.py); only the n-gram (prompt lookup) method.

    num_speculative_tokens is an int > 0 (a bool is refused); VllmConfig also bounds it by the context and the
    step budget: num_speculative_tokens < max_model_len and 1 + num_speculative_tokens <= max_num_batched_tokens
    (a decode step of one request must fit; vLLM's check is on max_num_scheduled_tokens).
    """

    method: str = "ngram"
    num_speculative_tokens: int | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"speculative_config method {self.method!r} is not supported; minivllm has 'ngram'")
        n = self.num_speculative_tokens
        if isinstance(n, bool) or not isinstance(n, int):  # JSON true is not 1
            raise ValueError(f"speculative_config.num_speculative_tokens must be an integer, got {n!r}")
        if n <= 0:  # vLLM's wording (SpeculativeConfig.__post_init__)
            raise ValueError(f"Expected num_speculative_tokens to be greater than zero ({n}).")
        for name in ("prompt_lookup_max", "prompt_lookup_min"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"speculative_config.{name} must be an integer, got {v!r}")
        # vLLM's defaults: both unset -> 5 and 5; one set -> the other takes its value.
        if self.prompt_lookup_min is None and self.prompt_lookup_max is None:
            self.prompt_lookup_min = self.prompt_lookup_max = 5
        elif self.prompt_lookup_min is None:
            self.prompt_lookup_min = self.prompt_lookup_max
        elif self.prompt_lookup_max is None:
            self.prompt_lookup_max = self.prompt_lookup_min
        if self.prompt_lookup_min < 1 or self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min={self.prompt_lookup_min} must be >= 1 and <= "
                             f"prompt_lookup_max={self.prompt_lookup_max}")

    @classmethod
    def from_arg(cls, arg: SpeculativeConfig | dict | None) -> SpeculativeConfig | None:
        if arg is None or isinstance(arg, cls):
            return arg
        if not isinstance(arg, dict):
            raise TypeError(f"speculative_config must be a dict, got {type(arg).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(arg) - names)
        if unknown:
            raise ValueError(f"unknown speculative_config key(s) {unknown}; valid ones are {sorted(names)}")
        return cls(**arg)


@dataclass
class CompilationConfig:
    """CUDA graphs (vLLM: config/compilation.py): the decode batch sizes captured at start-up.

    vLLM's default list is [1, 2, 4] + multiples of 8 below 256 + multiples of 16, up to
    max_cudagraph_capture_size (default min(2 * max_num_seqs, 512)). minivllm captures uniform decode
    batches only (vLLM's FULL_DECODE_ONLY mode), which never hold more than max_num_seqs tokens, so the
    bound here is max_num_seqs, and max_num_seqs itself is added to the list so every decode batch fits.
    """

    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int | None = None

    def set_cudagraph_sizes(self, max_num_seqs: int) -> None:
        """Resolve the capture list for this max_num_seqs (vLLM: VllmConfig._set_cudagraph_sizes)."""
        limit = self.max_cudagraph_capture_size
        bound = min(512 if limit is None else limit, max_num_seqs)
        if self.cudagraph_capture_sizes is not None:
            sizes = list(self.cudagraph_capture_sizes)
            if any(not isinstance(s, int) or s <= 0 for s in sizes):
                raise ValueError(f"cudagraph_capture_sizes must be positive integers, got {sizes}")
            sizes = sorted({s for s in sizes if s <= bound})
        else:
            sizes = [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)] if s <= bound]
            sizes = sorted(set(sizes) | {bound}) if bound > 0 else []
        self.cudagraph_capture_sizes = sizes
        self.max_cudagraph_capture_size = sizes[-1] if sizes else 0


@dataclass
class StructuredOutputsConfig:
    """Limits on structured-output requests (vLLM: config/structured_outputs.py has the backend options only).

    Bad or oversized constraints are a 400 in the frontend, before anything is sampled:
      * max_spec_bytes (MINIVLLM_STRUCTURED_OUTPUTS_MAX_BYTES, 131072): the JSON schema / regex / grammar /
        choice / structural tag text, in UTF-8 bytes;
      * max_json_depth (MINIVLLM_STRUCTURED_OUTPUTS_MAX_DEPTH, 64): nesting of a JSON schema's objects and
        arrays (a string schema is measured before json.loads, so nothing recurses past it);
      * a constraint that matches no string at all (a $ref cycle with no value, an empty character class).
    In the EngineCore:
      * compile_timeout_s (MINIVLLM_GRAMMAR_COMPILE_TIMEOUT_S, 30): a request whose grammar is not compiled in
        time finishes with finish_reason "error" (the compile itself cannot be interrupted; it is still cached);
      * cache_bytes (MINIVLLM_XGRAMMAR_CACHE_MB, 512, as vLLM's VLLM_XGRAMMAR_CACHE_MB): compiled grammars are
        evicted least recently used first once their xgrammar memory_size_bytes total passes it.
    """

    max_spec_bytes: int = field(default_factory=lambda: envs.MINIVLLM_STRUCTURED_OUTPUTS_MAX_BYTES)
    max_json_depth: int = field(default_factory=lambda: envs.MINIVLLM_STRUCTURED_OUTPUTS_MAX_DEPTH)
    compile_timeout_s: float = field(default_factory=lambda: envs.MINIVLLM_GRAMMAR_COMPILE_TIMEOUT_S)
    cache_bytes: int = field(default_factory=lambda: envs.MINIVLLM_XGRAMMAR_CACHE_MB << 20)

    def __post_init__(self) -> None:
        for name in ("max_spec_bytes", "max_json_depth", "compile_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"structured outputs {name} must be positive, got {getattr(self, name)}")
        if self.cache_bytes < 0:
            raise ValueError(f"structured outputs cache_bytes must be >= 0, got {self.cache_bytes}")


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
    enforce_eager: bool | None = None  # None: eager on CPU, CUDA graphs on CUDA (see GPUModelRunner)
    trace: bool = False
    speculative_config: SpeculativeConfig | None = None
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)

    structured_outputs_config: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)

    def __post_init__(self) -> None:
        self.compilation_config.set_cudagraph_sizes(self.scheduler_config.max_num_seqs)
        spec, sc = self.speculative_config, self.scheduler_config
        if spec is not None:
            if sc.async_scheduling:  # checked with the config, as vLLM does, before any process or weight loads
                raise ValueError("async_scheduling with speculative_config is not supported in minivllm yet "
                                 "(vLLM combines them); turn one off")
            n = spec.num_speculative_tokens
            if n >= sc.max_model_len:
                raise ValueError(f"speculative_config.num_speculative_tokens={n} must be smaller than "
                                 f"max_model_len={sc.max_model_len}")
            if 1 + n > sc.max_num_batched_tokens:
                raise ValueError(f"speculative_config.num_speculative_tokens={n} leaves no room: a decode step of "
                                 f"1 + {n} tokens exceeds max_num_batched_tokens={sc.max_num_batched_tokens}; "
                                 "decrease num_speculative_tokens or increase max_num_batched_tokens")


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
    num_gpu_blocks_override: int | None = None  # vLLM's name for num_gpu_blocks (either sets the pool size)
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int = 256 << 20
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int | None = None
    max_num_seqs: int = 128
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    scheduler_reserve_full_isl: bool = True
    watermark: float = 0.0
    # vLLM: None = on unless incompatible. minivllm: None = off, because the lessons plug a synchronous
    # step (a plain step function, a schedule loop without placeholders) into EngineCore.
    async_scheduling: bool | None = None
    device: str = "auto"
    attention_backend: str = "auto"
    tensor_parallel_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    distributed_executor_backend: str | None = None
    enforce_eager: bool | None = None
    trace: bool = False
    speculative_config: dict | None = None
    cudagraph_capture_sizes: list[int] | None = None
    max_cudagraph_capture_size: int | None = None

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """One flag per field in CLI_HELP, its type and default read off the field, as vLLM's
        EngineArgs.add_cli_args builds its flags from the config dataclasses (a bool is --x/--no-x)."""
        hints, defaults = typing.get_type_hints(cls), {f.name: f.default for f in dataclasses.fields(cls)}
        for name, help_text in CLI_HELP.items():
            kind = next(t for t in typing.get_args(hints[name]) or (hints[name],) if t is not type(None))
            kwargs: dict = {"default": defaults[name], "help": help_text}
            if kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif typing.get_origin(kind) is list:
                kwargs.update(type=typing.get_args(kind)[0], nargs="+")
            else:
                kwargs["type"] = json.loads if kind is dict else kind
            parser.add_argument("--" + name.replace("_", "-"), *CLI_ALIASES.get(name, ()), **kwargs)
        return parser

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
            cache_config=CacheConfig(self.block_size, self.num_gpu_blocks_override or self.num_gpu_blocks,
                                     self.gpu_memory_utilization,
                                     self.kv_cache_memory_bytes, self.enable_prefix_caching),
            scheduler_config=SchedulerConfig(batched, self.max_num_seqs, max_len,
                                             self.long_prefill_token_threshold, self.enable_chunked_prefill,
                                             self.scheduler_reserve_full_isl, self.watermark,
                                             async_scheduling=bool(self.async_scheduling)),
            device=self.device, attention_backend=self.attention_backend,
            parallel_config=ParallelConfig(self.tensor_parallel_size, self.master_addr, self.master_port,
                                           self.distributed_executor_backend),
            enforce_eager=self.enforce_eager, trace=self.trace,
            speculative_config=SpeculativeConfig.from_arg(self.speculative_config),
            compilation_config=CompilationConfig(self.cudagraph_capture_sizes, self.max_cudagraph_capture_size))


# The EngineArgs fields that are `minivllm serve|generate` flags (vLLM's names; --device and the rest of the
# fields are minivllm's own or LLM(...)-only) and each flag's help.
CLI_HELP = {
    "device": "auto | cpu | cuda",
    "attention_backend": "auto | torch | triton",
    "dtype": None,
    "max_model_len": None,
    "max_num_seqs": None,
    "max_num_batched_tokens": None,
    "block_size": None,
    "enable_prefix_caching": None,
    "seed": None,
    "speculative_config": 'JSON, as vLLM: \'{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}\'',
    "enforce_eager": "never capture CUDA graphs (default: graphs for decode batches on CUDA)",
    "cudagraph_capture_sizes": "decode batch sizes to capture (default: vLLM's list up to --max-num-seqs)",
    "tensor_parallel_size": "ranks (one worker process each) to split the model over",
    "master_addr": "tensor-parallel rendezvous address",
    "master_port": "rendezvous port (0: any free port)",
    "async_scheduling": "plan step N+1 while step N runs (vLLM's flag; off by default in minivllm)",
}
CLI_ALIASES = {"tensor_parallel_size": ("-tp",)}
