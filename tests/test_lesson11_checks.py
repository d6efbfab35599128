"""Lesson 11's checks (autograder/lesson11/checks.py) pass the reference answer and reject the issue's mutants.

The reference answer and the mutants live here until the lesson's solution notebook exists; each mutant
is the reference with one misconception (#21): the largest size instead of the smallest that fits,
padded slots writing block 0, stale inputs left in the static buffers, padded rows' logits returned,
padded rows' positions out of range.
"""
from __future__ import annotations

import pytest

from autograder.common import CheckFailed
from autograder.lesson11 import checks as L11


def choose_capture_size(num_reqs, capture_sizes):
    fits = [s for s in capture_sizes if s >= num_reqs]
    return min(fits) if fits else None


def fill_static_buffers(bufs, input_ids, positions, slot_mapping, seq_lens, block_table, size, *,
                        pad_slot=-1, pad_position=0, clear=True):
    n = input_ids.shape[0]
    bufs.input_ids[:n] = input_ids
    bufs.positions[:n] = positions
    bufs.slot_mapping[:n] = slot_mapping
    bufs.seq_lens[:n] = seq_lens
    if clear:
        bufs.block_table[:size] = 0
        bufs.input_ids[n:size] = 0
        bufs.seq_lens[n:size] = 0
    bufs.block_table[:n, :block_table.shape[1]] = block_table
    bufs.positions[n:size] = pad_position
    bufs.slot_mapping[n:size] = pad_slot


def real_rows(logits, num_reqs):
    return logits[:num_reqs]


REFERENCE = (choose_capture_size, fill_static_buffers, real_rows)
# name -> (answer, a phrase the failure message must carry)
MUTANTS = {
    "largest_size": ((lambda n, sizes: max(sizes) if n <= max(sizes) else None, fill_static_buffers, real_rows),
                     "能装下的最小尺寸"),
    "pad_slot_block_0": ((choose_capture_size, lambda *a: fill_static_buffers(*a, pad_slot=0), real_rows),
                         "填充行必须不写 KV"),
    "stale_inputs": ((choose_capture_size, lambda *a: fill_static_buffers(*a, clear=False), real_rows), "残留"),
    "padded_logits": ((choose_capture_size, fill_static_buffers, lambda logits, n: logits), "真实行"),
    "position_out_of_range": ((choose_capture_size, lambda *a: fill_static_buffers(*a, pad_position=10 ** 6),
                               real_rows), "position 越界"),
}


@pytest.mark.slow
def test_reference_passes_both_checks():
    L11.check_main_path(*REFERENCE)
    L11.check_boundary(*REFERENCE)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_each_mutant_fails_a_check(name):
    answer, phrase = MUTANTS[name]
    failed = []
    for check in (L11.check_main_path, L11.check_boundary):
        try:
            check(*answer)
        except CheckFailed as e:
            failed.append(str(e))
    assert failed, f"mutant {name} passed every check"
    assert any(phrase in msg for msg in failed), failed


@pytest.mark.slow
def test_demo_padding_table_and_cost():
    from autograder.lesson11 import demo
    table = demo.padding_table([1, 2, 4, 8], 9)
    assert [r["size"] for r in table] == [1, 2, 4, 4, 8, 8, 8, 8, None]
    assert [r["wasted"] for r in table][:5] == [0, 0, 1, 0, 3]
    rows = demo.padding_cost(batch_sizes=(3,), capture_sizes=(4,), pairs=1)
    assert rows[0]["size"] == 4 and rows[0]["unpadded_ms"] > 0 and rows[0]["padded_ms"] > 0
    if not __import__("torch").cuda.is_available():
        assert demo.launch_counts() is None


def test_source_map_accepts_vllm_names_and_rejects_others():
    good = {"choose_capture_size": "CudagraphDispatcher._bs_to_padded_graph_size",
            "fill_static_buffers": "GPUModelRunner._prepare_inputs()", "real_rows": "logits_indices"}
    L11.check_source_map(good)
    with pytest.raises(CheckFailed, match="real_rows"):
        L11.check_source_map(good | {"real_rows": "compute_logits"})
    with pytest.raises(CheckFailed, match="键应恰好是"):
        L11.check_source_map({"choose_capture_size": "dispatch"})
    assert L11.LESSON.total == 10 and sum(p.points for p in L11.LESSON.parts if not p.manual) == 4
