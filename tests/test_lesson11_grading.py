"""Lesson 11's grader: each mutant's failure names its misconception (an error raised inside the engine step still
reaches the student, though EngineCore ends a failed step's requests instead of raising); the source map accepts
vLLM's names only; the student copy shows the blanks; the demo's padding table runs and the GPU launch counts are
skipped on CPU with a sentence; nbgrader agrees end to end (solution 4, blank 0, a mutant 2).
Shared tests cover the rest: tests/test_mutants.py (solution 4/4, every mutant fails its parts), tests/test_autograder.py
(the unfilled release scores 0, the notebook runs with every grade cell passing, its figures and padding-cost table)."""
import json

import pytest
import torch

from autograder.common import REPO, CheckFailed, exec_source, run_part
from autograder.lesson11 import LESSON, check_source_map, demo
from autograder.mutation import mutant_source, mutants

# mutant -> (the part whose message is checked, a phrase that message must carry)
MESSAGES = {
    "largest_size": ("l11_main_path", "能装下的最小尺寸"),
    "pad_slot_block_0": ("l11_boundary", "填充行必须不写 KV"),
    "stale_inputs": ("l11_boundary", "残留的块号"),
    "padded_logits": ("l11_real_engine", "真实行"),  # raised inside the engine step
    "position_out_of_range": ("l11_boundary", "position 是 -1"),
    "first_fit_in_list_order": ("l11_main_path", "不一定按升序"),
    "strictly_larger_size": ("l11_boundary", "正好是捕获尺寸 8"),
    "next_power_of_two": ("l11_main_path", "不一定是 2 的幂"),
    "multiple_of_8_above_8": ("l11_main_path", "间隔不一定是 8"),
    "clamped_to_largest": ("l11_main_path", "CudagraphDispatcher.dispatch"),  # caught by the vLLM comparison
}


def test_every_required_mutant_is_there():
    assert set(mutants("lesson11")) == set(MESSAGES)


def test_mutants_change_only_blank_lines():
    sol = json.loads((REPO / "solutions/lesson11/lesson11.ipynb").read_text(encoding="utf-8"))
    cell = next("".join(c["source"]) for c in sol["cells"] if c["id"] == "l11_padding")
    blank_lines = {line.split("  ### BLANK")[0].strip() for line in cell.splitlines() if "### BLANK" in line}
    for name, m in mutants("lesson11").items():
        for old, _new in m.edits:
            assert old in blank_lines, (name, old)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_mutant_failure_names_the_misconception(name, solution_ns):
    part_id, phrase = MESSAGES[name]
    ns = dict(solution_ns)  # the mutant's functions see the setup's names (PAD_SLOT_ID, torch)
    exec_source(mutant_source("lesson11", name), ns, f"<mutant {name}>")
    result = run_part(next(p for p in LESSON.parts if p.grade_id == part_id), ns)
    assert result.score == 0 and phrase in result.message, result.message


def test_vllm_recording_backs_the_lessons_lists():
    """The recorded side of the pinned vLLM: its default list at max_num_seqs 20 is the VLLM_HEAD the checks use, the
    engine's sizes come back sorted, and on CPU vLLM captures nothing."""
    from autograder.lesson11.checks import CAPTURE_SIZES, ODD_SIZES, VLLM_HEAD
    from autograder.vllm_oracle import recorded

    assert recorded("lesson11", "default_20_seqs")["cudagraph_capture_sizes"] == VLLM_HEAD
    assert recorded("lesson11", "lesson_engine")["decode_capture_sizes"] == CAPTURE_SIZES
    assert recorded("lesson11", "odd_sizes")["decode_capture_sizes"] == ODD_SIZES
    assert all(recorded("lesson11", n)["on_cpu"]["cudagraph_capture_sizes"] == [] for n in
               ("default_20_seqs", "lesson_engine"))


def test_source_map_accepts_vllm_names_and_rejects_others(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({"padded_descriptor": "self._create_padded_batch_descriptor()",
                      "sorted_sizes": "`post_init_cudagraph_sizes`", "uniform_check": "self._is_uniform_decode()"})
    with pytest.raises(CheckFailed, match="uniform_check"):  # the dispatcher's attribute, not the runner's check
        check_source_map(dict(good, uniform_check="uniform_decode_query_len"))
    with pytest.raises(CheckFailed, match="sorted_sizes"):
        check_source_map(dict(good, sorted_sizes="cudagraph_capture_sizes"))
    with pytest.raises(CheckFailed, match="padded_descriptor"):
        check_source_map(dict(good, padded_descriptor="_bs_to_padded_graph_size"))
    with pytest.raises(CheckFailed, match="键应恰好是"):
        check_source_map({"padded_descriptor": "dispatch"})


def test_student_copy_shows_the_blanks():
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((REPO / "notebooks/lesson11/lesson11.ipynb").read_text(encoding="utf-8"))["cells"]}
    code = cells["l11_padding"]
    assert code.count("______") == 8 and "### BLANK" not in code
    for line in ("fits = ______", "size = ______", "pad_slot = ______", "pad_position = ______", "rows = ______"):
        assert line in code, line
    assert "PAD_SLOT_ID" not in code and "min(" not in code and "hidden[:" not in code
    assert "bufs.block_table[:size]" not in code and "bufs.slot_mapping[n:size] = pad_slot" in code
    assert "L11.check_boundary" not in cells["l11_boundary"] and "assert choose_capture_size(9" in cells["l11_boundary"]


def test_demo_padding_table_and_launch_counts(capsys):
    table = demo.padding_table([1, 2, 4, 8], 9)
    assert [r["size"] for r in table] == [1, 2, 4, 4, 8, 8, 8, 8, None]
    assert [r["wasted"] for r in table][:5] == [0, 0, 1, 0, 3]
    if not torch.cuda.is_available():
        assert demo.launch_counts() is None
        demo.print_launch_counts(None)
        assert "没有 CUDA" in capsys.readouterr().out


