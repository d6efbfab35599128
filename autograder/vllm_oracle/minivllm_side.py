"""The minivllm side of every comparison: the same harnesses as vllm_side.py, on minivllm's objects."""
from __future__ import annotations

from autograder.vllm_oracle import scheduler_harness


class MinivllmSchedulerBackend:
    """Adapter for scheduler_harness: minivllm's Scheduler and Request. (It imports nothing from workloads.py:
    the student release ships this file and the harness for the lessons' vLLM-graded parts, not workloads.py.)"""

    @staticmethod
    def make_scheduler(cfg: dict):
        from minivllm.config import CacheConfig, SchedulerConfig
        from minivllm.core.sched.async_scheduler import AsyncScheduler
        from minivllm.core.sched.scheduler import Scheduler

        scheduler_config = SchedulerConfig(
            max_num_batched_tokens=cfg["max_num_batched_tokens"], max_num_seqs=cfg["max_num_seqs"],
            max_model_len=cfg["max_model_len"], long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
            enable_chunked_prefill=cfg["enable_chunked_prefill"], async_scheduling=cfg["async_scheduling"],
            **{k: cfg[k] for k in ("scheduler_reserve_full_isl",) if k in cfg})
        cache_config = CacheConfig(block_size=cfg["block_size"], enable_prefix_caching=cfg["enable_prefix_caching"])
        cls = AsyncScheduler if cfg["async_scheduling"] else Scheduler
        return cls(scheduler_config, cache_config, num_gpu_blocks=cfg["num_blocks"])

    @staticmethod
    def make_request(spec: dict, cfg: dict):
        from minivllm.request import Request
        from minivllm.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=spec["max_tokens"], min_tokens=spec["min_tokens"],
                                ignore_eos=spec["ignore_eos"], stop_token_ids=list(spec["stop_token_ids"]))
        return Request(spec["id"], list(spec["prompt"]), params, eos_token_id=1)  # workloads.EOS, as in vllm_side

    @staticmethod
    def resumed_ids(cached) -> set[str]:
        return {i for i, resumed in zip(cached.req_ids, cached.resumed_from_preemption, strict=True) if resumed}

    @staticmethod
    def update(sched, so, req_ids, sampled):
        from minivllm.worker.outputs import ModelRunnerOutput

        out = ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled)
        return sched.update_from_output(so, out).outputs

    @staticmethod
    def abort(sched, ids):
        from minivllm.request import RequestStatus

        sched.finish_requests(ids, RequestStatus.FINISHED_ABORTED)


def run_scheduler(cases: list[dict]) -> list[dict]:
    backend = MinivllmSchedulerBackend()
    return [scheduler_harness.run(backend, w) for w in cases]


def run_sampler(cases: list[dict]) -> list[dict]:
    """minivllm's Sampler with the SamplingMetadata its runner builds from an InputBatch holding the rows."""
    import functools
    from types import SimpleNamespace

    import numpy as np
    import torch

    from autograder.vllm_oracle.vllm_side import case_logits
    from minivllm.logprobs import entry_ranks
    from minivllm.sample.sampler import Sampler
    from minivllm.sampling_params import SamplingParams
    from minivllm.worker.gpu_input_batch import CachedRequestState, InputBatch
    from minivllm.worker.gpu_model_runner import GPUModelRunner

    answers = []
    for case in cases:
        rows = case["rows"]
        batch = InputBatch(max_num_reqs=len(rows), max_model_len=64, block_size=16)
        for i, row in enumerate(rows):
            sp = SamplingParams(temperature=row["temperature"], top_k=row["top_k"], top_p=row["top_p"],
                                min_p=row["min_p"], seed=row["seed"], logprobs=row["logprobs"],
                                min_tokens=row["min_tokens"], ignore_eos=row["ignore_eos"],
                                stop_token_ids=list(row["stop_token_ids"]), max_tokens=16)
            gen = torch.Generator().manual_seed(row["seed"]) if not sp.greedy else None
            batch.add_request(CachedRequestState(f"r{i}", [7, 8], sp, gen, [], 2, [5] * row["num_output_tokens"],
                                                 eos_token_id=case["eos"]))
        runner = SimpleNamespace(input_batch=batch, device=torch.device("cpu"), _sampling_metadata_key=None)
        runner._make_sampling_metadata = functools.partial(GPUModelRunner._make_sampling_metadata, runner)
        md = GPUModelRunner._sampling_metadata(runner, np.arange(len(rows)))
        out = Sampler()(case_logits(case), md)
        lp = None
        if out.logprobs is not None:
            lp = [None if d is None else [[t, v, k] for (t, v), k in zip(
                d.items(), entry_ranks(rows[i]["logprobs"], len(d), out.sampled_ranks[i]), strict=True)]
                  for i, d in enumerate(out.logprobs)]
        answers.append({"seed": case["seed"], "sampled": out.sampled_token_ids.tolist(), "logprobs": lp})
    return answers


