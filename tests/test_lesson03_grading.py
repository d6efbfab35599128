"""Lesson 3's grader: the solution earns 4/4 code points, the unfilled release 0, every mutant loses points;
the real engine shows the damage each wrong answer does; nbgrader agrees end to end."""

import pytest
from grading_flow import namespace_scores

from autograder.common import CheckFailed
from autograder.lesson03 import (
    FUNCS,
    check_source_map,
    pressure_prompts,
    reference_runs,
    run_batch,
    run_eviction_order,
    run_sequential,
)
from autograder.mutation import mutant_namespace, mutants
from autograder.pin import VLLM_VERSION

UNIT_PARTS = ("l03_main_path", "l03_boundary", "l03_source_map")


def mutant(name):
    ns = mutant_namespace("lesson03", name)
    return {k: ns[k] for k in FUNCS}


def funcs(ns):
    return [ns[k] for k in FUNCS]


@pytest.mark.parametrize("name", sorted(mutants("lesson03")))
def test_mutant_loses_unit_points(name, solution_ns):
    """Fast: the parts that need no engine."""
    scores = namespace_scores("lesson03", dict(solution_ns, **mutant(name)), UNIT_PARTS)
    failed = {k for k, v in scores.items() if v == 0}
    assert mutants("lesson03")[name].fails & set(UNIT_PARTS) <= failed, scores
    assert failed, scores


def test_source_map_accepts_spellings_and_rejects_swaps(solution_ns):
    good = solution_ns["SOURCE_MAP"]
    check_source_map({k: f"self.{v}()" for k, v in good.items()})
    check_source_map(dict(good, free_link="KVCacheBlock.next_free_block", null_flag="block.is_null",
                          lookup_gate="self.prefix_cache_lookup_enabled(request)",
                          evict_hashes="self._remove_cached_block_hashes(block)"))
    for bad in (dict(good, lookup_gate=good["evict_hashes"], evict_hashes=good["lookup_gate"]),
                dict(good, evict_hashes="_maybe_evict_cached_block"), dict(good, free_link="prev_free_block"),
                dict(good, lookup_gate="enable_caching"),
                {k: v for k, v in good.items() if k != "null_flag"}, dict(good, hashed_count=None)):
        with pytest.raises(AssertionError):
            check_source_map(bad)


@pytest.mark.slow
def test_real_engine_shows_each_bug():
    """Independent of the exact-stats rule: the engine's own outputs, hits and block ids show the damage."""
    ref = reference_runs()
    assert ref["batch"].tokens == ref["batch_off"].tokens and ref["batch"].hits > 0  # the invariant holds
    assert ref["pressure"].tokens == ref["pressure_off"].tokens
    # Same tokens at another position share a hash: the wrong KV is reused, logprobs move.
    collide = run_batch(funcs(mutant("hash_without_parent")))
    assert any(abs(a - b) > 1e-3 for rid in collide.logprobs
               for a, b in zip(collide.logprobs[rid], ref["batch_off"].logprobs[rid], strict=True))
    # A full hit with no cap leaves 0 tokens to compute: the scheduler refuses it loudly.
    with pytest.raises(CheckFailed, match="prefix hit covers the whole request"):
        run_batch(funcs(mutant("no_cap")))
    # Tail eviction hands out the most recently freed blocks first.
    assert run_eviction_order(funcs(mutant("evict_from_tail"))).new_block_ids[-1] != [6]
    assert run_eviction_order().free_order == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    assert run_eviction_order().new_block_ids[-1] == [6]
    # A reused block that keeps its hash is "hit" after its KV was overwritten.
    stale = run_sequential(funcs(mutant("stale_hash_kept")))
    assert stale.hits > ref["pressure"].hits
    assert stale.cached["r5"] > 0 and ref["pressure"].cached["r5"] == 0
    # Hashing the partial block loses the next chat turn's hit on the previous answer.
    partial = run_sequential(funcs(mutant("partial_blocks_hashed")), prompts=pressure_prompts())
    assert partial.cached["r1"] < ref["pressure"].cached["r1"] == 64


# ---------------------------------------------------------------------------- against the pinned vLLM (recorded)
def test_minivllms_kv_cache_manager_answers_every_recorded_scenario_as_vllm_does():
    from autograder import vllm_oracle
    from autograder.lesson03 import run_vllm_view

    for name in vllm_oracle.scenarios("lesson03"):
        assert run_vllm_view(name) == vllm_oracle.recorded("lesson03", name), name


def test_vllm_comparison_passes_the_solution_and_catches_wrong_pieces(solution_ns):
    from autograder.lesson03 import compare_with_vllm

    pieces = ("request_block_hasher", "get_computed_blocks", "get_new_blocks")
    for prefixes in (("demo_", "main_"), ("boundary_",)):
        compare_with_vllm(*(solution_ns[k] for k in pieces), prefixes)
    for name, prefixes in (("generated_tokens_not_hashed", ("boundary_",)), ("cap_from_prompt_length", ("boundary_",)),
                           ("stale_hash_kept", ("demo_",)), ("key_drops_last_token", ("boundary_",))):
        ns = dict(solution_ns, **mutant(name))
        with pytest.raises(CheckFailed, match=f"vLLM {VLLM_VERSION}"):
            compare_with_vllm(*(ns[k] for k in pieces), prefixes)


def test_vllm_side_by_side_from_the_recording(monkeypatch, capsys):
    from autograder import vllm_oracle
    from autograder.lesson03 import vllm_side_by_side

    monkeypatch.setattr(vllm_oracle, "vllm_python", lambda: None)
    vllm_side_by_side()
    out = capsys.readouterr().out
    assert "读取录制结果" in out and "[6, 10, 5, 4, 3, 2, 1, 9, 8, 7]" in out and "✗" not in out
