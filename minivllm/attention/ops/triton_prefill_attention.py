"""Prefill and chunked-prefill attention over the varlen batch, reading all K/V from the paged cache
(vLLM: attention/ops/triton_unified_attention.py, chunked_prefill_paged_decode.py).

The new tokens' K/V are already in the cache (triton_reshape_and_cache_flash runs first), so a prefill chunk of
q_len tokens at the end of a seq_len context is query positions [seq_len - q_len, seq_len) attending
causally to cache positions [0, seq_len). One program per (request, tile of BLOCK_Q query tokens,
kv head). A tile's BLOCK_M rows are its query tokens times the kv head's query heads (GQA): row r is
token r // QUERIES_PER_KV, head r % QUERIES_PER_KV, so the whole group shares every K/V load. The
program walks the cache blocks up to its last query's position with the same fp32 online softmax as
the decode kernel, plus a causal mask.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from minivllm.attention.ops.triton_decode_attention import check_kv_cache, dot_config, head_dim_pad


@triton.jit
def _chunked_prefill_paged_attention_kernel(
    out_ptr,                         # [num_tokens, num_heads, head_size]
    query_ptr,                       # [num_tokens, num_heads, head_size]
    k_cache_ptr, v_cache_ptr,        # [num_blocks, BLOCK_SIZE, num_kv_heads, head_size]
    block_table_ptr,                 # [num_reqs, max_blocks_per_req] int32
    seq_lens_ptr,                    # [num_reqs] int32, context after this step (cached + new)
    query_start_loc_ptr,             # [num_reqs + 1] int32
    scale,
    first_req,                       # requests before it (the decodes) are someone else's
    stride_out_tok, stride_out_head,
    stride_query_tok, stride_query_head,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    stride_block_table_req,
    head_size,
    QUERIES_PER_KV: tl.constexpr,    # query heads per kv head (GQA ratio)
    BLOCK_Q: tl.constexpr,           # query tokens per program: BLOCK_M // QUERIES_PER_KV
    BLOCK_M: tl.constexpr,           # rows per program (tokens x group heads), power of two >= 16
    HEAD_DIM_PAD: tl.constexpr,      # head_size padded to a power of two >= 16
    BLOCK_SIZE: tl.constexpr,        # tokens per cache block: one block per loop iteration
    COMPUTE_DTYPE: tl.constexpr,     # as in the decode kernel (dot_config)
    DOT_PRECISION: tl.constexpr,
):
    req = first_req + tl.program_id(0)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + req)
    q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:     # the grid is sized for the longest chunk; shorter ones stop here
        return
    seq_len = tl.load(seq_lens_ptr + req)
    context_len = seq_len - q_len     # tokens cached before this chunk

    rows = tl.arange(0, BLOCK_M)
    q_idx = q_tile * BLOCK_Q + rows // QUERIES_PER_KV        # token inside the chunk
    heads = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
    row_mask = (rows < BLOCK_Q * QUERIES_PER_KV) & (q_idx < q_len)
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < head_size
    slots = tl.arange(0, BLOCK_SIZE)
    q_pos = context_len + q_idx                              # position in the sequence

    tok = (q_start + q_idx).to(tl.int64)
    q_mask = row_mask[:, None] & dim_mask[None, :]
    q = tl.load(query_ptr + tok[:, None] * stride_query_tok + heads[:, None] * stride_query_head + dims[None, :],
                mask=q_mask, other=0.0).to(COMPUTE_DTYPE)

    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)

    # Keys past the tile's last query are causally masked for every row: stop before their blocks.
    last_q_idx = tl.minimum((q_tile + 1) * BLOCK_Q, q_len) - 1
    kv_len = context_len + last_q_idx + 1
    for logical_block in range(0, tl.cdiv(kv_len, BLOCK_SIZE)):
        physical_block = tl.load(block_table_ptr + req * stride_block_table_req + logical_block).to(tl.int64)
        key_pos = logical_block * BLOCK_SIZE + slots
        key_mask = key_pos < kv_len
        kv_offsets = (physical_block * stride_cache_block + slots[:, None] * stride_cache_slot
                      + kv_head * stride_cache_head + dims[None, :])
        kv_mask = key_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)

        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale   # [BLOCK_M, BLOCK_SIZE]
        causal = (key_pos[None, :] <= q_pos[:, None]) & key_mask[None, :]
        scores = tl.where(causal, scores, float("-inf"))

        # Every row sees key 0 in the first block, so running_max is finite from then on and a row
        # whose keys in a later block are all masked just adds exp(-inf) = 0.
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        rescale = tl.exp(running_max - new_max)
        probs = tl.exp(scores - new_max[:, None])
        running_sum = running_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + tl.dot(probs.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)
        running_max = new_max

    running_sum = tl.where(running_sum == 0.0, 1.0, running_sum)
    out = acc / running_sum[:, None]
    tl.store(out_ptr + tok[:, None] * stride_out_tok + heads[:, None] * stride_out_head + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_mask)


def chunked_prefill_paged_attention(out: torch.Tensor, query: torch.Tensor, k_cache: torch.Tensor,
                                    v_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                                    query_start_loc: torch.Tensor, max_query_len: int, scale: float,
                                    first_req: int = 0, num_reqs: int | None = None,
                                    block_m: int = 64, num_warps: int = 4) -> torch.Tensor:
    """Causal attention for requests [first_req, first_req + num_reqs) of the flat varlen batch.

    out, query [num_tokens, num_heads, head_size]; request i's query tokens are rows
    query_start_loc[i]:query_start_loc[i + 1] and sit at the end of its seq_lens[i]-token context, whose
    K/V (the new tokens' included) are in k_cache/v_cache [num_blocks, block_size, num_kv_heads,
    head_size] through block_table[i]. max_query_len (a host int) sizes the grid. Returns out.
    """
    num_tokens, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, cache_head_size = k_cache.shape
    assert cache_head_size == head_size and num_heads % num_kv_heads == 0
    check_kv_cache(k_cache, v_cache)
    assert out.shape == query.shape
    assert query.stride(-1) == 1 and out.stride(-1) == 1 and block_table.stride(-1) == 1
    if num_reqs is None:
        num_reqs = seq_lens.shape[0] - first_req
    if num_reqs == 0 or max_query_len == 0:
        return out
    queries_per_kv = num_heads // num_kv_heads
    block_m = max(block_m, 16, triton.next_power_of_2(queries_per_kv))
    block_q = block_m // queries_per_kv
    compute_dtype, dot_precision = dot_config(k_cache.dtype, query.device)
    grid = (num_reqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _chunked_prefill_paged_attention_kernel[grid](
        out, query, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, first_req,
        out.stride(0), out.stride(1),
        query.stride(0), query.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0),
        head_size,
        QUERIES_PER_KV=queries_per_kv,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        HEAD_DIM_PAD=head_dim_pad(head_size),
        BLOCK_SIZE=block_size,
        COMPUTE_DTYPE=compute_dtype,
        DOT_PRECISION=dot_precision,
        num_warps=num_warps,
    )
    return out
