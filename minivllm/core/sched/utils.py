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
    params = request.sampling_params
    output_token_ids = request.output_token_ids
    num_output_tokens = len(output_token_ids)
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
    if len(request.all_token_ids) >= max_model_len or (
            request.max_tokens is not None and num_output_tokens >= request.max_tokens):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    repetition_detection = params.repetition_detection
    if repetition_detection is not None and repetition_detection.repeats(output_token_ids):
        request.status = RequestStatus.FINISHED_REPETITION
        request.stop_reason = "repetition_detected"
        return True
    return False
