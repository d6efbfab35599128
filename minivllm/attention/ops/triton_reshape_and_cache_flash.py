"""Write new K/V into the paged cache (vLLM: v1/attention/ops/triton_reshape_and_cache_flash.py).

Each new token reads its slot from slot_mapping (slot = block_id * block_size + offset, -1 = a padding
token to skip) and copies its [num_kv_heads, head_size] key and value there. One token per program on
GPU (as vLLM); a tile of tokens per program under the interpreter, where every program is slow.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def reshape_and_cache_kernel_flash(
    key_ptr, value_ptr,              # [num_tokens, num_kv_heads, head_size]
    k_cache_ptr, v_cache_ptr,        # [num_blocks, block_size, num_kv_heads, head_size]
    slot_mapping_ptr,                # [num_tokens] int64, -1 = skip
    num_tokens,
    stride_key_tok, stride_key_head,
    stride_value_tok, stride_value_head,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    num_kv_heads, head_size,
    BLOCK_SIZE: tl.constexpr,        # tokens per cache block
    TOKENS: tl.constexpr,            # tokens per program (1 on GPU; more under the slow interpreter)
    HEADS_PAD: tl.constexpr,         # num_kv_heads rounded up to a power of two
    HEAD_DIM_PAD: tl.constexpr,      # head_size rounded up to a power of two
):
    tokens = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    slots = tl.load(slot_mapping_ptr + tokens, mask=tokens < num_tokens, other=-1)
    block_ids = slots // BLOCK_SIZE
    block_offsets = slots % BLOCK_SIZE

    tok = tokens[:, None, None]                                  # [TOKENS, 1, 1]
    heads = tl.arange(0, HEADS_PAD)[None, :, None]               # [1, HEADS_PAD, 1]
    dims = tl.arange(0, HEAD_DIM_PAD)[None, None, :]             # [1, 1, HEAD_DIM_PAD]
    # slot -1 (a padding token, or past num_tokens) writes nothing.
    mask = (slots >= 0)[:, None, None] & (heads < num_kv_heads) & (dims < head_size)

    key = tl.load(key_ptr + tok * stride_key_tok + heads * stride_key_head + dims, mask=mask, other=0.0)
    value = tl.load(value_ptr + tok * stride_value_tok + heads * stride_value_head + dims, mask=mask, other=0.0)
    cache_offsets = (block_ids[:, None, None] * stride_cache_block + block_offsets[:, None, None] * stride_cache_slot
                     + heads * stride_cache_head + dims)
    tl.store(k_cache_ptr + cache_offsets, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + cache_offsets, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def triton_reshape_and_cache_flash(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                                   value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into key_cache/value_cache [num_blocks, block_size, Hkv, D] at slot_mapping."""
    num_tokens, num_kv_heads, head_size = key.shape
    block_size = key_cache.shape[1]
    assert value.shape == key.shape and slot_mapping.shape == (num_tokens,)
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert key_cache.shape[2:] == (num_kv_heads, head_size)
    assert key.stride(-1) == 1 and value.stride(-1) == 1 and key_cache.stride(-1) == 1
    if num_tokens == 0:
        return
    tokens = 1 if key.is_cuda else 16          # each interpreted program costs milliseconds: batch tokens there
    reshape_and_cache_kernel_flash[(triton.cdiv(num_tokens, tokens),)](
        key, value, key_cache, value_cache, slot_mapping, num_tokens,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        num_kv_heads, head_size,
        BLOCK_SIZE=block_size,
        TOKENS=tokens,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM_PAD=triton.next_power_of_2(head_size),
    )
