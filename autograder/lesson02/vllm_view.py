"""Lesson 2 on the pinned vLLM: its own Scheduler (v1/core/sched/scheduler.py) on the lesson's scheduler scenarios.

Each scenario is a scheduler_harness workload (the loop EngineCore runs: arrivals, schedule, update_from_output)
on a bare Scheduler built as vLLM's tests/v1/core/utils.py create_scheduler builds one. "demo_*" are the ones
the notebook shows; "main_*" and "boundary_*" cover the exercise's input-space table (checks.py)
and grade the student's loop, which runs inside minivllm's Scheduler, against vLLM's own decisions.
Runs under .venv-vllm only (imports vllm, never minivllm).
"""
from __future__ import annotations

from autograder.vllm_oracle.scheduler_harness import request, workload
from autograder.vllm_oracle.vllm_side import scheduler_answer as vllm_answer  # noqa: F401  (its Scheduler, per step)

SAMPLED = 7  # every sampled token: not EOS, not a stop id


def _workload(prompts, steps, max_tokens=64, arrivals=None, block_size=16, num_blocks=10000, max_num_seqs=16,
              max_num_batched_tokens=1024, long_prefill_token_threshold=0, max_model_len=None,
              enable_prefix_caching=True, enable_chunked_prefill=True, scheduler_reserve_full_isl=True) -> dict:
    """A harness workload: requests "0", "1", ... in arrival order; prompts[i] its token ids (an int n means
    n copies of i + 10, as the lesson's run_scenario builds them)."""
    at = {i: 0 for i in range(len(prompts))}
    for step, ids in (arrivals or {}).items():
        at.update(dict.fromkeys(ids, step))
    requests = [request(str(i), [i + 10] * p if isinstance(p, int) else p, max_tokens, [SAMPLED] * (max_tokens + 1),
                        ignore_eos=True, arrival_step=at[i]) for i, p in enumerate(prompts)]
    return workload(requests, steps, block_size=block_size, num_blocks=num_blocks, max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len or max_num_batched_tokens,
                    long_prefill_token_threshold=long_prefill_token_threshold,
                    enable_chunked_prefill=enable_chunked_prefill, enable_prefix_caching=enable_prefix_caching,
                    scheduler_reserve_full_isl=scheduler_reserve_full_isl)


SCENARIOS = {
    # The lesson's demo scenarios.
    "demo_3x800": _workload([800, 800, 800], 4, max_tokens=8, long_prefill_token_threshold=400),
    "demo_preemption": _workload([32, 32, 32, 32], 6, max_num_batched_tokens=256, num_blocks=9,
                                 enable_prefix_caching=False, max_model_len=256, max_num_seqs=8),
    # Main path: threshold off, decodes + a late long prompt, max_num_seqs, chunked prefill off, a prefix hit.
    "main_no_threshold": _workload([800, 800, 800], 4, max_tokens=8),
    "main_late_long_prompt": _workload([20, 20, 20, 20, 500], 10, arrivals={3: [4]}, max_num_batched_tokens=96,
                                       long_prefill_token_threshold=64, max_model_len=1024),
    "main_max_num_seqs": _workload([30] * 5, 4, max_tokens=2, max_num_batched_tokens=512, max_num_seqs=3),
    "main_no_chunked_prefill": _workload([40, 100, 20], 4, max_tokens=3, max_num_batched_tokens=128,
                                         enable_chunked_prefill=False, max_model_len=128),
    "main_prefix_hit": _workload([list(range(10, 110)), list(range(300, 400)),
                                  list(range(10, 90)) + list(range(500, 520))], 6, arrivals={2: [2]},
                                 max_num_batched_tokens=64, long_prefill_token_threshold=48, max_model_len=512),
    # Boundary: the KV pool runs out (an arrival in the preempting step), the only request, the gate off.
    "boundary_no_admission": _workload([32, 32, 32, 32, 8], 6, arrivals={1: [4]}, max_num_batched_tokens=256,
                                       num_blocks=9, enable_prefix_caching=False, max_model_len=256,
                                       max_num_seqs=8),
    "boundary_self_preemption": _workload([32], 3, max_num_batched_tokens=64, num_blocks=3,
                                          enable_prefix_caching=False, max_model_len=64),
    "boundary_gate_off": _workload([24, 24, 200], 12, max_num_batched_tokens=64, long_prefill_token_threshold=40,
                                   num_blocks=15, enable_prefix_caching=False, max_model_len=256,
                                   scheduler_reserve_full_isl=False),
}
