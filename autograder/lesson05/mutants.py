"""Lesson 5's wrong answers: each a few edits of the solution cell l05_prepare_inputs, with the misconception.

Instructor side only (`python -m autograder release` leaves this file out). Every mutant must score less
than the solution (tests/test_mutants.py and tests/test_lesson05_grading.py grade each one).
"""
from autograder.mutation import Mutant

CELL = "l05_prepare_inputs"

MUTANTS = {
    "logical_block_in_slot_mapping": Mutant(CELL, (
        ("input_batch.block_table[req_indices, positions // block_size].astype(np.int64)",
         "(positions // block_size).astype(np.int64)"),
    ), "Uses the logical block (pos // block_size) as if it were the physical block the KV cache allocated.",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"},
        hint="slot 映射里用的是逻辑块号还是块表里的物理块号？"),
    "positions_capped_at_known_tokens": Mutant(CELL, (
        ("positions = num_computed[req_indices] + query_pos",
         "positions = np.minimum(num_computed[req_indices] + query_pos, input_batch.num_tokens[req_indices] - 1)"),
    ), "Caps positions at the last known token: a row with speculative drafts schedules tokens past num_tokens.",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"},
        hint="一行本步调度的 token 一定都在已知的 token 之内吗？想想投机解码的草稿 token 放在哪里。"),
    "positions_from_zero": Mutant(CELL, (
        ("positions = num_computed[req_indices] + query_pos", "positions = query_pos"),
    ), "Counts positions from 0 in every step instead of from num_computed_tokens (chunks, decodes, prefix hits).",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"},
        hint="每一步的位置从哪里开始数？想想分块 prefill、decode 和前缀命中。"),
    "logits_at_first_token": Mutant(CELL, (
        ("logits_indices = cu_num_tokens[sampled] - 1", "logits_indices = query_start_loc[:-1][sampled]"),
    ), "Takes logits at each request's first scheduled token instead of its last.",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"},
        hint="每个请求应在它这一步的哪个 token 上取 logits？"),
    "logits_for_partial_chunk": Mutant(CELL, (
        ("sampled = seq_lens >= input_batch.num_tokens[:num_reqs]", "sampled = seq_lens > 0"),
    ), "Samples from a prefill chunk that stops before the end of its prompt.",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"},
        hint="prompt 还没处理完的 prefill 分块，这一步需要采样吗？"),
    "query_start_loc_not_cumulative": Mutant(CELL, (
        ("query_start_loc[1:] = cu_num_tokens", "query_start_loc[1:] = num_scheduled"),
    ), "Stores each request's length where its start offset (a prefix sum) belongs.",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"},
        hint="query_start_loc 存的是每个请求的长度，还是起始偏移？"),
    "rows_in_scheduler_order": Mutant(CELL, (
        ("req_ids = input_batch.req_ids[:num_reqs]", "req_ids = list(scheduler_output.num_scheduled_tokens)"),
    ), "Takes the requests in the scheduler's order, not the persistent batch's row order (reordered, condensed).",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"},
        hint="请求按调度器的顺序排，还是按持久批次（persistent batch）的行顺序排？"),
    "per_token_loop": Mutant(CELL, (
        ("input_ids = input_batch.token_ids_cpu[req_indices, positions]",
         "input_ids = np.array([input_batch.token_ids_cpu[r, p] for r, p in zip(req_indices, positions)], "
         "dtype=np.int64)"),
    ), "Gathers the token ids with one Python iteration per token: right values, not vectorised.",
        fails={"l05_real_engine"},
        hint="结果是对的，但这里能否不用逐 token 的 Python 循环？"),
    "logits_one_token_early": Mutant(CELL, (
        ("sampled = seq_lens >= input_batch.num_tokens[:num_reqs]",
         "sampled = seq_lens >= input_batch.num_tokens[:num_reqs] - 1"),
    ), "Samples from a chunk that ends one token before the end (the last position is num_tokens - 1).",
        fails={"l05_boundary"},
        hint="判断分块是否到达 prompt 末尾时，最后一个位置是多少？"),
    "rows_sorted_by_id": Mutant(CELL, (
        ("req_ids = input_batch.req_ids[:num_reqs]", "req_ids = sorted(scheduler_output.num_scheduled_tokens)"),
    ), "Takes the requests sorted by id, as if rows were kept in id order.",
        fails={"l05_boundary"},
        hint="行顺序真的按请求 id 排序吗？"),
    "rows_in_index_dict_order": Mutant(CELL, (
        ("req_ids = input_batch.req_ids[:num_reqs]", "req_ids = list(input_batch.req_id_to_index)"),
    ), "Takes the requests in req_id_to_index's insertion order: a swap moves rows, not the dict's keys.",
        fails={"l05_boundary"},
        hint="批次的行顺序由什么决定？字典的插入顺序会随交换而变吗？"),
    "block_size_constant": Mutant(CELL, (
        ("input_batch.block_table[req_indices, positions // block_size]",
         "input_batch.block_table[req_indices, positions // 8]"),
        ("slot_mapping = block_numbers * block_size + positions % block_size",
         "slot_mapping = block_numbers * 8 + positions % 8"),
    ), "Uses the engine's usual block size instead of the block_size argument.",
        fails={"l05_boundary", "l05_real_engine"},
        hint="块大小应来自哪里？检查是否用到了传入的参数。"),
    "slot_offset_in_chunk": Mutant(CELL, (
        ("slot_mapping = block_numbers * block_size + positions % block_size",
         "slot_mapping = block_numbers * block_size + query_pos % block_size"),
    ), "Takes the offset inside the block from the token's place in this step's chunk, not its position.",
        fails={"l05_main_path", "l05_boundary"},
        hint="块内偏移应由 token 在序列中的位置决定，还是在本步分块中的位置？"),
    "logits_row_not_token": Mutant(CELL, (
        ("logits_indices = cu_num_tokens[sampled] - 1", "logits_indices = np.nonzero(sampled)[0]"),
    ), "Returns the rows that sample instead of their last token's index in the flat batch.",
        fails={"l05_main_path", "l05_boundary"},
        hint="返回的是行号，还是该行最后一个 token 在扁平批次中的下标？"),
}
