"""Lesson 5 on the pinned vLLM: the input tensors its CPU model runner prepares for the lesson's workload. Runs under
.venv-vllm (imports vllm, never minivllm).

vLLM's LLM, in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0), fp32, eager, synchronous scheduling, on the shipped
checkpoint; its runner is vllm/v1/worker/cpu_model_runner.py CPUModelRunner, a GPUModelRunner subclass (V1:
without Triton `use_v2_model_runner` is false). The runner instance's _prepare_inputs is wrapped: after it
returns, the six arrays are read from the runner's own buffers (input_ids, positions, query_start_loc, seq_lens,
the block table's slot_mapping) and its return value (logits_indices). Block size 16, not the lesson's 8: the CPU
attention backend supports multiples of 16 only (CPUAttentionBackend.get_supported_kernel_block_sizes).
"""
from __future__ import annotations

from pathlib import Path

MODEL = str(Path(__file__).resolve().parents[2] / "data" / "models" / "shakespeare-llama")

# autograder/lesson05/checks.py PROMPTS, MAX_TOKENS, ARRIVALS and ENGINE_KW, block_size 16.
LESSON = {
    "prompts": ["ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun. "
                "Arise, fair sun, and kill the envious moon",
                "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?",
                "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and the pale moon is sick",
                "HAMLET:\nTo be, or not to be"],
    "max_tokens": [10, 6, 9, 8], "arrivals": [0, 0, 5, 9],
    "engine": {"block_size": 16, "max_num_batched_tokens": 24, "long_prefill_token_threshold": 16, "max_num_seqs": 4,
               "max_model_len": 160, "enable_prefix_caching": True, "num_gpu_blocks": 64},
}
NAMES = ("input_ids", "positions", "query_start_loc", "seq_lens", "slot_mapping", "logits_indices")

SCENARIOS = {"lesson": LESSON}


def vllm_answer(name: str, case: dict) -> dict:
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import torch
    from vllm import LLM, SamplingParams

    kw = dict(case["engine"])
    llm = LLM(model=MODEL, dtype="float32", enforce_eager=True, seed=0, async_scheduling=False,
              enable_chunked_prefill=True, kv_cache_memory_bytes=64 << 20,
              num_gpu_blocks_override=kw.pop("num_gpu_blocks"), **kw)
    engine = llm.llm_engine
    runner = engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    steps: list = []
    original = runner._prepare_inputs

    def first(x, k):
        return (x if isinstance(x, torch.Tensor) else x.gpu)[:k].tolist()

    def _prepare_inputs(so, num_scheduled_tokens):
        out = original(so, num_scheduled_tokens)
        n, r = so.total_num_scheduled_tokens, runner.input_batch.num_reqs
        plain = {q: q.split("-")[0] for q in so.num_scheduled_tokens}   # LLMEngine appends "-<random>" to ids
        steps.append({"rows": [plain[q] for q in runner.input_batch.req_ids[:r]],
                      "scheduled": {plain[q]: k for q, k in so.num_scheduled_tokens.items()},
                      "input_ids": first(runner.input_ids, n), "positions": first(runner.positions, n),
                      "query_start_loc": first(runner.query_start_loc, r + 1), "seq_lens": first(runner.seq_lens, r),
                      "slot_mapping": runner.input_batch.block_table[0].slot_mapping.cpu[:n].tolist(),
                      "logits_indices": out[0].tolist()})
        return out

    runner._prepare_inputs = _prepare_inputs
    tok = llm.get_tokenizer()
    ids = [tok.encode(t) for t in case["prompts"]]
    done: dict = {}
    step = 0
    while step < 500 and (step <= max(case["arrivals"]) or engine.has_unfinished_requests()):
        for i, at in enumerate(case["arrivals"]):
            if at == step:
                engine.add_request(str(i), {"prompt_token_ids": ids[i]},
                                   SamplingParams(max_tokens=case["max_tokens"][i], temperature=0.0, ignore_eos=True))
        for o in engine.step():
            if o.finished:
                done[o.request_id.split("-")[0]] = list(o.outputs[0].token_ids)
        step += 1
    return {"runner": f"{type(runner).__module__}.{type(runner).__name__}",
            "bases": [c.__name__ for c in type(runner).__mro__[1:3]], "prompt_ids": ids, "steps": steps,
            "tokens": [done.get(str(i), []) for i in range(len(ids))]}
