"""LLMEngine (vLLM: v1/engine/llm_engine.py): the synchronous frontend behind LLM.

InputProcessor (tokenize, validate) -> EngineCoreClient -> OutputProcessor (detokenize, stop strings).
By default the EngineCore runs in its own process (SyncMPClient); multiprocess_mode=False keeps it
in this one (InprocClient), where its scheduler and tracer can be read directly.
"""
from __future__ import annotations

import itertools
import time

from minivllm import envs
from minivllm.config import EngineArgs, VllmConfig
from minivllm.engine.core_client import EngineCoreClient
from minivllm.engine.input_processor import InputProcessor, PromptType
from minivllm.engine.output_processor import OutputProcessor
from minivllm.metrics.stats import IterationStats
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import get_tokenizer


def multiprocessing_default() -> bool:
    """MINIVLLM_ENABLE_MULTIPROCESSING=0 (vLLM: VLLM_ENABLE_V1_MULTIPROCESSING) keeps the core in-process."""
    return envs.MINIVLLM_ENABLE_MULTIPROCESSING


class LLMEngine:
    """add_request / step / has_unfinished_requests over an EngineCore."""

    def __init__(self, vllm_config: VllmConfig, engine_core: EngineCoreClient, log_stats: bool = False) -> None:
        self.vllm_config = vllm_config
        self.stat_logger = None  # log_stats: the Prometheus metrics that get_metrics() reads
        if log_stats:
            from minivllm.entrypoints.openai.metrics import PrometheusStatLogger
            self.stat_logger = PrometheusStatLogger(vllm_config.model_config.model,
                                                    vllm_config.scheduler_config.max_model_len)
        self.tokenizer = get_tokenizer(vllm_config.model_config.tokenizer)
        self.input_processor = InputProcessor(vllm_config, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.engine_core = engine_core
        self._ids = itertools.count()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, multiprocess_mode: bool | None = None,
                         log_stats: bool = False, **core_kwargs) -> LLMEngine:
        """core_kwargs go to EngineCore (executor_class, log_stats); log_stats keeps the frontend's metrics for
        get_metrics()."""
        from minivllm.engine.core import make_vllm_config
        if multiprocess_mode is None:
            multiprocess_mode = multiprocessing_default()
        config = make_vllm_config(engine_args)
        return cls(config, EngineCoreClient.make_client(multiprocess_mode, False, config, **core_kwargs), log_stats)

    def add_request(self, request_id: str | None, prompt: PromptType, params: SamplingParams) -> str:
        request_id = request_id if request_id is not None else str(next(self._ids))
        text, request = self.input_processor.process_inputs(request_id, prompt, params)
        self.output_processor.add_request(request, text)
        try:
            self.engine_core.add_request(request)
        except Exception:
            self.output_processor.abort_requests([request_id])
            raise
        return request_id

    def abort_request(self, request_ids: list[str]) -> None:
        self.output_processor.abort_requests(request_ids)
        self.engine_core.abort_requests(request_ids)

    def step(self) -> list[RequestOutput]:
        outputs = self.engine_core.get_output()
        iteration_stats = IterationStats() if self.stat_logger is not None else None
        processed = self.output_processor.process_outputs(outputs.outputs, time.time(), iteration_stats)
        if self.stat_logger is not None:
            self.stat_logger.record(outputs.scheduler_stats, iteration_stats)
        if processed.reqs_to_abort:
            self.engine_core.abort_requests(processed.reqs_to_abort)
        return processed.request_outputs

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.get_num_unfinished_requests() > 0

    def get_stats(self):
        return self.engine_core.get_stats()

    def get_metrics(self) -> list:
        """vLLM's LLMEngine.get_metrics: the metrics snapshot (minivllm.metrics.reader) of this engine."""
        if self.stat_logger is None:
            raise AssertionError("Stat logging disabled: build the LLM with disable_log_stats=False")
        from minivllm.metrics.reader import get_metrics_snapshot
        return get_metrics_snapshot(self.stat_logger.registry)

    def shutdown(self) -> None:
        self.engine_core.shutdown()
