"""Lesson 5's grader: the solution earns 4/4 code points, the unfilled release 0 without crashing, every mutant
loses the parts its table names; the engine run covers every kind of row the lesson promises; the plug restores
the runner; the vectorisation gate is deterministic (line counts) and rejects a per-token loop; nbgrader agrees."""
import json

import numpy as np
import pytest
from grading_flow import namespace_scores

from autograder.common import REPO, CheckFailed
from autograder.lesson05 import (
    LINE_BUDGET,
    MAX_TOKENS,
    NAMES,
    big_batch,
    check_source_map,
    check_vectorised,
    count_lines,
    engine_inputs,
    hf_greedy,
    per_token_loop,
    plugged,
    recorded_steps,
    reference_run,
    run_engine,
    spec_reference_run,
)
from autograder.mutation import mutant_namespace, mutants

UNIT_PARTS = ("l05_main_path", "l05_boundary", "l05_source_map")


def mutant(name):
    return mutant_namespace("lesson05", name)["prepare_inputs"]


def test_the_engine_run_mixes_every_kind_of_row():
    feats = set().union(*(s.features for s in recorded_steps()))
    assert {"new_prefill", "partial_chunk", "final_chunk", "decode", "prefix_hit", "moved_row",
            "order_differs"} <= feats, feats
    mixed = [s for s in recorded_steps() if {"decode", "prefix_hit"} <= s.features]
    assert mixed and any(s.so.num_scheduled_tokens[r] > 1 for s in mixed for r in s.so.num_scheduled_tokens)


@pytest.mark.slow
def test_the_speculative_run_schedules_drafts_and_keeps_the_greedy_text():
    """check_main_path / check_real_engine's second run (#56): rows with more scheduled tokens than known ones,
    the drafts written after the known tokens; its greedy text equals the same engine without drafts."""
    spec = spec_reference_run()
    rows = [(st, r) for st in spec.steps for r in st.so.scheduled_spec_decode_tokens]
    assert rows
    for st, r in rows:
        i = st.batch.req_id_to_index[r]
        draft = st.so.scheduled_spec_decode_tokens[r]
        n = int(st.batch.num_tokens[i])
        assert st.batch.num_computed_tokens_cpu[i] + st.so.num_scheduled_tokens[r] > n
        assert st.batch.token_ids_cpu[i, n:n + len(draft)].tolist() == draft
    plain = run_engine(max_tokens=len(spec.tokens[0]), arrivals=[0] * len(spec.tokens))
    assert spec.tokens == plain.tokens


@pytest.mark.slow
def test_the_reference_run_equals_hf_greedy():
    """The tokens check_real_engine holds a plugged run to: the engine's own run equals HF's greedy tokens."""
    ref = reference_run()
    assert [len(t) for t in ref.tokens] == MAX_TOKENS
    assert ref.tokens == [hf_greedy([p], n)[0] for p, n in zip(ref.prompt_ids, MAX_TOKENS, strict=True)]


@pytest.mark.parametrize("name", sorted(mutants("lesson05")))
def test_mutant_loses_unit_points(name, solution_ns):
    """Fast: the parts that need no engine (the per-token loop mutant is right everywhere but the cost gate)."""
    scores = namespace_scores("lesson05", dict(solution_ns, prepare_inputs=mutant(name)), UNIT_PARTS)
    failed = {k for k, v in scores.items() if v == 0}
    assert mutants("lesson05")[name].fails & set(UNIT_PARTS) <= failed, scores


def test_vectorisation_gate_is_deterministic_and_rejects_a_loop(solution_ns):
    so, batch = big_batch()
    fn = solution_ns["prepare_inputs"]
    assert count_lines(fn, so, batch, 16) == count_lines(fn, so, batch, 16) <= 40
    assert count_lines(per_token_loop, so, batch, 16) > 10 * so.total_num_scheduled_tokens // 10
    want = engine_inputs(so, batch, 16)
    assert all((want[k] == v).all() for k, v in zip(NAMES, per_token_loop(so, batch, 16), strict=True))
    check_vectorised(fn)
    with pytest.raises(CheckFailed, match=f"上限 {LINE_BUDGET}"):
        check_vectorised(per_token_loop)
    with pytest.raises(CheckFailed, match=f"上限 {LINE_BUDGET}"):
        check_vectorised(mutant("per_token_loop"))


def test_plug_restores_the_runner(solution_ns):
    from minivllm.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._prepare_inputs
    with pytest.raises(CheckFailed), plugged(solution_ns["prepare_inputs"]):
        assert GPUModelRunner._prepare_inputs is not original
        raise CheckFailed("inside")
    assert GPUModelRunner._prepare_inputs is original


@pytest.mark.slow
@pytest.mark.parametrize("name", ["logits_for_partial_chunk", "rows_in_scheduler_order"])
def test_mutant_fails_the_real_engine(name, solution_ns):
    scores = namespace_scores("lesson05", dict(solution_ns, prepare_inputs=mutant(name)), ("l05_real_engine",))
    assert scores == {"l05_real_engine": 0}


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"`{v}`" for k, v in good.items()})
    check_source_map(dict(good, block_tables="vllm.v1.worker.block_table.MultiGroupBlockTable",
                          condense_rows="self.block_table.move_row()", sample_rows="self.optimistic_seq_lens_cpu"))
    for bad in (dict(good, condense_rows=good["swap_pair"], swap_pair=good["condense_rows"]),
                dict(good, sample_rows="discard_request_mask"), dict(good, block_tables="InputBatch"),
                dict(good, swap_pair="swap_states"), {k: v for k, v in good.items() if k != "flat_offsets"}):
        with pytest.raises(AssertionError):
            check_source_map(bad)


def test_student_copy_shows_the_blanks():
    cells = {c["id"]: "".join(c["source"])
             for c in json.loads((REPO / "notebooks/lesson05/lesson05.ipynb").read_text(encoding="utf-8"))["cells"]}
    code = cells["l05_prepare_inputs"]
    assert code.count("______") == 7 and "### BLANK" not in code
    for line in ("req_ids = ______", "positions = ______", "slot_mapping = ______", "logits_indices = ______"):
        assert line in code, line
    assert "block_table[" not in code and "cu_num_tokens[" not in code
    assert "assert logits.tolist() == [0, 9]" in cells["l05_main_path"]
    assert np.array([1])  # numpy is importable in the student kernel's environment


