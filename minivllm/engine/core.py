"""EngineCore (vLLM: v1/engine/core.py): the busy loop's body, one step at a time.

EngineCore owns the Scheduler (request lifecycle, KV ledger) and the executor handle; it is the only
place where a step's phases are ordered (EngineCore.step, as vLLM writes it):

    schedule -> execute_model(non_block=True) -> grammar bitmask -> wait -> aborts -> update_from_output

Each phase is recorded by the tracer (minivllm/tracing.py) under the step's number. With async_scheduling,
step_fn is step_with_batch_queue instead: it schedules step N+1 while step N's forward runs.
"""
from __future__ import annotations

import inspect
import logging
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from functools import partial

import msgspec
import zmq

from minivllm.config import EngineArgs, VllmConfig
from minivllm.core.sched.async_scheduler import AsyncScheduler
from minivllm.core.sched.interface import PauseState
from minivllm.core.sched.output import SchedulerOutput
from minivllm.core.sched.scheduler import Scheduler
from minivllm.engine import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineCoreRequestType,
    FinishReason,
    UtilityOutput,
)
from minivllm.engine.exceptions import EngineDeadError
from minivllm.executor.abstract import Executor
from minivllm.request import Request, RequestStatus
from minivllm.structured_output import StructuredOutputManager
from minivllm.tracing import Tracer

logger = logging.getLogger(__name__)


def make_vllm_config(engine_args: EngineArgs) -> VllmConfig:
    """EngineArgs -> VllmConfig, capped by the checkpoint's max_position_embeddings."""
    from minivllm.model_executor.model_loader import load_hf_config, resolve_model_path
    hf_config = load_hf_config(resolve_model_path(engine_args.model))
    config = engine_args.create_engine_config(getattr(hf_config, "max_position_embeddings", None))
    config.parallel_config.verify_with_model(hf_config)
    return config


