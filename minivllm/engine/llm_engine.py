"""LLMEngine (vLLM: v1/engine/llm_engine.py): the synchronous frontend behind LLM.

Processor (tokenize, validate) -> EngineCore client -> OutputProcessor (detokenize, stop strings).
"""
from __future__ import annotations

import itertools
import time

from minivllm.config import EngineArgs, VllmConfig
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.processor import Processor, PromptType
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import get_tokenizer


class LLMEngine:
    """add_request / step / has_unfinished_requests over an EngineCore."""

    def __init__(self, vllm_config: VllmConfig, engine_core) -> None:
        self.vllm_config = vllm_config
        self.tokenizer = get_tokenizer(vllm_config.model_config.tokenizer)
        self.processor = Processor(vllm_config, self.tokenizer)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.engine_core = engine_core
        self._ids = itertools.count()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, **core_kwargs) -> LLMEngine:
        from minivllm.engine.core import EngineCore
        core = EngineCore.from_engine_args(engine_args, **core_kwargs)
        return cls(core.vllm_config, core)

    def add_request(self, request_id: str | None, prompt: PromptType, params: SamplingParams) -> str:
        request_id = request_id if request_id is not None else str(next(self._ids))
        text, request = self.processor.process_inputs(request_id, prompt, params)
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
        outputs, _ = self.engine_core.step()
        processed = self.output_processor.process_outputs(outputs.outputs, time.monotonic())
        if processed.reqs_to_abort:
            self.engine_core.abort_requests(processed.reqs_to_abort)
        return processed.request_outputs

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.get_num_unfinished_requests() > 0

    def get_stats(self):
        return self.engine_core.get_stats()

    def shutdown(self) -> None:
        self.engine_core.shutdown()
