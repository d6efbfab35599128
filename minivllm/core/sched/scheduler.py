"""The unified scheduler (vLLM: v1/core/sched/scheduler.py).

No prefill phase and no decode phase: every request simply has num_computed_tokens chasing num_tokens,
and each step hands out a token budget, running requests first, then waiting ones. Chunked prefill,
decode and prefix-cache hits all fall out of that one rule. The scheduler is the only writer of request
status and num_computed_tokens.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from minivllm.config import CacheConfig, SchedulerConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.core.sched.interface import SchedulerInterface
from minivllm.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from minivllm.engine import EngineCoreOutput, EngineCoreOutputs, SchedulerStats
from minivllm.request import Request, RequestStatus
from minivllm.worker.outputs import ModelRunnerOutput


class Scheduler(SchedulerInterface):
    """FCFS token-budget scheduler with chunked prefill, prefix caching and preemption by recompute."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, num_gpu_blocks: int,
                 log_stats: bool = True) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_num_running_reqs = scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = scheduler_config.max_num_batched_tokens
        self.max_model_len = scheduler_config.max_model_len
        self.long_prefill_token_threshold = scheduler_config.long_prefill_token_threshold
        self.enable_chunked_prefill = scheduler_config.enable_chunked_prefill
        self.block_size = cache_config.block_size
        self.log_stats = log_stats
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        self.step_id = 0
        self.kv_cache_manager = KVCacheManager(num_gpu_blocks, self.block_size, self.max_model_len,
                                               cache_config.enable_prefix_caching)
        self.block_hasher = (get_request_block_hasher(self.block_size)
                             if cache_config.enable_prefix_caching else None)

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        kv = self.kv_cache_manager
        threshold = self.long_prefill_token_threshold
        token_budget = self.max_num_scheduled_tokens
        num_scheduled_tokens: dict[str, int] = {}
        req_to_new_block_ids: dict[str, list[int] | None] = {}
        scheduled_running_reqs: list[Request] = []
        running_new_block_ids: list[list[int] | None] = []  # one row per scheduled running request
        scheduled_new_reqs: list[Request] = []
        scheduled_resumed_reqs: list[Request] = []
        preempted_reqs: list[Request] = []

        # 1. Running requests first: each advances by min(remaining, threshold, budget left).
        running = self.running
        max_model_len = self.max_model_len
        allocate_slots = kv.allocate_slots
        req_index = 0
        while req_index < len(running) and token_budget > 0:
            request = running[req_index]
            num_computed_tokens = request.num_computed_tokens
            # = request.num_tokens_with_spec - num_computed_tokens, without a property call per request
            num_new_tokens = len(request.all_token_ids) + len(request.spec_token_ids) - num_computed_tokens
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            # The budget and max_model_len cap it too (plain ifs: this loop runs per request per step,
            # and min() costs several times more).
            if num_new_tokens > token_budget:
                num_new_tokens = token_budget
            if num_new_tokens > max_model_len - 1 - num_computed_tokens:
                num_new_tokens = max_model_len - 1 - num_computed_tokens
            if num_new_tokens <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = allocate_slots(request, num_new_tokens)
                if new_blocks is not None:
                    break
                # Out of blocks: preempt the lowest-priority (last admitted) request by recompute.
                preempted = running.pop()
                self._preempt(preempted)
                preempted_reqs.append(preempted)
                if preempted is request:
                    break
            if new_blocks is None:
                break
            scheduled_running_reqs.append(request)
            running_new_block_ids.append(new_blocks.get_block_ids() if new_blocks.blocks else None)
            num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
            req_index += 1

        # 2. Then waiting requests, in order, unless this step had to preempt (it is short of blocks).
        if not preempted_reqs:
            while self.waiting and token_budget > 0:
                if len(self.running) >= self.max_num_running_reqs:
                    break
                request = self.waiting[0]
                new_computed_blocks, num_new_local_computed = kv.get_computed_blocks(request)
                num_computed_tokens = request.num_computed_tokens + num_new_local_computed
                num_new_tokens = request.num_tokens - num_computed_tokens
                # The prefix hit is capped at num_tokens - 1: a request always has a token to compute.
                assert num_new_tokens > 0, f"{request.request_id}: prefix hit covers the whole request"
                if 0 < threshold < num_new_tokens:
                    num_new_tokens = threshold
                if not self.enable_chunked_prefill and num_new_tokens > token_budget:
                    break
                num_new_tokens = min(num_new_tokens, token_budget)
                new_blocks = kv.allocate_slots(request, num_new_tokens, num_new_local_computed,
                                               new_computed_blocks)
                if new_blocks is None:
                    break
                self.waiting.popleft()
                self.running.append(request)
                if request.status == RequestStatus.PREEMPTED:
                    scheduled_resumed_reqs.append(request)
                else:
                    scheduled_new_reqs.append(request)
                if request.num_cached_tokens < 0:
                    request.num_cached_tokens = num_computed_tokens
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed_tokens
                req_to_new_block_ids[request.request_id] = kv.get_block_ids(request.request_id)
                num_scheduled_tokens[request.request_id] = num_new_tokens
                token_budget -= num_new_tokens

        total = self.max_num_scheduled_tokens - token_budget
        assert total <= self.max_num_scheduled_tokens
        assert len(self.running) <= self.max_num_running_reqs

        # Requests the worker already holds travel as deltas: running ones, then resumed ones.
        cached_reqs = scheduled_running_reqs + scheduled_resumed_reqs
        cached = CachedRequestData(
            req_ids=[r.request_id for r in cached_reqs],
            resumed_from_preemption=[False] * len(scheduled_running_reqs) + [True] * len(scheduled_resumed_reqs),
            new_block_ids=running_new_block_ids + [req_to_new_block_ids[r.request_id]
                                                   for r in scheduled_resumed_reqs],
            num_computed_tokens=[r.num_computed_tokens for r in cached_reqs],
        )
        self.step_id += 1
        output = SchedulerOutput(
            scheduled_new_reqs=[NewRequestData.from_request(r, req_to_new_block_ids[r.request_id])
                                for r in scheduled_new_reqs],
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=total,
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids={r.request_id for r in preempted_reqs},
            step=self.step_id,
        )
        self.finished_req_ids = set()
        # Tokens scheduled now count as computed now (vLLM's _update_after_schedule), so the next
        # schedule() may run before this step's output arrives.
        requests = self.requests
        for req_id, n in num_scheduled_tokens.items():
            requests[req_id].num_computed_tokens += n
        return output

    def _preempt(self, request: Request) -> None:
        """Preemption by recompute: drop the KV, forget progress, go back to the front of waiting."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    # ---------------------------------------------------------------- update
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        sampled_token_ids = model_runner_output.sampled_token_ids
        logprobs = model_runner_output.logprobs
        req_id_to_index = model_runner_output.req_id_to_index
        requests = self.requests
        check_stop = self._check_stop
        outputs: list[EngineCoreOutput] = []
        stopped_running: set[Request] = set()
        stopped_preempted: set[Request] = set()
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(req_id)
            if request is None:
                continue  # finished or aborted while the step ran (it left self.requests): dropped
            req_index = req_id_to_index.get(req_id)
            generated = sampled_token_ids[req_index] if req_index is not None else ()
            if not generated:
                continue  # a partial prefill produces no token
            status_before = request.status
            new_token_ids = []
            finished = False
            for token_id in generated:
                request.append_output_token_ids(token_id)
                new_token_ids.append(token_id)
                if check_stop(request):
                    finished = True
                    break
            new_logprobs = None
            if logprobs is not None and logprobs[req_index] is not None:
                new_logprobs = logprobs[req_index][:len(new_token_ids)]
            if finished:
                if status_before == RequestStatus.RUNNING:
                    stopped_running.add(request)
                else:
                    stopped_preempted.add(request)
                self._free_request(request)
            outputs.append(EngineCoreOutput(
                req_id, new_token_ids, new_logprobs,
                request.get_finished_reason() if finished else None,
                request.stop_reason, request.num_cached_tokens if request.num_cached_tokens > 0 else 0))
        if stopped_running:
            self.running = [r for r in self.running if r not in stopped_running]
        if stopped_preempted:
            # Rare: preempted while its step ran, then finished by that step's late token.
            self.waiting = deque(r for r in self.waiting if r not in stopped_preempted)
        return EngineCoreOutputs(outputs=outputs,
                                 scheduler_stats=self.make_stats() if self.log_stats else None)

    def _check_stop(self, request: Request) -> bool:
        """vLLM's check_stop: nothing before min_tokens, then EOS and stop token ids, then the length caps
        (so an EOS that is also the max_tokens-th token finishes with "stop"). The InputProcessor keeps
        min_tokens within the context, so min_tokens cannot carry a request past max_model_len."""
        output_token_ids = request.output_token_ids
        num_output_tokens = len(output_token_ids)  # runs per token: plain len(), no properties
        params = request.sampling_params
        if num_output_tokens < params.min_tokens:
            return False
        last = output_token_ids[-1]
        if not params.ignore_eos and last == request.eos_token_id:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if params.stop_token_ids and last in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last
            return True
        if len(request.all_token_ids) >= self.max_model_len or (
                request.max_tokens is not None and num_output_tokens >= request.max_tokens):
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    # ---------------------------------------------------------------- requests
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        if self.block_hasher is not None and request._block_hasher is None:
            request.set_block_hasher(self.block_hasher)
        self.waiting.append(request)
        self.requests[request.request_id] = request

    def finish_requests(self, request_ids: str | Iterable[str], finished_status: RequestStatus) -> None:
        assert RequestStatus.is_finished(finished_status)
        ids = {request_ids} if isinstance(request_ids, str) else set(request_ids)
        to_finish = [self.requests[i] for i in ids if i in self.requests]
        if not to_finish:
            return
        running_ids = {r.request_id for r in to_finish if r.status == RequestStatus.RUNNING}
        if running_ids:
            self.running = [r for r in self.running if r.request_id not in running_ids]
        waiting_ids = {r.request_id for r in to_finish} - running_ids
        if waiting_ids:
            self.waiting = deque(r for r in self.waiting if r.request_id not in waiting_ids)
        for request in to_finish:
            request.status = finished_status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_finished_requests(self) -> bool:
        return len(self.finished_req_ids) > 0

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def make_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        pool = kv.block_pool
        stats = kv.prefix_cache_stats
        return SchedulerStats(
            num_running_reqs=len(self.running), num_waiting_reqs=len(self.waiting),
            kv_cache_usage=kv.usage, num_free_blocks=pool.get_num_free_blocks(),
            num_total_blocks=pool.num_gpu_blocks - 1, prefix_cache_queries=stats.queries,
            prefix_cache_hits=stats.hits, num_preemptions=self.num_preemptions)
