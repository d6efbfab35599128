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
from minivllm.engine import EngineCoreOutputs
from minivllm.worker.outputs import ModelRunnerOutput


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

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        engine_core_outputs = super().update_from_output(scheduler_output, model_runner_output)
        requests = self.requests
        for output in engine_core_outputs.outputs:
            request = requests.get(output.request_id)
            # Finished requests are gone; a request preempted while its step ran had its placeholders
            # zeroed then, and its late token is not one of the new ones.
            if request is not None and request.num_output_placeholders:
                request.num_output_placeholders -= len(output.new_token_ids)
                assert request.num_output_placeholders >= 0, request
        return engine_core_outputs
