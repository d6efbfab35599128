"""GPUModelRunner (vLLM: v1/worker/gpu_model_runner.py): SchedulerOutput in, ModelRunnerOutput out.

The runner owns every device tensor: the model, the paged KV cache, and the persistent InputBatch.
Each step it applies the scheduler's deltas (_update_states), lays the batch out flat with decodes
first (_prepare_inputs), runs one forward pass, and samples one token per request that reached the
end of its known tokens. It never changes a request's status: it only reports tokens.
"""
from __future__ import annotations

import numpy as np
import torch

from minivllm.attention import AttentionMetadata, get_attn_backend
from minivllm.config import VllmConfig
from minivllm.core.sched.output import SchedulerOutput
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.sampler import Sampler
from minivllm.tracing import Tracer
from minivllm.utils import cdiv
from minivllm.worker.gpu_input_batch import CachedRequestState, InputBatch
from minivllm.worker.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

_STR_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
               "half": torch.float16, "float": torch.float32}


def resolve_dtype(dtype: str, config_dtype, device: torch.device) -> torch.dtype:
    """auto = the checkpoint's 16-bit dtype on CUDA, float32 on CPU (fast and exact against HF)."""
    if dtype != "auto":
        if dtype not in _STR_DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose auto, float32, float16 or bfloat16")
        return _STR_DTYPES[dtype]
    if device.type == "cuda" and config_dtype in (torch.float16, torch.bfloat16):
        return config_dtype
    return torch.float32


