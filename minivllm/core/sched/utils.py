"""The scheduler's per-token stop check (vLLM: v1/core/sched/utils.py).

A free function, as in vLLM, so the scheduler's update and a lesson can call (or replace) it alone.
"""
from __future__ import annotations

from minivllm.request import Request, RequestStatus


def check_stop(request: Request, max_model_len: int) -> bool:
    """vLLM's check_stop: nothing before min_tokens, then EOS and stop token ids, then the length caps
    (so an EOS that is also the max_tokens-th token finishes with "stop"), then repetition. The
    InputProcessor keeps min_tokens within the context, so min_tokens cannot carry a request past
    max_model_len."""
    all_token_ids = request.all_token_ids
    num_tokens = len(all_token_ids)
    if (num_tokens < request._max_num_tokens and num_tokens < max_model_len
            and all_token_ids[-1] not in request._stop_token_ids and request._repetition is None):
        return False  # fast exit, most tokens: no stop id, no length cap (the checks below all say no)
    output_token_ids = request.output_token_ids
    num_output_tokens = len(output_token_ids)  # runs per token: plain len(), no properties
    params = request.sampling_params
    if num_output_tokens < params.min_tokens:
        return False
    last = output_token_ids[-1]
    if last == request.eos_token_id and not params.ignore_eos:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if params.stop_token_ids and last in params.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    if num_tokens >= max_model_len or (request.max_tokens is not None and num_output_tokens >= request.max_tokens):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    if request._repetition is not None and request._repetition.repeats(output_token_ids):
        request.status = RequestStatus.FINISHED_REPETITION
        request.stop_reason = "repetition_detected"
        return True
    return False
