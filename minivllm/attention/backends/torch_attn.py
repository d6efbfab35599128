"""Torch reference attention over the paged KV cache: the oracle every kernel is checked against.

Plain tensor ops, runs anywhere. Decodes are batched (gather each request's blocks, mask past its
length); each prefill chunk attends causally to its cached context plus itself.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.attention.backends.abstract import AttentionBackend, AttentionImpl, AttentionMetadata

DECODE_BUCKET = 16  # decode rows per SDPA call: less padding than one call, fewer calls than one per row


def reshape_and_cache_torch(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                            slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into the paged cache at slot_mapping; slot -1 means skip."""
    num_kv_heads, head_size = kv_cache.shape[-2:]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid] if not bool(valid.all()) else slot_mapping
    k_cache = kv_cache[0].view(-1, num_kv_heads, head_size)
    v_cache = kv_cache[1].view(-1, num_kv_heads, head_size)
    if slots.numel() != slot_mapping.numel():
        key, value = key[valid], value[valid]
    k_cache.index_copy_(0, slots, key.to(k_cache.dtype))
    v_cache.index_copy_(0, slots, value.to(v_cache.dtype))


def gather_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Contiguous K and V [num_reqs, max_len, Hkv, D] read through each request's block table."""
    return _gather(kv_cache, _block_ids(kv_cache, block_table, max_len), block_table.shape[0], max_len)


def _block_ids(kv_cache: torch.Tensor, block_table: torch.Tensor, max_len: int) -> torch.Tensor:
    num_blocks = -(max_len // -kv_cache.shape[2])
    return block_table[:, :num_blocks].reshape(-1).long()


def _gather(kv_cache: torch.Tensor, ids: torch.Tensor, num_reqs: int, max_len: int):
    # One index_select over K and V together copies whole blocks (memcpy); advanced indexing kv[ids] is
    # ~5x slower on CPU.
    kv = kv_cache.index_select(1, ids)
    shape = (2, num_reqs, -1, *kv_cache.shape[3:])
    kv = kv.view(shape)[:, :, :max_len]
    return kv[0], kv[1]


class _StepPlan:
    """What every layer of one forward pass would otherwise recompute from the metadata: the decode buckets
    (rows, block ids, masks) and each prefill's span, block ids and causal mask. Built by the first layer."""

    def __init__(self, kv_cache: torch.Tensor, md: AttentionMetadata, device) -> None:
        qsl = (md.query_start_loc_cpu if md.query_start_loc_cpu is not None else md.query_start_loc).tolist()
        seq_lens = (md.seq_lens_cpu if md.seq_lens_cpu is not None else md.seq_lens).tolist()
        nd = md.num_decodes
        # Decodes: sorted by length and taken DECODE_BUCKET at a time, so each bucket gathers (and pads to)
        # only its own longest context; one fused SDPA call per bucket, computed in float32.
        # Padded rows of a CUDA-graph batch (seq_len 0) attend to nothing: their output is 0, as in the kernel.
        order = sorted((r for r in range(nd) if seq_lens[r] > 0), key=seq_lens.__getitem__)
        self.zero_rows = [r for r in range(nd) if seq_lens[r] == 0]
        self.decode = []
        for b in range(0, len(order), DECODE_BUCKET):
            rows = order[b:b + DECODE_BUCKET]
            idx = torch.tensor(rows, device=device)
            max_len = seq_lens[rows[-1]]
            lens = torch.tensor([seq_lens[r] for r in rows], device=device)
            mask = torch.arange(max_len, device=device)[None, :] < lens[:, None]
            self.decode.append((idx, _block_ids(kv_cache, md.block_table[idx], max_len), max_len,
                                mask[:, None, None, :]))
        self.prefill = []
        for i in range(nd, len(seq_lens)):
            start, end, seq_len = qsl[i], qsl[i + 1], seq_lens[i]
            q_pos = torch.arange(seq_len - (end - start), seq_len, device=device)
            mask = torch.arange(seq_len, device=device)[None, :] <= q_pos[:, None]
            self.prefill.append((start, end, _block_ids(kv_cache, md.block_table[i:i + 1], seq_len), seq_len, mask))


def paged_attention_ref(query: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata,
                        scale: float) -> torch.Tensor:
    """Attention for every query token in the flat batch, assuming the cache already holds its K/V."""
    num_heads = query.shape[1]
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    plan = md.backend_cache.get("torch")  # one per step: the metadata is shared by every layer
    if plan is None:
        plan = md.backend_cache["torch"] = _StepPlan(kv_cache, md, query.device)
    if plan.zero_rows:
        out[plan.zero_rows] = 0
    for idx, ids, max_len, mask in plan.decode:
        k, v = _gather(kv_cache, ids, idx.shape[0], max_len)                 # [b, L, Hkv, D]
        o = F.scaled_dot_product_attention(
            query[idx].float().unsqueeze(2), k.float().transpose(1, 2), v.float().transpose(1, 2),
            attn_mask=mask, scale=scale, enable_gqa=group > 1)
        out[idx] = o.squeeze(2).to(query.dtype)
    for start, end, ids, seq_len, mask in plan.prefill:
        k, v = _gather(kv_cache, ids, 1, seq_len)
        q = query[start:end].transpose(0, 1)                                 # [H, q, D]
        k = k[0].transpose(0, 1).repeat_interleave(group, 0).to(q.dtype)   # [H, L, D]
        v = v[0].transpose(0, 1).repeat_interleave(group, 0).to(q.dtype)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        out[start:end] = o.transpose(0, 1)
    return out


class TorchAttentionImpl(AttentionImpl):
    def forward(self, query, key, value, kv_cache, attn_metadata):
        n = attn_metadata.num_actual_tokens
        reshape_and_cache_torch(key[:n], value[:n], kv_cache, attn_metadata.slot_mapping[:n])
        return paged_attention_ref(query[:n], kv_cache, attn_metadata, self.scale)


class TorchAttentionBackend(AttentionBackend):
    name = "TORCH"

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        return TorchAttentionImpl
