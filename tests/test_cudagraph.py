"""CUDA-graph padding: decode batches padded to a capture size give the same tokens as the eager run.

On CPU, enforce_eager=False runs the padded static-buffer path with an eager "replay" (no graph exists
there), so everything but the capture is checked here: the capture list, the dispatch, the buffers'
contents, token equality on and off the capture list, after preemption and with prefix hits, and that
padded rows never write the KV cache. The tests at the end need CUDA (real capture, launch counts).
"""
from __future__ import annotations

import random

import pytest
import torch

import minivllm.worker.gpu_model_runner as gmr
from minivllm.compilation.cuda_graph import PAD_SLOT_ID, BatchDescriptor, CudagraphDispatcher
from minivllm.config import CompilationConfig, EngineArgs
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams

CAPTURE_SIZES = [1, 2, 4, 8]
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def tiny_llama(tiny_model):
    return tiny_model("llama")


def prompts_of(n: int, seed: int, lo: int = 3, hi: int = 40, prefix: list[int] | None = None) -> list[list[int]]:
    rng = random.Random(seed)
    return [(prefix or []) + [rng.randrange(4, 500) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def greedy(max_tokens: int = 10) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def runner_of(llm: LLM):
    return llm.llm_engine.engine_core.model_executor.driver_worker.model_runner


def run(llm: LLM, prompts, params=None) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params or greedy(), use_tqdm=False)]


def record_padding(llm: LLM) -> list[tuple[int, int]]:
    """(real rows, padded size) of every padded forward the runner makes."""
    runner, seen = runner_of(llm), []
    orig = runner._pad_for_cudagraph

    def spy(desc, input_ids, positions, md):
        seen.append((0 if md is None else md.num_actual_tokens, desc.num_tokens))
        return orig(desc, input_ids, positions, md)
    runner._pad_for_cudagraph = spy
    return seen


def engines(path: str, **kw) -> tuple[LLM, LLM]:
    """(eager, padded) engines on the same checkpoint and settings."""
    common = dict(device="cpu", attention_backend="torch", multiprocess=False) | kw
    return (LLM(path, enforce_eager=True, **common),
            LLM(path, enforce_eager=False, cudagraph_capture_sizes=CAPTURE_SIZES, **common))


# ---------------------------------------------------------------- config and dispatch
def test_default_capture_sizes_follow_vllm_bounded_by_max_num_seqs():
    vllm_list = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16))
    for max_num_seqs in (1, 3, 8, 100, 128, 256, 300, 1024):
        sizes = EngineArgs(max_num_seqs=max_num_seqs).create_engine_config().compilation_config.cudagraph_capture_sizes
        bound = min(max_num_seqs, 512)
        assert sizes == sorted({s for s in vllm_list if s <= bound} | {bound}), max_num_seqs


def test_explicit_capture_sizes_are_deduped_sorted_and_bounded():
    cc = EngineArgs(max_num_seqs=16, cudagraph_capture_sizes=[8, 2, 2, 64]).create_engine_config().compilation_config
    assert cc.cudagraph_capture_sizes == [2, 8] and cc.max_cudagraph_capture_size == 8
    with pytest.raises(ValueError, match="positive"):
        CompilationConfig([0, 4]).set_cudagraph_sizes(8)


