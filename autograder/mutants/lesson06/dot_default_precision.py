"""Wrong on a GPU only: tl.dot without input_precision=DOT_PRECISION (the interpreter ignores it; a GPU uses tf32)."""
import triton
import triton.language as tl


@triton.jit
def paged_decode_kernel(
    out_ptr,                         # [num_seqs, num_heads, head_size]
    query_ptr,                       # [num_seqs, num_heads, head_size]
    k_cache_ptr, v_cache_ptr,        # [num_blocks, BLOCK_SIZE, num_kv_heads, head_size]
    block_table_ptr,                 # [num_seqs, max_blocks_per_seq] int32
    seq_lens_ptr,                    # [num_seqs] int32
    scale,                           # softmax scale, head_size ** -0.5
    stride_out_seq, stride_out_head,
    stride_query_seq, stride_query_head,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    stride_block_table_seq,
    head_size,
    QUERIES_PER_KV: tl.constexpr,    # query heads per kv head (GQA ratio)
    GROUP_PAD: tl.constexpr,         # QUERIES_PER_KV padded to a power of two >= 16
    HEAD_DIM_PAD: tl.constexpr,      # head_size padded to a power of two >= 16
    BLOCK_SIZE: tl.constexpr,        # tokens per cache block
    COMPUTE_DTYPE: tl.constexpr,     # dtype fed to tl.dot
    DOT_PRECISION: tl.constexpr,     # "ieee" for fp32 inputs
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
        # 1. Where does this block of the sequence live in the cache? (row `seq` of the block table)
        physical_block = tl.load(block_table_ptr + seq * stride_block_table_seq + logical_block)
        physical_block = physical_block.to(tl.int64)   # block * stride can pass 2**31 in a big cache

        # 2. Its BLOCK_SIZE tokens of this kv head: which are inside the sequence, and their offsets.
        token_pos = logical_block * BLOCK_SIZE + slots
        token_mask = token_pos < seq_len
        kv_offsets = physical_block * stride_cache_block + slots[:, None] * stride_cache_slot + kv_head * stride_cache_head + dims[None, :]
        kv_mask = token_mask[:, None] & dim_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(COMPUTE_DTYPE)

        # 3. Scores of every query head of the group against the block's tokens (given).
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale   # [GROUP_PAD, BLOCK_SIZE]
        scores = tl.where(token_mask[None, :], scores, float("-inf"))

        # 4. Online softmax: raise the running max, rescale what was summed under the old max.
        block_max = tl.max(scores, axis=1)
        new_max = tl.maximum(running_max, block_max)
        rescale = tl.exp(running_max - new_max)
        probs = tl.exp(scores - new_max[:, None])
        running_sum = running_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + tl.dot(probs.to(COMPUTE_DTYPE), v)
        running_max = new_max

    running_sum = tl.where(running_sum == 0.0, 1.0, running_sum)   # seq_len 0 (a padded row): output 0
    out = acc / running_sum[:, None]
    out_offsets = seq * stride_out_seq + heads[:, None] * stride_out_head + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None] & dim_mask[None, :])
