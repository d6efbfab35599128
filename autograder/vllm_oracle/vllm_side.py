"""The pinned vLLM side of every comparison. Runs under .venv-vllm's Python only (imports vllm, never minivllm):

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
    """Adapter for scheduler_harness: the pinned vLLM's Scheduler and Request."""

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
        sched = cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=cfg["block_size"],
                    log_stats=True, structured_output_manager=StructuredOutputManager(vllm_config))
        if "scheduler_reserve_full_isl" in cfg:
            # Scheduler.__init__ copies SchedulerConfig.scheduler_reserve_full_isl into this attribute.
            sched.scheduler_reserve_full_isl = cfg["scheduler_reserve_full_isl"]
        return sched

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


def quiet() -> None:
    """vLLM logs INFO lines to stdout-adjacent stderr; answers go to stdout as JSON only."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


def case_logits(case: dict):
    """The case's logits: torch draws them from its seed, the same under either venv (same torch)."""
    import torch

    g = torch.Generator().manual_seed(case["seed"])
    logits = torch.randn(len(case["rows"]), case["vocab"], generator=g) * case["scale"]
    for row, token in case.get("boost", ()):
        logits[row, token] = logits[row].max() + 120.0  # a gap of over 100 nats
    return logits


def logprob_rows(token_ids, logprobs, ranks, num_logprobs: list) -> list:
    """vLLM's LogprobsTensors, per row as the OutputProcessor turns them into a {token: Logprob} dict: the
    sampled token first, then the top-n, a repeated token keeping its first place; [token, logprob, rank]."""
    rows = []
    for i, n in enumerate(num_logprobs):
        if n is None:
            rows.append(None)
            continue
        ids, lps = token_ids[i][:n + 1], logprobs[i][:n + 1]
        rank = [ranks[i]] + list(range(1, n + 1))
        d: dict = {}
        for t, lp, rk in zip(ids, lps, rank, strict=True):
            d[t] = [t, lp, rk]
        rows.append(list(d.values()))
    return rows


def sampler_inputs(rows: list[dict], vocab: int, generators: dict, output_token_ids: list, logitsprocs: list):
    """vLLM's SamplingMetadata for rows of {temperature, top_p, top_k, logprobs}, as its InputBatch builds it (a
    row with top-k off stored as the vocabulary size, penalties off), and a Sampler on the path vLLM takes on CPU:
    a batch mixing greedy and random rows draws every row from the global RNG on forward_cpu when some row has no
    generator, so such a batch runs forward_native (CUDA's, which keeps each row's generator). Returns (metadata,
    sampler, path)."""
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler

    n = len(rows)
    greedy = [r["temperature"] < 1e-5 for r in rows]
    top_k = [r["top_k"] if 0 < r["top_k"] < vocab else vocab for r in rows]
    num_logprobs = [r["logprobs"] for r in rows]
    md = SamplingMetadata(
        temperature=None if all(greedy) else torch.tensor([0.0 if g else r["temperature"]
                                                            for g, r in zip(greedy, rows, strict=True)]),
        all_greedy=all(greedy), all_random=not any(greedy),
        top_p=None if all(r["top_p"] >= 1 for r in rows) else torch.tensor([r["top_p"] for r in rows]),
        top_k=None if all(k == vocab for k in top_k) else torch.tensor(top_k),
        generators=generators,
        max_num_logprobs=max((x for x in num_logprobs if x is not None), default=None),
        no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(n),
        presence_penalties=torch.zeros(n), repetition_penalties=torch.ones(n), output_token_ids=output_token_ids,
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(logitsprocs))
    sampler = Sampler()
    path = "forward_cpu"
    if any(greedy) and not all(greedy):
        sampler.topk_topp_sampler.forward = sampler.topk_topp_sampler.forward_native
        path = "forward_native"
    return md, sampler, path


def _sampler(cases: list[dict]) -> list[dict]:
    """vLLM's Sampler (v1/sample/sampler.py) with the SamplingMetadata its InputBatch would build, and its own
    MinP / MinTokens logits processors fed through BatchUpdate, as the model runner feeds them."""
    from types import SimpleNamespace

    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor, MinTokensLogitsProcessor

    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=64))
    answers = []
    for case in cases:
        rows, vocab = case["rows"], case["vocab"]
        n = len(rows)
        logits = case_logits(case)
        params, outputs = [], []
        for row in rows:
            sp = SamplingParams(temperature=row["temperature"], top_k=row["top_k"], top_p=row["top_p"],
                                min_p=row["min_p"], seed=row["seed"], logprobs=row["logprobs"],
                                min_tokens=row["min_tokens"], ignore_eos=row["ignore_eos"],
                                stop_token_ids=list(row["stop_token_ids"]), max_tokens=16)
            sp.update_from_generation_config({}, eos_token_id=case["eos"])
            params.append(sp)
            outputs.append([5] * row["num_output_tokens"])
        procs = [MinPLogitsProcessor(config, torch.device("cpu"), False),
                 MinTokensLogitsProcessor(config, torch.device("cpu"), False)]
        update = BatchUpdate(batch_size=n, removed=[], moved=[],
                             added=[(i, sp, None, out) for i, (sp, out) in enumerate(zip(params, outputs, strict=True))])
        for p in procs:
            p.update_state(update)
        generators = {i: torch.Generator().manual_seed(row["seed"]) for i, row in enumerate(rows)
                      if row["temperature"] >= 1e-5}
        md, sampler, path = sampler_inputs(rows, vocab, generators, outputs, procs)
        out = sampler(logits.clone(), md)
        sampled = out.sampled_token_ids.view(-1).tolist()
        lp = None
        if out.logprobs_tensors is not None:
            t = out.logprobs_tensors
            lp = logprob_rows(t.logprob_token_ids.tolist(), t.logprobs.tolist(), t.selected_token_ranks.tolist(),
                              [row["logprobs"] for row in rows])
        answers.append({"seed": case["seed"], "path": path, "sampled": sampled, "logprobs": lp})
    return answers


