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
    ), 'Caps the hit a whole block early (n - block_size): needless recompute.',
       fails={"l03_boundary", "l03_main_path", "l03_real_engine"}),
    "evict_from_tail": Mutant(CELL, (
        (('    # TODO：从空闲队列的哪一端取块？\n'
          '    blocks = self.free_block_queue.popleft_n(num_blocks)'),
         ('    blocks = list(reversed(self.free_block_queue.get_all_free_blocks()))[:num_blocks]\n'
          '    for block in blocks:\n'
          '        self.free_block_queue.remove(block)')),
    ), "Takes new blocks from the free queue's tail (most recently freed) instead of the LRU head.",
       fails={"l03_main_path", "l03_real_engine"}),
    "extra_keys_ignored": Mutant(CELL, (
        (('    # TODO：块的哈希要同时覆盖父块哈希、本块 token 和 extra keys。\n'
          '    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)'),
         '    key = (parent_block_hash, tuple(curr_block_token_ids))'),
    ), 'The block hash leaves out extra_keys: LoRA / cache_salt / multimodal requests share blocks.',
       fails={"l03_boundary", "l03_main_path"}),
    "hash_without_parent": Mutant(CELL, (
        (('    # TODO：块的哈希要同时覆盖父块哈希、本块 token 和 extra keys。\n'
          '    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)'),
         '    key = (tuple(curr_block_token_ids), extra_keys)'),
    ), "The block hash leaves out the parent's hash: equal blocks at two positions collide.",
       fails={"l03_boundary", "l03_main_path", "l03_real_engine"}),
    "hasher_not_chained": Mutant(CELL, (
        ('        parent_hash = hash_block_tokens(hash_function, parent_hash, block_tokens)',
         '        parent_hash = hash_block_tokens(hash_function, None, block_tokens)'),
    ), 'The hasher hashes every block as a first block (parent None): no chain.',
       fails={"l03_boundary", "l03_main_path", "l03_real_engine"}),
    "hit_counts_blocks": Mutant(CELL, (
        ('    num_computed_tokens = len(computed_blocks) * self.block_size',
         '    num_computed_tokens = len(computed_blocks)'),
    ), 'Reports the number of hit blocks, not tokens.',
       fails={"l03_boundary", "l03_main_path", "l03_real_engine"}),
    "hit_skips_misses": Mutant(CELL, (
        ('            break  # the chain breaks at the first miss',
         '            continue'),
    ), 'Keeps looking past a miss: the hit is no longer a prefix.',
       fails={"l03_main_path"}),
    "no_cap": Mutant(CELL, (
        (('    # TODO：命中最多到哪里？命中的 token 数是多少？\n'
          '    max_cache_hit_length = request.num_tokens - 1'),
         '    max_cache_hit_length = request.num_tokens'),
    ), 'No cap at n-1: a prompt that is all cached leaves nothing to compute.',
       fails={"l03_boundary", "l03_real_engine"}),
    "partial_blocks_hashed": Mutant(CELL, (
        (('    # TODO：哪些块有哈希？新哈希链在谁后面？\n'
          '    num_full_blocks = request.num_tokens // block_size'),
         '    num_full_blocks = -(-request.num_tokens // block_size)'),
    ), 'The hasher also hashes the last, partial block (ceil instead of floor).',
       fails={"l03_boundary", "l03_main_path", "l03_real_engine"}),
    "stale_hash_kept": Mutant(CELL, (
        (('        if block.block_hash is not None:\n'
          '            self._maybe_evict_cached_block(block)  # its old KV is about to be overwritten'),
         ''),
    ), 'Reuses a free block without evicting its cached hash: the old hash now points at new KV.',
       fails={"l03_main_path", "l03_real_engine"}),
    "hash_key_is_a_set": Mutant(CELL, (
        ('    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)',
         '    key = (parent_block_hash, frozenset(curr_block_token_ids), extra_keys)'),
    ), 'The block key loses token order and repeats: a permuted block hits another prompt\'s cache.',
       fails={"l03_main_path"}),
    "cap_from_prompt_length": Mutant(CELL, (
        ('    max_cache_hit_length = request.num_tokens - 1',
         '    max_cache_hit_length = request.num_prompt_tokens - 1'),
    ), 'Caps the hit by the prompt length, not all tokens: a resumed preempted request recomputes its output.',
       fails={"l03_boundary"}),
    "hasher_block_size_constant": Mutant(CELL, (
        ('    num_full_blocks = request.num_tokens // block_size', '    num_full_blocks = request.num_tokens // 16'),
        ('        block_tokens = request.all_token_ids[i * block_size:(i + 1) * block_size]',
         '        block_tokens = request.all_token_ids[i * 16:(i + 1) * 16]'),
    ), 'Hashes blocks of 16 whatever block_size the engine runs with.',
       fails={"l03_boundary"}),
    "hit_tokens_block_size_constant": Mutant(CELL, (
        ('    num_computed_tokens = len(computed_blocks) * self.block_size',
         '    num_computed_tokens = len(computed_blocks) * 16'),
    ), 'Counts hit tokens in blocks of 16 instead of self.block_size.',
       fails={"l03_boundary"}),
    "hashes_only_computed_blocks": Mutant(CELL, (
        ('    num_full_blocks = request.num_tokens // block_size',
         '    num_full_blocks = request.num_computed_tokens // block_size'),
    ), 'Hashes only blocks already computed: a new request has no hashes, so it can never hit.',
       fails={"l03_main_path", "l03_boundary", "l03_real_engine"}),
    "hasher_ignores_hash_function": Mutant(CELL, (
        ('        parent_hash = hash_block_tokens(hash_function, parent_hash, block_tokens)',
         '        parent_hash = hash_block_tokens(hash, parent_hash, block_tokens)'),
    ), 'Hashes with Python\'s hash whatever hash_function the engine configured (sha256 for cross-process caches).',
       fails={"l03_boundary"}),
}
