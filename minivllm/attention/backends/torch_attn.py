"""The CPU attention backend: torch ops over the paged KV cache, runs anywhere.

Built to serve, not to read: requests are bucketed into shared SDPA calls over a reused gather workspace.
Decodes are batched (gather each request's blocks, mask past its length); each prefill chunk attends
causally to its cached context plus itself. The tests check it, and the Triton kernels, against the plain
per-request attention of tests/attention_reference.py.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.attention.backend import AttentionBackend, AttentionImpl, AttentionMetadata

# Requests share one SDPA call (padded to the bucket's longest query and context) while the padding costs at most
# PAD_LIMIT times the useful query x context area, and the bucket's gathered K/V stays within MAX_BUCKET_TOKENS
# context positions: one call per bucket instead of one per request, without padding short rows to long ones.
PAD_LIMIT = 1.5
MAX_BUCKET_TOKENS = 1 << 15


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


def _gather(kv_cache: torch.Tensor, ids: torch.Tensor, num_reqs: int, max_len: int,
            out: torch.Tensor | None = None):
    # One index_select over K and V together copies whole blocks (memcpy); advanced indexing kv[ids] is
    # ~5x slower on CPU.
    kv = torch.index_select(kv_cache, 1, ids, out=out) if out is not None else kv_cache.index_select(1, ids)
    shape = (2, num_reqs, -1, *kv_cache.shape[3:])
    kv = kv.view(shape)[:, :, :max_len]
    return kv[0], kv[1]


_WORKSPACE: dict[tuple, torch.Tensor] = {}


def _workspace(kv_cache: torch.Tensor, num_ids: int) -> torch.Tensor:
    """Where a bucket's K/V is gathered: one grow-only buffer reused by every layer and step. On CPU a fresh
    multi-MB tensor per layer costs a page fault per 4 KiB on first write, which took longer than the copy."""
    shape = (2, num_ids, *kv_cache.shape[2:])
    numel = 2 * num_ids * kv_cache[0, 0].numel()
    # An inference tensor cannot be written outside inference mode: one buffer per mode.
    key = (kv_cache.dtype, kv_cache.device, torch.is_inference_mode_enabled())
    buf = _WORKSPACE.get(key)
    if buf is None or buf.numel() < numel:
        buf = _WORKSPACE[key] = torch.empty(numel, dtype=kv_cache.dtype, device=kv_cache.device)
    return buf[:numel].view(shape)


def _buckets(rows: list[int], q_lens: list[int], seq_lens: list[int]) -> list[list[int]]:
    """Rows sorted by context length, cut greedily into buckets within PAD_LIMIT and MAX_BUCKET_TOKENS."""
    buckets: list[list[int]] = []
    bucket: list[int] = []
    useful = max_q = 0
    for r in sorted(rows, key=seq_lens.__getitem__):
        q, length = q_lens[r], seq_lens[r]  # sorted: length is the bucket's longest context so far
        padded = (len(bucket) + 1) * max(max_q, q) * length
        if bucket and (padded > PAD_LIMIT * (useful + q * length)
                       or (len(bucket) + 1) * length > MAX_BUCKET_TOKENS):
            buckets.append(bucket)
            bucket, useful, max_q = [], 0, 0
        bucket.append(r)
        useful += q * length
        max_q = max(max_q, q)
    return buckets + [bucket] if bucket else buckets


class _StepPlan:
    """What every layer of one forward pass would otherwise recompute from the metadata: per bucket of
    requests, the query rows to gather, the block ids, the additive mask and where the outputs go. Built by the
    first layer.

    Decodes (one query token each) fold each KV head's query group into the query dimension ([n, Hkv, group,
    D] against [n, Hkv, L, D]), so every K/V head is read once per group; their mask only hides the padding past
    each context. Prefill chunks and verified drafts pad their queries too and mask causally: query t of a
    request with q queries and context L sees positions <= L - q + t. Padded query rows see nothing and are
    dropped. Padded rows of a CUDA-graph batch (seq_len 0) attend to nothing: output 0, as in
    the kernel.
    """

    def __init__(self, kv_cache: torch.Tensor, md: AttentionMetadata, device, dtype: torch.dtype) -> None:
        qsl = (md.query_start_loc_cpu if md.query_start_loc_cpu is not None else md.query_start_loc).tolist()
        seq_lens = (md.seq_lens_cpu if md.seq_lens_cpu is not None else md.seq_lens).tolist()
        nd, nr = md.num_decodes, len(seq_lens)
        q_lens = [qsl[i + 1] - qsl[i] for i in range(nr)]
        self.zero_rows = [r for r in range(nd) if seq_lens[r] == 0]
        self.decode = []
        for rows in _buckets([r for r in range(nd) if seq_lens[r] > 0], q_lens, seq_lens):
            max_len = seq_lens[rows[-1]]
            idx = torch.tensor(rows, device=device)
            lens = torch.tensor([seq_lens[r] for r in rows], device=device)
            mask = _additive(torch.arange(max_len, device=device)[None, :] < lens[:, None], torch.float32)
            self.decode.append((idx, _block_ids(kv_cache, md.block_table[idx], max_len), max_len,
                                mask[:, None, None, :]))
        self.prefill = []
        for rows in _buckets(list(range(nd, nr)), q_lens, seq_lens):
            max_len, max_q = seq_lens[rows[-1]], max(q_lens[r] for r in rows)
            # Query row t of request r is token qsl[r] + t; padded rows repeat the request's last token.
            t = torch.arange(max_q)
            q_rows = torch.tensor([[qsl[r] + min(i, q_lens[r] - 1) for i in range(max_q)] for r in rows])
            first = torch.tensor([seq_lens[r] - q_lens[r] for r in rows])          # context before the chunk
            qn = torch.tensor([q_lens[r] for r in rows])
            visible = torch.arange(max_len)[None, None, :] <= (first[:, None] + t[None, :])[:, :, None]
            visible &= (t[None, :] < qn[:, None])[:, :, None]
            valid = (t[None, :] < qn[:, None]).reshape(-1).nonzero().squeeze(1)
            idx = torch.tensor(rows, device=device)
            self.prefill.append((q_rows.reshape(-1).to(device), valid.to(device), q_rows.reshape(-1)[valid].to(device),
                                 len(rows), max_q, _block_ids(kv_cache, md.block_table[idx], max_len), max_len,
                                 _additive(visible.to(device), dtype)[:, None]))


def _additive(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as SDPA's additive float mask, built once per step (SDPA would convert it every call)."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, float("-inf"))


def paged_attention_ref(query: torch.Tensor, kv_cache: torch.Tensor, md: AttentionMetadata,
                        scale: float) -> torch.Tensor:
    """Attention for every query token in the flat batch, assuming the cache already holds its K/V."""
    num_heads, head_size = query.shape[1:]
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    plan = md.backend_cache.get("torch")  # one per step: the metadata is shared by every layer
    if plan is None:
        plan = md.backend_cache["torch"] = _StepPlan(kv_cache, md, query.device, query.dtype)
    if plan.zero_rows:
        out[plan.zero_rows] = 0
    for idx, ids, max_len, mask in plan.decode:
        n = idx.shape[0]
        k, v = _gather(kv_cache, ids, n, max_len, _workspace(kv_cache, ids.shape[0]))  # [n, L, Hkv, D]
        q = query.index_select(0, idx).float().view(n, num_kv_heads, group, head_size)
        o = F.scaled_dot_product_attention(q, k.float().transpose(1, 2), v.float().transpose(1, 2),
                                           attn_mask=mask, scale=scale)      # [n, Hkv, group, D]
        out.index_copy_(0, idx, o.reshape(n, num_heads, head_size).to(query.dtype))
    for q_rows, valid, dest, n, max_q, ids, max_len, mask in plan.prefill:
        k, v = _gather(kv_cache, ids, n, max_len, _workspace(kv_cache, ids.shape[0]))
        q = query.index_select(0, q_rows).view(n, max_q, num_heads, head_size).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k.to(q.dtype).transpose(1, 2), v.to(q.dtype).transpose(1, 2),
                                           attn_mask=mask, scale=scale, enable_gqa=group > 1)  # [n, H, q, D]
        o = o.transpose(1, 2).reshape(n * max_q, num_heads, head_size)
        out.index_copy_(0, dest, o.index_select(0, valid))
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
