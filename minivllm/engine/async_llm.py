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
from minivllm.engine import EngineCoreRequest, SchedulerStats
from minivllm.engine.core_client import EngineCoreClient
from minivllm.engine.exceptions import EngineDeadError, EngineGenerateError
from minivllm.engine.output_processor import IterationStats, OutputProcessor, RequestOutputCollector
from minivllm.engine.processor import InputProcessor, PromptType
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

    async def reset_prefix_cache(self) -> bool:
        return await self.engine_core.reset_prefix_cache_async()

    def get_tokenizer(self):
        return self.tokenizer

    def shutdown(self) -> None:
        if self.output_handler is not None and not self.output_handler.done():
            self.output_handler.cancel()
        self.engine_core.shutdown()
