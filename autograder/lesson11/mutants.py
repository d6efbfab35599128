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
        ("rows = hidden[:num_reqs]", "rows = hidden"),
    ), "Returns the padded rows too, so compute_logits and sampling see `size` requests instead of the real ones.",
       fails={"l11_main_path", "l11_real_engine", "l11_boundary"},
       hint="交给 compute_logits 的行只包含真实的行吗？"),
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
    "next_power_of_two": Mutant(CELL, (
        ("size = min(fits) if fits else None", "size = 1 << (num_reqs - 1).bit_length() if fits else None"),
    ), "Rounds the batch up to the next power of two: right for [1, 2, 4, 8], a size not in vLLM's list for 17 (24).",
       fails={"l11_main_path", "l11_boundary"},
       hint="捕获尺寸一定是 2 的幂吗？vLLM 的默认列表里有哪些尺寸？"),
    "clamped_to_largest": Mutant(CELL, (
        ("size = min(fits) if fits else None", "size = min(fits) if fits else max(capture_sizes)"),
    ), "Runs a batch above every size in the largest graph, which has fewer rows than the batch (vLLM: eager).",
       fails={"l11_main_path", "l11_boundary"},
       hint="批大小超过所有捕获尺寸时，还能用哪张图？"),
    "multiple_of_8_above_8": Mutant(CELL, (
        ("size = min(fits) if fits else None",
         "size = (min(fits) if num_reqs <= 8 else -(-num_reqs // 8) * 8) if fits else None"),
    ), "Assumes vLLM's default step of 8 above 8: a list with other steps ([..., 16, 32, 64]) gets a size it lacks.",
       fails={"l11_main_path"},
       hint="尺寸是从列表里选的，还是按某个固定间隔算出来的？"),
}
