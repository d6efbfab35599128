"""Write new K/V into the paged cache (vLLM: attention/ops/triton_reshape_and_cache_flash.py).

One program per new token: read the token's slot from slot_mapping (slot = block_id * block_size +
offset, -1 = a padding token to skip) and copy its [num_kv_heads, head_size] key and value there.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr,              # [num_tokens, num_kv_heads, head_size]
    k_cache_ptr, v_cache_ptr,        # [num_blocks, block_size, num_kv_heads, head_size]
    slot_mapping_ptr,                # [num_tokens] int64, -1 = skip
    stride_key_tok, stride_key_head,
    stride_value_tok, stride_value_head,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    num_kv_heads, head_size,
    BLOCK_SIZE: tl.constexpr,        # tokens per cache block
    HEADS_PAD: tl.constexpr,         # num_kv_heads rounded up to a power of two
    HEAD_DIM_PAD: tl.constexpr,      # head_size rounded up to a power of two
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:                     # padding token: nothing to write
        return
    block_id = slot // BLOCK_SIZE
    block_offset = slot % BLOCK_SIZE

    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    mask = (heads[:, None] < num_kv_heads) & (dims[None, :] < head_size)

    key = tl.load(key_ptr + token * stride_key_tok + heads[:, None] * stride_key_head + dims[None, :],
                  mask=mask, other=0.0)
    value = tl.load(value_ptr + token * stride_value_tok + heads[:, None] * stride_value_head + dims[None, :],
                    mask=mask, other=0.0)
    cache_offsets = (block_id * stride_cache_block + block_offset * stride_cache_slot
                     + heads[:, None] * stride_cache_head + dims[None, :])
    tl.store(k_cache_ptr + cache_offsets, key.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + cache_offsets, value.to(v_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into k_cache/v_cache [num_blocks, block_size, Hkv, D] at slot_mapping."""
    num_tokens, num_kv_heads, head_size = key.shape
    block_size = k_cache.shape[1]
    assert value.shape == key.shape and slot_mapping.shape == (num_tokens,)
    assert k_cache.shape == v_cache.shape and k_cache.stride() == v_cache.stride()
    assert k_cache.shape[2:] == (num_kv_heads, head_size)
    assert key.stride(-1) == 1 and value.stride(-1) == 1 and k_cache.stride(-1) == 1
    if num_tokens == 0:
        return
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        num_kv_heads, head_size,
        BLOCK_SIZE=block_size,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM_PAD=triton.next_power_of_2(head_size),
    )
