"""Lesson 10's grader: the solution earns 4/4 code points; the checks accept minivllm's own parallel layers and
reject each misconception (the mutants of autograder/lesson10/mutants.py, graded in tests/test_mutants.py, plus
an extra collective only the profiler can see); an unfilled blank is one line, also from inside a rank; the
engine plug restores the model; the student copy shows the blanks; nbgrader agrees end to end.

Two-rank startups are the cost (~1 s each, an engine at TP=2 ~10 s): the solution's verdicts are computed once
per module, and each check here runs the fewest ranks that show its point."""
import json
import os

import pytest
import torch
import torch.nn.functional as F

from autograder.common import REPO, CheckFailed
from autograder.lesson10 import check_mlp, check_real_engine, check_source_map
from autograder.lesson10.checks import _weights, probe, reference_mlp, run_two_ranks
from autograder.mutation import mutants
from minivllm.distributed import tensor_model_parallel_all_reduce
from minivllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear

REQUIRED_MUTANTS = {"row_splits_output_dim", "all_reduce_after_column", "no_all_reduce", "gate_up_one_block",
                    "row_bias_every_rank"}


def test_every_required_mutant_is_there():
    assert REQUIRED_MUTANTS <= set(mutants("lesson10"))


def test_the_engine_layers_pass_the_two_rank_checks():
    """The student's layers are graded against the same contract as minivllm's own (which the engine uses)."""
    check_mlp(MergedColumnParallelLinear, RowParallelLinear)


class ReduceTwiceRow(RowParallelLinear):
    """All-reduces again "to keep the ranks in sync" (halved first: the same numbers, one more collective)."""

    def forward(self, x):
        return tensor_model_parallel_all_reduce(super().forward(x) / self.tp_size)


@pytest.mark.slow
def test_real_engine_counts_all_reduces_and_restores_the_model():
    """Same tokens, one collective too many per layer: only the profiler's count catches it; the plug is undone."""
    import minivllm.model_executor.models.llama as llama
    before = llama.MergedColumnParallelLinear, llama.RowParallelLinear, os.environ.get("MINIVLLM_WORKER_MULTIPROC_METHOD")
    with pytest.raises(CheckFailed, match="all-reduce，应是 9"):
        check_real_engine(MergedColumnParallelLinear, ReduceTwiceRow)
    after = llama.MergedColumnParallelLinear, llama.RowParallelLinear, os.environ.get("MINIVLLM_WORKER_MULTIPROC_METHOD")
    assert after == before


def test_reference_mlp_is_the_llama_mlp():
    from minivllm.model_executor.models.llama import LlamaMLP
    w = _weights()
    mlp = LlamaMLP(48, 40)
    mlp.gate_up_proj.weight.data.copy_(torch.cat([w["gate"], w["up"]]))
    mlp.down_proj.weight.data.copy_(w["down"])
    with torch.inference_mode():
        torch.testing.assert_close(mlp(w["x"]), reference_mlp(w))
        torch.testing.assert_close(mlp(w["x"]) + w["down_bias"], reference_mlp(w, bias=True))


def _rank_reduce(rank):
    return tensor_model_parallel_all_reduce(torch.full((2,), float(rank + 1)))


def _rank_raise(rank):
    raise ValueError(f"boom on {rank}")


def test_two_ranks_sum_and_report_a_rank_error_in_one_line():
    assert [t.tolist() for t in run_two_ranks(_rank_reduce)] == [[3.0, 3.0], [3.0, 3.0]]
    with pytest.raises(CheckFailed, match=r"rank 0 运行你的层时出错：ValueError: boom on 0"):
        run_two_ranks(_rank_raise)


def _rank_exit(rank):
    os._exit(3)


def test_spawned_ranks_get_classes_defined_in_main_by_value_and_a_silent_death_is_one_line():
    """The notebook's classes live in __main__, which a spawned interpreter does not have: they travel by
    value. A child that dies without a word (a crash, os._exit) is reported with its exit code, at once."""
    import types

    main = types.ModuleType("__main__")
    exec("from minivllm.model_executor.layers.linear import RowParallelLinear\n"
         "class Halved(RowParallelLinear):\n"
         "    def forward(self, x):\n"
         "        return super().forward(x) / 2\n", main.__dict__)
    assert main.Halved.__module__ == "__main__"
    check_mlp(MergedColumnParallelLinear, RowParallelLinear)
    with pytest.raises(CheckFailed, match="MLP 输出与不切分的 MLP 不一致"):
        check_mlp(MergedColumnParallelLinear, main.Halved)
    with pytest.raises(CheckFailed, match=r"rank 0 意外退出（退出码 3）"):
        run_two_ranks(_rank_exit, timeout_s=30)


def test_a_half_filled_answer_names_the_blank(solution_ns):
    """A blank in forward (after the constructor ran) is still reported as a blank, before any rank starts."""
    from autograder.common import BlankNotFilled, ______

    class BlankBias(solution_ns["RowParallelLinear"]):
        def forward(self, x):
            return F.linear(x, self.weight, ______)

    with pytest.raises(BlankNotFilled):
        probe(solution_ns["MergedColumnParallelLinear"], BlankBias)
    with pytest.raises(CheckFailed, match="______"):
        check_mlp(solution_ns["MergedColumnParallelLinear"], BlankBias)


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"`{v}`" for k, v in good.items()})
    check_source_map(dict(good, no_split="vllm.model_executor.layers.linear.ReplicatedLinear",
                          gather_outputs="tensor_model_parallel_all_gather()", output_rank="self._get_output_rank()"))
    check_source_map(dict(good, gather_outputs="get_tp_group().all_gather"))  # GroupCoordinator.all_gather
    for bad in (dict(good, divisible=good["split_input"], split_input=good["divisible"]),
                dict(good, no_split="ColumnParallelLinear"), dict(good, gather_outputs="all_reduce"),
                dict(good, output_rank="get_output_rank"),  # not a vLLM name: only _get_output_rank exists
                {k: v for k, v in good.items() if k != "output_rank"}):
        with pytest.raises(CheckFailed):
            check_source_map(bad)


def test_student_copy_shows_the_blanks():
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((REPO / "notebooks/lesson10/lesson10.ipynb").read_text(encoding="utf-8"))["cells"]}
    code = cells["l10_parallel_linear"]
    assert code.count("______") == 10 and "### BLANK" not in code
    for line in ("in_per_rank = ______", "out_per_rank = ______", "offset = ______", "start = ______",
                 "loaded_weight = ______", "bias = ______"):
        assert line in code, line
    assert "tensor_model_parallel_all_reduce(y)" not in code and "tp_rank == 0" not in code
    assert "narrow(1" not in code and "divide(input_size" not in code


