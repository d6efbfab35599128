"""The vLLM 0.27.1 side of every comparison. Runs under .venv-vllm's Python only (imports vllm, never minivllm):

    .venv-vllm/bin/python -m autograder.vllm_oracle.vllm_side KIND < cases.json > answers.json

vLLM's objects are built on CPU the way vLLM's own unit tests build them (tests/v1/core/utils.py create_scheduler:
a VllmConfig from a ModelConfig of a local checkpoint, a one-group KVCacheConfig, the Scheduler or AsyncScheduler;
Requests with get_request_block_hasher), so the code under test is vLLM's Scheduler, KVCacheManager and BlockPool.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path

from autograder.vllm_oracle import scheduler_harness

MODEL = str(Path(__file__).resolve().parents[2] / "data" / "models" / "shakespeare-llama")


class VllmSchedulerBackend:
    """Adapter for scheduler_harness: vLLM 0.27.1's Scheduler and Request."""

    def __init__(self) -> None:
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.request import Request, RequestStatus
        from vllm.v1.structured_output import StructuredOutputManager

        self.torch = torch
        self.cls = (CacheConfig, ModelConfig, SchedulerConfig, VllmConfig, Scheduler, AsyncScheduler,
                    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, StructuredOutputManager)
        self.Request, self.RequestStatus = Request, RequestStatus
        self.get_request_block_hasher, self.sha256 = get_request_block_hasher, sha256
        init_none_hash(sha256)
        self.model_config = ModelConfig(model=MODEL, dtype="float32", seed=0, max_model_len=1024)
        self.hashers: dict[int, object] = {}

    def make_scheduler(self, cfg: dict):
        (CacheConfig, ModelConfig, SchedulerConfig, VllmConfig, Scheduler, AsyncScheduler,
         FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, StructuredOutputManager) = self.cls
        scheduler_config = SchedulerConfig(
            max_num_seqs=cfg["max_num_seqs"], max_num_batched_tokens=cfg["max_num_batched_tokens"],
            max_model_len=cfg["max_model_len"], long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
            enable_chunked_prefill=cfg["enable_chunked_prefill"], async_scheduling=cfg["async_scheduling"],
            is_encoder_decoder=False)
        cache_config = CacheConfig(block_size=cfg["block_size"], enable_prefix_caching=cfg["enable_prefix_caching"])
        vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=self.model_config,
                                 cache_config=cache_config)
        # VllmConfig may overwrite limits from the model: the workload's win, as vLLM's tests set them.
        vllm_config.scheduler_config.max_model_len = cfg["max_model_len"]
        vllm_config.model_config.max_model_len = cfg["max_model_len"]
        kv_cache_config = KVCacheConfig(
            num_blocks=cfg["num_blocks"], kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
                block_size=cfg["block_size"], num_kv_heads=1, head_size=1, dtype=self.torch.float32))])
        cache_config.num_gpu_blocks = cfg["num_blocks"]
        cls = AsyncScheduler if cfg["async_scheduling"] else Scheduler
        return cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=cfg["block_size"],
                   log_stats=True, structured_output_manager=StructuredOutputManager(vllm_config))

    def make_request(self, spec: dict, cfg: dict):
        from vllm.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=spec["max_tokens"], min_tokens=spec["min_tokens"],
                                ignore_eos=spec["ignore_eos"], stop_token_ids=list(spec["stop_token_ids"]))
        # What the InputProcessor does with the model's generation config: EOS into the sampling params.
        params.update_from_generation_config({}, eos_token_id=1)
        bs = cfg["block_size"]
        hasher = self.get_request_block_hasher(bs, self.sha256) if cfg["enable_prefix_caching"] else None
        return self.Request(request_id=spec["id"], prompt_token_ids=list(spec["prompt"]), sampling_params=params,
                            pooling_params=None, block_hasher=hasher)

    def schedule(self, sched):
        return sched.schedule()

    @staticmethod
    def resumed_ids(cached) -> set[str]:
        return set(cached.resumed_req_ids)

    def update(self, sched, so, req_ids, sampled):
        from vllm.v1.outputs import ModelRunnerOutput

        out = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        result = sched.update_from_output(so, out)
        return [o for eco in result.values() for o in eco.outputs]

    def abort(self, sched, ids):
        sched.finish_requests(ids, self.RequestStatus.FINISHED_ABORTED)

    @staticmethod
    def num_free_blocks(sched) -> int:
        return sched.kv_cache_manager.block_pool.get_num_free_blocks()

    @staticmethod
    def block_pool(sched):
        return sched.kv_cache_manager.block_pool


def quiet() -> None:
    """vLLM logs INFO lines to stdout-adjacent stderr; answers go to stdout as JSON only."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


KINDS = {"scheduler": lambda cases: _scheduler(cases)}


def _scheduler(cases: list[dict]) -> list[dict]:
    backend = VllmSchedulerBackend()
    return [scheduler_harness.run(backend, w) for w in cases]


def main() -> int:
    quiet()
    kind = sys.argv[1]
    cases = json.load(sys.stdin)
    answers = KINDS[kind](cases)
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
