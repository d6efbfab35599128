"""Lesson 6's wrong answers: each a few edits of the solution cell l06_kernel, with the misconception it models.

Instructor side only (`python -m autograder release` leaves this file out). Every mutant must score less
than the solution (tests/test_lesson06_grading.py builds each wrong notebook from the release and grades it).
"""
from autograder.mutation import Mutant

CELL = "l06_kernel"

MUTANTS = {
    "block_table_row_of_seq0": Mutant(CELL, (
        ('        physical_block = tl.load(block_table_ptr + seq * stride_block_table_seq + logical_block)',
         '        physical_block = tl.load(block_table_ptr + logical_block)'),
    ), 'Reads row 0 of the block table for every sequence (forgets the row stride).',
       fails={"l06_main_path", "l06_real_engine"},
       hint="每个序列读的是块表的哪一行？"),
    "block_table_wrong_stride": Mutant(CELL, (
        ('        physical_block = tl.load(block_table_ptr + seq * stride_block_table_seq + logical_block)',
         '        physical_block = tl.load(block_table_ptr + seq * stride_cache_block + logical_block)'),
    ), "Steps through the block table with the cache's block stride, reading far past the table (a wild pointer: under the interpreter the bounds-checked launcher must turn it into a failed check, not a crash).",
       fails={"l06_boundary", "l06_main_path", "l06_real_engine"},
       hint="遍历块表时用的步长属于哪个张量？"),
    "logical_block_index": Mutant(CELL, (
        ('        physical_block = tl.load(block_table_ptr + seq * stride_block_table_seq + logical_block)',
         '        physical_block = logical_block'),
    ), 'Uses the logical block number as the physical one (ignores the block table).',
       fails={"l06_boundary", "l06_main_path", "l06_real_engine"},
       hint="读 KV 时，块号有没有经过块表换算？"),
    "mask_off_by_one": Mutant(CELL, (
        ('        token_mask = token_pos < seq_len',
         '        token_mask = token_pos <= seq_len'),
    ), 'Lets the slot at position seq_len (one past the last token) through.',
       fails={"l06_boundary", "l06_main_path", "l06_real_engine"},
       hint="掩码是否让序列末尾之后的一个位置漏了进来？检查边界。"),
    "no_acc_rescale": Mutant(CELL, (
        ('        acc = acc * rescale[:, None] + tl.dot(probs.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)',
         '        acc = acc + tl.dot(probs.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)'),
    ), 'Rescales the denominator but not the accumulator when the running max rises.',
       fails={"l06_boundary", "l06_main_path", "l06_real_engine"},
       hint="运行最大值变大时，哪些累积量需要一起缩放？"),
    "no_mask_last_block": Mutant(CELL, (
        ('        token_mask = token_pos < seq_len',
         '        token_mask = token_pos < num_logical_blocks * BLOCK_SIZE'),
    ), 'Masks only whole blocks, so the unwritten tail of the last partial block is read and scored.',
       fails={"l06_boundary", "l06_main_path", "l06_real_engine"},
       hint="最后一个未填满的块里，未写入的部分有没有被掩掉？"),
    "no_max_subtraction": Mutant(CELL, (
        (('        rescale = tl.exp(running_max - new_max)\n'
          '        probs = tl.exp(scores - new_max[:, None])\n'
          '        running_sum = running_sum * rescale + tl.sum(probs, axis=1)\n'
          '        acc = acc * rescale[:, None] + tl.dot(probs.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)'),
         ('        rescale = 1.0\n'
          '        probs = tl.exp(scores)\n'
          '        running_sum = running_sum * rescale + tl.sum(probs, axis=1)\n'
          '        acc = acc * rescale + tl.dot(probs.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)')),
    ), 'Plain exp(scores) without the running max (exact on small scores, overflows on big ones).',
       fails={"l06_boundary"},
       hint="分数很大时 exp 会怎样？回顾数值稳定的 softmax。"),
    "no_sum_rescale": Mutant(CELL, (
        ('        running_sum = running_sum * rescale + tl.sum(probs, axis=1)',
         '        running_sum = running_sum + tl.sum(probs, axis=1)'),
    ), 'Rescales the accumulator but not the denominator when the running max rises.',
       fails={"l06_boundary", "l06_main_path", "l06_real_engine"},
       hint="运行最大值变大时，分母（sum）是否也随之缩放？"),
    "probs_use_block_max": Mutant(CELL, (
        ('        probs = tl.exp(scores - new_max[:, None])',
         '        probs = tl.exp(scores - block_max[:, None])'),
    ), "Exponentiates against the block's own max instead of the new running max.",
       fails={"l06_boundary", "l06_main_path", "l06_real_engine"},
       hint="取指数时减去的是哪个最大值？"),
    "dot_default_precision": Mutant(CELL, (
        ('        acc = acc * rescale[:, None] + tl.dot(probs.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)',
         '        acc = acc * rescale[:, None] + tl.dot(probs.to(COMPUTE_DTYPE), v)'),
    ), 'Wrong on a GPU only: tl.dot without input_precision=DOT_PRECISION (the interpreter ignores it; a GPU uses tf32).',
       fails={"l06_boundary", "l06_main_path", "l06_real_engine"},
       hint="tl.dot 在 GPU 上默认用什么精度？对照 torch 的结果。"),
    "probs_not_cast": Mutant(CELL, (
        ('        acc = acc * rescale[:, None] + tl.dot(probs.to(COMPUTE_DTYPE), v, input_precision=DOT_PRECISION)',
         '        acc = acc * rescale[:, None] + tl.dot(probs, v, input_precision=DOT_PRECISION)'),
    ), 'Wrong on a GPU only: fp32 probs fed to tl.dot against a V in the compute dtype (the interpreter computes in fp32).',
       fails={"l06_boundary", "l06_main_path", "l06_real_engine"},
       hint="送入 tl.dot 的两个操作数 dtype 一致吗？"),
    "mask_ignores_block_offset": Mutant(CELL, (
        ("        token_mask = token_pos < seq_len", "        token_mask = slots < seq_len"),
    ), "Masks by the slot inside the block, not the token's position in the sequence: past the first block every slot looks valid.",
        fails={"l06_main_path", "l06_boundary"},
        hint="掩码比较的是块内 slot，还是 token 在序列中的位置？"),
    "table_row_stride_from_length": Mutant(CELL, (
        ("        physical_block = tl.load(block_table_ptr + seq * stride_block_table_seq + logical_block)",
         "        physical_block = tl.load(block_table_ptr + seq * num_logical_blocks + logical_block)"),
    ), "Takes the block table's row length to be this sequence's block count instead of the table's stride.",
        fails={"l06_main_path", "l06_boundary"},
        hint="块表的行步长来自哪里？它和这个序列的块数一样吗？"),
    "rescale_inverted": Mutant(CELL, (
        ("        rescale = tl.exp(running_max - new_max)", "        rescale = tl.exp(new_max - running_max)"),
    ), "Rescales the old sum and accumulator by exp(new - old) instead of exp(old - new).",
        fails={"l06_main_path", "l06_boundary"},
        hint="缩放因子的方向对吗？想想新旧最大值的大小关系。"),
    "rescale_by_block_max": Mutant(CELL, (
        ("        rescale = tl.exp(running_max - new_max)", "        rescale = tl.exp(running_max - block_max)"),
    ), "Rescales the old state against this block's max instead of the new running max (>1 when the block's max is lower).",
        fails={"l06_main_path", "l06_boundary"},
        hint="旧的分母和累加器是相对哪个 max 算的，现在要换算到哪个 max 下？"),
    "sum_forgets_earlier_blocks": Mutant(CELL, (
        ("        running_sum = running_sum * rescale + tl.sum(probs, axis=1)",
         "        running_sum = tl.sum(probs, axis=1)"),
    ), "Keeps only the last block's denominator: the earlier blocks drop out of the softmax sum.",
        fails={"l06_main_path", "l06_boundary", "l06_real_engine"},
        hint="分母要覆盖整段上下文，还是只覆盖当前块？"),
}
