"""BlockPool: the one owner of every KVCacheBlock (vLLM: v1/core/block_pool.py).

Blocks live in a free queue (LRU order, evict from the head) and/or the hash->block map of cached full
blocks. A free block may still hold a cached hash: it is reusable on a prefix hit until it is evicted,
which happens lazily, when get_new_blocks pops it. Freed blocks without a hash can never be hit, so they
go to the head of the queue, to be reused first (vLLM #42656).
"""
from __future__ import annotations

from collections.abc import Iterable

from minivllm.core.kv_cache_utils import BlockHash


class KVCacheBlock:
    """Metadata of one physical KV block; the tensors live in the worker."""

    __slots__ = ("block_id", "ref_cnt", "_block_hash", "prev_free_block", "next_free_block", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: BlockHash | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    @property
    def block_hash(self) -> BlockHash | None:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash: BlockHash) -> None:
        assert self._block_hash is None, "the block already has a hash"
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        self._block_hash = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={self._block_hash})"


class FreeKVCacheBlockQueue:
    """Intrusive doubly-linked list of free blocks: O(1) popleft, append and remove from the middle.

    Head = least recently used = evicted first. Sentinel head/tail nodes avoid None checks.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_head = KVCacheBlock(-1)
        self.fake_tail = KVCacheBlock(-1)
        prev = self.fake_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self.fake_tail
        self.fake_tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        block = self.fake_head.next_free_block
        if block is self.fake_tail:
            raise ValueError("no free blocks available")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} free blocks, only {self.num_free_blocks} available")
        out = []
        block = self.fake_head.next_free_block
        for _ in range(n):
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        self.fake_head.next_free_block = block
        block.prev_free_block = self.fake_head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        if block.prev_free_block is None or block.next_free_block is None:
            raise RuntimeError(f"remove() called on a block that is not free: {block}")
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put blocks at the head, in the given order (the first one is evicted first)."""
        if not blocks:
            return
        first = self.fake_head.next_free_block
        prev = self.fake_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def append(self, block: KVCacheBlock) -> None:
        last = self.fake_tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.fake_tail
        self.fake_tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        for block in blocks:
            self.append(block)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out = []
        block = self.fake_head.next_free_block
        while block is not self.fake_tail:
            out.append(block)
            block = block.next_free_block
        return out


class BlockHashToBlockMap:
    """Cached full blocks by hash, several blocks per hash allowed.

    No deduplication (as vLLM): when two requests compute the same prefix at once, both blocks are cached
    under the same hash and each request keeps its own, so block ids handed out never change and block
    tables stay append-only. A hit takes any one of them. vLLM keys the map by (hash, KV-cache group);
    minivllm has one group, so the key is the hash alone.
    """

    def __init__(self) -> None:
        self._cache: dict[BlockHash, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHash) -> KVCacheBlock | None:
        blocks = self._cache.get(key)
        if blocks is None or isinstance(blocks, KVCacheBlock):
            return blocks
        return next(iter(blocks.values()))

    def insert(self, key: BlockHash, block: KVCacheBlock) -> None:
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block  # the common case: one block, no inner dict
        elif isinstance(blocks, KVCacheBlock):
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, key: BlockHash, block_id: int) -> KVCacheBlock | None:
        """Remove that one block from the hash's entry; the hash stays while other blocks carry it."""
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            if blocks.block_id != block_id:
                return None
            del self._cache[key]
            return blocks
        block = blocks.pop(block_id, None)
        if len(blocks) == 1:
            self._cache[key] = next(iter(blocks.values()))
        elif not blocks:
            del self._cache[key]
        return block

    def blocks(self, key: BlockHash) -> list[KVCacheBlock]:
        blocks = self._cache.get(key)
        if blocks is None:
            return []
        return [blocks] if isinstance(blocks, KVCacheBlock) else list(blocks.values())

    def keys(self):
        return self._cache.keys()

    def __contains__(self, key: BlockHash) -> bool:
        return key in self._cache

    def __len__(self) -> int:
        return len(self._cache)


class BlockPool:
    """Allocates, shares (ref_cnt), caches (hash map) and frees KV blocks. Block 0 is the null block."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool) -> None:
        assert num_gpu_blocks >= 2, "need the null block and at least one real block"
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get_one_block(block_hash)

    def cache_full_blocks(self, request, blocks: list[KVCacheBlock], num_cached_blocks: int,
                          num_full_blocks: int) -> None:
        """Register blocks [num_cached_blocks, num_full_blocks) of a request under their hashes.

        A block that already has a hash is a prefix hit (already in the map). If another block holds the
        same hash (two requests computed the same prefix at once), both are cached: see BlockHashToBlockMap.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes
        insert = self.cached_block_hash_to_block.insert
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block._block_hash is not None or block.is_null:
                continue
            block_hash = hashes[i]
            block._block_hash = block_hash  # checked None just above
            insert(block_hash, block)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop blocks from the LRU head, evicting their stale hashes; each comes back with ref_cnt 1."""
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            if self.enable_caching and block._block_hash is not None:
                self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0, block
            block.ref_cnt = 1
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        block_hash = block._block_hash
        if block_hash is None:
            return False
        self.cached_block_hash_to_block.pop(block_hash, block.block_id)
        block.reset_hash()
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks, pulling free ones out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; ordered_blocks is in eviction priority (first = evicted first).

        With caching on, blocks reaching 0 without a hash can never be hit: they go to the head of the
        free queue, to be reused first; hashed ones join the tail (LRU), both in the given order (vLLM
        #42656). With caching off every block joins the tail.
        """
        with_hash: list[KVCacheBlock] = []
        without_hash: list[KVCacheBlock] = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                if block._block_hash is None and self.enable_caching:
                    without_hash.append(block)
                else:
                    with_hash.append(block)
        self.free_block_queue.prepend_n(without_hash)
        self.free_block_queue.append_n(with_hash)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any request still holds blocks."""
        if self.get_num_free_blocks() != self.num_gpu_blocks - 1:
            return False
        for block in self.blocks:
            block.reset_hash()
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)
