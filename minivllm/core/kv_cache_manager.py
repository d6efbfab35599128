"""KVCacheManager: the scheduler's view of the KV cache (vLLM: v1/core/kv_cache_manager.py).

It maps each request to its list of blocks, finds prefix-cache hits, allocates slots for the tokens a
step will compute, and frees blocks. It never touches a tensor: the worker owns those.
"""
from __future__ import annotations

from dataclasses import dataclass

from minivllm.core.block_pool import BlockPool, KVCacheBlock
from minivllm.core.kv_cache_utils import BlockHash
from minivllm.request import Request
from minivllm.utils import cdiv


@dataclass
class KVCacheBlocks:
    """The blocks handed to one request by one allocation."""

    blocks: list[KVCacheBlock]

    def get_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(self.blocks + other.blocks)


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the last reset: requests, tokens asked for, tokens hit."""

    requests: int = 0
    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


_EMPTY = KVCacheBlocks([])


class KVCacheManager:
    """Block ledger per request on top of the BlockPool."""

    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        # Per request: up to this many tokens (computed + new), allocate_slots would find nothing to do
        # (no new block, no block to cache), so the scheduler's hot loop skips the call.
        self.allocate_slots_noop_until: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def empty_kv_cache_blocks(self) -> KVCacheBlocks:
        return KVCacheBlocks([])

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest run of cached full blocks from the start of the request, and its token count.

        The hit stops at num_tokens - 1: at least the last token is recomputed, because the step must
        produce its logits to sample the next token.
        """
        if not self.enable_caching:
            return KVCacheBlocks([]), 0
        max_cache_hit_length = request.num_tokens - 1
        computed: list[KVCacheBlock] = []
        get = self.block_pool.cached_block_hash_to_block.get
        for block_hash in request.block_hashes[:max_cache_hit_length // self.block_size]:
            block = get(block_hash)
            if block is None:
                break
            computed.append(block)
        num_computed_tokens = len(computed) * self.block_size
        stats = self.prefix_cache_stats
        stats.requests += 1
        stats.queries += request.num_tokens
        stats.hits += num_computed_tokens
        return KVCacheBlocks(computed), num_computed_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_lookahead_tokens: int = 0) -> KVCacheBlocks | None:
        """Make room for num_new_tokens more tokens; None (and no change at all) if blocks run short.

        Layout of the request's tokens after the call:
        | computed | new computed (prefix hit) | new tokens (this step) | lookahead (spec) |
        Full blocks among them are cached at once: the forward pass writes every layer's K/V before any
        layer's attention reads it, so a hit in the same step is safe.
        """
        block_size = self.block_size
        request_id = request.request_id
        req_blocks = self.req_to_blocks.get(request_id)
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens + num_lookahead_tokens

        if (req_blocks is not None and new_computed_blocks is None
                and num_tokens_need_slot <= len(req_blocks) * block_size and num_new_tokens > 0):
            # Fast path, most decode steps: the tokens fit in the blocks the request already holds.
            new_blocks = None
        else:
            if num_new_tokens == 0 and num_new_computed_tokens == 0:
                raise ValueError("num_new_tokens must be greater than 0")
            if num_tokens_need_slot > self.max_model_len:
                num_tokens_need_slot = self.max_model_len
            if req_blocks is None:
                req_blocks = []
            new_computed = new_computed_blocks.blocks if new_computed_blocks is not None else []
            num_new_blocks = cdiv(num_tokens_need_slot, block_size) - len(req_blocks) - len(new_computed)
            # Free prefix-hit blocks leave the free queue when touched: they cannot also be new blocks.
            num_evictable_computed = (sum(1 for b in new_computed if b.ref_cnt == 0 and not b.is_null)
                                      if new_computed else 0)
            if num_new_blocks > self.block_pool.get_num_free_blocks() - num_evictable_computed:
                return None
            if new_computed:
                assert self.enable_caching
                self.block_pool.touch(new_computed)
                req_blocks.extend(new_computed)
            new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
            req_blocks.extend(new_blocks)
            self.req_to_blocks[request_id] = req_blocks

        if self.enable_caching:
            # Cache the blocks this step fills. Tokens past request.num_tokens are unverified
            # speculative ones: never cache them (checked only when a block may have filled).
            num_full = (num_computed_tokens + num_new_tokens) // block_size
            num_cached = self.num_cached_block.get(request_id, 0)
            if num_full > num_cached:
                if num_full > request.num_tokens // block_size:
                    num_full = request.num_tokens // block_size
                if num_full > num_cached:
                    self.block_pool.cache_full_blocks(request, req_blocks, num_cached, num_full)
                    self.num_cached_block[request_id] = num_full
                    num_cached = num_full
            noop_until = (num_cached + 1) * block_size - 1
            self.allocate_slots_noop_until[request_id] = min(noop_until, len(req_blocks) * block_size)
        else:
            self.allocate_slots_noop_until[request_id] = len(req_blocks) * block_size
        return KVCacheBlocks(new_blocks) if new_blocks else _EMPTY

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first, so its unshared tail is evicted before the prefix."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request.request_id, None)
        self.allocate_slots_noop_until.pop(request.request_id, None)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(list(self.req_to_blocks.get(request_id, [])))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    def reset_prefix_cache(self) -> bool:
        ok = self.block_pool.reset_prefix_cache()
        if ok:
            self.prefix_cache_stats = PrefixCacheStats()
        return ok

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        return self.prefix_cache_stats

    def cached_hashes(self) -> set[BlockHash]:
        return set(self.block_pool.cached_block_hash_to_block)