def test_dispatcher_pads_uniform_decodes_to_the_smallest_size_that_fits():
    d = CudagraphDispatcher([8, 1, 4, 2])
    assert [d.dispatch(n, True).num_tokens for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert d.dispatch(9, True) is None and d.dispatch(3, False) is None and d.dispatch(0, True) is None
    assert [x.num_tokens for x in d.get_capture_descs()] == [8, 4, 2, 1]


def test_cpu_default_is_plain_eager(tiny_llama):
    runner = runner_of(LLM(tiny_llama, device="cpu", multiprocess=False))
    assert not runner.use_cuda_graph and runner.cudagraph_dispatcher.capture_sizes == []


def test_pad_fills_every_static_buffer_and_clears_stale_rows(tiny_llama):
    _, llm = engines(tiny_llama)
    r = runner_of(llm)
    for buf in (r.cg_input_ids, r.cg_positions, r.cg_slot_mapping, r.cg_seq_lens, r.cg_block_table):
        buf.fill_(77)  # stale values from an earlier, larger batch
    md = gmr.AttentionMetadata(
        num_actual_tokens=3, max_query_len=1, query_start_loc=torch.arange(4, dtype=torch.int32), max_seq_len=20,
        seq_lens=torch.tensor([5, 20, 17], dtype=torch.int32),
        block_table=torch.tensor([[3, 0], [4, 5], [6, 7]], dtype=torch.int32),
        slot_mapping=torch.tensor([52, 83, 112]), num_decodes=3, num_decode_tokens=3)
    ids, pos, pmd = r._pad_for_cudagraph(BatchDescriptor(4, 4, True), torch.tensor([9, 8, 7]),
                                         torch.tensor([4, 19, 16]), md)
    assert ids.tolist() == [9, 8, 7, 0] and pos.tolist() == [4, 19, 16, 0]
    assert pmd.slot_mapping.tolist() == [52, 83, 112, PAD_SLOT_ID] and pmd.seq_lens.tolist() == [5, 20, 17, 0]
    assert pmd.block_table[:, :2].tolist() == [[3, 0], [4, 5], [6, 7], [0, 0]]
    assert not pmd.block_table[:, 2:].any(), "stale block ids left past the batch's width"
    assert (pmd.num_actual_tokens, pmd.num_decodes, pmd.max_query_len) == (4, 4, 1)
    assert r.cg_input_ids[4:].eq(77).all(), "rows past the padded size are not part of this batch"


# ---------------------------------------------------------------- token equality
@pytest.mark.parametrize("num_prompts", [1, 3, 8, 11])
def test_padded_equals_eager(tiny_llama, num_prompts):
    """1 and 8 are capture sizes, 3 pads to 4, 11 exceeds the largest size and must run eagerly."""
    eager, padded = engines(tiny_llama, max_num_seqs=16)
    seen = record_padding(padded)
    prompts = prompts_of(num_prompts, seed=num_prompts)
    params = [greedy(4 + i) for i in range(num_prompts)]  # requests finish one by one: the batch shrinks
    assert run(padded, prompts, params) == run(eager, prompts, params)
    assert seen, "no decode batch went through the padded path"
    assert all(s == min(c for c in CAPTURE_SIZES if c >= n) for n, s in seen)
    assert max(n for n, _ in seen) == min(num_prompts, 8)  # 9..11 decodes stayed eager


def test_padded_equals_eager_after_preemption(tiny_llama):
    eager, padded = engines(tiny_llama, num_gpu_blocks=14, max_num_seqs=8, enable_prefix_caching=False)
    seen = record_padding(padded)
    prompts = prompts_of(8, seed=3, lo=20, hi=40)
    assert run(padded, prompts, greedy(24)) == run(eager, prompts, greedy(24))
    assert padded.llm_engine.get_stats().num_preemptions > 0 and any(n < s for n, s in seen)


def test_padded_equals_eager_with_prefix_hits(tiny_llama):
    eager, padded = engines(tiny_llama, max_num_seqs=4)
    prompts = prompts_of(10, seed=5, lo=1, hi=12, prefix=prompts_of(1, seed=6, lo=40, hi=40)[0])
    assert run(padded, prompts) == run(eager, prompts)
    assert padded.llm_engine.get_stats().prefix_cache_hits >= 32 * 8


# ---------------------------------------------------------------- padded rows and the KV cache
def kv_guard(llm: LLM) -> list[int]:
    """Wrap the padded forward: blocks outside the real rows' block tables must keep their checksum."""
    runner, checked = runner_of(llm), []
    orig = runner._model_forward

    def guarded(desc, input_ids, positions, md):
        if desc is None:
            return orig(desc, input_ids, positions, md)
        n = int((md.seq_lens > 0).sum())
        used = set(md.block_table[:n].flatten().tolist()) - {0}
        outside = [b for b in range(runner.kv_caches[0].shape[1]) if b not in used]
        before = [kv[:, outside].double().sum((0, 2, 3, 4)) for kv in runner.kv_caches]
        real_slots = md.slot_mapping[:n].clone()
        out = orig(desc, input_ids, positions, md)
        after = [kv[:, outside].double().sum((0, 2, 3, 4)) for kv in runner.kv_caches]
        for b, a in zip(before, after, strict=True):
            assert torch.equal(b, a), f"a padded row wrote KV block(s) {[outside[i] for i in (b != a).nonzero()]}"
        assert runner.kv_caches[0][0].flatten(0, 1)[real_slots].abs().sum() > 0  # real rows did write
        checked.append(desc.num_tokens - n)
        return out
    runner._model_forward = guarded
    return checked


def test_padded_rows_never_write_the_kv_cache(tiny_llama):
    _, padded = engines(tiny_llama, max_num_seqs=8)
    checked = kv_guard(padded)
    run(padded, prompts_of(5, seed=9))  # 5 decodes pad to 8, then fewer as requests finish
    assert checked and max(checked) > 0


def test_kv_guard_catches_padded_slots_writing_block_0(tiny_llama, monkeypatch):
    """The guard can fail: padded slots pointed at block 0 (the null block) instead of PAD_SLOT_ID."""
    _, padded = engines(tiny_llama, max_num_seqs=8)
    kv_guard(padded)
    monkeypatch.setattr(gmr, "PAD_SLOT_ID", 0)
    with pytest.raises(AssertionError, match="padded row wrote KV block"):
        run(padded, prompts_of(3, seed=9))


def test_padded_attention_rows_are_zero_not_nan():
    """seq_len 0 (a padded row) attends to nothing: the torch reference gives 0, like the Triton kernel."""
    from minivllm.attention.backends.torch_attn import paged_attention_ref
    torch.manual_seed(0)
    kv = torch.randn(2, 4, 16, 2, 8)
    q = torch.randn(3, 4, 8)
    md = gmr.AttentionMetadata(num_actual_tokens=3, max_query_len=1, query_start_loc=torch.arange(4, dtype=torch.int32),
                               max_seq_len=20, seq_lens=torch.tensor([20, 0, 5], dtype=torch.int32),
                               block_table=torch.tensor([[1, 2], [0, 0], [3, 0]], dtype=torch.int32),
                               slot_mapping=torch.tensor([35, -1, 52]), num_decodes=3, num_decode_tokens=3)
    out = paged_attention_ref(q, kv, md, 8 ** -0.5)
    assert out[1].eq(0).all() and not out.isnan().any()
    alone = paged_attention_ref(q[[0, 2]], kv, gmr.AttentionMetadata(
        num_actual_tokens=2, max_query_len=1, query_start_loc=torch.arange(3, dtype=torch.int32), max_seq_len=20,
        seq_lens=torch.tensor([20, 5], dtype=torch.int32), block_table=torch.tensor([[1, 2], [3, 0]], dtype=torch.int32),
        slot_mapping=torch.tensor([35, 52]), num_decodes=2, num_decode_tokens=2), 8 ** -0.5)
    torch.testing.assert_close(out[[0, 2]], alone)


# ---------------------------------------------------------------- CUDA only
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA device")


@needs_cuda
@pytest.mark.parametrize("num_prompts", [1, 3, 8, 11])
def test_cuda_graph_equals_eager(tiny_llama, num_prompts):
    common = dict(device="cuda", dtype="float32", multiprocess=False, max_num_seqs=16)
    eager = LLM(tiny_llama, enforce_eager=True, **common)
    graph = LLM(tiny_llama, cudagraph_capture_sizes=CAPTURE_SIZES, **common)  # enforce_eager defaults off on CUDA
    runner = runner_of(graph)
    assert runner.use_cuda_graph and len(runner.cudagraph_wrapper.concrete_cudagraph_entries) == len(CAPTURE_SIZES)
    seen = record_padding(graph)
    prompts = prompts_of(num_prompts, seed=num_prompts)
    assert run(graph, prompts, greedy(16)) == run(eager, prompts, greedy(16))
    assert any(n > 0 for n, _ in seen)


@needs_cuda
def test_cuda_graph_after_preemption(tiny_llama):
    common = dict(device="cuda", dtype="float32", multiprocess=False, num_gpu_blocks=14, max_num_seqs=8,
                  enable_prefix_caching=False)
    eager = LLM(tiny_llama, enforce_eager=True, **common)
    graph = LLM(tiny_llama, cudagraph_capture_sizes=CAPTURE_SIZES, **common)
    prompts = prompts_of(8, seed=3, lo=20, hi=40)
    assert run(graph, prompts, greedy(24)) == run(eager, prompts, greedy(24))
    assert graph.llm_engine.get_stats().num_preemptions > 0


def forward_launches(runner, desc: BatchDescriptor, graph: bool) -> dict[str, int]:
    """CUDA runtime calls made by one decode forward of desc.num_tokens rows (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    ids, pos, md = runner._pad_for_cudagraph(desc, None, None, None)
    with torch.inference_mode():
        runner._model_forward(desc, ids, pos, md) if graph else runner.model(ids, pos, runner.kv_caches, md)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            runner._model_forward(desc, ids, pos, md) if graph else runner.model(ids, pos, runner.kv_caches, md)
            torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    return {"graph": sum(n == "cudaGraphLaunch" for n in names),
            "kernel": sum(n in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
                          for n in names)}


@needs_cuda
def test_graph_decode_is_one_replay(tiny_llama):
    llm = LLM(tiny_llama, device="cuda", dtype="float32", multiprocess=False, max_num_seqs=8,
              cudagraph_capture_sizes=CAPTURE_SIZES)
    runner = runner_of(llm)
    desc = BatchDescriptor(8, 8, True)
    eager = forward_launches(runner, desc, graph=False)
    graph = forward_launches(runner, desc, graph=True)
    assert eager["graph"] == 0 and eager["kernel"] >= 10 * runner.hf_config.num_hidden_layers, eager
    assert graph == {"graph": 1, "kernel": 0}, graph


@needs_cuda
def test_graph_memory_is_estimated_before_the_kv_cache(tiny_llama):
    llm = LLM(tiny_llama, device="cuda", dtype="float32", multiprocess=False, max_num_seqs=8,
              cudagraph_capture_sizes=CAPTURE_SIZES)
    assert runner_of(llm).profile_cudagraph_memory() >= len(CAPTURE_SIZES) << 20


@pytest.mark.slow
@pytest.mark.skipif(not CUDA and __import__("os").environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton needs CUDA or TRITON_INTERPRET=1")
def test_padded_equals_eager_through_triton_kernels(tiny_llama):
    """The kernels a graph captures: seq_len-0 rows give 0 in the decode kernel, slot -1 writes nothing."""
    device = "cuda" if CUDA else "cpu"
    eager, padded = engines(tiny_llama, device=device, dtype="float32", attention_backend="triton", max_num_seqs=4)
    seen = record_padding(padded)
    checked = kv_guard(padded)
    prompts = prompts_of(3, seed=12, lo=3, hi=20)
    params = [greedy(3 + i) for i in range(3)]
    assert run(padded, prompts, params) == run(eager, prompts, params)
    assert (3, 4) in seen and max(checked) > 0
