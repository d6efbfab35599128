"""LLM (vLLM: vllm/entrypoints/llm.py): offline batched generation with a progress bar."""
from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

from tqdm.auto import tqdm

from minivllm.config import EngineArgs
from minivllm.engine.input_processor import PromptType
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.metrics.reader import Metric
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams


class LLM:
    """LLM(model=..., **engine args).generate(prompts, sampling_params) -> list[RequestOutput].

    Defaults to the tiny Shakespeare model shipped in data/. The EngineCore runs in its own process
    (as in vLLM); multiprocess=False keeps it in this process, so llm.llm_engine.engine_core.scheduler
    and .tracer can be read (notebooks, tests). As in vLLM,
    disable_log_stats defaults to True here; disable_log_stats=False enables get_metrics().
    """

    def __init__(self, model: str | None = None, multiprocess: bool | None = None, **kwargs) -> None:
        if model is not None:
            kwargs["model"] = model
        disable_log_stats = kwargs.pop("disable_log_stats", True)
        self.engine_args = EngineArgs.from_kwargs(**kwargs)
        self.llm_engine = LLMEngine.from_engine_args(self.engine_args, multiprocess, not disable_log_stats)
        self._profiler = None

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                  and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, Sequence) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(params)} sampling params")
        engine = self.llm_engine
        order: dict[str, tuple[int, int]] = {}  # engine request id -> (prompt index, sample index)
        for i, (prompt, sp) in enumerate(zip(prompts, params, strict=True)):
            try:
                if sp.n == 1:
                    order[engine.add_request(None, prompt, sp)] = (i, 0)
                    continue
                parent = ParentRequest(f"{i}-{uuid.uuid4().hex}", sp)  # vLLM's fan-out of n samples
                for j in range(sp.n):
                    child_id, child_params = parent.get_child_info(j)
                    order[engine.add_request(child_id, prompt, child_params)] = (i, j)
            except ValueError:
                engine.abort_request(list(order))
                raise
        samples: list[list[RequestOutput | None]] = [[None] * sp.n for sp in params]
        with tqdm(total=len(prompts), desc="Processed prompts", disable=not use_tqdm) as bar:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished and out.request_id in order:
                        i, j = order[out.request_id]
                        samples[i][j] = out
                        bar.update(all(o is not None for o in samples[i]))
        return [outs[0] if len(outs) == 1 else dataclasses.replace(
            outs[0], outputs=[dataclasses.replace(o.outputs[0], index=j) for j, o in enumerate(outs)])
            for outs in samples]

    def start_profile(self, path: str = "minivllm_profile.json") -> None:
        """Start torch.profiler on the worker; stop_profile() writes a Chrome trace to path."""
        self._profile_path = path
        self.llm_engine.engine_core.profile(True, path)
        self._profiler = path

    def stop_profile(self) -> str:
        if self._profiler is None:
            raise RuntimeError("stop_profile() called without start_profile()")
        self._profiler = None
        return self.llm_engine.engine_core.profile(False, self._profile_path)

    def get_metrics(self) -> list[Metric]:
        """A snapshot of the engine's Prometheus metrics as Counter / Gauge / Histogram / Vector objects
        (vLLM's LLM.get_metrics; names keep the minivllm: prefix). Needs disable_log_stats=False."""
        return self.llm_engine.get_metrics()

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.engine_core.reset_prefix_cache()
