"""Lesson 1 on the pinned vLLM: the order of EngineCore.step's phases, recorded on vLLM's own EngineCore.

"demo_step_phases" builds vLLM's LLM in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0: an InprocClient holding the
EngineCore) on the shipped model, fp32, eager, runs the lesson's two greedy requests and, as the lesson's demo
does, aborts r0 while step 3's forward is in flight (into EngineCore.aborts_queue, as EngineCoreProc's input
thread would). The instance's scheduler, executor and _process_aborts_queue are wrapped to log each call.
vLLM's CPU platform turns async scheduling off (platforms/cpu.py, CpuPlatform.check_and_update_config), so
"demo_async_batch_queue" shows the nearest thing that runs: vLLM's AsyncScheduler driven as
EngineCore.step_with_batch_queue drives it, two batches in flight (autograder/vllm_oracle/scheduler_harness.py).
Runs under .venv-vllm only (imports vllm, never minivllm).
"""
from __future__ import annotations

from pathlib import Path

from autograder.vllm_oracle.scheduler_harness import request, workload
from autograder.vllm_oracle.vllm_side import scheduler_answer as _scheduler_answer

MODEL = Path(__file__).resolve().parents[2] / "data" / "models" / "shakespeare-llama"
# The method each phase of the lesson's trace is, on vLLM's EngineCore instance (object path, method).
# "wait" is the future execute_model(non_block=True) returns, its result(); "sample" is vLLM's second half of a
# forward (sample_tokens), called only when execute_model's result was None.
PHASES = {"schedule": ("scheduler", "schedule"), "execute": ("model_executor", "execute_model"),
          "grammar": ("scheduler", "get_grammar_bitmask"), "sample": ("model_executor", "sample_tokens"),
          "aborts": (None, "_process_aborts_queue"), "update": ("scheduler", "update_from_output")}

SCENARIOS = {
    "demo_step_phases": {"requests": [["r0", list(range(5, 37))], ["r1", list(range(40, 56))]], "max_tokens": 6,
                         "abort": ["r0", 3], "max_steps": 24},
    "demo_async_batch_queue": workload(
        [request(str(i), [i + 10] * n, 6, [7] * 7, ignore_eos=True) for i, n in enumerate((32, 16))], 12,
        block_size=16, num_blocks=10000, max_num_batched_tokens=1024, max_num_seqs=16, max_model_len=1024,
        async_scheduling=True, scheduler_reserve_full_isl=True),
}


def _step_phases(payload: dict) -> dict:
    import os

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0", "in-process EngineCore only"
    llm = LLM(model=str(MODEL), dtype="float32", enforce_eager=True, seed=0, max_num_seqs=4,
              kv_cache_memory_bytes=64 << 20)
    core = llm.llm_engine.engine_core.engine_core  # InprocClient -> EngineCore
    calls: list = []

    def external(request_id: str) -> str:
        """LLMEngine.add_request appends a random suffix to each request id (r0 -> r0-<8 hex>)."""
        return request_id.rsplit("-", 1)[0]

    step = {"n": 1}  # numbered from 1, as minivllm's EngineCore.step_counter
    victim, abort_step = payload["abort"]

    def wrap(obj, name, phase):
        inner = getattr(obj, name)

        def logged(*args, **kwargs):
            calls.append([step["n"], phase])
            result = inner(*args, **kwargs)
            if phase == "execute":
                if step["n"] == abort_step:  # lands while this step's forward is in flight
                    core.aborts_queue.put_nowait([i for i in core.scheduler.requests if external(i) == victim])
                wait, at = result.result, step["n"]
                result.result = lambda *a, **k: calls.append([at, "wait"]) or wait(*a, **k)
            return result
        setattr(obj, name, logged)

    for phase, (owner, name) in PHASES.items():
        wrap(core if owner is None else getattr(core, owner), name, phase)
    for rid, prompt in payload["requests"]:
        llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt),
                                   SamplingParams(max_tokens=payload["max_tokens"], temperature=0.0))
    outputs = {}
    while core.scheduler.has_requests() and step["n"] <= payload["max_steps"]:
        out, _ = core.step_fn()
        outputs[step["n"]] = [[external(o.request_id), list(o.new_token_ids), None if o.finish_reason is None
                               else str(o.finish_reason)] for eco in out.values() for o in eco.outputs]
        step["n"] += 1
    return {"step_fn": core.step_fn.__name__, "async_scheduling": bool(core.async_scheduling),
            "calls": calls, "outputs": {str(k): v for k, v in outputs.items()}}


def vllm_answer(name: str, payload: dict):
    if name == "demo_step_phases":
        return _step_phases(payload)
    return _scheduler_answer(name, payload)
