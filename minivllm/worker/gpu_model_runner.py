"""GPUModelRunner (vLLM: v1/worker/gpu_model_runner.py): SchedulerOutput in, ModelRunnerOutput out.

The runner owns every device tensor: the model, the paged KV cache, and the persistent InputBatch.
Each step it applies the scheduler's deltas (_update_states), lays the batch out flat with decodes
first (_prepare_inputs), runs one forward pass, and samples one token per request that reached the
end of its known tokens. It never changes a request's status: it only reports tokens.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import torch

from minivllm.attention import AttentionMetadata, get_attn_backend
from minivllm.attention.backend import AttentionCGSupport
from minivllm.compilation.cuda_graph import (
    PAD_SLOT_ID,
    BatchDescriptor,
    CudagraphDispatcher,
    CUDAGraphWrapper,
)
from minivllm.config import VllmConfig
from minivllm.core.sched.output import SchedulerOutput
from minivllm.distributed import get_tensor_model_parallel_world_size
from minivllm.sample.metadata import SamplingMetadata
from minivllm.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, RejectionSampler, SpecDecodeMetadata
from minivllm.sample.sampler import Sampler, apply_logits_processors, gather_logprobs, sampled_token_ranks
from minivllm.spec_decode.ngram_proposer import NgramProposer
from minivllm.structured_output.utils import apply_grammar_bitmask
from minivllm.tracing import Tracer
from minivllm.utils import cdiv
from minivllm.worker.gpu_input_batch import CachedRequestState, InputBatch
from minivllm.worker.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

logger = logging.getLogger(__name__)

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
        self._sampling_metadata_key: tuple | None = None
        self._cached_sampling_metadata: SamplingMetadata | None = None
        self.sampler = Sampler()
        spec = vllm_config.speculative_config
        self.drafter = (NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max,
                                      self.max_model_len) if spec is not None else None)
        self.rejection_sampler = RejectionSampler()
        self._draft_token_ids: tuple[list[str], list[list[int]]] | None = None
        self.kv_caches: list[torch.Tensor] = []
        self.model = None
        self._pending: tuple | None = None
        self._step = 0
        self._init_cudagraph_state()

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
        self.cudagraph_wrapper = CUDAGraphWrapper(self.model, self.use_cuda_graph)

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        cfg = self.hf_config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        num_kv_heads = max(1, cfg.num_key_value_heads // get_tensor_model_parallel_world_size())  # this rank's
        return self.attn_backend.get_kv_cache_shape(num_blocks, self.block_size, num_kv_heads, head_dim)

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
        cached = so.scheduled_cached_reqs
        # A resumed request still in the batch was preempted outside a step (reset_prefix_cache with
        # reset_running_requests) and its row holds the old blocks: it leaves too, and comes back below with
        # its new ones (vLLM: gpu_model_runner.py:1240-1247).
        resumed = {r for r, res in zip(cached.req_ids, cached.resumed_from_preemption, strict=True) if res}
        for req_id in [r for r in batch.req_id_to_index if r not in scheduled or r in resumed]:
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
        for req_id, draft in so.scheduled_spec_decode_tokens.items():
            # Drafts sit after the known tokens, so input preparation reads them like any token.
            idx = batch.req_id_to_index[req_id]
            n = batch.num_tokens[idx]
            batch.token_ids_cpu[idx, n:n + len(draft)] = draft
        batch.condense()
        self._may_reorder_batch(so)

    def _may_reorder_batch(self, scheduler_output: SchedulerOutput) -> None:
        """Decodes (one query token) first, then prefills: the layout AttentionMetadata promises (vLLM: same
        name; every minivllm backend wants it, so it always reorders)."""
        num_scheduled_tokens = scheduler_output.num_scheduled_tokens
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
        spec_md = None
        if so.scheduled_spec_decode_tokens:
            # Each draft is verified by the logits of the token before it: k + 1 rows per request.
            drafts = [so.scheduled_spec_decode_tokens.get(req_ids[i], []) for i in emit]
            spec_md = SpecDecodeMetadata.make(drafts, dev)
            num_rows = np.array([len(d) + 1 for d in drafts], dtype=np.int64)
            first_row = np.cumsum(num_rows) - num_rows
            offset_in_req = np.arange(num_rows.sum()) - np.repeat(first_row, num_rows)
            logits_indices = torch.from_numpy(np.repeat(cu[emit] - num_rows, num_rows) + offset_in_req).to(dev)
        else:
            logits_indices = torch.from_numpy(cu[emit] - 1).to(dev)
        return (torch.from_numpy(input_ids).to(dev), torch.from_numpy(positions).to(dev), md,
                emit, logits_indices, spec_md)

    def _sampling_metadata(self, rows: np.ndarray) -> SamplingMetadata:
        """The rows' SamplingMetadata: rebuilt only when the batch or the rows changed (most decode steps
        reuse the last one); the per-step min_tokens rows are refreshed every step."""
        b = self.input_batch
        key = (b.version, rows.tobytes())
        if self._sampling_metadata_key != key:
            self._cached_sampling_metadata = self._make_sampling_metadata(rows)
            self._sampling_metadata_key = key
        md = self._cached_sampling_metadata
        if not b.min_tokens and not b.has_penalties and not b.bad_words:
            return md
        return dataclasses.replace(md, **b.history_fields(rows, self.device))

    def _make_sampling_metadata(self, rows: np.ndarray) -> SamplingMetadata:
        b = self.input_batch
        temp = b.temperature[rows]
        greedy = temp < 1e-5
        row_of = {int(r): i for i, r in enumerate(rows)}
        dev = self.device
        num_logprobs = [b.num_logprobs[r] for r in rows]
        asked = [n for n in num_logprobs if n is not None]
        return SamplingMetadata(
            temperature=None if greedy.all() else torch.from_numpy(temp).to(dev),
            all_greedy=bool(greedy.all()), all_random=not bool(greedy.any()),
            top_p=torch.from_numpy(b.top_p[rows]).to(dev) if (b.top_p[rows] < 1).any() else None,
            top_k=torch.from_numpy(b.top_k[rows]).to(dev) if (b.top_k[rows] > 0).any() else None,
            min_p=torch.from_numpy(b.min_p[rows]).to(dev) if (b.min_p[rows] > 0).any() else None,
            generators={row_of[r]: g for r, g in b.generators.items() if r in row_of},
            max_num_logprobs=max(asked) if asked else None, num_logprobs=num_logprobs,
            logit_bias={i: b.logit_bias[r] for i, r in enumerate(rows.tolist()) if r in b.logit_bias} or None,
            allowed_token_ids={i: b.allowed_token_ids[r] for i, r in enumerate(rows.tolist())
                               if r in b.allowed_token_ids} or None)

    # ------------------------------------------------------------------ step
    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput | None:
        """Forward pass; samples at once unless a grammar must be applied first (then sample_tokens)."""
        self._update_states(so)
        if so.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        with self.tracer.span("prepare_inputs", so.step):
            input_ids, positions, md, emit, logits_indices, spec_md = self._prepare_inputs(so)
            batch_desc = self.cudagraph_dispatcher.dispatch(md.num_actual_tokens, md.max_query_len == 1)
            if batch_desc is not None:
                input_ids, positions, md = self._pad_for_cudagraph(batch_desc, input_ids, positions, md)
        with self.tracer.span("forward", so.step, list(so.num_scheduled_tokens)):
            hidden = self._model_forward(batch_desc, input_ids, positions, md)
            logits = self.model.compute_logits(hidden[logits_indices]) if len(emit) else None
            self._get_prompt_logprobs_dict(hidden, so)
        self._pending = (emit, logits, spec_md, so.scheduled_spec_decode_tokens)
        self._step = so.step
        if so.has_structured_output_requests:
            return None  # EngineCore computes the bitmask meanwhile, then calls sample_tokens
        return self.sample_tokens(None)

    @torch.inference_mode()
    def sample_tokens(self, grammar_output) -> ModelRunnerOutput:
        """Apply the grammar bitmask (if any) to the pending logits, sample, and report tokens."""
        emit, logits, spec_md, spec_tokens = self._pending
        self._pending = None
        batch = self.input_batch
        num_reqs = batch.num_reqs
        req_ids = list(batch.req_ids[:num_reqs])
        sampled_token_ids: list[list[int]] = [[] for _ in range(num_reqs)]
        prompt_logprobs: dict[str, tuple[list[dict[int, float]], list[int]]] = {}
        logprobs = ranks = None
        if logits is not None:
            if grammar_output is not None:
                apply_grammar_bitmask(grammar_output, [req_ids[i] for i in emit], logits,
                                      spec_tokens)
            rows_logprobs = rows_ranks = None  # per emitted row: one dict (and one rank) per token, or None
            if spec_md is not None:
                with self.tracer.span("sample", self._step):
                    out_ids = self.rejection_sampler(spec_md, None, self._spec_logits(logits, spec_md, emit),
                                                     self._sampling_metadata(emit))
                rows_tokens = [[t for t in r if t != PLACEHOLDER_TOKEN_ID] for r in out_ids.tolist()]
                if any(batch.num_logprobs[r] is not None for r in emit):
                    rows_logprobs, rows_ranks = self._spec_logprobs(logits, spec_md, emit, rows_tokens)
            else:
                with self.tracer.span("sample", self._step):
                    out = self.sampler(logits, self._sampling_metadata(emit))
                rows_tokens = [[t] for t in out.sampled_token_ids.tolist()]
                if out.logprobs is not None:
                    rows_logprobs = [None if d is None else [d] for d in out.logprobs]
                    if out.sampled_ranks is not None:
                        rows_ranks = [None if d is None else [r] for d, r in zip(out.logprobs, out.sampled_ranks,
                                                                                 strict=True)]
            if rows_logprobs is not None:
                logprobs = [None] * num_reqs
            if rows_ranks is not None:
                ranks = [None] * num_reqs
            for j, row in enumerate(emit.tolist()):
                tokens = rows_tokens[j]
                sampled_token_ids[row] = tokens
                state = self.requests[req_ids[row]]
                if state.sampling_params.prompt_logprobs is not None and not state.prompt_logprobs_sent:
                    state.prompt_logprobs_sent = True
                    entries = [state.prompt_logprobs[p] for p in range(1, len(state.prompt_token_ids))]
                    prompt_logprobs[req_ids[row]] = ([e[0] for e in entries], [e[1] for e in entries])
                self.requests[req_ids[row]].output_token_ids.extend(tokens)
                for token in tokens:
                    batch.append_token(row, token)
                if rows_logprobs is not None:
                    logprobs[row] = rows_logprobs[j]
                if rows_ranks is not None:
                    ranks[row] = rows_ranks[j]
            if self.drafter is not None:
                self.propose_draft_token_ids(req_ids, emit)
        return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled_token_ids, logprobs,
                                 logprob_ranks=ranks, prompt_logprobs=prompt_logprobs)

    def _get_prompt_logprobs_dict(self, hidden: torch.Tensor, so: SchedulerOutput) -> None:
        """vLLM's prompt logprobs (vLLM: same name): for each prompt position this step computes, the raw logprob
        of the next prompt token, its rank, and the top prompt_logprobs tokens, kept on the request until its
        first token (sample_tokens sends them all then) where vLLM returns each chunk's."""
        batch = self.input_batch
        if not batch.prompt_logprobs_reqs:
            return
        start = 0
        for row, req_id in enumerate(batch.req_ids[:batch.num_reqs]):
            n = so.num_scheduled_tokens[req_id]
            state = self.requests[req_id]
            k = state.sampling_params.prompt_logprobs
            first, prompt = int(batch.num_computed_tokens_cpu[row]), state.prompt_token_ids
            last = min(first + n, len(prompt) - 1)  # position p predicts prompt token p + 1
            if k is not None and first < last:
                lp = self.model.compute_logits(hidden[start:start + last - first]).float().log_softmax(-1)
                target = torch.tensor(prompt[first + 1:last + 1], device=lp.device).unsqueeze(1)
                actual = lp.gather(1, target)
                ranks = (lp >= actual).sum(-1).tolist()
                top = lp.topk(k, dim=-1) if k > 0 else None
                for i, p in enumerate(range(first, last)):
                    entry = {prompt[p + 1]: actual[i, 0].item()}
                    if top is not None:
                        for tok, v in zip(top.indices[i].tolist(), top.values[i].tolist(), strict=True):
                            entry.setdefault(tok, v)
                    state.prompt_logprobs[p + 1] = (entry, ranks[i])
            start += n

    def _spec_logits(self, logits: torch.Tensor, spec_md: SpecDecodeMetadata, emit: np.ndarray) -> torch.Tensor:
        """Every sampling constraint on the verification rows, as vLLM applies them before rejection sampling
        (RejectionSampler.apply_logits_processors for the draft rows, its Sampler for the bonus row): draft row
        p of a request sees its output plus its first p drafts in penalties, bad words and min_tokens; the bonus
        row sees all k drafts in penalties and bad words but, as in vLLM (MinTokensLogitsProcessor.apply), only
        the output in min_tokens. logit_bias and min_p never reach here (refused with speculation)."""
        b = self.input_batch
        if not (b.min_tokens or b.has_penalties or b.bad_words or b.allowed_token_ids):
            return logits
        k = np.asarray(spec_md.num_draft_tokens, dtype=np.int64)
        rows = np.repeat(emit, k + 1)
        num_drafts = np.concatenate([np.arange(n + 1) for n in k])
        min_tokens_drafts = np.where(num_drafts == np.repeat(k, k + 1), 0, num_drafts)  # the bonus row counts 0
        md = dataclasses.replace(self._make_sampling_metadata(rows), logit_bias=None,
                                 **b.history_fields(rows, self.device, num_drafts, min_tokens_drafts))
        return apply_logits_processors(logits.float(), md)

    def _spec_logprobs(self, logits: torch.Tensor, spec_md: SpecDecodeMetadata, emit: np.ndarray,
                       rows_tokens: list[list[int]]) -> tuple[list, list]:
        """Per emitted row, the logprobs (and the sampled token's rank) of each emitted token, from the raw
        logits row that produced it."""
        num_logprobs = self.input_batch.num_logprobs
        first_row = (spec_md.bonus_logits_indices.cpu() - torch.tensor(spec_md.num_draft_tokens)).tolist()
        sel_rows, sel_tokens, sel_n, owners = [], [], [], []
        for j, row in enumerate(emit.tolist()):
            if num_logprobs[row] is None:
                continue
            for p, token in enumerate(rows_tokens[j]):
                sel_rows.append(first_row[j] + p)
                sel_tokens.append(token)
                sel_n.append(num_logprobs[row])
                owners.append(j)
        out: list = [None] * len(emit)
        out_ranks: list = [None] * len(emit)
        if sel_rows:
            raw = logits[torch.tensor(sel_rows, device=logits.device)].float().log_softmax(dim=-1)
            sel = torch.tensor(sel_tokens, device=raw.device)
            dicts = gather_logprobs(raw, sel, sel_n)
            for j, d, rank in zip(owners, dicts, sampled_token_ranks(raw, sel), strict=True):
                out[j] = (out[j] or []) + [d]
                out_ranks[j] = (out_ranks[j] or []) + [rank]
        return out, out_ranks

    def propose_draft_token_ids(self, req_ids: list[str], emit: np.ndarray) -> None:
        """N-gram drafts for every request that just emitted tokens (prefill chunks get none; vLLM: same name)."""
        batch = self.input_batch
        rows = emit.tolist()
        drafts = self.drafter.propose([batch.token_ids_cpu[r, :min(batch.num_tokens[r], self.max_model_len)]
                                       for r in rows])
        self._draft_token_ids = ([req_ids[r] for r in rows], drafts)

    def take_draft_token_ids(self) -> tuple[list[str], list[list[int]]] | None:
        drafts, self._draft_token_ids = self._draft_token_ids, None
        return drafts

    # ------------------------------------------------------------------ CUDA graphs
    def _init_cudagraph_state(self) -> None:
        """Decode batches run padded to a capture size from static buffers: graphs on CUDA, eager on CPU.

        enforce_eager=None means graphs on CUDA and the plain eager path on CPU. enforce_eager=False on
        CPU runs the padded path with an eager "replay" (no graph exists there): the tests and lesson 11
        check the padding that way without a GPU.
        """
        eager = self.vllm_config.enforce_eager
        if eager is None:
            eager = self.device.type != "cuda"
        self.use_cuda_graph = not eager and self.device.type == "cuda"
        if self.use_cuda_graph and self.attn_backend.cudagraph_support is AttentionCGSupport.NEVER:
            logger.warning("attention backend %s cannot run inside a CUDA graph: running eagerly",
                           self.attn_backend.name)
            eager, self.use_cuda_graph = True, False
        sizes = [] if eager else self.vllm_config.compilation_config.cudagraph_capture_sizes
        self.cudagraph_dispatcher = CudagraphDispatcher(sizes)
        self.cudagraph_wrapper: CUDAGraphWrapper | None = None
        n, dev = max(sizes, default=0), self.device
        # The static inputs every graph reads; _pad_for_cudagraph refills them in place each step.
        self.cg_input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.cg_positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.cg_slot_mapping = torch.full((n,), PAD_SLOT_ID, dtype=torch.int64, device=dev)
        self.cg_seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.cg_block_table = torch.zeros((n, self.input_batch.max_num_blocks_per_req), dtype=torch.int32,
                                          device=dev)
        qsl = torch.arange(n + 1, dtype=torch.int32)
        qsl_dev = qsl.to(dev)
        self.cg_attn_metadata = {s: AttentionMetadata(
            num_actual_tokens=s, max_query_len=1, query_start_loc=qsl_dev[:s + 1], max_seq_len=self.max_model_len,
            seq_lens=self.cg_seq_lens[:s], block_table=self.cg_block_table[:s],
            slot_mapping=self.cg_slot_mapping[:s], num_decodes=s, num_decode_tokens=s, num_prefills=0,
            query_start_loc_cpu=qsl[:s + 1], seq_lens_cpu=self.cg_seq_lens[:s] if dev.type == "cpu" else None)
            for s in sizes}

    def _pad_for_cudagraph(self, batch_desc: BatchDescriptor, input_ids: torch.Tensor | None,
                           positions: torch.Tensor | None, md: AttentionMetadata | None):
        """Copy a decode batch into the static buffers and pad it to batch_desc.num_tokens rows.

        A padded row reads token 0 at position 0, writes no KV (slot PAD_SLOT_ID), and attends to
        nothing (seq_len 0, block table row of zeros); its hidden state is never indexed for logits.
        md None: every row is padding (the dummy batch that capture runs).
        """
        n, size = (0 if md is None else md.num_actual_tokens), batch_desc.num_tokens
        self.cg_attn_metadata[size].backend_cache.clear()
        self.cg_block_table[:size].zero_()
        if n:
            self.cg_input_ids[:n].copy_(input_ids, non_blocking=True)
            self.cg_positions[:n].copy_(positions, non_blocking=True)
            self.cg_slot_mapping[:n].copy_(md.slot_mapping, non_blocking=True)
            self.cg_seq_lens[:n].copy_(md.seq_lens, non_blocking=True)
            self.cg_block_table[:n, :md.block_table.shape[1]].copy_(md.block_table, non_blocking=True)
        self.cg_input_ids[n:size].zero_()
        self.cg_positions[n:size].zero_()
        self.cg_slot_mapping[n:size].fill_(PAD_SLOT_ID)
        self.cg_seq_lens[n:size].zero_()
        return self.cg_input_ids[:size], self.cg_positions[:size], self.cg_attn_metadata[size]

    def _model_forward(self, batch_desc: BatchDescriptor | None, input_ids: torch.Tensor, positions: torch.Tensor,
                       md: AttentionMetadata) -> torch.Tensor:
        """Hidden states [num tokens (padded), hidden]: a graph replay for a dispatched batch, else eager."""
        if batch_desc is None:
            return self.model(input_ids, positions, self.kv_caches, md)
        return self.cudagraph_wrapper(batch_desc, input_ids, positions, self.kv_caches, md)

    @torch.inference_mode()
    def capture_model(self) -> int:
        """Capture one graph per capture size, largest first, over the allocated KV cache.

        vLLM: GPUModelRunner.capture_model. Returns the device memory the graphs took, in bytes.
        """
        if not self.use_cuda_graph:
            return 0
        from tqdm.auto import tqdm
        assert self.kv_caches, "capture_model() runs after initialize_kv_cache(): graphs bake in its addresses"
        torch.cuda.synchronize(self.device)
        free_before = torch.cuda.mem_get_info(self.device)[0]
        start = time.perf_counter()
        for desc in tqdm(self.cudagraph_dispatcher.get_capture_descs(), desc="Capturing CUDA graphs (decode)"):
            input_ids, positions, md = self._pad_for_cudagraph(desc, None, None, None)
            self.cudagraph_wrapper.capture(desc, input_ids, positions, self.kv_caches, md)
        used = free_before - torch.cuda.mem_get_info(self.device)[0]
        logger.info("Graph capturing finished in %.1f s, took %.2f GiB", time.perf_counter() - start, used / 2**30)
        return used

    @torch.inference_mode()
    def profile_cudagraph_memory(self) -> int:
        """Graph memory to set aside before the KV cache is sized (vLLM: profile_cudagraph_memory).

        Captures the two largest sizes into a throwaway pool over a one-block stand-in KV cache and
        extrapolates: the first graph's memory plus the second's (>= 1 MiB) for every other size.
        """
        descs = self.cudagraph_dispatcher.get_capture_descs() if self.use_cuda_graph else []
        if not descs:
            return 0
        saved, self.kv_caches = self.kv_caches, [torch.zeros(self.kv_cache_shape(1), dtype=self.dtype,
                                                             device=self.device)
                                                 for _ in range(self.hf_config.num_hidden_layers)]
        wrapper = CUDAGraphWrapper(self.model, True)
        samples = []
        try:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            for desc in descs[:2]:
                free_before = torch.cuda.mem_get_info(self.device)[0]
                input_ids, positions, md = self._pad_for_cudagraph(desc, None, None, None)
                wrapper.capture(desc, input_ids, positions, self.kv_caches, md)
                samples.append(free_before - torch.cuda.mem_get_info(self.device)[0])
        finally:
            wrapper.clear_graphs()
            del wrapper
            self.kv_caches = saved
            torch.cuda.empty_cache()
        per_graph = max(samples[1] if len(samples) > 1 else 0, 1 << 20)
        return max(samples[0], 0) + per_graph * (len(descs) - 1)
