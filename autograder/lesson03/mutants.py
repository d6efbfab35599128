"""Lesson 3's wrong answers: each a few edits of the solution cell l03_prefix_cache, with the misconception it models.

Instructor side only (`python -m autograder release` leaves this file out). Every mutant must score less
than the solution (tests/test_lesson03_grading.py builds each wrong notebook from the release and grades it).
"""
from autograder.mutation import Mutant

CELL = "l03_prefix_cache"

MUTANTS = {
    "cap_a_whole_block": Mutant(CELL, (
        (('    # TODO：命中最多到哪里？命中的 token 数是多少？\n'
          '    max_cache_hit_length = request.num_tokens - 1'),
         '    max_cache_hit_length = request.num_tokens - self.block_size'),
    ), 'Caps the hit a whole block early (n - block_size): needless recompute.'),
    "evict_from_tail": Mutant(CELL, (
        (('    # TODO：从空闲队列的哪一端取块？\n'
          '    blocks = self.free_block_queue.popleft_n(num_blocks)'),
         ('    blocks = list(reversed(self.free_block_queue.get_all_free_blocks()))[:num_blocks]\n'
          '    for block in blocks:\n'
          '        self.free_block_queue.remove(block)')),
    ), "Takes new blocks from the free queue's tail (most recently freed) instead of the LRU head."),
    "extra_keys_ignored": Mutant(CELL, (
        (('    # TODO：块的哈希要同时覆盖父块哈希、本块 token 和 extra keys。\n'
          '    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)'),
         '    key = (parent_block_hash, tuple(curr_block_token_ids))'),
    ), 'The block hash leaves out extra_keys: LoRA / cache_salt / multimodal requests share blocks.'),
    "hash_without_parent": Mutant(CELL, (
        (('    # TODO：块的哈希要同时覆盖父块哈希、本块 token 和 extra keys。\n'
          '    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)'),
         '    key = (tuple(curr_block_token_ids), extra_keys)'),
    ), "The block hash leaves out the parent's hash: equal blocks at two positions collide."),
    "hasher_not_chained": Mutant(CELL, (
        ('        parent_hash = hash_block_tokens(hash_function, parent_hash, block_tokens)',
         '        parent_hash = hash_block_tokens(hash_function, None, block_tokens)'),
    ), 'The hasher hashes every block as a first block (parent None): no chain.'),
    "hit_counts_blocks": Mutant(CELL, (
        ('    num_computed_tokens = len(computed_blocks) * self.block_size',
         '    num_computed_tokens = len(computed_blocks)'),
    ), 'Reports the number of hit blocks, not tokens.'),
    "hit_skips_misses": Mutant(CELL, (
        ('            break  # the chain breaks at the first miss',
         '            continue'),
    ), 'Keeps looking past a miss: the hit is no longer a prefix.'),
    "no_cap": Mutant(CELL, (
        (('    # TODO：命中最多到哪里？命中的 token 数是多少？\n'
          '    max_cache_hit_length = request.num_tokens - 1'),
         '    max_cache_hit_length = request.num_tokens'),
    ), 'No cap at n-1: a prompt that is all cached leaves nothing to compute.'),
    "partial_blocks_hashed": Mutant(CELL, (
        (('    # TODO：哪些块有哈希？新哈希链在谁后面？\n'
          '    num_full_blocks = request.num_tokens // block_size'),
         '    num_full_blocks = -(-request.num_tokens // block_size)'),
    ), 'The hasher also hashes the last, partial block (ceil instead of floor).'),
    "stale_hash_kept": Mutant(CELL, (
        (('        if block.block_hash is not None:\n'
          '            self._maybe_evict_cached_block(block)  # its old KV is about to be overwritten'),
         ''),
    ), 'Reuses a free block without evicting its cached hash: the old hash now points at new KV.'),
}