class EngineCore:
    """Scheduler + executor + the step loop body; requests enter via add_request, leave as outputs."""

    def __init__(self, vllm_config: VllmConfig, executor_class=None, log_stats: bool = True) -> None:
        self.vllm_config = vllm_config
        self.tracer = Tracer(vllm_config.trace)
        self.model_executor = (executor_class or Executor.get_class(vllm_config))(vllm_config, self.tracer)
        num_gpu_blocks = self.model_executor.determine_num_available_blocks()
        self.model_executor.initialize_cache(num_gpu_blocks)
        vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        async_scheduling = vllm_config.scheduler_config.async_scheduling
        scheduler_cls = AsyncScheduler if async_scheduling else Scheduler
        spec = vllm_config.speculative_config
        self.structured_output_manager = StructuredOutputManager(vllm_config)
        self.scheduler = scheduler_cls(vllm_config.scheduler_config, vllm_config.cache_config, num_gpu_blocks,
                                       log_stats, spec.num_speculative_tokens if spec else 0,
                                       self.structured_output_manager)
        # Async scheduling: (step number, plan, future) of steps in flight, newest first; two, so that the next
        # step is planned while one executes (vLLM: batch_queue, of size max_concurrent_batches).
        self.batch_queue_size = 2
        self.batch_queue: deque[tuple[int, SchedulerOutput, Future]] | None = deque() if async_scheduling else None
        self.aborts_queue: queue.Queue[list[str]] = queue.Queue()
        self.step_fn = self.step if self.batch_queue is None else self.step_with_batch_queue  # as vLLM picks it
        self.step_counter = 0  # the tracer's step number
        self._queue_times: dict[str, float] = {}  # scheduled, first output not sent yet
        self.num_failed_steps = 0
        self._weight_version = "default"  # the dev server's /update_weight_version and /weight_info

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs | None = None, **kwargs) -> EngineCore:
        return cls(make_vllm_config(engine_args or EngineArgs()), **kwargs)

    # ------------------------------------------------------------------ requests
    def add_request(self, request: EngineCoreRequest) -> None:
        """Validate and queue a request; a bad one raises ValueError and leaves the engine untouched."""
        max_len = self.vllm_config.scheduler_config.max_model_len
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.request_id!r}: the prompt is empty")
        if len(request.prompt_token_ids) >= max_len:  # vLLM's rule: room for at least one output token
            raise ValueError(f"request {request.request_id!r}: prompt length {len(request.prompt_token_ids)} "
                             f"leaves no room for an output token within max_model_len {max_len}")
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        req = Request.from_engine_core_request(request)
        if req.use_structured_output:
            self.structured_output_manager.grammar_init(req)  # compiles on a pool; the request waits for it
        self.scheduler.add_request(req)

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
        """Schedule, execute and update one batch (vLLM: EngineCore.step); returns the outputs and whether the
        model ran. The grammar bitmask is computed while the forward runs; aborts that arrived meanwhile are
        processed before update_from_output, so a request aborted mid-forward gets no token from this step."""
        if not self.scheduler.has_requests():
            return EngineCoreOutputs(), False
        n = self._next_step()
        scheduler_output = self._schedule(n)
        try:
            future = self._execute(n, scheduler_output)
            grammar_output = self._get_grammar_bitmask(n, scheduler_output)
            model_output = self._wait(n, future, grammar_output)
            self._process_aborts(n)
            engine_core_outputs = self._update(n, scheduler_output, model_output)
        except Exception as e:
            return self._fail_step(scheduler_output, e), True
        self.num_failed_steps = 0
        return engine_core_outputs, scheduler_output.total_num_scheduled_tokens > 0

    def post_step(self, model_executed: bool) -> None:
        """Hand the runner's fresh draft tokens to the scheduler for the next step (vLLM: same name)."""
        if model_executed and self.vllm_config.speculative_config is not None:
            drafts = self.model_executor.take_draft_token_ids()
            if drafts is not None:
                self.scheduler.update_draft_token_ids(*drafts)

    def step_with_batch_queue(self) -> tuple[EngineCoreOutputs, bool]:
        """Async scheduling (vLLM: step_with_batch_queue): schedule and launch a step, and while the queue
        has room return at once, so the next call plans step N+1 during step N's forward; otherwise wait
        for the oldest step and apply its output. The phases of one plan keep their order (schedule,
        execute, grammar, wait, aborts, update) and are traced under that plan's step number, so the trace
        shows the next step's schedule inside this step's forward.

        A plan that needs a grammar bitmask is not run ahead of: the bitmask needs the tokens of the step
        before it, and its sampling must happen before the worker starts another step.
        """
        batch_queue = self.batch_queue
        newest_needs_grammar = bool(batch_queue) and batch_queue[0][1].has_structured_output_requests
        model_executed = False
        if self.scheduler.has_requests() and not newest_needs_grammar:
            n = self._next_step()
            scheduler_output = self._schedule(n)
            batch_queue.appendleft((n, scheduler_output, self._execute(n, scheduler_output)))
            model_executed = scheduler_output.total_num_scheduled_tokens > 0
            if (model_executed and len(batch_queue) < self.batch_queue_size
                    and not scheduler_output.has_structured_output_requests):
                return EngineCoreOutputs(), True
        elif not batch_queue:
            return EngineCoreOutputs(), False
        n, scheduler_output, future = batch_queue.pop()
        grammar_output = self._get_grammar_bitmask(n, scheduler_output)
        model_output = self._wait(n, future, grammar_output)
        self._process_aborts(n)
        return self._update(n, scheduler_output, model_output), model_executed

    def _fail_step(self, scheduler_output: SchedulerOutput, error: Exception) -> EngineCoreOutputs:
        """A step raised after scheduling: finish its requests with FinishReason.ERROR and free their blocks,
        so the engine keeps serving everyone else (vLLM would die here: EngineDeadError for all).

        Which request caused it cannot be known, so the whole batch ends. Hashes of the blocks they free
        are dropped, since this step's KV was never written. Several failing steps in a row mean the core
        cannot continue: re-raise, and the client sees a dead engine. Nor is a broken invariant
        (AssertionError) or a missing implementation (NotImplementedError) hidden: that is a bug in the engine
        or in code plugged into it, not a bad request. A dead executor (EngineDeadError: a tensor-parallel
        worker died or raised) cannot run another step.
        """
        self.num_failed_steps += 1
        if self.num_failed_steps > 3 or isinstance(error, (AssertionError, NotImplementedError, EngineDeadError)):
            raise error
        logger.exception("step %d failed; finishing its %d request(s) with an error", self.step_counter,
                         len(scheduler_output.num_scheduled_tokens))
        scheduler, kv = self.scheduler, self.scheduler.kv_cache_manager
        failed = [r for r in scheduler_output.num_scheduled_tokens if r in scheduler.requests]
        blocks = [b for r in failed for b in kv.get_blocks(r).blocks]
        scheduler.finish_requests(failed, RequestStatus.FINISHED_ERROR)
        for block in blocks:
            if block.ref_cnt == 0:
                kv.block_pool._maybe_evict_cached_block(block)
        message = f"{type(error).__name__}: {error}"
        outputs = [EngineCoreOutput(r, [], finish_reason=FinishReason.ERROR, stop_reason=message) for r in failed]
        self._attach_queue_times(outputs)
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=scheduler.make_stats() if scheduler.log_stats else None)

    # The phases, each one call of vLLM's step traced under its step number n.
    def _next_step(self) -> int:
        self.step_counter += 1
        return self.step_counter

    def _schedule(self, n: int) -> SchedulerOutput:
        with self.tracer.span("schedule", n):
            scheduler_output = self.scheduler.schedule()
        if scheduler_output.scheduled_new_reqs and self.scheduler.log_stats:
            now, requests = time.time(), self.scheduler.requests  # arrival_time is the frontend's time.time()
            for new in scheduler_output.scheduled_new_reqs:
                self._queue_times[new.req_id] = max(0.0, now - requests[new.req_id].arrival_time)
        return scheduler_output

    def _execute(self, n: int, scheduler_output: SchedulerOutput) -> Future:
        with self.tracer.span("execute", n, scheduler_output.num_scheduled_tokens):
            return self.model_executor.execute_model(scheduler_output, non_block=True)

    def _get_grammar_bitmask(self, n: int, scheduler_output: SchedulerOutput):
        with self.tracer.span("grammar", n):
            return self.scheduler.get_grammar_bitmask(scheduler_output)

    def _wait(self, n: int, future: Future, grammar_output):
        """The forward's result; None means sampling was split off (vLLM: sample_tokens with the bitmask)."""
        with self.tracer.span("wait", n):
            model_output = future.result()
            if model_output is None:
                model_output = self.model_executor.sample_tokens(grammar_output)
            return model_output

    def _process_aborts(self, n: int) -> None:
        with self.tracer.span("aborts", n):
            self._process_aborts_queue()

    def _update(self, n: int, scheduler_output: SchedulerOutput, model_output) -> EngineCoreOutputs:
        with self.tracer.span("update", n):
            outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        self._attach_queue_times(outputs.outputs)
        return outputs

    def _attach_queue_times(self, outputs: list[EngineCoreOutput]) -> None:
        """A request's queue time rides on its first output (vLLM derives it from QUEUED/SCHEDULED events)."""
        queue_times = self._queue_times
        if queue_times:
            for out in outputs:
                if out.request_id in queue_times:
                    out.queue_time = queue_times.pop(out.request_id)
            if len(queue_times) > len(self.scheduler.requests):  # aborted before their first output
                for rid in [r for r in queue_times if r not in self.scheduler.requests]:
                    del queue_times[rid]

    # ------------------------------------------------------------------ utilities
    def get_stats(self):
        return self.scheduler.make_stats()

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return self.scheduler.reset_prefix_cache(reset_running_requests, reset_connector)

    # ------------------------------------------------------------------ pause, sleep (the dev server's routes)
    def pause_scheduler(self, mode: str = "abort", clear_cache: bool = True) -> Future | None:
        """Stop scheduling (vLLM: EngineCore.pause_scheduler, core.py:829/1838). "abort" ends every request
        (finish_reason "abort") and schedules no new one; "keep" schedules nothing and keeps the requests for
        resume_scheduler; "wait" lets the running ones finish. Once the engine is idle, clear_cache resets the
        prefix cache (preempting whatever still holds blocks). In-process there is no busy loop to finish a
        pause later: "wait" is refused, the rest complete at once (None); EngineCoreProc answers when idle."""
        if mode not in ("keep", "abort", "wait"):
            raise ValueError(f"Invalid pause mode: {mode}")
        if mode == "wait":
            raise ValueError("'wait' mode can't be used in inproc-engine mode")
        if mode == "abort":
            self.scheduler.finish_requests(list(self.scheduler.requests), RequestStatus.FINISHED_ABORTED)
        self.scheduler.pause_state = PauseState.PAUSED_ALL if mode == "keep" else PauseState.PAUSED_NEW
        if clear_cache:
            self._reset_caches()
        return None

    def _reset_caches(self) -> None:
        """vLLM's _reset_caches: minivllm has a prefix cache only (no multimodal, encoder or connector cache)."""
        self.reset_prefix_cache(reset_running_requests=True, reset_connector=True)

    def resume_scheduler(self) -> None:
        """Schedule again; requests that arrived while paused run now."""
        self.scheduler.pause_state = PauseState.UNPAUSED

    def is_scheduler_paused(self) -> bool:
        return self.scheduler.pause_state != PauseState.UNPAUSED

    def sleep(self, level: int = 1, mode: str = "abort") -> Future | None:
        """vLLM's EngineCore.sleep (core.py:868): pause (clearing the caches from level 1), then, from level 1
        and once the pause completed, put the executor to sleep (Worker.sleep frees the KV cache)."""
        paused = self.pause_scheduler(mode=mode, clear_cache=level >= 1)
        if level < 1:
            return paused
        if paused is None:
            self.model_executor.sleep(level)
            return None
        future: Future = Future()

        def then_sleep(f: Future) -> None:
            try:
                f.result()
                future.set_result(self.model_executor.sleep(level))
            except Exception as e:
                future.set_exception(e)
        paused.add_done_callback(then_sleep)
        return future

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Wake the executor ("scheduling" is no executor tag); resume once nothing of it sleeps (core.py:906)."""
        if tags is not None and "scheduling" in tags:
            tags = [t for t in tags if t != "scheduling"]
        if tags is None or tags:
            self.model_executor.wake_up(tags)
        if not self.model_executor.is_sleeping:
            self.resume_scheduler()

    def is_sleeping(self) -> bool:
        return self.is_scheduler_paused() or self.model_executor.is_sleeping

    def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                       kwargs: dict | None = None) -> list:
        """Run Worker.<method> on every worker (vLLM: EngineCore.collective_rpc). Checked here first, so a
        wrong name or arguments is an error for the caller, never a failed tensor-parallel worker; kwargs
        become positional; an answer msgpack cannot carry comes back as its str()."""
        from minivllm.worker.gpu_worker import Worker
        fn = getattr(Worker, method, None) if isinstance(method, str) and not method.startswith("_") else None
        if not callable(fn):
            raise AttributeError(f"'Worker' object has no attribute {method!r}")
        bound = inspect.signature(fn).bind(None, *args, **(kwargs or {}))
        if bound.kwargs:
            raise TypeError(f"Worker.{method}: keyword-only arguments {sorted(bound.kwargs)} are not supported")
        results = self.model_executor.collective_rpc(method, tuple(bound.args[1:]), timeout=timeout)
        return [r if r is None or isinstance(r, (dict, list, tuple, str, int, float, bool)) else str(r)
                for r in results]

    def set_weight_version(self, weight_version: str) -> None:
        self._weight_version = weight_version

    def get_weight_version(self) -> str:
        return self._weight_version

    def profile(self, is_start: bool = True, path: str = "minivllm_core_profile.json") -> str | None:
        """torch.profiler around the worker's steps (a utility call when the core runs apart)."""
        return self.model_executor.profile(is_start, path)

    def shutdown(self) -> None:
        self.structured_output_manager.shutdown()
        self.model_executor.shutdown()


