"""The deterministic counts that lessons 3, 4, 8 and 9 argue from (issue #51 item 4): the text quotes these, so a
change that moves one must fail here rather than leave the prose wrong. Wall-clock numbers are never asserted;
lesson 5's V1/V2 table is checked for aligned columns on a hand-built run."""
from types import SimpleNamespace

from autograder import lesson03 as L03
from autograder import lesson04 as L04
from autograder import lesson08 as L08
from autograder import lesson09 as L09
from autograder.common import width
from autograder.lesson05.demo import print_v1_v2


def test_lesson03_prefix_cache_counts():
    """Figure 3-2/3-3: 528-token prompts, 512 shared; from the second request on only 16 are computed."""
    runs = L03.ttft_runs(repeats=1)
    assert L03.computed_tokens(runs, False) == [528] * 8
    assert L03.computed_tokens(runs, True) == [528] + [16] * 7
    assert (runs[True].hits, runs[True].queries) == (3584, 4224)


def test_lesson04_recompute_cost_counts():
    """Table 4-1's token and preemption columns (its seconds column is only this machine's)."""
    rows = {r["prefix_caching"]: r for r in L04.recompute_cost(repeats=1)}
    assert (rows[False]["preemptions"], rows[False]["steps"], rows[False]["computed_tokens"],
            rows[False]["recomputed_tokens"]) == (18, 59, 719, 379)
    assert (rows[True]["preemptions"], rows[True]["steps"], rows[True]["computed_tokens"],
            rows[True]["recomputed_tokens"]) == (5, 60, 419, 79)


def test_lesson08_grammar_steps():
    """The demo cell's count: 12 steps wait for a bitmask. How many finish before the forward is timing (12/12 in
    every loaded run we made), so only its bounds are asserted."""
    g = L08.grammar_steps(L08.run_demo().events)
    assert g["steps"] == 12
    assert 0 <= g["before_forward_end"] <= g["steps"] and 0 < g["median_us"] <= g["max_us"]


def test_lesson09_k_sweep_counts():
    """Figure 9-1: 40 steps without speculation; steps and accepted drafts per k; greedy output unchanged."""
    sweep = L09.k_sweep()
    assert (sweep["plain_steps"], sweep["total"]) == (40, 120)
    got = [(r["k"], r["steps"], r["accepted"], r["same"]) for r in sweep["rows"]]
    assert got == [(1, 34, 21, True), (2, 33, 27, True), (3, 32, 33, True), (5, 31, 37, True)]


def test_lesson05_v1_v2_table_columns_line_up(capsys):
    step = SimpleNamespace(rows=["0", "1"], condensed=[(2, 0)], swapped=[(0, 1)], before=["0", "1", "2"])
    run = SimpleNamespace(batch_log=[step, SimpleNamespace(rows=["1"], condensed=[], swapped=[], before=["1"])],
                          v2=[({3: "0", 2: "1"}, ["1", "0"], [2, 3]), ({2: "1"}, ["1"], [2])])
    print_v1_v2(run)
    lines = capsys.readouterr().out.splitlines()[:3]
    head = lines[0]
    for title in ("moves (condense / swap)", "V2 slots 0..3", "idx_mapping (batch order)"):
        col = width(head[:head.index(title)])
        assert head[col - 2:col] == "  ", (title, head)  # two spaces before every header
        for row in lines[1:]:  # every row's cell starts in the header's column
            assert row[col - 1] == " " and row[col] != " ", (title, row)
