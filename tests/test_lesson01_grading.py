"""Lesson 1's grader: the solution earns 4/4 code points, the unfilled release 0, every mutant loses points;
the real engine shows the bug each order mistake causes; the notebook runs; nbgrader agrees end to end."""

import csv
import json

import pytest
from grading_flow import namespace_scores, solution_cells

from autograder.common import REPO, student_namespace
from autograder.lesson01 import check_source_map, run_engine
from autograder.mutation import mutant_namespace
from autograder.mutation import solution_cells as mutation_solution_cells
from autograder.preprocessors import NOT_RUN


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"`{v}`" for k, v in good.items()})
    check_source_map(dict(good, future="multiproc_executor.FutureWrapper", plan="scheduler_output.num_common_prefix_blocks",
                          outputs="request.client_index"))
    for bad in (dict(good, plan=good["outputs"], outputs=good["plan"]), dict(good, aborts="aborts_queue"),
                dict(good, future="Future"), {k: v for k, v in good.items() if k != "future"},
                dict(good, model_output=None)):
        with pytest.raises(AssertionError):
            check_source_map(bad)


def mutant(name):
    return mutant_namespace("lesson01", name)["engine_core_step"]


def test_real_engine_shows_each_order_bug():
    """Independent of the exact-order rule: the engine's own outputs and timings show the damage."""
    ok = run_engine()
    assert not [o for s, outs in ok.outputs.items() if s >= ok.abort_step for o in outs
                if o.request_id == "r0" and o.new_token_ids]
    leak = run_engine(mutant("update_before_aborts"))
    assert [o for o in leak.outputs[leak.abort_step] if o.request_id == "r0" and o.new_token_ids]
    never = run_engine(mutant("aborts_skipped"))
    assert [o for s, outs in never.outputs.items() if s > never.abort_step for o in outs
            if o.request_id == "r0" and o.new_token_ids]
    serial = run_engine(mutant("wait_before_grammar"))
    for e in serial.events:
        if e.phase == "forward":
            grammar = next(g for g in serial.events if g.step == e.step and g.phase == "grammar")
            assert grammar.start >= e.end


@pytest.mark.slow
def test_nbgrader_end_to_end(lesson01_class, release_scores):
    """generate_assignment -> submissions (solution, blank, mutant) -> autograde -j 2 -> export -> feedback, on
    the class tests/conftest.py grades once (test_feedback_page's student is in it too)."""
    results, csv_path, course = lesson01_class["results"], lesson01_class["csv"], lesson01_class["course"]
    flow = ("solution_student", "blank_student", "mutant_student")
    code = {s: sum(v or 0 for k, v in results[s].items() if k in ("l01_main_path", "l01_real_engine", "l01_boundary",
                                                                  "l01_source_map")) for s in flow}
    assert code == {"solution_student": 4, "blank_student": 0, "mutant_student": 1}
    assert {s: results[s]["l01_q1"] for s in flow} == {  # written: pending; untouched: 0
        "solution_student": None, "mutant_student": None, "blank_student": 0}
    # the Colab self-check gives the same points per part: the solution's and the mutant's code cells are the
    # release filled as release_scores fills it (graded once per run, test_mutants reads the same), the blank's
    # is the release as is
    sol = solution_cells("lesson01")
    assert {k: sol[k] for k in ("l01_engine_core_step", "l01_source_map_answer")} == \
        {k: v for k, v in mutation_solution_cells("lesson01").items() if not k.startswith("l01_q")}
    ns, _ = student_namespace(lesson01_class["subs"] / "blank_student" / "lesson01" / "lesson01.ipynb")
    self_check = {"solution_student": release_scores("lesson01"),
                  "blank_student": namespace_scores("lesson01", ns),
                  "mutant_student": release_scores("lesson01", "update_before_aborts")}
    for student in flow:
        assert self_check[student] == {k: v for k, v in results[student].items() if k in self_check[student]}, student
    with open(csv_path, newline="") as f:
        rows = {r["student_id"]: (r["score"], r["max_score"], r["pending_manual_points"]) for r in csv.DictReader(f)}
    assert {s: rows[s] for s in flow} == {"solution_student": ("4.0", "10.0", "2"),
                                          "blank_student": ("0.0", "10.0", "0"),
                                          "mutant_student": ("1.0", "10.0", "2")}
    assert rows.keys() == results.keys() == set(flow) | {"misconception_student"}
    html = lesson01_class["pages"]
    assert html.keys() == results.keys()
    assert all("MARK SCHEME" not in p.read_text(encoding="utf-8") for p in html.values())
    page = html["solution_student"].read_text(encoding="utf-8")
    assert page.count("pending manual grading") >= 2 and "代码 code 4/4, 2 分待人工评分" in page
    # autograde ran the setup, answer and grade cells, and none of the release's demo cells (SkipUngradedCells)
    release = {c["id"]: c for c in json.loads((REPO / "notebooks/lesson01/lesson01.ipynb").read_text())["cells"]}
    graded = json.loads((course / "autograded/solution_student/lesson01/lesson01.ipynb").read_text())
    ran = {c["id"]: c.get("execution_count") for c in graded["cells"] if c["cell_type"] == "code"}
    demos = {i for i, c in release.items() if c["cell_type"] == "code" and "nbgrader" not in c["metadata"]}
    assert len(demos) >= 5 and all(ran[i] is None for i in demos), ran
    assert all(ran[i] for i in ran.keys() - demos), ran
    shown = {c["id"]: "".join("".join(o.get("text", "")) for o in c["outputs"]) for c in graded["cells"]
             if c["id"] in demos}
    assert set(shown.values()) == {NOT_RUN}, shown


def test_vllm_side_by_side_from_the_recording(monkeypatch, capsys):
    """The pinned vLLM's EngineCore (recorded) called the same phases in the same order and gave the same tokens on
    the lesson's run, r0 silent from its abort on; its AsyncScheduler pipelines as minivllm's does."""
    from autograder import lesson01 as L01
    from autograder import vllm_oracle

    rec = vllm_oracle.recorded("lesson01", "demo_step_phases")
    assert not [o for s, outs in rec["outputs"].items() if int(s) >= 3 for o in outs if o[0] == "r0"]
    monkeypatch.setattr(vllm_oracle, "vllm_python", lambda: None)
    L01.vllm_side_by_side(run_engine())
    out = capsys.readouterr().out
    assert "读取录制结果" in out and "✗" not in out
    assert sum(line.endswith("✓") for line in out.splitlines()) == len(rec["outputs"])
    assert "vLLM AsyncScheduler     S0 S1 U0 S2 U1" in out
    orders = [line.split("AsyncScheduler")[1].strip() for line in out.splitlines() if "AsyncScheduler" in line]
    assert len(orders) == 2 and orders[0] == orders[1]