def make_llm(model: str, engine: dict):
    """vLLM's LLM, in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), fp32, eager, on a local checkpoint."""
    import gc

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    gc.collect()  # the previous case's engine
    return LLM(model=model, dtype="float32", enforce_eager=True, seed=0, kv_cache_memory_bytes=64 << 20, **engine)


def _engine(cases: list[dict]) -> list[dict]:
    """vLLM's LLM, greedy, on the same checkpoint."""
    from vllm import SamplingParams

    from autograder.vllm_oracle.workloads import generate_case

    return [generate_case(make_llm, SamplingParams, case) for case in cases]


def fix_cpu_expand_kernel() -> None:
    """The pinned vLLM's CPU stand-in for the rejection sampler's Triton expand_kernel (utils/cpu_triton_utils.py)
    writes into an int64 copy of its output (_ensure_int64), so the per-draft temperatures (float32) and top-k
    (int32) it expands stay uninitialised: random rows under speculation divide by garbage, and top-k gathers
    out of bounds (`index -306122064 is out of bounds for dimension 1`). This replaces it with what the Triton
    kernel computes on CUDA (each request's value repeated over its draft tokens, replace_from -> replace_to);
    it runs before the model runner installs its CPU kernels."""
    import torch
    import vllm.utils.cpu_triton_utils as cpu_tl

    def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
        counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
        values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
        output.copy_(values.repeat_interleave(counts))

    cpu_tl.expand_kernel = cpu_tl._FuncWrapper(expand)


def _generate(cases: list[dict]) -> list[dict]:
    """vLLM's LLM with n-gram speculation or without, every sampling parameter."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from autograder.vllm_oracle.workloads import sample_run

    fix_cpu_expand_kernel()
    # Seeded rows draw from their own generators, as on CUDA: vLLM's forward_cpu samples a batch that has any row
    # without a generator (a greedy one too) from the global RNG (see sampler_inputs); forward_native does not.
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler
    TopKTopPSampler.forward_cpu = TopKTopPSampler.forward_native
    return [sample_run(make_llm, SamplingParams, StructuredOutputsParams, case) for case in cases]


def _detokenizer(cases: list[dict]) -> list[dict]:
    """vLLM's IncrementalDetokenizer.from_new_request (the fast DecodeStream one), shipped and Metaspace tokenizers."""
    from vllm.sampling_params import SamplingParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    from autograder.vllm_oracle.models import METASPACE
    from autograder.vllm_oracle.workloads import detokenize

    tokenizers = {"shipped": get_tokenizer(MODEL), "metaspace": get_tokenizer(str(METASPACE))}

    def make(case):
        params = SamplingParams(max_tokens=64, **case["params"])
        request = EngineCoreRequest(request_id="r", prompt_token_ids=list(case["prompt"]), mm_features=None,
                                    sampling_params=params, pooling_params=None, arrival_time=0.0,
                                    lora_request=None, cache_salt=None, data_parallel_rank=None)
        return IncrementalDetokenizer.from_new_request(tokenizers[case["tokenizer"]], request)

    answers = [detokenize(make, case) for case in cases]
    assert {type(make(c)).__name__ for c in cases} == {"FastIncrementalDetokenizer"}
    return answers


def _structured_output(cases: list[dict]) -> list[dict]:
    """vLLM's StructuredOutputManager with its xgrammar backend, on the shipped model's tokenizer and vocab."""
    import json as _json

    from vllm.config import ModelConfig, VllmConfig
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from autograder.vllm_oracle.workloads import structured_output_walk

    config = VllmConfig(model_config=ModelConfig(model=MODEL, dtype="float32", seed=0, max_model_len=1024))
    tokenizer = get_tokenizer(MODEL)

    def make(case):
        constraint = dict(case["constraint"])
        if "json" in constraint:
            constraint["json"] = _json.dumps(constraint["json"])
        params = SamplingParams(max_tokens=64, structured_outputs=StructuredOutputsParams(**constraint))
        # What the InputProcessor does: pick the backend ("auto" -> xgrammar here), rewrite a choice as a grammar.
        params._validate_structured_outputs(config.model_config, config.structured_outputs_config, tokenizer)
        request = Request(request_id="r", prompt_token_ids=[5, 6], sampling_params=params, pooling_params=None)
        manager = StructuredOutputManager(config)
        manager.grammar_init(request)
        so_request = request.structured_output_request
        so_request._grammar = so_request._grammar.result(timeout=120) if hasattr(
            so_request._grammar, "result") else so_request._grammar
        return manager, {"r": request}, "r", so_request.grammar

    return [structured_output_walk(make, case) for case in cases]


def _scheduler(cases: list[dict]) -> list[dict]:
    backend = VllmSchedulerBackend()
    return [scheduler_harness.run(backend, w) for w in cases]


KINDS = {"structured_output": _structured_output, "detokenizer": _detokenizer, "scheduler": _scheduler,
         "sampler": _sampler, "engine": _engine, "generate": _generate}


def scheduler_answer(name: str, payload: dict) -> dict:
    """A lesson view's answer to a scheduler_harness workload: per step what vLLM's Scheduler scheduled,
    preempted, and the free blocks."""
    return scheduler_harness.run(VllmSchedulerBackend(), payload)


def main() -> int:
    quiet()
    kind = sys.argv[1]
    cases = json.load(sys.stdin)
    answers = KINDS[kind](cases)
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
