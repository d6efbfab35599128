"""Wrong: the block hash leaves out extra_keys: LoRA / cache_salt / multimodal requests share blocks."""
from minivllm.core import kv_cache_utils
from minivllm.core.kv_cache_manager import KVCacheBlocks


def hash_block_tokens(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None):
    """One full block's hash, chained to its parent (vLLM: kv_cache_utils.hash_block_tokens)."""
    if parent_block_hash is None:
        parent_block_hash = kv_cache_utils.NONE_HASH  # the first block's parent: a fixed seed
    key = (parent_block_hash, tuple(curr_block_token_ids))
    return hash_function(key)


def request_block_hasher(request, block_size=16, hash_function=hash):
    """Hashes of the request's newly full blocks, chained onto request.block_hashes."""
    parent_hash = request.block_hashes[-1] if request.block_hashes else None
    num_full_blocks = request.num_tokens // block_size
    new_hashes = []
    for i in range(len(request.block_hashes), num_full_blocks):
        block_tokens = request.all_token_ids[i * block_size:(i + 1) * block_size]
        parent_hash = hash_block_tokens(hash_function, parent_hash, block_tokens)
        new_hashes.append(parent_hash)
    return new_hashes


def get_computed_blocks(self, request):
    """KVCacheManager.get_computed_blocks: the longest run of cached full blocks from the start."""
    if not self.enable_caching:
        return KVCacheBlocks([]), 0
    max_cache_hit_length = request.num_tokens - 1
    computed_blocks = []
    for block_hash in request.block_hashes[:max_cache_hit_length // self.block_size]:
        block = self.block_pool.get_cached_block(block_hash)
        if block is None:
            break  # the chain breaks at the first miss
        computed_blocks.append(block)
    num_computed_tokens = len(computed_blocks) * self.block_size
    return KVCacheBlocks(computed_blocks), num_computed_tokens


def get_new_blocks(self, num_blocks):
    """BlockPool.get_new_blocks: reuse free blocks, evicting any stale cached hash they still carry."""
    blocks = self.free_block_queue.popleft_n(num_blocks)
    for block in blocks:
        if block.block_hash is not None:
            self._maybe_evict_cached_block(block)  # its old KV is about to be overwritten
        assert block.ref_cnt == 0, block
        block.ref_cnt = 1
    return blocks