# ====================================================================== the EngineCore process
# Frames core -> client on the handshake (input) socket, and the output-socket marker of a dead core.
HANDSHAKE_READY = b"READY"
HANDSHAKE_FAILED = b"FAILED"
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"
ENGINE_IDENTITY = b"\x00\x00"  # engine index 0 as 2 little-endian bytes, the ROUTER's routing id for us


class EngineCoreProc(EngineCore):
    """EngineCore in its own process (vLLM: EngineCoreProc): the busy loop on the main thread, ZMQ on two IO threads.

    input:  client ROUTER --(type, msgpack)--> our DEALER --process_input_sockets--> input_queue
    output: output_queue --process_output_sockets--> our PUSH --msgpack--> client PULL
    The IO threads only (de)serialize and move bytes, so socket work overlaps the model's forward pass.
    """

    startup_failure_sent = False  # set in the child when the FAILED handshake went out

    def __init__(self, vllm_config: VllmConfig, input_address: str, output_address: str,
                 executor_class=None, log_stats: bool = True) -> None:
        self.input_queue: queue.Queue[tuple[EngineCoreRequestType, object]] = queue.Queue()
        self.output_queue: queue.Queue[EngineCoreOutputs | bytes] = queue.Queue()
        self.ctx = zmq.Context()
        input_socket = self.ctx.socket(zmq.DEALER)
        input_socket.setsockopt(zmq.ROUTING_ID, ENGINE_IDENTITY)
        input_socket.setsockopt(zmq.LINGER, 2000)
        input_socket.connect(input_address)
        try:
            super().__init__(vllm_config, executor_class, log_stats)
        except BaseException:
            # Start-up handshake, failure branch: the client raises with our traceback instead of waiting.
            input_socket.send_multipart([HANDSHAKE_FAILED, traceback.format_exc().encode()])
            input_socket.close()
            EngineCoreProc.startup_failure_sent = True
            raise
        self.engines_running = False
        self._idle_state_callbacks: list = []  # pause/sleep answers waiting for an idle engine
        ready = {"num_gpu_blocks": vllm_config.cache_config.num_gpu_blocks,
                 "max_model_len": vllm_config.scheduler_config.max_model_len, "pid": os.getpid()}
        input_socket.send_multipart([HANDSHAKE_READY, msgspec.msgpack.encode(ready)])
        # The socket moves to its IO thread now; thread start is the memory barrier zmq asks for.
        threading.Thread(target=self.process_input_sockets, args=(input_socket,), daemon=True,
                         name="EngineCoreInputIO").start()
        self.output_thread = threading.Thread(target=self.process_output_sockets, args=(output_address,),
                                              daemon=True, name="EngineCoreOutputIO")
        self.output_thread.start()

    # ------------------------------------------------------------------ process entry point
    @staticmethod
    def run_engine_core(vllm_config: VllmConfig, input_address: str, output_address: str, parent_pid: int,
                        executor_class=None, log_stats: bool = True) -> None:
        """Target of the spawned process: build the core, handshake, run the busy loop until SIGTERM."""

        def signal_handler(signum, frame):
            raise SystemExit(0)
        signal.signal(signal.SIGTERM, signal_handler)
        signal.signal(signal.SIGINT, signal_handler)
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True, name="ParentWatch").start()
        _leave_a_core_for_the_frontend(vllm_config)
        engine: EngineCoreProc | None = None
        try:
            engine = EngineCoreProc(vllm_config, input_address, output_address, executor_class, log_stats)
            engine.run_busy_loop()
        except SystemExit:
            pass
        except BaseException:
            if engine is None and EngineCoreProc.startup_failure_sent:
                # The handshake carried the traceback; the client reports it (`serve`: in one line). The teardown
                # still has to flush that message, so the client's SIGTERM is ignored from here: raised inside
                # zmq's Context.__del__ it would print an "Exception ignored" traceback of its own.
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                sys.exit(1)
            traceback.print_exc()
            print("EngineCore hit a fatal error; telling the client it is dead.", file=sys.stderr)
            if engine is not None:
                engine._send_engine_dead()
            sys.exit(1)
        finally:
            if engine is not None:
                engine.shutdown()

    # ------------------------------------------------------------------ the busy loop
    def run_busy_loop(self) -> None:
        """Forever: take in what the client sent (blocking while idle), then run one step."""
        while True:
            self._process_input_queue()
            self._process_engine_step()

    def _process_input_queue(self) -> None:
        # Idle: sleep on the queue instead of spinning. Busy: drain whatever arrived during the step.
        while not self.has_work():
            while self._idle_state_callbacks:  # a pause waiting for the engine to be idle completes
                self._idle_state_callbacks.pop()(self)
            self._handle_client_request(*self.input_queue.get())
        while not self.input_queue.empty():
            self._handle_client_request(*self.input_queue.get_nowait())

    def has_work(self) -> bool:
        """Whether the engine should step (vLLM: same name); a paused scheduler counts only what it may run."""
        return self.engines_running or self.scheduler.has_requests() or bool(self.batch_queue)

    def pause_scheduler(self, mode: str = "abort", clear_cache: bool = True) -> Future | None:
        """vLLM's EngineCoreProc.pause_scheduler (core.py:1838): the aborted requests' streams end at once;
        the answer (a Future, see _handle_client_request) comes when the engine is idle: the running requests
        finished ("wait"), the aborted ones reported to the worker; the caches are reset then."""
        if mode not in ("keep", "abort", "wait"):
            raise ValueError(f"Invalid pause mode: {mode}")
        if mode == "abort":
            ids = list(self.scheduler.requests)
            self.scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
            if ids:
                self.output_queue.put_nowait(EngineCoreOutputs(outputs=[
                    EngineCoreOutput(i, [], finish_reason=FinishReason.ABORT) for i in ids]))
        self.scheduler.pause_state = PauseState.PAUSED_ALL if mode == "keep" else PauseState.PAUSED_NEW
        if not self.has_work():
            if clear_cache:
                self._reset_caches()
            return None
        future: Future = Future()

        def when_idle(engine: EngineCoreProc) -> None:
            if clear_cache:
                engine._reset_caches()
            future.set_result(None)
        self._idle_state_callbacks.append(when_idle)
        return future

    def _process_engine_step(self) -> bool:
        outputs, model_executed = self.step_fn()
        self.post_step(model_executed)
        if outputs.outputs or outputs.scheduler_stats is not None:
            self.output_queue.put_nowait(outputs)
        return model_executed

    def _handle_client_request(self, request_type: EngineCoreRequestType, request) -> None:
        if request_type == EngineCoreRequestType.ADD:
            try:
                self.add_request(request)
            except ValueError as e:  # the frontend validates, so this is rare; never leave its stream hanging
                self.output_queue.put_nowait(EngineCoreOutputs(outputs=[EngineCoreOutput(
                    request.request_id, [], finish_reason=FinishReason.ABORT, stop_reason=str(e))]))
        elif request_type == EngineCoreRequestType.ABORT:
            self.abort_requests(request)
        elif request_type == EngineCoreRequestType.UTILITY:
            call_id, method_name, args = request
            try:
                if method_name.startswith("_") or method_name not in UTILITY_METHODS:
                    raise ValueError(f"{method_name!r} is not a utility method; choose from {UTILITY_METHODS}")
                result = getattr(self, method_name)(*args)
            except Exception as e:
                result = e
            if isinstance(result, Future):  # answered when it completes (a pause waiting for an idle engine)
                result.add_done_callback(partial(self._send_utility_output, call_id))
            else:
                self._send_utility_output(call_id, result)

    def _send_utility_output(self, call_id: int, result) -> None:
        if isinstance(result, Future):
            try:
                result = result.result()
            except Exception as e:
                result = e
        output = (UtilityOutput(call_id, failure_message=f"{type(result).__name__}: {result}")
                  if isinstance(result, Exception) else UtilityOutput(call_id, result=result))
        self.output_queue.put_nowait(EngineCoreOutputs(utility_output=output))

    # ------------------------------------------------------------------ IO threads
    def process_input_sockets(self, input_socket: zmq.Socket) -> None:
        """Input IO thread: recv (type, payload) frames, decode, feed input_queue."""
        add_decoder = msgspec.msgpack.Decoder(EngineCoreRequest)
        generic_decoder = msgspec.msgpack.Decoder()
        while True:
            type_frame, data = input_socket.recv_multipart(copy=False)
            request_type = EngineCoreRequestType(bytes(type_frame.buffer))
            decoder = add_decoder if request_type == EngineCoreRequestType.ADD else generic_decoder
            request = decoder.decode(data.buffer)
            if request_type == EngineCoreRequestType.ABORT:
                # vLLM: into both queues, so a step in flight drops the request before update_from_output;
                # the input_queue copy keeps the order with its ADD (aborting is idempotent)
                self.aborts_queue.put_nowait(list(request))
            self.input_queue.put_nowait((request_type, request))

    def process_output_sockets(self, output_address: str) -> None:
        """Output IO thread: drain output_queue, encode, push to the client."""
        encoder = msgspec.msgpack.Encoder()
        socket = self.ctx.socket(zmq.PUSH)
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.LINGER, 2000)
        socket.connect(output_address)
        try:
            while True:
                outputs = self.output_queue.get()
                if outputs is ENGINE_CORE_DEAD:
                    socket.send(ENGINE_CORE_DEAD)
                    return
                socket.send(encoder.encode(outputs), copy=False)
        finally:
            socket.close()

    def _send_engine_dead(self) -> None:
        """Tell the client we are dying (before exiting), so no request waits forever."""
        self.output_queue.put_nowait(ENGINE_CORE_DEAD)
        self.output_thread.join(timeout=5.0)

    # ------------------------------------------------------------------ utilities (called by name)
    def sleep_for_test(self, seconds: float) -> bool:
        """Block the busy loop (tests use it to stack requests up, or to time a utility round trip)."""
        time.sleep(seconds)
        return True

    def raise_for_test(self, message: str) -> None:
        """Crash the busy loop on purpose: tests check that the client learns of a dead core."""
        raise _InjectedFatalError(message)


