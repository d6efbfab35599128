"""AsyncLLM (vLLM: v1/engine/async_llm.py): the asyncio frontend that owns request streams.

    generate() --InputProcessor--> EngineCoreRequest --AsyncMPClient--> EngineCoreProc (own process)
    output handler task <--EngineCoreOutputs-- ; OutputProcessor detokenizes, finds stop strings,
    and puts each request's RequestOutput into its RequestOutputCollector, which generate() yields.

Cancellation is the frontend's job: a generate() that is cancelled or closed aborts its request in the
core, which frees its KV blocks at the next step. A dead core fails every stream with EngineDeadError.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator

from minivllm.config import EngineArgs, VllmConfig
from minivllm.engine import EngineCoreRequest
from minivllm.engine.core_client import EngineCoreClient
from minivllm.engine.exceptions import EngineDeadError, EngineGenerateError
from minivllm.engine.input_processor import InputProcessor, PromptType
from minivllm.engine.output_processor import OutputProcessor, RequestOutputCollector
from minivllm.metrics.stats import IterationStats, SchedulerStats
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import get_tokenizer


class AsyncLLM:
    """generate() as an async generator over a multiprocess EngineCore; abort(); engine stats."""

    def __init__(self, vllm_config: VllmConfig, executor_class=None, log_stats: bool = True) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.tokenizer = get_tokenizer(vllm_config.model_config.tokenizer)
        self.input_processor = InputProcessor(vllm_config, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.engine_core = EngineCoreClient.make_client(True, True, vllm_config, executor_class, log_stats)
        self.output_handler: asyncio.Task | None = None
        self.dead_error: BaseException | None = None
        # Frontend-side metrics: the latest core snapshot and per-batch stats handed to stat_loggers.
        self.scheduler_stats = SchedulerStats()
        self.stat_loggers: list = []

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs | None = None, **kwargs) -> AsyncLLM:
        from minivllm.engine.core import make_vllm_config
        return cls(make_vllm_config(engine_args or EngineArgs()), **kwargs)

    # ------------------------------------------------------------------ requests
    @property
    def errored(self) -> bool:
        return self.dead_error is not None or self.engine_core.engine_dead

    async def add_request(self, request_id: str, prompt: PromptType | EngineCoreRequest, params: SamplingParams,
                          delta: bool = False, prompt_text: str | None = None) -> RequestOutputCollector:
        """Validate (ValueError on bad input), register the stream, send to the core.

        prompt may be an EngineCoreRequest the caller built with input_processor already (the server does,
        on a thread pool, so tokenizing a long prompt never blocks the event loop); prompt_text is its text.
        """
        if self.errored:
            raise EngineDeadError()
        if isinstance(prompt, EngineCoreRequest):
            text, request = prompt_text, prompt
        else:
            text, request = self.input_processor.process_inputs(request_id, prompt, params)
        queue = RequestOutputCollector(delta)
        self.output_processor.add_request(request, text, delta, queue)
        try:
            await self.engine_core.add_request_async(request)
        except BaseException:
            self.output_processor.abort_requests([request_id])
            raise
        self._run_output_handler()
        return queue

    async def generate(self, prompt: PromptType | EngineCoreRequest, sampling_params: SamplingParams,
                       request_id: str, delta: bool = False,
                       prompt_text: str | None = None) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's RequestOutputs (cumulative, or only what is new with delta=True)."""
        queue = await self.add_request(request_id, prompt, sampling_params, delta, prompt_text)
        try:
            finished = False
            while not finished:
                out = queue.get_nowait() or await queue.get()
                finished = out.finished
                yield out
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away (task cancelled / generator closed): free the request in the core.
            self._abort(request_id)
            raise
        except (EngineDeadError, EngineGenerateError, ValueError):
            raise
        except Exception as e:
            self._abort(request_id)
            raise EngineGenerateError(f"request {request_id!r} failed: {e}") from e

    async def abort(self, request_id: str | list[str]) -> None:
        self._abort(request_id)

    def _abort(self, request_id: str | list[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        aborted = self.output_processor.abort_requests(ids)
        if aborted and not self.errored:
            self.engine_core.abort_requests(aborted)
        for logger in self.stat_loggers:
            if aborted and hasattr(logger, "record_abort"):
                logger.record_abort(len(aborted))

    # ------------------------------------------------------------------ the output handler
    def _run_output_handler(self) -> None:
        """Start (once) the task that pulls EngineCoreOutputs and feeds every request's collector."""
        if self.output_handler is not None:
            return
        engine_core, output_processor = self.engine_core, self.output_processor

        async def output_handler() -> None:
            try:
                while True:
                    outputs = await engine_core.get_output_async()
                    iteration_stats = IterationStats()
                    processed = output_processor.process_outputs(outputs.outputs, time.time(), iteration_stats)
                    if processed.reqs_to_abort:  # stop strings, found here, end the request in the core
                        engine_core.abort_requests(processed.reqs_to_abort)
                    if outputs.scheduler_stats is not None:
                        self.scheduler_stats = outputs.scheduler_stats
                    for logger in self.stat_loggers:
                        logger.record(outputs.scheduler_stats, iteration_stats)
                    await asyncio.sleep(0)  # let the streams run between batches
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                self.dead_error = e if isinstance(e, EngineDeadError) else EngineDeadError(f"output handler: {e!r}")
                output_processor.propagate_error(self.dead_error)

        self.output_handler = asyncio.get_running_loop().create_task(output_handler(), name="AsyncLLMOutputHandler")

    # ------------------------------------------------------------------ engine queries
    async def check_health(self) -> None:
        if self.errored:
            raise self.dead_error or EngineDeadError()

    async def get_stats(self) -> SchedulerStats:
        """A fresh snapshot from the core (a utility call), not the last one that came with outputs."""
        return await self.engine_core.get_stats_async()

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return await self.engine_core.reset_prefix_cache_async(reset_running_requests, reset_connector)

    # ------------------------------------------------------------------ the dev server's routes (vLLM: async_llm.py)
    async def pause_generation(self, *, mode: str = "abort", wait_for_inflight_requests: bool | None = None,
                               clear_cache: bool = True) -> None:
        """New requests wait until resume_generation; in-flight ones are aborted ("abort"), finish ("wait") or
        are kept for resume ("keep"). All in the core (EngineCore.pause_scheduler), which answers once the pause
        is complete; the short sleep lets the aborted streams' last outputs through first, as vLLM's does."""
        if wait_for_inflight_requests:  # deprecated in vLLM: mode="wait"
            mode = "wait"
        await self.engine_core.call_utility_async("pause_scheduler", mode, clear_cache)
        await asyncio.sleep(0.02)

    async def resume_generation(self) -> None:
        await self.engine_core.call_utility_async("resume_scheduler")

    async def is_paused(self) -> bool:
        return bool(await self.engine_core.call_utility_async("is_scheduler_paused"))

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        await self.engine_core.call_utility_async("sleep", level, mode)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        await self.engine_core.call_utility_async("wake_up", tags)

    async def is_sleeping(self) -> bool:
        return bool(await self.engine_core.call_utility_async("is_sleeping"))

    async def reset_mm_cache(self) -> None:
        """Nothing to reset: minivllm has no multimodal cache."""

    async def reset_encoder_cache(self) -> None:
        """Nothing to reset: minivllm has no encoder cache."""

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (),
                             kwargs: dict | None = None) -> list:
        return await self.engine_core.call_utility_async("collective_rpc", method, timeout, tuple(args), kwargs)

    async def update_weight_version(self, new_version: str) -> None:
        await self.engine_core.call_utility_async("set_weight_version", new_version)

    async def get_weight_version(self) -> str:
        return await self.engine_core.call_utility_async("get_weight_version")

    async def weight_transfer(self, what: str) -> None:
        """vLLM's init_weight_transfer_engine, start_(draft_)weight_update, update_weights and finish_weight_update
        all need a weight transfer engine (its --weight-transfer-config); minivllm has none, so each fails as vLLM's
        do when none is configured (a 500 from the dev server)."""
        raise RuntimeError(f"{what}: weight transfer not configured (minivllm has no weight transfer engine; "
                           "vLLM's is set with weight_transfer_config)")

    def abort_all_ids(self) -> list[str]:
        """Every request the frontend tracks (the dev server's /abort_requests without ids)."""
        return list(self.output_processor.request_states)

    def abort_external(self, request_ids: list) -> None:
        """Abort by the ids a client knows (a response's "id"): the engine requests of that id, of its n > 1
        children ("<i>_<id>") and of its prompts ("<id>-<k>", a completion with a list of prompts)."""
        wanted = {r for r in request_ids if isinstance(r, str)}

        def client_ids(engine_id: str):
            child, sep, rest = engine_id.partition("_")
            base = rest if sep and child.isdigit() else engine_id
            head, dash, k = base.rpartition("-")
            return (engine_id, base, head) if dash and k.isdigit() else (engine_id, base)
        ids = [r for r in self.output_processor.request_states if any(c in wanted for c in client_ids(r))]
        if ids:
            self._abort(ids)

    def get_tokenizer(self):
        return self.tokenizer

    def shutdown(self) -> None:
        if self.output_handler is not None and not self.output_handler.done():
            self.output_handler.cancel()
        self.engine_core.shutdown()
