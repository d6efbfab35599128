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
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"}),
    "positions_from_zero": Mutant(CELL, (
        ("positions = num_computed[req_indices] + query_pos", "positions = query_pos"),
    ), "Counts positions from 0 in every step instead of from num_computed_tokens (chunks, decodes, prefix hits).",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"}),
    "logits_at_first_token": Mutant(CELL, (
        ("logits_indices = cu_num_tokens[sampled] - 1", "logits_indices = query_start_loc[:-1][sampled]"),
    ), "Takes logits at each request's first scheduled token instead of its last.",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"}),
    "logits_for_partial_chunk": Mutant(CELL, (
        ("sampled = seq_lens >= input_batch.num_tokens[:num_reqs]", "sampled = seq_lens > 0"),
    ), "Samples from a prefill chunk that stops before the end of its prompt.",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"}),
    "query_start_loc_not_cumulative": Mutant(CELL, (
        ("query_start_loc[1:] = cu_num_tokens", "query_start_loc[1:] = num_scheduled"),
    ), "Stores each request's length where its start offset (a prefix sum) belongs.",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"}),
    "rows_in_scheduler_order": Mutant(CELL, (
        ("req_ids = input_batch.req_ids[:num_reqs]", "req_ids = list(scheduler_output.num_scheduled_tokens)"),
    ), "Takes the requests in the scheduler's order, not the persistent batch's row order (reordered, condensed).",
        fails={"l05_main_path", "l05_real_engine", "l05_boundary"}),
    "per_token_loop": Mutant(CELL, (
        ("input_ids = input_batch.token_ids_cpu[req_indices, positions]",
         "input_ids = np.array([input_batch.token_ids_cpu[r, p] for r, p in zip(req_indices, positions)], "
         "dtype=np.int64)"),
    ), "Gathers the token ids with one Python iteration per token: right values, not vectorised.",
        fails={"l05_real_engine"}),
    "logits_one_token_early": Mutant(CELL, (
        ("sampled = seq_lens >= input_batch.num_tokens[:num_reqs]",
         "sampled = seq_lens >= input_batch.num_tokens[:num_reqs] - 1"),
    ), "Samples from a chunk that ends one token before the end (the last position is num_tokens - 1).",
        fails={"l05_boundary"}),
    "rows_sorted_by_id": Mutant(CELL, (
        ("req_ids = input_batch.req_ids[:num_reqs]", "req_ids = sorted(scheduler_output.num_scheduled_tokens)"),
    ), "Takes the requests sorted by id, as if rows were kept in id order.",
        fails={"l05_boundary"}),
    "rows_in_index_dict_order": Mutant(CELL, (
        ("req_ids = input_batch.req_ids[:num_reqs]", "req_ids = list(input_batch.req_id_to_index)"),
    ), "Takes the requests in req_id_to_index's insertion order: a swap moves rows, not the dict's keys.",
        fails={"l05_boundary"}),
    "block_size_constant": Mutant(CELL, (
        ("input_batch.block_table[req_indices, positions // block_size]",
         "input_batch.block_table[req_indices, positions // 8]"),
        ("slot_mapping = block_numbers * block_size + positions % block_size",
         "slot_mapping = block_numbers * 8 + positions % 8"),
    ), "Uses the engine's usual block size instead of the block_size argument.",
        fails={"l05_boundary", "l05_real_engine"}),
    "slot_offset_in_chunk": Mutant(CELL, (
        ("slot_mapping = block_numbers * block_size + positions % block_size",
         "slot_mapping = block_numbers * block_size + query_pos % block_size"),
    ), "Takes the offset inside the block from the token's place in this step's chunk, not its position.",
        fails={"l05_main_path", "l05_boundary"}),
    "logits_row_not_token": Mutant(CELL, (
        ("logits_indices = cu_num_tokens[sampled] - 1", "logits_indices = np.nonzero(sampled)[0]"),
    ), "Returns the rows that sample instead of their last token's index in the flat batch.",
        fails={"l05_main_path", "l05_boundary"}),
}
