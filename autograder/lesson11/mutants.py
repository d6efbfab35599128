"""Lesson 11's wrong answers: each an edit of the solution cell l11_padding, with the misconception (#21).

Instructor side only (`python -m autograder release` leaves this file out). Every mutant must score less
than the solution (tests/test_mutants.py builds each wrong notebook from the release and grades it).
"""
from autograder.mutation import Mutant

CELL = "l11_padding"

MUTANTS = {
    "largest_size": Mutant(CELL, (
        ("size = min(fits) if fits else None", "size = max(fits) if fits else None"),
    ), "Pads every batch to the largest size that holds it: correct tokens, but a 1-request batch computes 8 rows.",
       fails={"l11_main_path"},
       hint="选出的尺寸是能容纳这批的最小尺寸吗？"),
    "pad_slot_block_0": Mutant(CELL, (
        ("pad_slot = PAD_SLOT_ID", "pad_slot = 0"),
    ), "Gives padded rows slot 0, so they write KV into block 0 (harmless only while block 0 is the null block).",
       fails={"l11_main_path", "l11_boundary"},
       hint="填充行的 KV 写到了哪里？"),
    "stale_inputs": Mutant(CELL, (
        ("bufs.block_table[:size] = 0", "pass"),
    ), "Writes only the real rows' block ids over the buffer, leaving the previous batch's ids in the rest.",
       fails={"l11_boundary"},
       hint="只覆盖真实行之后，缓冲的其余部分还留着什么？"),
    "padded_logits": Mutant(CELL, (
        ("rows = logits[:num_reqs]", "rows = logits"),
    ), "Returns the padded rows' logits too, so sampling sees `size` requests instead of the real ones.",
       fails={"l11_main_path", "l11_real_engine", "l11_boundary"},
       hint="返回的 logits 只包含真实的行吗？"),
    "position_out_of_range": Mutant(CELL, (
        ("pad_position = 0", "pad_position = PAD_SLOT_ID"),
    ), "Pads positions with the pad slot -1: rotary indexes its cos/sin table out of range (wraps on CPU).",
       fails={"l11_main_path", "l11_real_engine", "l11_boundary"},
       hint="填充行的 position 会不会让旋转位置编码越界？"),
    "first_fit_in_list_order": Mutant(CELL, (
        ("size = min(fits) if fits else None", "size = fits[0] if fits else None"),
    ), "Takes the first size that fits in list order: right only while capture_sizes is ascending.",
       fails={"l11_main_path"},
       hint="选捕获尺寸时，是否假定了 capture_sizes 已经有序？"),
    "strictly_larger_size": Mutant(CELL, (
        ("fits = [s for s in capture_sizes if s >= num_reqs]", "fits = [s for s in capture_sizes if s > num_reqs]"),
    ), "Looks for a size strictly above the batch: a batch of exactly a capture size is padded or run eagerly.",
       fails={"l11_main_path", "l11_boundary"},
       hint="批大小恰好等于某个捕获尺寸时选哪个？检查比较符。"),
    "block_table_cleared_in_padded_rows_only": Mutant(CELL, (
        ("bufs.block_table[:size] = 0", "bufs.block_table[n:size] = 0"),
    ), "Clears only the padded rows: a real row's columns past this batch's table keep the previous batch's ids.",
       fails={"l11_boundary"},
       hint="静态缓冲中上一批留下的块号，哪些位置需要清掉？"),
}
