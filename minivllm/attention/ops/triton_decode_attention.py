"""Paged decode attention: one query token per sequence.

vLLM: kernel_paged_attention_2d in attention/ops/chunked_prefill_paged_decode.py has this shape; its
attention/ops/triton_decode_attention.py splits each sequence's blocks over several programs and merges
the partial softmaxes in a second kernel (split-KV), which this one does not do.

One program per (sequence, kv head). It loads the query heads that share the kv head (GQA: the whole
group at once, padded to 16 rows as vLLM pads num_queries_per_kv_padded), then walks the sequence's
logical blocks: read the physical block id from the block table, load that block's K and V, and fold
the scores into an fp32 online softmax (running max, running denominator, rescaled accumulator). The
output is the accumulator divided by the denominator.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_attention_kernel(
    out_ptr,                         # [num_seqs, num_heads, head_size]
    query_ptr,                       # [num_seqs, num_heads, head_size]
    k_cache_ptr, v_cache_ptr,        # [num_blocks, BLOCK_SIZE, num_kv_heads, head_size]
    block_table_ptr,                 # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,                    # [num_seqs] int32
    scale,                           # softmax scale, usually head_size ** -0.5
    stride_out_seq, stride_out_head,
    stride_query_seq, stride_query_head,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    stride_block_table_seq,
    head_size,
    QUERIES_PER_KV: tl.constexpr,    # query heads per kv head (GQA ratio)
    GROUP_PAD: tl.constexpr,         # QUERIES_PER_KV padded to a power of two >= 16
    HEAD_DIM_PAD: tl.constexpr,      # head_size padded to a power of two >= 16
    BLOCK_SIZE: tl.constexpr,        # tokens per cache block
    COMPUTE_DTYPE: tl.constexpr,     # dtype fed to tl.dot (fp32 under the interpreter: bf16 dot is wrong there)
    DOT_PRECISION: tl.constexpr,     # "ieee" for fp32 inputs (no tf32 rounding), else "tf32" (ignored)
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)

    group = tl.arange(0, GROUP_PAD)          # row r = query head kv_head * QUERIES_PER_KV + r
    dims = tl.arange(0, HEAD_DIM_PAD)
    slots = tl.arange(0, BLOCK_SIZE)         # token offsets inside one cache block
    head_mask = group < QUERIES_PER_KV
    dim_mask = dims < head_size
    heads = kv_head * QUERIES_PER_KV + group

    q_offsets = seq * stride_query_seq + heads[:, None] * stride_query_head + dims[None, :]
    q = tl.load(query_ptr + q_offsets, mask=head_mask[:, None] & dim_mask[None, :], other=0.0)
    q = q.to(COMPUTE_DTYPE)                  # [GROUP_PAD, HEAD_DIM_PAD]

    # Online softmax state, one entry per query head of the group, all fp32.
    running_max = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)

    num_logical_blocks = tl.cdiv(seq_len, BLOCK_SIZE)
    for logical_block in range(0, num_logical_blocks):
        # 1. Where does this block of the sequence live in the cache?
        physical_block = tl.load(block_table_ptr + seq * stride_block_table_seq + logical_block)
        physical_block = physical_block.to(tl.int64)   # block * stride can pass 2**31 in a big cache

        # 2. Pointers to its BLOCK_SIZE tokens of this kv head; tokens past seq_len are masked.
        token_pos = logical_block * BLOCK_SIZE + slots
        token_mask = token_pos < seq_len
        kv_offsets = (physical_block * stride_cache_block + slots[:, None] * stride_cache_slot
                      + kv_head * stride_cache_head + dims[None, :])
        kv_mask = token_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)

        # 3. Scores of every query head of the group against the block's tokens.
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale   # [GROUP_PAD, BLOCK_SIZE]
        scores = tl.where(token_mask[None, :], scores, float("-inf"))

        # 4. Online softmax: raise the running max, rescale what was summed under the old max.
        block_max = tl.max(scores, axis=1)
        new_max = tl.maximum(running_max, block_max)
        rescale = tl.exp(running_max - new_max)          # 0 on the first block (old max is -inf)
        probs = tl.exp(scores - new_max[:, None])        # masked tokens give exp(-inf) = 0
        running_sum = running_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + tl.dot(probs.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)
        running_max = new_max

    running_sum = tl.where(running_sum == 0.0, 1.0, running_sum)   # seq_len 0 (a padded row): output 0
    out = acc / running_sum[:, None]
    out_offsets = seq * stride_out_seq + heads[:, None] * stride_out_head + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None] & dim_mask[None, :])


_TL_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def dot_config(cache_dtype: torch.dtype, device: torch.device) -> tuple[tl.dtype, str]:
    """(dtype fed to tl.dot, input_precision) for a cache dtype.

    On CUDA fp16/bf16 go to the tensor cores as they are and fp32 uses exact ("ieee") products; under the
    interpreter everything is upcast to fp32, since its bf16 tl.dot gives wrong results.
    """
    if cache_dtype not in _TL_DTYPES:
        raise ValueError(f"unsupported KV cache dtype {cache_dtype}; use float32, float16 or bfloat16")
    if device.type != "cuda" or cache_dtype == torch.float32:
        return tl.float32, "ieee"
    return _TL_DTYPES[cache_dtype], "tf32"


def check_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """The layout every kernel here assumes; a clear error beats a wrong pointer."""
    block_size = k_cache.shape[1]
    if block_size & (block_size - 1) or (k_cache.is_cuda and block_size < 16):
        raise ValueError(f"block_size must be a power of two (>= 16 on CUDA, for tl.dot), got {block_size}")
    assert v_cache.shape == k_cache.shape and v_cache.stride() == k_cache.stride()
    assert k_cache.stride(-1) == 1, "the head dimension of the KV cache must be contiguous"


def head_dim_pad(head_size: int) -> int:
    """head_size rounded up to a power of two, and to 16 at least (tl.dot's smallest K on GPU)."""
    return max(16, triton.next_power_of_2(head_size))


def paged_decode_attention(out: torch.Tensor, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           num_warps: int = 4) -> torch.Tensor:
    """out[s] = softmax(query[s] K_s^T * scale) V_s, K_s/V_s read through block_table[s] up to seq_lens[s].

    out, query [num_seqs, num_heads, head_size]; k_cache, v_cache [num_blocks, block_size, num_kv_heads,
    head_size]; block_table [num_seqs, max_blocks] int32; seq_lens [num_seqs] int32. Returns out.
    """
    num_seqs, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, cache_head_size = k_cache.shape
    assert cache_head_size == head_size and num_heads % num_kv_heads == 0
    check_kv_cache(k_cache, v_cache)
    assert out.shape == query.shape and block_table.shape[0] >= num_seqs and seq_lens.shape[0] >= num_seqs
    assert query.stride(-1) == 1 and out.stride(-1) == 1 and block_table.stride(-1) == 1
    if num_seqs == 0:
        return out
    queries_per_kv = num_heads // num_kv_heads
    compute_dtype, dot_precision = dot_config(k_cache.dtype, query.device)
    _paged_decode_attention_kernel[(num_seqs, num_kv_heads)](
        out, query, k_cache, v_cache, block_table, seq_lens, scale,
        out.stride(0), out.stride(1),
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0),
        head_size,
        QUERIES_PER_KV=queries_per_kv,
        GROUP_PAD=max(16, triton.next_power_of_2(queries_per_kv)),
        HEAD_DIM_PAD=head_dim_pad(head_size),
        BLOCK_SIZE=block_size,
        COMPUTE_DTYPE=compute_dtype,
        DOT_PRECISION=dot_precision,
        num_warps=num_warps,
    )
    return out
