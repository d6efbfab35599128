"""The plainest paged attention: the reference the Triton kernels and the CPU backend are tested against.

One request at a time: read its K/V position by position through its block table, score every query token
against the positions it may see (causal: query t of q sees the first seq_len - q + t + 1), softmax, weight V.
No buckets, no padding, no workspace, no SDPA: nothing the serving backends do to be fast.
"""
from __future__ import annotations

import torch

from minivllm.attention.backend import AttentionMetadata


def naive_paged_attention(query: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata,
                          scale: float) -> torch.Tensor:
    """query [T, H, D], kv_cache [2, num_blocks, block_size, Hkv, D] -> [T, H, D] in fp32; a request with
    seq_len 0 (a padded CUDA-graph row) attends to nothing and gets 0, as the kernels give."""
    num_heads, head_size = query.shape[1:]
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    group = num_heads // num_kv_heads
    query_start_loc = md.query_start_loc.tolist()
    seq_lens = md.seq_lens.tolist()
    block_table = md.block_table.tolist()
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    for i, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        q_len = end - start
        if seq_len == 0 or q_len == 0:
            continue
        slots = [block_table[i][p // block_size] * block_size + p % block_size for p in range(seq_len)]
        slots = torch.tensor(slots, device=kv_cache.device)
        k = kv_cache[0].reshape(-1, num_kv_heads, head_size)[slots].float()   # [L, Hkv, D]
        v = kv_cache[1].reshape(-1, num_kv_heads, head_size)[slots].float()
        k = k.repeat_interleave(group, dim=1)                                 # [L, H, D]: head h reads kv head h // group
        v = v.repeat_interleave(group, dim=1)
        q = query[start:end].float()                                          # [q, H, D]
        scores = torch.einsum("qhd,lhd->hql", q, k) * scale                   # [H, q, L]
        visible = torch.arange(seq_len)[None, :] <= (seq_len - q_len + torch.arange(q_len))[:, None]  # [q, L]
        scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
        out[start:end] = torch.einsum("hql,lhd->qhd", scores.softmax(dim=-1), v)
    return out
