"""KVCacheManager: the scheduler's view of the KV cache (vLLM: v1/core/kv_cache_manager.py).

It maps each request to its list of blocks, finds prefix-cache hits, allocates slots for the tokens a
step will compute, and frees blocks. It never touches a tensor: the worker owns those.
"""
from __future__ import annotations

from dataclasses import dataclass

from minivllm.core.block_pool import BlockPool, KVCacheBlock
from minivllm.core.kv_cache_utils import BlockHash
from minivllm.metrics.stats import PrefixCacheStats
from minivllm.request import Request, RequestStatus
from minivllm.utils import cdiv


@dataclass
class KVCacheBlocks:
    """The blocks handed to one request by one allocation."""

    blocks: list[KVCacheBlock]

    def get_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(self.blocks + other.blocks)


_EMPTY = KVCacheBlocks([])


class KVCacheManager:
    """Block ledger per request on top of the BlockPool."""

    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool = True, watermark: float = 0.0) -> None:
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0.0, 1.0), got {watermark}")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        # Blocks kept free when admitting a waiting or preempted request (vLLM's watermark).
        self.watermark_blocks = int(watermark * num_gpu_blocks)

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def empty_kv_cache_blocks(self) -> KVCacheBlocks:
        return KVCacheBlocks([])

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest run of cached full blocks from the start of the request, and its token count.

        The hit stops at num_tokens - 1: at least the last token is recomputed, because the step must
        produce its logits to sample the next token. vLLM returns a third value (a shared-prefix boundary
        for sliding-window / Mamba groups), which a full-attention-only engine does not need. Stats are
        not recorded here: the scheduler records them at admission (record_prefix_cache_stats), so a
        lookup retried while the request waits for blocks counts once.
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return KVCacheBlocks([]), 0
        max_cache_hit_length = request.num_tokens - 1
        computed: list[KVCacheBlock] = []
        get = self.block_pool.cached_block_hash_to_block.get_one_block
        for block_hash in request.block_hashes[:max_cache_hit_length // self.block_size]:
            block = get(block_hash)
            if block is None:
                break
            computed.append(block)
        return KVCacheBlocks(computed), len(computed) * self.block_size

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count an admitted request's lookup; a previously preempted one counts apart. A request that skipped
        the lookup (prompt logprobs: skip_reading_prefix_cache) is no query, as in vLLM's get_computed_blocks."""
        if self.enable_caching and not request.skip_reading_prefix_cache:
            self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_lookahead_tokens: int = 0, full_sequence_must_fit: bool = False,
                       has_scheduled_reqs: bool = False) -> KVCacheBlocks | None:
        """Make room for num_new_tokens more tokens; None (and no change at all) if blocks run short.

        full_sequence_must_fit (the scheduler's admission gate, vLLM's scheduler_reserve_full_isl): also
        None unless the free blocks could hold the whole prompt, not just this chunk. The watermark keeps
        watermark_blocks free, for waiting or preempted requests only and only while some request is
        already scheduled (so an idle engine still admits its first request).

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
            num_free = self.block_pool.get_num_free_blocks() - num_evictable_computed
            if has_scheduled_reqs and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                num_free -= self.watermark_blocks
            if full_sequence_must_fit:
                num_full_seq = min(request.num_tokens, self.max_model_len)
                if max(cdiv(num_full_seq, block_size) - len(req_blocks) - len(new_computed), 0) > num_free:
                    return None
            if num_new_blocks > num_free:
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
            # speculative ones or async placeholders: never cache them.
            self.cache_blocks(request, num_computed_tokens + num_new_tokens, req_blocks)
        return KVCacheBlocks(new_blocks) if new_blocks else _EMPTY

    def cache_blocks(self, request: Request, num_computed_tokens: int,
                     req_blocks: list[KVCacheBlock] | None = None) -> int:
        """Hash and register the request's blocks that num_computed_tokens (capped at its known tokens)
        fills; the number of its cached blocks after (vLLM: same name)."""
        num_cached = self.num_cached_block.get(request.request_id, 0)
        if not self.enable_caching:
            return num_cached
        num_tokens = len(request.all_token_ids)
        num_full = (num_computed_tokens if num_computed_tokens < num_tokens else num_tokens) // self.block_size
        if num_full > num_cached:
            blocks = req_blocks if req_blocks is not None else self.req_to_blocks.get(request.request_id, [])
            self.block_pool.cache_full_blocks(request, blocks, num_cached, num_full)
            self.num_cached_block[request.request_id] = num_cached = num_full
        return num_cached

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first, so its unshared tail is evicted before the prefix."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request.request_id, None)

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
        return set(self.block_pool.cached_block_hash_to_block.keys())
