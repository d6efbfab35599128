"""AsyncScheduler (vLLM: v1/core/sched/async_scheduler.py): plans step N+1 before step N's tokens are known.

With async scheduling, EngineCore schedules the next step while the current one executes. A request
that will sample a token in the step in flight gets a placeholder for it (num_output_placeholders), and
the running loop of Scheduler.schedule() counts placeholders as tokens to compute: the next step computes
the unknown token at its position, and the worker fills in its id from the step before (its own sampled
tokens), so the scheduler never needs to see it first. When the output arrives, the real tokens replace
the placeholders.
"""
from __future__ import annotations

from minivllm.core.sched.output import SchedulerOutput
from minivllm.core.sched.scheduler import Scheduler
from minivllm.request import Request, RequestStatus


class AsyncScheduler(Scheduler):
    """Scheduler + output placeholders, for EngineCore's batch queue (two steps in flight)."""

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        super()._update_after_schedule(scheduler_output)
        spec_decode_tokens = scheduler_output.scheduled_spec_decode_tokens
        requests = self.requests
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests[req_id]
            if request.num_computed_tokens < len(request.all_token_ids) + request.num_output_placeholders:
                continue  # a prefill chunk: this step samples nothing for it
            request.num_output_placeholders += 1 + len(spec_decode_tokens.get(req_id, ()))

    def _update_request_with_output(self, request: Request, new_token_ids: list[int]) -> tuple[list[int], bool]:
        """The real tokens replace their placeholders, and the blocks they fill are cached now (vLLM: same
        name): at schedule time those positions held placeholders, which allocate_slots does not hash. A
        request preempted while its step ran had its placeholders zeroed then; its late tokens replace none,
        and it caches nothing (its blocks are gone)."""
        status_before = request.status
        new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids)
        if request.num_output_placeholders:
            request.num_output_placeholders -= len(new_token_ids)
            assert request.num_output_placeholders >= 0, request
        if status_before == RequestStatus.RUNNING:
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens - request.num_output_placeholders)
        return new_token_ids, stopped
