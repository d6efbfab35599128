"""Lesson 6 on the pinned vLLM: its Triton paged-attention kernels need a GPU (this CPU build has no Triton), so the
nearest thing that runs is its CPU attention backend (v1/attention/backends/cpu_attn.py) on the lesson's paged
decode batch: the K/V written into its own cache layout by cpu_attn_reshape_and_cache, the
scheduler_metadata CPUAttentionMetadataBuilder.build computes, then cpu_attention_with_kv_cache, as
CPUAttentionBackendImpl.forward calls them. Runs under .venv-vllm (imports vllm, never minivllm).

`case_tensors` draws the batch for autograder/lesson06/checks.py make_case too (same seed, same torch), so the
notebook compares vLLM's output with minivllm's torch reference and the student's kernel on one batch.
"""
from __future__ import annotations

LESSON = {"seq_lens": [5, 16, 17, 40], "num_heads": 8, "num_kv_heads": 2, "head_size": 32, "block_size": 16,
          "seed": 0}
LONG = {"seq_lens": [1, 33, 100, 257], "num_heads": 8, "num_kv_heads": 2, "head_size": 64, "block_size": 16,
        "seed": 1}

SCENARIOS = {"lesson": LESSON, "long_gqa": LONG}


def case_tensors(spec: dict, garbage: float = 0.0):
    """(query [n, H, D], kv [2, blocks, block_size, KVH, D], block_table [n, max_blocks] int32, seq_lens), on CPU:
    every sequence's blocks are a random, non-monotone choice of physical blocks (plus a few unowned ones), and
    `garbage` fills the unwritten slots past each sequence's length. The one recipe: checks.make_case calls it."""
    import torch

    g = torch.Generator().manual_seed(spec["seed"])
    bs, lens = spec["block_size"], spec["seq_lens"]
    blocks = [max(1, -(s // -bs)) for s in lens]
    num_blocks = sum(blocks) + 3
    perm = torch.randperm(num_blocks, generator=g)
    if perm[0] == 0:  # keep logical 0 != physical 0 for the first sequence
        perm = perm.roll(1)
    table = torch.zeros(len(lens), max(blocks), dtype=torch.int32)
    start = 0
    for i, n in enumerate(blocks):
        table[i, :n] = perm[start:start + n]
        start += n
    kv = torch.randn(2, num_blocks, bs, spec["num_kv_heads"], spec["head_size"], generator=g)
    for i, s in enumerate(lens):
        for pos in range(s, blocks[i] * bs):
            kv[:, table[i, pos // bs], pos % bs] = garbage
    query = torch.randn(len(lens), spec["num_heads"], spec["head_size"], generator=g)
    return query, kv, table, torch.tensor(lens, dtype=torch.int32)


def vllm_answer(name: str, spec: dict) -> dict:
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    query, kv, table, seq_lens = case_tensors(spec)
    n, heads, d = query.shape
    bs, kvh = spec["block_size"], spec["num_kv_heads"]
    num_blocks = kv.shape[1]
    isa = _get_attn_isa(torch.float32, bs, d, "auto")
    # CPUAttentionBackend.get_kv_cache_shape: [num_blocks, num_kv_heads, block_size, 2 * head_size], split as
    # CPUAttentionBackendImpl.forward splits it.
    cache = torch.zeros(num_blocks, kvh, bs, 2 * d)
    key_cache, value_cache = cache.view(num_blocks, kvh, bs * 2, d).chunk(2, dim=2)
    slots, keys, values = [], [], []
    for i, s in enumerate(spec["seq_lens"]):
        for pos in range(s):
            block = int(table[i, pos // bs])
            slots.append(block * bs + pos % bs)
            keys.append(kv[0, block, pos % bs])
            values.append(kv[1, block, pos % bs])
    ops.cpu_attn_reshape_and_cache(torch.stack(keys), torch.stack(values), key_cache, value_cache,
                                   torch.tensor(slots, dtype=torch.int64), isa)
    qsl = torch.arange(n + 1, dtype=torch.int32)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=n, num_heads=heads, num_kv_heads=kvh, head_dim=d, seq_lens=seq_lens, dtype=torch.float32,
        query_start_loc=qsl, causal=True, sliding_window_size=-1, isa=isa, enable_kv_split=False)
    out = torch.zeros(n, heads * d)
    ops.cpu_attention_with_kv_cache(
        query=query, key_cache=key_cache, value_cache=value_cache, output=out, query_start_loc=qsl,
        seq_lens=seq_lens, scale=d ** -0.5, causal=True, alibi_slopes=None, sliding_window=-1, block_table=table,
        softcap=0.0, scheduler_metadata=metadata, s_aux=None)
    return {"isa": isa, "output": [[round(float(x), 6) for x in row] for row in out]}
