"""Lesson 11's vLLM side: the pinned vLLM's capture-size list (VllmConfig._set_cudagraph_sizes) and its padding table
(CudagraphDispatcher.dispatch over `_bs_to_padded_graph_size`) for the lesson's settings. Runs under .venv-vllm only.

On CPU vLLM captures nothing: CpuPlatform.check_and_update_config (vllm/platforms/cpu.py) empties
`cudagraph_capture_sizes` and the mode ends NONE; each answer records that first. Then, on the same VllmConfig, it
restores the user's sizes, sets FULL_DECODE_ONLY (minivllm's mode: full graphs for uniform decode batches) and reruns
vLLM's own `_set_cudagraph_sizes` (what a CUDA platform keeps; it sorts and de-duplicates), builds the
dispatcher and asks it, for every decode batch of n requests, which graph runs and at how many rows. Full decode
graphs exist only for sizes <= max_num_seqs (initialize_cudagraph_keys): `decode_capture_sizes`.
"""
from __future__ import annotations

from pathlib import Path

MODEL = str(Path(__file__).resolve().parents[2] / "data" / "models" / "shakespeare-llama")


def _setting(sizes, max_num_seqs, max_num_batched_tokens=2048, performance_mode=None):
    return {"cudagraph_capture_sizes": sizes, "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens, "performance_mode": performance_mode}


SCENARIOS = {
    # Figure 11-1's list: vLLM's default for max_num_seqs = 20 (max size 2 * 20 = 40).
    "default_20_seqs": _setting(None, 20),
    # The engine checks: sizes [1, 2, 4, 8] (given out of order) and [1, 3, 6], max_num_seqs 8.
    "lesson_engine": _setting([8, 1, 4, 2], 8),
    "odd_sizes": _setting([1, 3, 6], 8),
    # vLLM's default at max_num_seqs = 256: step 8 up to 248, then step 16 up to 512.
    "default_256_seqs": _setting(None, 256, 8192),
    # A user list with sizes above max_num_batched_tokens: vLLM drops them.
    "sizes_above_token_budget": _setting([1, 2, 4, 8, 16, 32], 8, 12),
    # performance_mode="interactivity": every size 1..32.
    "interactivity": _setting(None, 20, 2048, "interactivity"),
}


def vllm_answer(name: str, payload: dict) -> dict:
    from vllm.config import CompilationConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    sizes = payload["cudagraph_capture_sizes"]
    extra = {} if payload["performance_mode"] is None else {"performance_mode": payload["performance_mode"]}
    vc = VllmConfig(
        model_config=ModelConfig(model=MODEL, dtype="float32", seed=0, max_model_len=1024),
        scheduler_config=SchedulerConfig(max_num_seqs=payload["max_num_seqs"],
                                         max_num_batched_tokens=payload["max_num_batched_tokens"],
                                         max_model_len=1024, is_encoder_decoder=False),
        compilation_config=CompilationConfig(cudagraph_mode="FULL_DECODE_ONLY",
                                             **({} if sizes is None else {"cudagraph_capture_sizes": list(sizes)})),
        **extra)
    cc = vc.compilation_config
    on_cpu = {"cudagraph_capture_sizes": list(cc.cudagraph_capture_sizes), "cudagraph_mode": cc.cudagraph_mode.name}
    cc.cudagraph_capture_sizes = None if sizes is None else list(sizes)
    cc.max_cudagraph_capture_size = None
    cc.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    vc._set_cudagraph_sizes()
    dispatcher = CudagraphDispatcher(vc)
    dispatcher.initialize_cudagraph_keys(CUDAGraphMode.FULL_DECODE_ONLY)
    table = []
    for n in range(1, cc.max_cudagraph_capture_size + 2):
        mode, desc = dispatcher.dispatch(n, uniform_decode=True)
        table.append([n, mode.name, desc.num_tokens])
    decode = sorted(d.num_tokens for d in dispatcher.cudagraph_keys[CUDAGraphMode.FULL])
    return {"on_cpu": on_cpu, "cudagraph_capture_sizes": list(cc.cudagraph_capture_sizes),
            "decode_capture_sizes": decode,
            "max_cudagraph_capture_size": cc.max_cudagraph_capture_size, "max_num_seqs": payload["max_num_seqs"],
            "decode_padding": table}
