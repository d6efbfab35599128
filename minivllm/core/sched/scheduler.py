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
from minivllm.core.sched.interface import PauseState, SchedulerInterface
from minivllm.core.sched.output import CachedRequestData, GrammarOutput, NewRequestData, SchedulerOutput
from minivllm.core.sched.utils import check_stop
from minivllm.engine import (
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
)
from minivllm.metrics.stats import SchedulerStats
from minivllm.request import Request, RequestStatus
from minivllm.spec_decode.metrics import SpecDecodingStats
from minivllm.structured_output import StructuredOutputManager
from minivllm.structured_output.utils import xgrammar_error
from minivllm.worker.outputs import ModelRunnerOutput


class Scheduler(SchedulerInterface):
    """FCFS token-budget scheduler with chunked prefill, prefix caching and preemption by recompute."""

    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, num_gpu_blocks: int,
                 log_stats: bool = True, num_spec_tokens: int = 0,
                 structured_output_manager: StructuredOutputManager | None = None) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_num_running_reqs = scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = scheduler_config.max_num_batched_tokens
        self.max_model_len = scheduler_config.max_model_len
        self.long_prefill_token_threshold = scheduler_config.long_prefill_token_threshold
        self.enable_chunked_prefill = scheduler_config.enable_chunked_prefill
        self.scheduler_reserve_full_isl = scheduler_config.scheduler_reserve_full_isl
        self.block_size = cache_config.block_size
        self.log_stats = log_stats
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        self.structured_output_manager = structured_output_manager or StructuredOutputManager()
        self.num_structured_output_reqs = 0  # live requests with a grammar: 0 keeps every grammar hook off
        self.grammar_compile_error_reqs: set[str] = set()
        self.step_id = 0
        self.kv_cache_manager = KVCacheManager(num_gpu_blocks, self.block_size, self.max_model_len,
                                               cache_config.enable_prefix_caching,
                                               watermark=scheduler_config.watermark)
        self.block_hasher = (get_request_block_hasher(self.block_size)
                             if cache_config.enable_prefix_caching else None)
        self.num_spec_tokens = num_spec_tokens
        self.spec_decoding_stats = SpecDecodingStats.new(num_spec_tokens) if num_spec_tokens else None
        self.pause_state = PauseState.UNPAUSED  # the dev server's /pause and /sleep (EngineCore.pause_scheduler)

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        kv = self.kv_cache_manager
        threshold = self.long_prefill_token_threshold
        # Paused (vLLM: scheduler.py:460, 684): PAUSED_ALL schedules nothing, PAUSED_NEW no waiting request.
        token_budget = self.max_num_scheduled_tokens if self.pause_state != PauseState.PAUSED_ALL else 0
        num_scheduled_tokens: dict[str, int] = {}
        # CachedRequestData's rows for the scheduled running requests, filled as they are scheduled.
        cached_req_ids: list[str] = []
        cached_new_block_ids: list[list[int] | None] = []
        cached_num_computed_tokens: list[int] = []
        scheduled_new_reqs: list[NewRequestData] = []
        preempted_reqs: list[Request] = []
        scheduled_spec_decode_tokens: dict[str, list[int]] = {}

        # 1. Running requests first: each advances by min(remaining, threshold, budget left).
        running = self.running
        max_model_len = self.max_model_len
        allocate_slots = kv.allocate_slots
        # A for loop over a list that only ever loses its tail meanwhile (preemption pops the last request, one
        # not reached yet): vLLM's `while req_index < len(self.running)` without the index bookkeeping.
        for request in running:
            if token_budget <= 0:
                break
            num_computed_tokens = request.num_computed_tokens
            num_output_placeholders = request.num_output_placeholders
            if num_output_placeholders and request.max_tokens is not None and (
                    num_computed_tokens + 2 - num_output_placeholders
                    >= request.num_prompt_tokens + request.max_tokens):
                continue  # async scheduling: the step in flight already samples this request's last token
            # = request.num_tokens_with_spec + placeholders - num_computed_tokens, without property calls
            num_new_tokens = (len(request.all_token_ids) + len(request.spec_token_ids) + num_output_placeholders
                              - num_computed_tokens)
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            # The budget and max_model_len cap it too (plain ifs: this loop runs per request per step,
            # and min() costs several times more).
            if num_new_tokens > token_budget:
                num_new_tokens = token_budget
            if num_new_tokens > max_model_len - 1 - num_computed_tokens:
                num_new_tokens = max_model_len - 1 - num_computed_tokens
            if num_new_tokens <= 0:
                continue
            request_id = request.request_id
            while True:
                new_blocks = allocate_slots(request, num_new_tokens)
                if new_blocks is not None:
                    break
                # Out of blocks: preempt the lowest-priority (last admitted) request by recompute.
                preempted = running.pop()
                self._preempt_request(preempted)
                preempted_reqs.append(preempted)
                if preempted is request:
                    break
            if new_blocks is None:
                break
            new_block_ids = new_blocks.get_block_ids() if new_blocks.blocks else None
            cached_req_ids.append(request_id)
            cached_new_block_ids.append(new_block_ids)
            cached_num_computed_tokens.append(num_computed_tokens)
            num_scheduled_tokens[request_id] = num_new_tokens
            token_budget -= num_new_tokens
            request.num_computed_tokens = num_computed_tokens + num_new_tokens  # see _update_after_schedule
            if request.spec_token_ids:
                # Drafts that fit this step's share ride along; fresh ones come after the step.
                num_spec = num_new_tokens + num_computed_tokens - len(request.all_token_ids)
                if num_spec > 0:
                    scheduled_spec_decode_tokens[request.request_id] = request.spec_token_ids[:num_spec]
                request.spec_token_ids = []

        # 2. Then waiting requests, in order, unless this step had to preempt (it is short of blocks). Resumed
        # ones join the cached rows, after the running ones.
        num_running_rows = len(cached_req_ids)
        if not preempted_reqs and self.pause_state == PauseState.UNPAUSED:
            skipped_waiting: list[Request] = []  # grammars still compiling: they keep their place
            while self.waiting and token_budget > 0:
                if len(self.running) >= self.max_num_running_reqs:
                    break
                request = self.waiting[0]
                if (request.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
                        and not self._try_promote_blocked_waiting_request(request)):
                    skipped_waiting.append(self.waiting.popleft())
                    continue
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
                # Admission gate: the whole prompt must fit, not just this chunk, so chunked prefills
                # admitted together cannot run the cache dry halfway and thrash (scheduler_reserve_full_isl).
                new_blocks = kv.allocate_slots(request, num_new_tokens, num_new_local_computed,
                                               new_computed_blocks,
                                               full_sequence_must_fit=self.scheduler_reserve_full_isl,
                                               has_scheduled_reqs=bool(self.running))
                if new_blocks is None:
                    break
                kv.record_prefix_cache_stats(request, num_new_local_computed)
                self.waiting.popleft()
                self.running.append(request)
                if request.num_cached_tokens < 0:
                    request.num_cached_tokens = num_computed_tokens
                request.num_computed_tokens = num_computed_tokens  # what the worker is told: before this step
                block_ids = kv.get_block_ids(request.request_id)
                if request.status == RequestStatus.PREEMPTED:
                    cached_req_ids.append(request.request_id)
                    cached_new_block_ids.append(block_ids)
                    cached_num_computed_tokens.append(num_computed_tokens)
                else:
                    scheduled_new_reqs.append(NewRequestData.from_request(request, block_ids))
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed_tokens + num_new_tokens
                num_scheduled_tokens[request.request_id] = num_new_tokens
                token_budget -= num_new_tokens
            if skipped_waiting:
                self.waiting.extendleft(reversed(skipped_waiting))

        total = self.max_num_scheduled_tokens - token_budget
        assert total <= self.max_num_scheduled_tokens
        assert len(self.running) <= self.max_num_running_reqs

        # Requests the worker already holds travel as deltas: running ones, then resumed ones.
        resumed_from_preemption = [False] * num_running_rows + [True] * (len(cached_req_ids) - num_running_rows)
        cached = CachedRequestData(req_ids=cached_req_ids, resumed_from_preemption=resumed_from_preemption,
                                   new_block_ids=cached_new_block_ids,
                                   num_computed_tokens=cached_num_computed_tokens)
        self.step_id += 1
        output = SchedulerOutput(
            scheduled_new_reqs=scheduled_new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=total,
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids={r.request_id for r in preempted_reqs},
            scheduled_spec_decode_tokens=scheduled_spec_decode_tokens,
            step=self.step_id,
        )
        self.finished_req_ids = set()
        self._update_after_schedule(output)
        if self.num_structured_output_reqs:
            output.has_structured_output_requests = bool(self._structured_output_request_ids(output))
        return output

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Tokens scheduled now count as computed now, so the next schedule() may run before this step's
        output arrives (the worker reads the old counts from scheduler_output).

        vLLM advances num_computed_tokens here, in one more pass over the step's requests; minivllm's two loops
        in schedule() advance each request as they schedule it, so the base class has nothing left to do here.
        AsyncScheduler adds its output placeholders.
        """

    def _try_promote_blocked_waiting_request(self, request: Request) -> bool:
        """WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR -> WAITING once the grammar compiled (never blocks); the only
        blocked state minivllm has (vLLM's also covers remote KV)."""
        grammar = request.structured_output_request.grammar
        if grammar is None:
            return False
        if isinstance(grammar, Exception):
            self.grammar_compile_error_reqs.add(request.request_id)  # finished in update_from_output
            return False
        request.status = RequestStatus.WAITING
        return True

    def _structured_output_request_ids(self, scheduler_output: SchedulerOutput) -> list[str]:
        """Constrained requests that sample this step (not mid-prefill), in scheduling order."""
        requests = self.requests
        return [req_id for req_id in scheduler_output.num_scheduled_tokens
                if (r := requests.get(req_id)) is not None and r.structured_output_request is not None
                and r.num_computed_tokens >= len(r.all_token_ids)]

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """The step's grammar phase: bitmask rows for the constrained requests that sample this step."""
        if not scheduler_output.has_structured_output_requests:
            return None
        req_ids = self._structured_output_request_ids(scheduler_output)
        if not req_ids:
            return None
        bitmask = self.structured_output_manager.grammar_bitmask(self.requests, req_ids,
                                                                 scheduler_output.scheduled_spec_decode_tokens)
        return GrammarOutput(req_ids, bitmask)

    def _preempt_request(self, request: Request) -> None:
        """Preemption by recompute: drop the KV, forget progress, go back to the front of waiting."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_output_placeholders = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    # ---------------------------------------------------------------- update
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        sampled_token_ids = model_runner_output.sampled_token_ids
        logprobs = model_runner_output.logprobs
        logprob_ranks = model_runner_output.logprob_ranks
        req_id_to_index = model_runner_output.req_id_to_index
        requests = self.requests
        prompt_logprobs = model_runner_output.prompt_logprobs
        outputs: list[EngineCoreOutput] = []
        stopped_running: set[Request] = set()
        stopped_preempted: set[Request] = set()
        scheduled_spec = scheduler_output.scheduled_spec_decode_tokens
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(req_id)
            if request is None:
                continue  # finished or aborted while the step ran (it left self.requests): dropped
            req_index = req_id_to_index.get(req_id)
            generated = sampled_token_ids[req_index] if req_index is not None else ()
            if not generated:
                continue  # a partial prefill produces no token
            status_before = request.status
            if scheduled_spec and req_id in scheduled_spec:
                self._roll_back_rejected(request, len(scheduled_spec[req_id]), len(generated) - 1)
            new_token_ids, stopped = self._update_request_with_output(request, generated)
            finish_reason = None
            if stopped:
                finish_reason = request.get_finished_reason()
                if status_before == RequestStatus.RUNNING:
                    stopped_running.add(request)
                else:
                    stopped_preempted.add(request)
                self._free_request(request)
            num_cached_tokens = request.num_cached_tokens  # -1 until admission sets it
            if num_cached_tokens < 0:
                num_cached_tokens = 0
            if logprobs is None and not prompt_logprobs:  # positional, defaults left out: half the cost
                outputs.append(EngineCoreOutput(req_id, new_token_ids, None, finish_reason, request.stop_reason,
                                                num_cached_tokens))
                continue
            new_logprobs = new_ranks = None
            if logprobs is not None and logprobs[req_index] is not None:
                new_logprobs = logprobs[req_index][:len(new_token_ids)]
                if logprob_ranks is not None and logprob_ranks[req_index] is not None:
                    new_ranks = logprob_ranks[req_index][:len(new_token_ids)]
            prompt_lps, prompt_ranks = prompt_logprobs.get(req_id, (None, None))
            outputs.append(EngineCoreOutput(req_id, new_token_ids, new_logprobs, finish_reason,
                                            request.stop_reason, num_cached_tokens,
                                            new_logprob_ranks=new_ranks, new_prompt_logprobs=prompt_lps,
                                            new_prompt_logprob_ranks=prompt_ranks))
        if stopped_running:
            self.running = [r for r in self.running if r not in stopped_running]
        if stopped_preempted:
            # Rare: preempted while its step ran, then finished by that step's late token.
            self.waiting = deque(r for r in self.waiting if r not in stopped_preempted)
        if self.grammar_compile_error_reqs:
            outputs.extend(self._finish_grammar_errors())
        return EngineCoreOutputs(outputs=outputs,
                                 scheduler_stats=self.make_stats() if self.log_stats else None)

    def _update_request_with_output(self, request: Request, new_token_ids: list[int]) -> tuple[list[int], bool]:
        """Append the sampled tokens one by one: a stop ends the request there, and later tokens (drafts)
        are dropped (vLLM: same name). A constrained request's grammar takes each token after check_stop."""
        has_grammar = request.structured_output_request is not None
        for i, token_id in enumerate(new_token_ids):
            request.append_output_token_ids(token_id)
            stopped = check_stop(request, self.max_model_len)
            if has_grammar:
                stopped = self._advance_grammar(request, stopped)
            if stopped:
                return new_token_ids[:i + 1], True
        return new_token_ids, False

    def _roll_back_rejected(self, request: Request, num_draft: int, num_accepted: int) -> None:
        """Rejected drafts were computed but are not the request's tokens: forget their KV positions.

        Their slots stay allocated and are overwritten by the next tokens (blocks past request.num_tokens
        are never cached), so nothing leaks. A request preempted meanwhile has nothing to roll back.
        """
        if request.num_computed_tokens > 0:
            request.num_computed_tokens -= num_draft - num_accepted
        if self.spec_decoding_stats is not None:
            self.spec_decoding_stats.observe_draft(num_draft, num_accepted)

    def update_draft_token_ids(self, req_ids: list[str], draft_token_ids: list[list[int]]) -> None:
        """The runner's fresh drafts, scheduled with their request next step (vLLM: same name).

        A constrained request keeps only the drafts its grammar accepts from its current state (vLLM:
        grammar.validate_tokens), so every draft it verifies is one the grammar allows.
        """
        requests = self.requests
        for req_id, draft in zip(req_ids, draft_token_ids, strict=True):
            request = requests.get(req_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue
            if draft and self.structured_output_manager.should_advance(request):
                draft = request.structured_output_request.grammar.validate_tokens(draft)
            request.spec_token_ids = draft

    def _advance_grammar(self, request: Request, stopped: bool) -> bool:
        """After check_stop (its verdict: stopped), feed the new token to the request's grammar (vLLM's order).

        A token the grammar rejects ends the request with FINISHED_ERROR (vLLM too). Unlike vLLM, a
        grammar that terminated (accepted its stop token) also ends the request even where EOS did not
        stop it (ignore_eos, min_tokens): past the grammar's end nothing would constrain it.
        """
        grammar = request.structured_output_request.grammar
        if not grammar.accept_tokens(request.request_id, request.output_token_ids[-1:]):
            request.status = RequestStatus.FINISHED_ERROR
            request.stop_reason = "the grammar rejected the sampled token"
            return True
        if not stopped and grammar.is_terminated():
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        return stopped

    def _finish_grammar_errors(self) -> list[EngineCoreOutput]:
        """Requests whose grammar failed to compile end with FINISHED_ERROR and the compiler's message."""
        ids, self.grammar_compile_error_reqs = self.grammar_compile_error_reqs, set()
        errors = {i: self.requests[i].structured_output_request.grammar for i in ids if i in self.requests}
        self.finish_requests(errors, RequestStatus.FINISHED_ERROR)
        return [EngineCoreOutput(i, [], None, FinishReason.ERROR, f"grammar compilation failed: {xgrammar_error(e)}")
                for i, e in errors.items()]

    # ---------------------------------------------------------------- requests
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        if self.block_hasher is not None and request._block_hasher is None:
            request.set_block_hasher(self.block_hasher)
        self.waiting.append(request)
        self.requests[request.request_id] = request
        if request.structured_output_request is not None:
            self.num_structured_output_reqs += 1

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
        if request.structured_output_request is not None:
            self.num_structured_output_reqs -= 1
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def get_num_unfinished_requests(self) -> int:
        """Those a step could advance: paused, the waiting ones do not count (vLLM: scheduler.py:2382), so the
        busy loop idles instead of stepping with nothing to schedule."""
        if self.pause_state == PauseState.PAUSED_ALL:
            return 0
        if self.pause_state == PauseState.PAUSED_NEW:
            return len(self.running)
        return len(self.waiting) + len(self.running)

    def has_finished_requests(self) -> bool:
        return len(self.finished_req_ids) > 0

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        """Forget the cached blocks; False while a request holds blocks, unless reset_running_requests
        preempts every running request first (vLLM: scheduler.py:2423; they recompute when scheduled again).
        minivllm has no KV connector, so reset_connector has nothing more to reset (vLLM: success)."""
        if reset_running_requests:
            while self.running:  # from the back, so they return to waiting in their running order
                self._preempt_request(self.running.pop())
        ok = self.kv_cache_manager.reset_prefix_cache()
        if reset_running_requests and not ok:
            raise RuntimeError("the prefix cache could not be reset even with every running request preempted")
        return ok

    def make_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        pool = kv.block_pool
        stats = kv.prefix_cache_stats
        return SchedulerStats(
            num_running_reqs=len(self.running), num_waiting_reqs=len(self.waiting),
            kv_cache_usage=kv.usage, num_free_blocks=pool.get_num_free_blocks(),
            num_total_blocks=pool.num_gpu_blocks - 1, prefix_cache_queries=stats.queries,
            prefix_cache_hits=stats.hits, num_preemptions=self.num_preemptions,
            spec_decoding_stats=self.spec_decoding_stats)
