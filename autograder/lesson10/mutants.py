"""Lesson 10's wrong answers: each a few edits of the solution cell l10_parallel_linear, with the misconception.

Instructor side only (`python -m autograder release` leaves this file out). Every mutant must score less
than the solution and fail its `fails` parts (tests/test_mutants.py grades each one).
"""
from autograder.mutation import Mutant

CELL = "l10_parallel_linear"
ALL_CODE = {"l10_main_path", "l10_real_engine", "l10_boundary"}
ONE_BLOCK = """full = sum(self.output_sizes) // self.tp_size
        lo, start = self.tp_rank * full, sum(self.output_sizes[:shard_id])
        a, b = max(lo, start), min(lo + full, start + self.output_sizes[shard_id])
        if a < b:
            default_weight_loader(param.data[a - lo:b - lo], loaded_weight[a - start:b - start])"""

MUTANTS = {
    "offset_from_previous_shard_only": Mutant(CELL, (
        ("offset = sum(self.output_sizes[:shard_id]) // self.tp_size",
         "offset = self.output_sizes[shard_id - 1] // self.tp_size if shard_id else 0"),
    ), "Starts shard k after shard k-1 only (output_sizes[k-1]), not after every earlier shard: right for gate/up, "
       "wrong for a third projection (q, k, v of unequal sizes).",
        fails={"l10_boundary"},
        hint="融合了三段（如 q、k、v）时，第 2 段在本 rank 参数里从哪里开始？它前面有几段？"),
    "row_splits_output_dim": Mutant(CELL, (
        ("in_per_rank = divide(input_size, tp)", "in_per_rank = input_size"),
        ("out_per_rank = output_size", "out_per_rank = divide(output_size, tp)"),
        ("loaded_weight.narrow(1, self.tp_rank * param.shape[1], param.shape[1])",
         "loaded_weight.narrow(0, self.tp_rank * param.shape[0], param.shape[0])"),
    ), "Splits down_proj along its output dim like a column layer, so its input is no longer the slice each rank "
       "holds.", fails=ALL_CODE,
       hint="行并行层沿哪个维度切分？它的输入是每个 rank 手里的哪一片？"),
    "all_reduce_after_column": Mutant(CELL, (
        ("return y_rank", "return tensor_model_parallel_all_reduce(y_rank)"),
    ), "All-reduces the column-parallel output, adding different neurons of the ranks as if they were partial "
       "sums.", fails=ALL_CODE,
       hint="列并行的输出需要 all-reduce 吗？各 rank 持有的是部分和还是不同的神经元？"),
    "no_all_reduce": Mutant(CELL, (
        ("return tensor_model_parallel_all_reduce(partial)", "return partial"),
    ), "Leaves out the row-parallel all-reduce: each rank keeps its own partial sum.", fails=ALL_CODE,
    hint="行并行层各 rank 的部分和最后如何合并？"),
    "gate_up_one_block": Mutant(CELL, (
        ("""offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        start = self.tp_rank * size
        default_weight_loader(param.data.narrow(0, offset, size), loaded_weight.narrow(0, start, size))""",
         ONE_BLOCK),
    ), "Splits [gate; up] as one block: rank 0 holds all of gate, rank 1 all of up, so SiluAndMul pairs the "
       "wrong rows.", fails=ALL_CODE,
       hint="[gate; up] 合并权重是怎样在 rank 之间切分的？"),
    "row_bias_every_rank": Mutant(CELL, (
        ("bias = self.bias if self.tp_rank == 0 else None", "bias = self.bias"),
    ), "Adds the row-parallel bias on every rank, so the all-reduce sums it tp times.", fails={"l10_boundary"},
    hint="行并行层的 bias 经过 all-reduce 后被加了几次？"),
    "offset_from_shard_index": Mutant(CELL, (
        ("offset = sum(self.output_sizes[:shard_id]) // self.tp_size", "offset = shard_id * size"),
    ), "Places projection shard_id at shard_id * its own width: right only while gate and up are the same size.",
        fails={"l10_boundary"},
        hint="gate 和 up 宽度不同时，各分片的偏移还对吗？"),
    "tp_size_as_constant": Mutant(CELL, (
        ("in_per_rank = divide(input_size, tp)", "in_per_rank = divide(input_size, 2)"),
    ), "Divides down_proj's input by a constant 2 instead of the group size: right only at TP=2.",
        fails={"l10_boundary"},
        hint="切分份数来自哪里？换一个 TP 大小还对吗？"),
    "row_bias_dropped": Mutant(CELL, (
        ("bias = self.bias if self.tp_rank == 0 else None", "bias = None"),
    ), "Drops the row-parallel bias on every rank to avoid adding it twice, so it is never added.",
        fails={"l10_boundary"},
        hint="行并行层的 bias 最终被加了几次？"),
    "fused_total_divided": Mutant(CELL, (
        ("out_per_rank = sum(divide(size, tp) for size in self.output_sizes)",
         "out_per_rank = divide(sum(self.output_sizes), tp)"),
    ), "Divides the fused width as a whole: [5, 7] at TP=2 builds a 6-row layer whose rows do not line up with gate and up, "
       "where vLLM asserts every projection splits evenly.", fails={"l10_boundary"},
       hint="融合投影的每一段都能被 tp 整除吗？只有总和能整除时该怎么办？"),
    "fused_sizes_floored": Mutant(CELL, (
        ("out_per_rank = sum(divide(size, tp) for size in self.output_sizes)",
         "out_per_rank = sum(size // tp for size in self.output_sizes)"),
    ), "Floors each projection's share instead of refusing a size tp does not divide: rows are silently dropped.",
        fails={"l10_boundary"},
        hint="某段投影不能被 tp 整除时，向下取整会丢掉哪些行？"),
    "row_input_floored": Mutant(CELL, (
        ("in_per_rank = divide(input_size, tp)", "in_per_rank = input_size // tp"),
    ), "Floors the row layer's input share: an input width tp does not divide leaves columns no rank holds.",
        fails={"l10_boundary"},
        hint="行并行层的输入维不能被 tp 整除时，哪些列没有任何 rank 持有？"),
}
