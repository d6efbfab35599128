"""Triton paged-attention kernels and the CPU (torch) backend against the plain per-request attention of
tests/attention_reference.py.

On CPU the kernels run under TRITON_INTERPRET=1 (set by conftest before triton is imported), so shapes
stay small: a few sequences whose lengths cross block boundaries, scattered non-monotone physical blocks.
The reference runs in fp32 on the same (rounded) cache and query values, so the tolerance only covers the
kernel's own arithmetic and the rounding of its output to the cache dtype.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from attention_reference import naive_paged_attention

from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.backends.torch_attn import (
    TorchAttentionImpl,
    paged_attention_ref,
    reshape_and_cache_torch,
)
from minivllm.attention.backends.triton_attn import TritonAttentionBackend, TritonAttentionImpl
from minivllm.attention.ops.triton_decode_attention import paged_decode_attention
from minivllm.attention.ops.triton_prefill_attention import chunked_prefill_paged_attention
from minivllm.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash
from minivllm.attention.selector import get_attn_backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REPO = Path(__file__).resolve().parents[1]
# Max abs error. fp32: exact products and fp32 sums. fp16: output rounding (half an ulp is 2.4e-4 at
# |o| < 1) plus the fp16 probabilities fed to P@V on GPU. bf16 (8 mantissa bits) is checked relative to
# the output instead, see assert_close.
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 4e-3}
# The interpreter casts fp32 -> bf16 by truncation (measured: up to one ulp, 2**-7 relative, where a GPU
# rounds to nearest), so bf16 allows one ulp of |ref| on top of ATOL (the bf16 probabilities on GPU).
BF16_RTOL = 2.0 ** -7


def make_batch(q_lens: list[int], seq_lens: list[int], *, num_heads: int, num_kv_heads: int, head_size: int,
               block_size: int, dtype: torch.dtype, seed: int = 0):
    """A random paged cache, queries and AttentionMetadata; every request's blocks are scattered."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_req = [-(s // -block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 3                     # a few blocks nobody owns
    perm = torch.randperm(num_blocks, generator=g)
    max_blocks = max(blocks_per_req)
    block_table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    start = 0
    for i, n in enumerate(blocks_per_req):
        block_table[i, :n] = perm[start:start + n]
        start += n
    slots = []
    for i, (q_len, seq_len) in enumerate(zip(q_lens, seq_lens, strict=True)):
        for pos in range(seq_len - q_len, seq_len):
            slots.append(int(block_table[i, pos // block_size]) * block_size + pos % block_size)
    num_tokens = sum(q_lens)
    qsl = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    num_decodes = 0
    while num_decodes < len(q_lens) and q_lens[num_decodes] == 1:
        num_decodes += 1
    md = AttentionMetadata(
        num_actual_tokens=num_tokens, max_query_len=max(q_lens), query_start_loc=qsl.to(DEVICE),
        max_seq_len=max(seq_lens), seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_table=block_table.to(DEVICE), slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        num_decodes=num_decodes, num_decode_tokens=num_decodes, num_prefills=len(q_lens) - num_decodes,
        query_start_loc_cpu=qsl, seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32))
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=g).to(DEVICE, dtype)
    query = torch.randn(num_tokens, num_heads, head_size, generator=g).to(DEVICE, dtype)
    key = torch.randn(num_tokens, num_kv_heads, head_size, generator=g).to(DEVICE, dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_size, generator=g).to(DEVICE, dtype)
    return query, key, value, kv_cache, md


def reference(query, kv_cache, md, scale):
    """The plain per-request attention in fp32 on the same rounded values."""
    return naive_paged_attention(query, kv_cache, md, scale)


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Max abs error within ATOL[dtype] (bf16: within ATOL plus one ulp of the reference value)."""
    err = (out.float() - ref.float()).abs()
    if dtype == torch.bfloat16:
        err = err - BF16_RTOL * ref.float().abs()
    assert err.max().item() <= ATOL[dtype], f"{dtype}: max error {err.max().item():.3g} > {ATOL[dtype]}"


# ---------------------------------------------------------------- triton_reshape_and_cache_flash

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_kv_heads,head_size,block_size", [(1, 64, 16), (2, 80, 32), (3, 128, 16)])
def test_reshape_and_cache_matches_torch(dtype, num_kv_heads, head_size, block_size):
    _, key, value, kv_cache, md = make_batch([1, 7, 20], [9, 7, 33], num_heads=num_kv_heads,
                                             num_kv_heads=num_kv_heads, head_size=head_size,
                                             block_size=block_size, dtype=dtype)
    slots = md.slot_mapping.clone()
    slots[[2, 5, 11]] = -1                                   # padding tokens: must leave the cache alone
    expected, got = kv_cache.clone(), kv_cache.clone()
    reshape_and_cache_torch(key, value, expected, slots)
    triton_reshape_and_cache_flash(key, value, got[0], got[1], slots)
    assert torch.equal(got, expected)


def test_reshape_and_cache_upcasts_into_wider_cache_and_ignores_all_padding():
    _, key, value, kv_cache, md = make_batch([5], [21], num_heads=2, num_kv_heads=2, head_size=64,
                                             block_size=16, dtype=torch.float16)
    cache32 = kv_cache.float()
    expected, got = cache32.clone(), cache32.clone()
    reshape_and_cache_torch(key, value, expected, md.slot_mapping)
    triton_reshape_and_cache_flash(key, value, got[0], got[1], md.slot_mapping)
    assert torch.equal(got, expected)
    untouched = cache32.clone()
    triton_reshape_and_cache_flash(key, value, untouched[0], untouched[1], torch.full_like(md.slot_mapping, -1))
    assert torch.equal(untouched, cache32)


# ---------------------------------------------------------------- decode

@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_size", [64, 80, 128])
@pytest.mark.parametrize("queries_per_kv", [1, 2, 4, 8])
def test_decode_fp32_grid(queries_per_kv, head_size, block_size):
    num_kv_heads = 2
    seq_lens = [1, block_size + 1, 2 * block_size + 8]       # 1 token, just over a block, 3 blocks
    query, _, _, kv_cache, md = make_batch([1, 1, 1], seq_lens, num_heads=num_kv_heads * queries_per_kv,
                                           num_kv_heads=num_kv_heads, head_size=head_size,
                                           block_size=block_size, dtype=torch.float32, seed=queries_per_kv)
    scale = head_size ** -0.5
    out = torch.full_like(query, float("nan"))
    paged_decode_attention(out, query, kv_cache[0], kv_cache[1], md.block_table, md.seq_lens, scale)
    assert_close(out, reference(query, kv_cache, md, scale), torch.float32)


@pytest.mark.parametrize("dtype,queries_per_kv,head_size,block_size", [
    (torch.float16, 4, 80, 16), (torch.float16, 1, 128, 32), (torch.bfloat16, 2, 64, 16),
    (torch.bfloat16, 8, 96, 32)])
def test_decode_half_precision(dtype, queries_per_kv, head_size, block_size):
    query, _, _, kv_cache, md = make_batch([1, 1, 1, 1], [3, 16, 40, 65], num_heads=2 * queries_per_kv,
                                           num_kv_heads=2, head_size=head_size, block_size=block_size,
                                           dtype=dtype)
    scale = head_size ** -0.5
    out = torch.empty_like(query)
    paged_decode_attention(out, query, kv_cache[0], kv_cache[1], md.block_table, md.seq_lens, scale)
    assert out.dtype == dtype
    assert_close(out, reference(query, kv_cache, md, scale), dtype)


def test_decode_empty_sequence_gives_zeros_and_stays_in_bounds():
    query, _, _, kv_cache, md = make_batch([1, 1], [5, 18], num_heads=4, num_kv_heads=2, head_size=64,
                                           block_size=16, dtype=torch.float32)
    seq_lens = md.seq_lens.clone()
    seq_lens[0] = 0                                           # a padded batch row (e.g. CUDA-graph padding)
    out = torch.full_like(query, float("nan"))
    paged_decode_attention(out, query, kv_cache[0], kv_cache[1], md.block_table, seq_lens, 0.125)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_close(out[1:], reference(query, kv_cache, md, 0.125)[1:], torch.float32)


# ---------------------------------------------------------------- prefill / chunked prefill

@pytest.mark.parametrize("queries_per_kv,head_size,block_size", [
    (1, 64, 16), (2, 80, 32), (4, 128, 16), (8, 64, 16), (3, 80, 16)])
def test_chunked_prefill_fp32(queries_per_kv, head_size, block_size):
    # A fresh prompt, a chunk after 23 cached tokens, a 1-token chunk after 16, and a chunk ending mid-block.
    q_lens, seq_lens = [13, 17, 1, 20], [13, 40, 17, 2 * block_size + 5]
    query, _, _, kv_cache, md = make_batch(q_lens, seq_lens, num_heads=2 * queries_per_kv, num_kv_heads=2,
                                           head_size=head_size, block_size=block_size, dtype=torch.float32,
                                           seed=queries_per_kv)
    scale = head_size ** -0.5
    out = torch.full_like(query, float("nan"))
    chunked_prefill_paged_attention(out, query, kv_cache[0], kv_cache[1], md.block_table, md.seq_lens,
                                    md.query_start_loc, md.max_query_len, scale, block_m=32)
    assert_close(out, reference(query, kv_cache, md, scale), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_chunked_prefill_half_precision(dtype):
    query, _, _, kv_cache, md = make_batch([9, 24], [30, 24], num_heads=8, num_kv_heads=2, head_size=96,
                                           block_size=16, dtype=dtype)
    scale = 96 ** -0.5
    out = torch.empty_like(query)
    chunked_prefill_paged_attention(out, query, kv_cache[0], kv_cache[1], md.block_table, md.seq_lens,
                                    md.query_start_loc, md.max_query_len, scale)
    assert_close(out, reference(query, kv_cache, md, scale), dtype)


def test_chunked_prefill_skips_requests_before_first_req():
    query, _, _, kv_cache, md = make_batch([1, 1, 6, 11], [4, 20, 6, 30], num_heads=4, num_kv_heads=2,
                                           head_size=64, block_size=16, dtype=torch.float32)
    out = torch.full_like(query, float("nan"))
    chunked_prefill_paged_attention(out, query, kv_cache[0], kv_cache[1], md.block_table, md.seq_lens,
                                    md.query_start_loc, md.max_query_len, 0.125, first_req=2, num_reqs=2)
    assert torch.isnan(out[:2]).all()                        # the decode rows are the decode kernel's
    assert_close(out[2:], reference(query, kv_cache, md, 0.125)[2:], torch.float32)


@pytest.mark.parametrize("head_size", [8, 24])
def test_small_head_sizes_pad_to_16(head_size):
    query, _, _, kv_cache, md = make_batch([1, 1, 7], [5, 20, 25], num_heads=4, num_kv_heads=2,
                                           head_size=head_size, block_size=16, dtype=torch.float32)
    out = torch.full_like(query, float("nan"))
    paged_decode_attention(out[:2], query[:2], kv_cache[0], kv_cache[1], md.block_table, md.seq_lens, 0.3)
    chunked_prefill_paged_attention(out, query, kv_cache[0], kv_cache[1], md.block_table, md.seq_lens,
                                    md.query_start_loc, md.max_query_len, 0.3, first_req=2)
    assert_close(out, reference(query, kv_cache, md, 0.3), torch.float32)


# ---------------------------------------------------------------- the backend

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_backend_matches_torch_backend_on_mixed_batch(dtype):
    # Two decodes, then a chunked prefill over cached context and a fresh prompt.
    q_lens, seq_lens = [1, 1, 10, 19], [17, 33, 26, 19]
    query, key, value, kv_cache, md = make_batch(q_lens, seq_lens, num_heads=8, num_kv_heads=2, head_size=80,
                                                 block_size=16, dtype=dtype)
    # Pad the flat batch with two tokens past num_actual_tokens (as a CUDA-graph runner would).
    pad = lambda t: torch.cat([t, torch.randn_like(t[:2])])  # noqa: E731
    query, key, value = pad(query), pad(key), pad(value)
    md.slot_mapping = torch.cat([md.slot_mapping, torch.full((2,), -1, dtype=torch.int64, device=DEVICE)])
    scale = 80 ** -0.5
    ref_cache, tri_cache = kv_cache.clone(), kv_cache.clone()
    torch_out = TorchAttentionImpl(8, 80, scale, 2).forward(query.float(), key, value, ref_cache, md)
    got = TritonAttentionImpl(8, 80, scale, 2).forward(query, key, value, tri_cache, md)
    assert torch.equal(tri_cache, ref_cache)
    expected = reference(query[:md.num_actual_tokens], ref_cache, md, scale)
    assert torch_out.shape == got.shape == (md.num_actual_tokens, 8, 80) and got.dtype == dtype
    assert_close(torch_out, expected, torch.float32)
    assert_close(got, expected, dtype)


def test_backend_matches_torch_backend_over_steps():
    """Two prompts: chunked prefill (8 + 12 tokens) and a one-shot prefill, then decodes past a block
    boundary, each step writing the cache the next step reads."""
    num_heads, num_kv_heads, head_size, block_size = 4, 1, 64, 16
    g = torch.Generator().manual_seed(3)
    block_table = torch.tensor([[6, 1], [3, 4]], dtype=torch.int32, device=DEVICE)
    caches = [torch.zeros(2, 8, block_size, num_kv_heads, head_size, device=DEVICE) for _ in range(2)]
    impls = [TorchAttentionImpl(num_heads, head_size, 0.125, num_kv_heads),
             TritonAttentionImpl(num_heads, head_size, 0.125, num_kv_heads)]
    # (query lengths, context lengths after the step) per step; decodes first as the runner orders them.
    steps = [([8], [8]), ([12, 14], [20, 14]), ([1, 1], [21, 15]), ([1, 1], [22, 16]), ([1, 1], [23, 17])]
    for q_lens, seq_lens in steps:
        reqs = list(range(len(q_lens)))                   # request 1 arrives in step 2
        slots = [int(block_table[r, p // block_size]) * block_size + p % block_size
                 for r, q_len, seq_len in zip(reqs, q_lens, seq_lens, strict=True)
                 for p in range(seq_len - q_len, seq_len)]
        qsl = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
        num_decodes = sum(1 for q in q_lens if q == 1)
        md = AttentionMetadata(
            num_actual_tokens=sum(q_lens), max_query_len=max(q_lens), query_start_loc=qsl.to(DEVICE),
            max_seq_len=max(seq_lens), seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
            block_table=block_table[reqs], slot_mapping=torch.tensor(slots, device=DEVICE),
            num_decodes=num_decodes, num_decode_tokens=num_decodes, num_prefills=len(q_lens) - num_decodes,
            query_start_loc_cpu=qsl, seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32))
        t = sum(q_lens)
        q, k, v = (torch.randn(t, h, head_size, generator=g).to(DEVICE)
                   for h in (num_heads, num_kv_heads, num_kv_heads))
        torch_out, got = (impl.forward(q, k, v, cache, md) for impl, cache in zip(impls, caches, strict=True))
        assert torch.equal(caches[1], caches[0])
        expected = reference(q, caches[0], md, 0.125)
        assert_close(torch_out, expected, torch.float32)
        assert_close(got, expected, torch.float32)


def test_selector_returns_triton_backend():
    backend = get_attn_backend("triton", DEVICE)
    assert backend is TritonAttentionBackend and backend.name == "TRITON"
    assert backend.get_impl_cls() is TritonAttentionImpl


# ---------------------------------------------------------------- compiling for a real GPU

# The interpreter runs numpy, so it cannot see what only the GPU compiler checks (tl.dot shapes and
# dtypes, layouts, vector widths). Compile every kernel ahead of time for sm_90 (H100/H200) with the
# ptxas bundled in the triton wheel: no GPU needed. Pointers and the int arguments that are multiples of
# 16 in a real launch get the divisibility hint the JIT would give them. In a subprocess, since
# TRITON_INTERPRET is set here.
_AOT_SCRIPT = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from minivllm.attention.ops import triton_decode_attention as D, triton_prefill_attention as P
from minivllm.attention.ops import triton_reshape_and_cache_flash as R

def compile_for_sm90(kernel, ptr_dtype, constexprs):
    types = {"block_table_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32",
             "slot_mapping_ptr": "*i64", "scale": "fp32", "first_req": "i32"}
    names = kernel.arg_names
    sig = {n: "constexpr" if n in constexprs else types.get(n, "*" + ptr_dtype if n.endswith("_ptr") else "i32")
           for n in names}
    div16 = [n for n in names if sig[n] != "constexpr" and (n.endswith("_ptr") or sig[n] == "i32")
             and n not in ("first_req", "num_kv_heads", "num_tokens")]
    src = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in constexprs.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in div16})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})

for ptr_dtype, tl_dtype in [("fp32", tl.float32), ("fp16", tl.float16), ("bf16", tl.bfloat16)]:
    compute = dict(COMPUTE_DTYPE=tl.float32 if ptr_dtype == "fp32" else tl_dtype,
                   DOT_PRECISION="ieee" if ptr_dtype == "fp32" else "tf32")
    decode = compile_for_sm90(D._paged_decode_attention_kernel, ptr_dtype, dict(
        QUERIES_PER_KV=4, GROUP_PAD=16, HEAD_DIM_PAD=128, BLOCK_SIZE=16, **compute))
    compile_for_sm90(P._chunked_prefill_paged_attention_kernel, ptr_dtype, dict(
        QUERIES_PER_KV=2, BLOCK_Q=32, BLOCK_M=64, HEAD_DIM_PAD=128, BLOCK_SIZE=32, **compute))
    compile_for_sm90(R.reshape_and_cache_kernel_flash, ptr_dtype, dict(BLOCK_SIZE=16, TOKENS=1, HEADS_PAD=8, HEAD_DIM_PAD=128))
    if ptr_dtype == "bf16":   # decode streams K/V: 16-byte vectors, prefetched by cp.async, on tensor cores
        ptx = decode.asm["ptx"]
        assert "cp.async.cg.shared.global" in ptx and "mma.sync" in ptx, "decode lost its streaming loads"
print("compiled")
"""


@pytest.mark.slow
@pytest.mark.skipif(DEVICE == "cuda", reason="a GPU run compiles the kernels for real")
def test_kernels_compile_for_sm90_without_a_gpu():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _AOT_SCRIPT], capture_output=True, text=True, timeout=300,
                          env=env, cwd=REPO)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-3000:]