class GPUModelRunner:
    """Device state and the per-step input preparation, forward pass and sampling."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, tracer: Tracer | None = None) -> None:
        self.vllm_config = vllm_config
        self.device = device
        self.tracer = tracer or Tracer(False)
        self.block_size = vllm_config.cache_config.block_size
        self.max_model_len = vllm_config.scheduler_config.max_model_len
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.attn_backend = get_attn_backend(vllm_config.attention_backend, str(device))
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = InputBatch(self.max_num_reqs, self.max_model_len, self.block_size)
        self.sampler = Sampler()
        self.kv_caches: list[torch.Tensor] = []
        self.model = None
        self._pending: tuple | None = None
        self._step = 0

    # ------------------------------------------------------------------ setup
    def load_model(self) -> None:
        from minivllm.model_executor.model_loader import get_model, load_hf_config, resolve_model_path
        path = resolve_model_path(self.vllm_config.model_config.model)
        hf_config = load_hf_config(path)
        self.dtype = resolve_dtype(self.vllm_config.model_config.dtype,
                                   getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None),
                                   self.device)
        self.model = get_model(path, self.dtype, self.device, self.attn_backend)
        self.hf_config = self.model.config

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        cfg = self.hf_config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return self.attn_backend.get_kv_cache_shape(num_blocks, self.block_size, cfg.num_key_value_heads,
                                                    head_dim)

    def get_kv_cache_bytes_per_block(self) -> int:
        per_layer = int(np.prod(self.kv_cache_shape(1))) * torch.tensor([], dtype=self.dtype).element_size()
        return per_layer * self.hf_config.num_hidden_layers

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = [torch.zeros(self.kv_cache_shape(num_blocks), dtype=self.dtype, device=self.device)
                          for _ in range(self.hf_config.num_hidden_layers)]

    # ------------------------------------------------------------------ states
    def _update_states(self, so: SchedulerOutput) -> None:
        batch = self.input_batch
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
        scheduled = so.num_scheduled_tokens
        for req_id in [r for r in batch.req_id_to_index if r not in scheduled]:
            batch.remove_request(req_id)  # preempted or not scheduled: keep the state, free the row
        for new in so.scheduled_new_reqs:
            sp = new.sampling_params
            gen = None
            if sp.seed is not None and not sp.greedy:
                gen = torch.Generator(device=self.device)
                gen.manual_seed(sp.seed)
            self.requests[new.req_id] = CachedRequestState(new.req_id, new.prompt_token_ids, sp, gen,
                                                           list(new.block_ids), new.num_computed_tokens,
                                                           eos_token_id=new.eos_token_id)
            batch.add_request(self.requests[new.req_id])
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            new_block_ids = cached.new_block_ids[i]
            if cached.resumed_from_preemption[i]:
                state.block_ids = list(new_block_ids)
            elif new_block_ids:
                state.block_ids.extend(new_block_ids)
            idx = batch.req_id_to_index.get(req_id)
            if idx is None:
                batch.add_request(state)
                continue
            batch.num_computed_tokens_cpu[idx] = state.num_computed_tokens
            if new_block_ids and not cached.resumed_from_preemption[i]:
                batch.append_block_ids(idx, new_block_ids)
        batch.condense()
        self._reorder_batch(scheduled)

    def _reorder_batch(self, num_scheduled_tokens: dict[str, int]) -> None:
        """Decodes (one query token) first, then prefills: the layout AttentionMetadata promises."""
        batch = self.input_batch
        lo, hi = 0, batch.num_reqs - 1
        while lo < hi:
            if num_scheduled_tokens[batch.req_ids[lo]] == 1:
                lo += 1
            elif num_scheduled_tokens[batch.req_ids[hi]] != 1:
                hi -= 1
            else:
                batch.swap_states(lo, hi)

    # ------------------------------------------------------------------ inputs
    def _prepare_inputs(self, so: SchedulerOutput):
        batch = self.input_batch
        num_reqs = batch.num_reqs
        req_ids = batch.req_ids[:num_reqs]
        num_sched = np.array([so.num_scheduled_tokens[r] for r in req_ids], dtype=np.int64)
        total = int(num_sched.sum())
        cu = np.cumsum(num_sched)
        req_indices = np.repeat(np.arange(num_reqs), num_sched)
        offsets = np.arange(total) - np.repeat(cu - num_sched, num_sched)
        num_computed = batch.num_computed_tokens_cpu[:num_reqs]
        positions = num_computed[req_indices] + offsets
        input_ids = batch.token_ids_cpu[req_indices, positions]
        block_ids = batch.block_table[req_indices, positions // self.block_size].astype(np.int64)
        slot_mapping = block_ids * self.block_size + positions % self.block_size
        seq_lens = (num_computed + num_sched).astype(np.int32)
        query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
        query_start_loc[1:] = cu
        num_decodes = int((num_sched == 1).sum())
        max_blocks = cdiv(int(seq_lens.max()), self.block_size)
        dev = self.device
        qsl_cpu, seq_lens_cpu = torch.from_numpy(query_start_loc), torch.from_numpy(seq_lens)
        md = AttentionMetadata(
            num_actual_tokens=total, max_query_len=int(num_sched.max()),
            query_start_loc=qsl_cpu.to(dev, non_blocking=True), max_seq_len=int(seq_lens.max()),
            seq_lens=seq_lens_cpu.to(dev, non_blocking=True),
            block_table=torch.from_numpy(batch.block_table[:num_reqs, :max_blocks].copy()).to(dev, non_blocking=True),
            slot_mapping=torch.from_numpy(slot_mapping).to(dev, non_blocking=True),
            num_decodes=num_decodes, num_decode_tokens=num_decodes, num_prefills=num_reqs - num_decodes,
            query_start_loc_cpu=qsl_cpu, seq_lens_cpu=seq_lens_cpu)
        # A request emits a token only when this step reaches the end of its known tokens.
        emit = np.nonzero(seq_lens >= batch.num_tokens[:num_reqs])[0]
        logits_indices = torch.from_numpy(cu[emit] - 1).to(dev)
        return (torch.from_numpy(input_ids).to(dev), torch.from_numpy(positions).to(dev), md,
                emit, logits_indices)

    def _sampling_metadata(self, rows: np.ndarray) -> SamplingMetadata:
        b = self.input_batch
        temp = b.temperature[rows]
        greedy = temp < 1e-5
        row_of = {int(r): i for i, r in enumerate(rows)}
        dev = self.device
        num_logprobs = [b.num_logprobs[r] for r in rows]
        asked = [n for n in num_logprobs if n is not None]
        min_tokens = {}  # rows still below min_tokens: their stop ids and EOS are masked
        for i, r in enumerate(rows.tolist() if b.min_tokens else ()):
            mt = b.min_tokens.get(r)
            if mt is not None and b.num_tokens[r] - mt[1] < mt[0]:
                min_tokens[i] = mt[2]
        return SamplingMetadata(
            temperature=None if greedy.all() else torch.from_numpy(temp).to(dev),
            all_greedy=bool(greedy.all()), all_random=not bool(greedy.any()),
            top_p=torch.from_numpy(b.top_p[rows]).to(dev) if (b.top_p[rows] < 1).any() else None,
            top_k=torch.from_numpy(b.top_k[rows]).to(dev) if (b.top_k[rows] > 0).any() else None,
            min_p=torch.from_numpy(b.min_p[rows]).to(dev) if (b.min_p[rows] > 0).any() else None,
            generators={row_of[r]: g for r, g in b.generators.items() if r in row_of},
            max_num_logprobs=max(asked) if asked else None, num_logprobs=num_logprobs,
            min_tokens=min_tokens or None)

    # ------------------------------------------------------------------ step
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        """Forward pass; samples at once unless a grammar must be applied first (then sample_tokens)."""
        self._update_states(so)
        if so.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        with self.tracer.span("prepare_inputs", so.step):
            input_ids, positions, md, emit, logits_indices = self._prepare_inputs(so)
        with self.tracer.span("forward", so.step, list(so.num_scheduled_tokens)):
            hidden = self.model(input_ids, positions, self.kv_caches, md)
            logits = self.model.compute_logits(hidden[logits_indices]) if len(emit) else None
        self._pending = (emit, logits)
        self._step = so.step
        if so.structured_output_request_ids:
            return None
        return self.sample_tokens(None)

    @torch.inference_mode()
    def sample_tokens(self, grammar_output) -> ModelRunnerOutput:
        """Apply the grammar bitmask (if any) to the pending logits, sample, and report tokens."""
        emit, logits = self._pending
        self._pending = None
        batch = self.input_batch
        num_reqs = batch.num_reqs
        req_ids = list(batch.req_ids[:num_reqs])
        sampled_token_ids: list[list[int]] = [[] for _ in range(num_reqs)]
        logprobs = None
        if logits is not None:
            if grammar_output is not None:
                logits = grammar_output.apply(logits, [req_ids[i] for i in emit])
            with self.tracer.span("sample", self._step):
                out = self.sampler(logits, self._sampling_metadata(emit))
            tokens = out.sampled_token_ids.tolist()
            if out.logprobs is not None:
                logprobs = [None] * num_reqs
            for j, row in enumerate(emit.tolist()):
                token = tokens[j]
                sampled_token_ids[row] = [token]
                self.requests[req_ids[row]].output_token_ids.append(token)
                batch.append_token(row, token)
                if logprobs is not None and out.logprobs[j] is not None:
                    logprobs[row] = [out.logprobs[j]]
        return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled_token_ids, logprobs)