class _InjectedFatalError(BaseException):
    """Escapes the utility handler's `except Exception`, so it kills the busy loop like a real bug would."""


UTILITY_METHODS = ("get_stats", "reset_prefix_cache", "sleep_for_test", "raise_for_test", "profile",
                   # the dev server's routes (vLLM's EngineCoreClient.*_async utility calls)
                   "pause_scheduler", "resume_scheduler", "is_scheduler_paused", "sleep", "wake_up", "is_sleeping",
                   "collective_rpc", "set_weight_version", "get_weight_version")


def _leave_a_core_for_the_frontend(vllm_config: VllmConfig) -> None:
    """On CPU, torch's intra-op threads would take every core; the frontend process (detokenizing while
    we step) then preempts one of them and the whole parallel region waits. Keep one core free unless
    OMP_NUM_THREADS says otherwise."""
    import torch
    if "OMP_NUM_THREADS" in os.environ or vllm_config.device not in ("auto", "cpu"):
        return
    if vllm_config.device == "auto" and torch.cuda.is_available():
        return
    torch.set_num_threads(max(1, min(torch.get_num_threads(), (os.cpu_count() or 2) - 1)))


def _watch_parent(parent_pid: int) -> None:
    """Die with the client: an orphaned EngineCore must not outlive a killed frontend."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(1)