# ---------------------------------------------------------------- the benchmark script

def _run_bench(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "paged_attention.py"), *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)


@pytest.mark.skipif(DEVICE == "cuda", reason="the CPU message is for machines without a GPU")
def test_benchmark_says_it_needs_a_gpu_on_cpu():
    proc = _run_bench()
    assert proc.returncode == 0, proc.stderr
    assert "needs a CUDA GPU" in proc.stdout


def test_benchmark_interpret_smoke_runs():
    proc = _run_bench("--interpret-smoke")
    assert proc.returncode == 0, proc.stderr
    assert "smoke ok" in proc.stdout


def test_torch_backend_buckets_equal_per_request_attention(monkeypatch):
    """The CPU backend pads requests into shared SDPA calls (decodes folded per KV head, prefill chunks and
    drafts masked causally): every bucketing gives what each request computes alone, a zero-length padded row
    gives 0, and the gather workspace is reused across buckets of different sizes."""
    import minivllm.attention.backends.torch_attn as ta

    q_lens = [1, 1, 1, 1, 1, 9, 3, 1 + 16, 40]
    seq_lens = [5, 0, 33, 17, 60, 9, 50, 20, 45]
    query, _, _, kv_cache, md = make_batch(q_lens, seq_lens, num_heads=8, num_kv_heads=2, head_size=16,
                                           block_size=8, dtype=torch.float32, seed=3)
    md.num_decodes = md.num_decode_tokens = 5
    expected = naive_paged_attention(query, kv_cache, md, 0.25)
    assert expected[1].abs().sum() == 0
    for pad_limit, max_tokens in ((1.0, 1 << 15), (1.5, 1 << 15), (100.0, 1 << 15), (100.0, 64)):
        monkeypatch.setattr(ta, "PAD_LIMIT", pad_limit)
        monkeypatch.setattr(ta, "MAX_BUCKET_TOKENS", max_tokens)
        md.backend_cache.clear()
        got = paged_attention_ref(query, kv_cache, md, 0.25)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        plan = md.backend_cache["torch"]
        sizes = [len(b[0]) for b in plan.decode], [b[3] for b in plan.prefill]
        assert sum(sizes[0]) == 4 and sum(sizes[1]) == 4, sizes
        if pad_limit == 1.0:
            assert max(sizes[0] + sizes[1]) == 1  # unequal lengths never share a call
        if pad_limit == 100.0 and max_tokens > 64:
            assert sizes == ([4], [4])  # one call for the decodes, one for the prefills