def make_llm(model: str, engine: dict):
    """minivllm's LLM, in-process, fp32, eager, on a local checkpoint."""
    from minivllm import LLM

    return LLM(model, multiprocess=False, dtype="float32", enforce_eager=True, seed=0, **engine)


def run_engine(cases: list[dict]) -> list[dict]:
    """minivllm's LLM, greedy, on the same checkpoint."""
    from autograder.vllm_oracle.workloads import generate_case
    from minivllm import SamplingParams

    return [generate_case(make_llm, SamplingParams, case) for case in cases]


def run_generate(cases: list[dict]) -> list[dict]:
    """minivllm's LLM with n-gram speculation or without, every sampling parameter."""
    from autograder.vllm_oracle.workloads import sample_run
    from minivllm import SamplingParams
    from minivllm.sampling_params import StructuredOutputsParams

    return [sample_run(make_llm, SamplingParams, StructuredOutputsParams, case) for case in cases]


def run_detokenizer(cases: list[dict]) -> list[dict]:
    from autograder.vllm_oracle.models import METASPACE, SHIPPED
    from autograder.vllm_oracle.workloads import detokenize
    from minivllm.engine.detokenizer import IncrementalDetokenizer
    from minivllm.sampling_params import SamplingParams
    from minivllm.tokenizer import get_tokenizer

    tokenizers = {"shipped": get_tokenizer(str(SHIPPED)), "metaspace": get_tokenizer(str(METASPACE))}

    def make(case):
        return IncrementalDetokenizer(tokenizers[case["tokenizer"]], SamplingParams(max_tokens=64, **case["params"]),
                                      case["prompt"])

    return [detokenize(make, case) for case in cases]


def run_structured_output(cases: list[dict]) -> list[dict]:
    """minivllm's StructuredOutputManager (xgrammar) on the shipped model's tokenizer and vocab."""
    import json

    from autograder.vllm_oracle.models import SHIPPED
    from autograder.vllm_oracle.workloads import structured_output_walk
    from minivllm.config import EngineArgs
    from minivllm.request import Request
    from minivllm.sampling_params import SamplingParams, StructuredOutputsParams
    from minivllm.structured_output import StructuredOutputManager

    config = EngineArgs(model=str(SHIPPED)).create_engine_config(1024)

    def make(case):
        constraint = dict(case["constraint"])
        if "json" in constraint:
            constraint["json"] = json.dumps(constraint["json"])
        params = SamplingParams(max_tokens=64, structured_outputs=StructuredOutputsParams(**constraint))
        request = Request("r", [5, 6], params, eos_token_id=2)
        manager = StructuredOutputManager(config)
        manager.grammar_init(request)
        so_request = request.structured_output_request
        so_request.grammar = so_request._grammar.result(timeout=120)
        return manager, {"r": request}, "r", so_request.grammar

    return [structured_output_walk(make, case) for case in cases]
