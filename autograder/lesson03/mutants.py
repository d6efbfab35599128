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
       fails={"l03_boundary", "l03_main_path", "l03_real_engine"},
       hint="命中长度的上限是否多减了？想想最少需要重算多少个 token。"),
    "evict_from_tail": Mutant(CELL, (
        (('    # TODO：从空闲队列的哪一端取块？\n'
          '    blocks = self.free_block_queue.popleft_n(num_blocks)'),
         ('    blocks = list(reversed(self.free_block_queue.get_all_free_blocks()))[:num_blocks]\n'
          '    for block in blocks:\n'
          '        self.free_block_queue.remove(block)')),
    ), "Takes new blocks from the free queue's tail (most recently freed) instead of the LRU head.",
       fails={"l03_main_path", "l03_real_engine"},
       hint="新块从空闲队列的哪一端取？回顾 LRU 的含义。"),
    "unhashed_first": Mutant(CELL, (
        (('    # TODO：从空闲队列的哪一端取块？\n'
          '    blocks = self.free_block_queue.popleft_n(num_blocks)'),
         ('    free = self.free_block_queue.get_all_free_blocks()\n'
          '    blocks = ([b for b in free if b.block_hash is None] + [b for b in free if b.block_hash is not None])[:num_blocks]\n'
          '    for block in blocks:\n'
          '        self.free_block_queue.remove(block)')),
    ), "Takes unhashed free blocks before the LRU head: a block that lost its hash while free (_fail_step) jumps the queue.",
       fails={"l03_main_path", "l03_real_engine"},
       hint="取块时该看的是空闲队列的顺序还是块有没有哈希？想想一个在空闲期间丢了哈希的块（如一步失败之后）排在队列哪里。"),
    "extra_keys_ignored": Mutant(CELL, (
        (('    # TODO：块的哈希要同时覆盖父块哈希、本块 token 和 extra keys。\n'
          '    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)'),
         '    key = (parent_block_hash, tuple(curr_block_token_ids))'),
    ), 'The block hash leaves out extra_keys: LoRA / cache_salt / multimodal requests share blocks.',
       fails={"l03_boundary", "l03_main_path"},
       hint="块哈希里除了 token，还要区分哪些请求属性（LoRA、cache_salt 等）？"),
    "hash_without_parent": Mutant(CELL, (
        (('    # TODO：块的哈希要同时覆盖父块哈希、本块 token 和 extra keys。\n'
          '    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)'),
         '    key = (tuple(curr_block_token_ids), extra_keys)'),
    ), "The block hash leaves out the parent's hash: equal blocks at two positions collide.",
       fails={"l03_boundary", "l03_main_path", "l03_real_engine"},
       hint="两个内容相同但位置不同的块，哈希能区分吗？回顾链式哈希。"),
    "hasher_not_chained": Mutant(CELL, (
        ('        parent_hash = hash_block_tokens(hash_function, parent_hash, block_tokens)',
         '        parent_hash = hash_block_tokens(hash_function, None, block_tokens)'),
    ), 'The hasher hashes every block as a first block (parent None): no chain.',
       fails={"l03_boundary", "l03_main_path", "l03_real_engine"},
       hint="每个块的哈希与前一个块有关系吗？"),
    "hit_counts_blocks": Mutant(CELL, (
        ('    num_computed_tokens = len(computed_blocks) * self.block_size',
         '    num_computed_tokens = len(computed_blocks)'),
    ), 'Reports the number of hit blocks, not tokens.',
       fails={"l03_boundary", "l03_main_path", "l03_real_engine"},
       hint="命中结果的单位是块还是 token？"),
    "hit_skips_misses": Mutant(CELL, (
        ('            break  # the chain breaks at the first miss',
         '            continue'),
    ), 'Keeps looking past a miss: the hit is no longer a prefix.',
       fails={"l03_main_path"},
       hint="遇到第一个未命中的块之后还该继续找吗？命中必须是前缀。"),
    "no_cap": Mutant(CELL, (
        (('    # TODO：命中最多到哪里？命中的 token 数是多少？\n'
          '    max_cache_hit_length = request.num_tokens - 1'),
         '    max_cache_hit_length = request.num_tokens'),
    ), 'No cap at n-1: a prompt that is all cached leaves nothing to compute.',
       fails={"l03_boundary", "l03_real_engine"},
       hint="整段 prompt 都命中时，还剩下什么需要计算？检查命中上限。"),
    "partial_blocks_hashed": Mutant(CELL, (
        (('    # TODO：哪些块有哈希？新哈希链在谁后面？\n'
          '    num_full_blocks = request.num_tokens // block_size'),
         '    num_full_blocks = -(-request.num_tokens // block_size)'),
    ), 'The hasher also hashes the last, partial block (ceil instead of floor).',
       fails={"l03_boundary", "l03_main_path", "l03_real_engine"},
       hint="最后一个没填满的块该不该有哈希？"),
    "stale_hash_kept": Mutant(CELL, (
        (('        if block.block_hash is not None:\n'
          '            self._maybe_evict_cached_block(block)  # its old KV is about to be overwritten'),
         ''),
    ), 'Reuses a free block without evicting its cached hash: the old hash now points at new KV.',
       fails={"l03_main_path", "l03_real_engine"},
       hint="复用一个空闲块时，它原来的缓存哈希怎么处理？"),
    "hash_key_is_a_set": Mutant(CELL, (
        ('    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)',
         '    key = (parent_block_hash, frozenset(curr_block_token_ids), extra_keys)'),
    ), 'The block key loses token order and repeats: a permuted block hits another prompt\'s cache.',
       fails={"l03_main_path"},
       hint="块的哈希键是否保留了 token 的顺序与重复？"),
    "cap_from_prompt_length": Mutant(CELL, (
        ('    max_cache_hit_length = request.num_tokens - 1',
         '    max_cache_hit_length = request.num_prompt_tokens - 1'),
    ), 'Caps the hit by the prompt length, not all tokens: a resumed preempted request recomputes its output.',
       fails={"l03_boundary"},
       hint="命中上限按什么长度算？想想被抢占后恢复、已有输出的请求。"),
    "hasher_block_size_constant": Mutant(CELL, (
        ('    num_full_blocks = request.num_tokens // block_size', '    num_full_blocks = request.num_tokens // 16'),
        ('        block_tokens = request.all_token_ids[i * block_size:(i + 1) * block_size]',
         '        block_tokens = request.all_token_ids[i * 16:(i + 1) * 16]'),
    ), 'Hashes blocks of 16 whatever block_size the engine runs with.',
       fails={"l03_boundary"},
       hint="哈希时的块大小来自哪里？引擎配置可能不同。"),
    "hit_tokens_block_size_constant": Mutant(CELL, (
        ('    num_computed_tokens = len(computed_blocks) * self.block_size',
         '    num_computed_tokens = len(computed_blocks) * 16'),
    ), 'Counts hit tokens in blocks of 16 instead of self.block_size.',
       fails={"l03_boundary"},
       hint="把命中块换算成 token 时用的块大小从哪里来？"),
    "hashes_only_computed_blocks": Mutant(CELL, (
        ('    num_full_blocks = request.num_tokens // block_size',
         '    num_full_blocks = request.num_computed_tokens // block_size'),
    ), 'Hashes only blocks already computed: a new request has no hashes, so it can never hit.',
       fails={"l03_main_path", "l03_boundary", "l03_real_engine"},
       hint="一个全新的请求有没有块哈希？没有的话它还能命中缓存吗？"),
    "hasher_ignores_hash_function": Mutant(CELL, (
        ('        parent_hash = hash_block_tokens(hash_function, parent_hash, block_tokens)',
         '        parent_hash = hash_block_tokens(hash, parent_hash, block_tokens)'),
    ), 'Hashes with Python\'s hash whatever hash_function the engine configured (sha256 for cross-process caches).',
       fails={"l03_boundary"},
       hint="哈希函数应该由谁决定？检查引擎配置的 hash_function 是否被用到。"),
    "key_drops_last_token": Mutant(CELL, (
        ('    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)',
         '    key = (parent_block_hash, tuple(curr_block_token_ids[:-1]), extra_keys)'),
    ), 'The block key leaves out the block\'s last token: two prompts differing only there share the block.',
       fails={"l03_boundary"},
       hint="两个 prompt 只差一个满块的最后一个 token：它们的块哈希一样吗？块的每个 token 都进哈希了吗？"),
    "key_drops_first_token": Mutant(CELL, (
        ('    key = (parent_block_hash, tuple(curr_block_token_ids), extra_keys)',
         '    key = (parent_block_hash, tuple(curr_block_token_ids[1:]), extra_keys)'),
    ), 'The block key leaves out the block\'s first token: two prompts differing only there share the block.',
       fails={"l03_boundary"},
       hint="两个 prompt 只差一个块的第一个 token：它们的块哈希一样吗？块的每个 token 都进哈希了吗？"),
    "hasher_slice_one_short": Mutant(CELL, (
        ('        block_tokens = request.all_token_ids[i * block_size:(i + 1) * block_size]',
         '        block_tokens = request.all_token_ids[i * block_size:(i + 1) * block_size - 1]'),
    ), 'The hasher slices block_size - 1 tokens per block: a block\'s last token never reaches its hash.',
       fails={"l03_boundary", "l03_main_path"},
       hint="哈希一个满块时取了哪几个 token？切片的右端包括块的最后一个 token 吗？"),
    "generated_tokens_not_hashed": Mutant(CELL, (
        ('    num_full_blocks = request.num_tokens // block_size',
         '    num_full_blocks = request.num_prompt_tokens // block_size'),
    ), 'Hashes only the prompt\'s full blocks: generated tokens never become cached blocks (no multi-turn hit).',
       fails={"l03_boundary"},
       hint="请求生成的 token 填满一个块之后，这个块会有哈希吗？下一轮对话能命中上一轮的输出吗？"),
}
