"""EngineCore (vLLM: v1/engine/core.py): the busy loop's body, one step at a time.

EngineCore owns the Scheduler (request lifecycle, KV ledger) and the executor handle; it is the only
place where a step's phases are ordered:

    schedule -> execute_model(non_block=True) -> grammar bitmask -> wait -> aborts -> update_from_output

The step itself is a plain function with lesson 1's signature, so a student's version can be plugged
in with EngineCore(step_fn=...), and every phase is recorded by the tracer.
"""
from __future__ import annotations

import queue
from collections.abc import Callable, Iterable

from minivllm.config import EngineArgs, VllmConfig
from minivllm.core.sched.output import SchedulerOutput
from minivllm.core.sched.scheduler import Scheduler
from minivllm.engine import EngineCoreOutputs, EngineCoreRequest
from minivllm.executor.uniproc_executor import UniProcExecutor
from minivllm.request import Request, RequestStatus
from minivllm.structured_output import StructuredOutputManager
from minivllm.tracing import Tracer


def engine_core_step(has_requests, schedule, execute_async, get_grammar, process_aborts, update):
    """One engine step in the order vLLM's EngineCore.step uses (lesson 1's exercise, solved)."""
    trace = []
    if not has_requests:
        return {}, False, trace
    plan = schedule()
    trace.append("schedule")
    future = execute_async(plan)
    trace.append("execute")
    grammar = get_grammar(plan)
    trace.append("grammar")
    model_output = future()
    trace.append("wait")
    process_aborts()
    trace.append("aborts")
    outputs = update(plan, model_output)
    trace.append("update")
    return outputs, plan["scheduled_tokens"] > 0, trace


class StepPlan(dict):
    """The plan a step function sees: {"scheduled_tokens": n}, carrying the real SchedulerOutput."""

    def __init__(self, scheduler_output: SchedulerOutput) -> None:
        super().__init__(scheduled_tokens=scheduler_output.total_num_scheduled_tokens)
        self.scheduler_output = scheduler_output


class EngineCore:
    """Scheduler + executor + the step loop body; requests enter via add_request, leave as outputs."""

    def __init__(self, vllm_config: VllmConfig, executor_class=UniProcExecutor, log_stats: bool = True,
                 step_fn: Callable | None = None) -> None:
        self.vllm_config = vllm_config
        self.tracer = Tracer(vllm_config.trace)
        self.model_executor = executor_class(vllm_config, self.tracer)
        num_gpu_blocks = self.model_executor.determine_num_available_blocks()
        self.model_executor.initialize_cache(num_gpu_blocks)
        vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        self.scheduler = Scheduler(vllm_config.scheduler_config, vllm_config.cache_config, num_gpu_blocks,
                                   log_stats)
        self.structured_output_manager = StructuredOutputManager()
        self.aborts_queue: queue.Queue[list[str]] = queue.Queue()
        self.step_fn = step_fn or engine_core_step
        self.step_counter = 0

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs | None = None, **kwargs) -> EngineCore:
        from minivllm.model_executor.model_loader import load_hf_config, resolve_model_path
        engine_args = engine_args or EngineArgs()
        hf_config = load_hf_config(resolve_model_path(engine_args.model))
        config = engine_args.create_engine_config(getattr(hf_config, "max_position_embeddings", None))
        return cls(config, **kwargs)

    # ------------------------------------------------------------------ requests
    def add_request(self, request: EngineCoreRequest) -> None:
        """Validate and queue a request; a bad one raises ValueError and leaves the engine untouched."""
        max_len = self.vllm_config.scheduler_config.max_model_len
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.request_id!r}: the prompt is empty")
        if len(request.prompt_token_ids) > max_len:
            raise ValueError(f"request {request.request_id!r}: prompt length {len(request.prompt_token_ids)} "
                             f"exceeds max_model_len {max_len}")
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        self.scheduler.add_request(Request.from_engine_core_request(request))

    def abort_requests(self, request_ids: str | Iterable[str]) -> None:
        """Thread-safe: queue aborts; the next step drains them before update_from_output."""
        self.aborts_queue.put([request_ids] if isinstance(request_ids, str) else list(request_ids))

    def _process_aborts_queue(self) -> None:
        request_ids: list[str] = []
        while not self.aborts_queue.empty():
            request_ids.extend(self.aborts_queue.get_nowait())
        if request_ids:
            self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    # ------------------------------------------------------------------ the step
    def step(self) -> tuple[EngineCoreOutputs, bool]:
        """Run one step through step_fn; returns the outputs and whether any token was scheduled."""
        self.step_counter += 1
        outputs, ran, _ = self.step_fn(self.scheduler.has_requests(), self._schedule, self._execute_async,
                                       self._get_grammar, self._process_aborts, self._update)
        return (outputs if isinstance(outputs, EngineCoreOutputs) else EngineCoreOutputs()), bool(ran)

    def _schedule(self) -> StepPlan:
        with self.tracer.span("schedule", self.step_counter):
            scheduler_output = self.scheduler.schedule()
        return StepPlan(scheduler_output)

    def _execute_async(self, plan: StepPlan) -> Callable:
        so = plan.scheduler_output
        with self.tracer.span("execute", self.step_counter, so.num_scheduled_tokens):
            future = self.model_executor.execute_model(so, non_block=True)
        step = self.step_counter

        def wait():
            with self.tracer.span("wait", step):
                output = future.result()
                if output is None:
                    output = self.model_executor.sample_tokens(plan.get("grammar_output"))
            return output
        return wait

    def _get_grammar(self, plan: StepPlan):
        with self.tracer.span("grammar", self.step_counter):
            plan["grammar_output"] = self.structured_output_manager.grammar_bitmask(plan.scheduler_output)
        return plan["grammar_output"]

    def _process_aborts(self) -> None:
        with self.tracer.span("aborts", self.step_counter):
            self._process_aborts_queue()

    def _update(self, plan: StepPlan, model_output) -> EngineCoreOutputs:
        with self.tracer.span("update", self.step_counter):
            return self.scheduler.update_from_output(plan.scheduler_output, model_output)

    # ------------------------------------------------------------------ utilities
    def get_stats(self):
        return self.scheduler.make_stats()

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()

    def shutdown(self) -> None:
        self.model_executor.shutdown()
