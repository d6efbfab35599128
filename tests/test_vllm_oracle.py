"""minivllm against the pinned vLLM itself (autograder/vllm_oracle): the same seeded workloads through vLLM's own objects
and minivllm's, driven at the same level by one harness.

Without vLLM installed (make test) every comparison runs against vLLM's recorded answers (data/vllm_oracle/*.json.xz,
whose header carries the vLLM version and the provenance check of the code that answered). With MINIVLLM_VLLM_LIVE=1
and .venv-vllm (make test-vllm), vLLM re-answers every case and must equal its recording.
"""
from __future__ import annotations

import copy
import os

import pytest

from autograder import vllm_oracle
from autograder.pin import VLLM_VERSION
from autograder.vllm_oracle import COMPARISONS, KINDS, compare, load_recording, recorded

LIVE = os.environ.get("MINIVLLM_VLLM_LIVE") == "1"


@pytest.mark.parametrize("kind", KINDS)
def test_recording_is_vllm_0_27_1s_code(kind):
    header = load_recording(kind)["header"]
    assert header["vllm_version"] == VLLM_VERSION
    prov = header["provenance"]
    assert prov["ok"] and prov["differs"] == 0 and prov["missing"] == 0 and prov["identical"] > 2000, prov
    assert len(recorded(kind)) == len(COMPARISONS[kind].cases())


@pytest.mark.parametrize("kind", KINDS)
def test_minivllm_equals_vllm(kind):
    n, diffs = compare(kind)
    assert not diffs, f"{len(diffs)} of {n} {kind} cases differ from vLLM {VLLM_VERSION}; the first:\n" + "\n".join(diffs[:3])


def test_scheduler_workloads_cover_what_they_claim():
    """The recorded scheduler runs exercise preemption, prefix hits, aborts, async scheduling and every finish."""
    answers = [a for a in recorded("scheduler") if "error" not in a]
    cases = COMPARISONS["scheduler"].cases()
    events = [e for a in answers for e in a["events"]]
    assert len(answers) >= 1000
    assert sum(any(e.get("preempted") for e in a["events"]) for a in answers) >= 100
    assert sum(any(n[2] > 0 for e in a["events"] if e["k"] == "s" for n in e["new"]) for a in answers) >= 100
    assert sum(any(e["k"] == "a" for e in a["events"]) for a in answers) >= 100
    assert sum(c["config"]["async_scheduling"] for c in cases) >= 300
    reasons = {o[2] for e in events if e["k"] == "u" for o in e["out"]}
    assert {"stop", "length"} <= reasons
    assert any(o[3] == 2 for e in events if e["k"] == "u" for o in e["out"])  # a stop_token_ids stop


def test_a_divergence_is_found_and_located():
    """The comparison can fail: one changed block id in vLLM's answer is reported with its step and field."""
    comparison = COMPARISONS["scheduler"]
    answer = recorded("scheduler")[0]
    changed = copy.deepcopy(answer)
    event = next(e for e in changed["events"] if e["k"] == "s" and e["new"])
    event["new"][0][1] = [b + 1 for b in event["new"][0][1]]
    assert comparison.first_divergence(answer, answer) is None
    msg = comparison.first_divergence(changed, answer)
    assert msg and f"step {event['step']} (schedule)" in msg and "'new'" in msg


def test_the_async_prefix_caching_fix_is_what_the_oracle_checks(monkeypatch):
    """Without caching the blocks that async placeholders' tokens fill (vLLM's AsyncScheduler does, in
    _update_request_with_output), minivllm's block ids diverge from vLLM's on some recorded workloads."""
    from minivllm.core.kv_cache_manager import KVCacheManager

    def cache_only_at_allocation(self, request, num_computed_tokens, req_blocks=None):
        if req_blocks is None:  # the call from AsyncScheduler after the output arrived
            return self.num_cached_block.get(request.request_id, 0)
        return original(self, request, num_computed_tokens, req_blocks)

    original = KVCacheManager.cache_blocks
    monkeypatch.setattr(KVCacheManager, "cache_blocks", cache_only_at_allocation)
    n, diffs = compare("scheduler")
    assert len(diffs) >= 10, f"only {len(diffs)} of {n} diverged"


@pytest.mark.skipif(not LIVE, reason="live vLLM comparisons run in `make test-vllm` (MINIVLLM_VLLM_LIVE=1)")
@pytest.mark.parametrize("kind", KINDS)
def test_live_vllm_equals_its_recording_and_minivllm(kind):
    assert vllm_oracle.vllm_python() is not None, "MINIVLLM_VLLM_LIVE=1 needs .venv-vllm: run `make vllm`"
    assert vllm_oracle.provenance_summary()["ok"]
    comparison = COMPARISONS[kind]
    live = vllm_oracle.live_answers(kind)[vllm_oracle.CASES]
    stale = [d for a, b in zip(live, recorded(kind), strict=True) if (d := comparison.first_divergence(a, b))]
    assert not stale, f"vLLM's live answers differ from its recording ({len(stale)}): {stale[:2]}"
    n, diffs = compare(kind, live)
    assert not diffs, f"{len(diffs)} of {n} differ from live vLLM: {diffs[:2]}"


def test_min_tokens_holds_eos_back_even_with_ignore_eos(monkeypatch):
    """vLLM puts EOS into all_stop_token_ids whatever ignore_eos says (SamplingParams.update_from_generation_config),
    and MinTokensLogitsProcessor masks all of them: an EOS-leaning row with ignore_eos and min_tokens not reached
    samples another token. Letting EOS through there (minivllm before the fix) diverges on recorded cases."""
    import minivllm.worker.gpu_input_batch as gib

    original = gib.InputBatch.add_request

    def add_request_ignoring_eos_for_min_tokens(self, state):
        idx = original(self, state)
        sp = state.sampling_params
        if idx in self.min_tokens and sp.ignore_eos:
            mt, n_prompt, ids = self.min_tokens[idx]
            ids = [i for i in ids if i != state.eos_token_id or i in (sp.stop_token_ids or ())]
            if ids:
                self.min_tokens[idx] = (mt, n_prompt, ids)
            else:
                del self.min_tokens[idx]
        return idx

    monkeypatch.setattr(gib.InputBatch, "add_request", add_request_ignoring_eos_for_min_tokens)
    n, diffs = compare("sampler")
    assert diffs and all("sampled" in d for d in diffs), diffs[:2]


def test_detokenizer_cases_cover_stops_hold_back_and_split_characters(monkeypatch):
    """The recorded detokenizer runs hit stop strings (kept and cut), hold text back while streaming, see U+FFFD
    from a character split across tokens; and minivllm without the hold-back diverges from them."""
    answers = recorded("detokenizer")
    assert sum(any(e[0] is not None for e in a["events"]) for a in answers) >= 50
    assert sum("\ufffd" in "".join(e[1] for e in a["events"]) for a in answers) >= 10
    from minivllm.engine.detokenizer import IncrementalDetokenizer

    original = IncrementalDetokenizer.get_next_output_text
    monkeypatch.setattr(IncrementalDetokenizer, "get_next_output_text",
                        lambda self, finished, delta: original(self, True, delta))
    n, diffs = compare("detokenizer")
    assert len(diffs) >= 20, f"only {len(diffs)} of {n}"


def test_completion_logprobs_are_vllm_logprob_entries():
    """CompletionOutput.logprobs: per position {token: Logprob(logprob, rank, decoded_token)} as in vLLM, the
    sampled token first; logprobs=0 gives the sampled token alone (with its true rank)."""
    from minivllm import LLM, SamplingParams
    from minivllm.logprobs import Logprob

    llm = LLM(multiprocess=False, enforce_eager=True)
    tok = llm.get_tokenizer()
    greedy, sampled = llm.generate(["ROMEO:", "JULIET:"], [SamplingParams(max_tokens=4, temperature=0, logprobs=2),
                                                            SamplingParams(max_tokens=6, seed=3, logprobs=0)],
                                   use_tqdm=False)
    for token, entries in zip(greedy.outputs[0].token_ids, greedy.outputs[0].logprobs, strict=True):
        assert all(isinstance(v, Logprob) for v in entries.values())
        assert next(iter(entries)) == token and entries[token].rank == 1 and len(entries) == 2
        assert [v.rank for v in entries.values()] == [1, 2]
        # a token's own text; one ending in U+FFFD (part of a character) is corrected from the context instead
        assert all(v.decoded_token == tok.decode([t]) or tok.decode([t]).endswith("\ufffd")
                   for t, v in entries.items())
        assert all(v.logprob == float(v) <= 0 for v in entries.values())
    ranks = []
    for token, entries in zip(sampled.outputs[0].token_ids, sampled.outputs[0].logprobs, strict=True):
        assert list(entries) == [token]
        ranks.append(entries[token].rank)
    assert all(r >= 1 for r in ranks) and abs(sampled.outputs[0].cumulative_logprob -
                                              sum(e[t] for t, e in zip(sampled.outputs[0].token_ids,
                                                                       sampled.outputs[0].logprobs, strict=True))) < 1e-5


def test_structured_output_walks_cover_drafts_and_can_diverge(monkeypatch):
    """The recorded grammar walks include draft rows and terminated grammars; a mask that also lets EOS through
    everywhere (a classic choice/regex mistake) diverges from vLLM's rows."""
    answers = recorded("structured_output")
    assert sum("draft_rows" in s for a in answers for s in a["steps"]) >= 50
    assert sum(a["terminated"] for a in answers) >= 20
    from minivllm.structured_output.backend_xgrammar import XgrammarGrammar

    original = XgrammarGrammar.fill_bitmask

    def eos_always(self, bitmask, idx):
        original(self, bitmask, idx)
        bitmask[idx, 0] |= 1 << 2  # token 2, the shipped model's EOS

    monkeypatch.setattr(XgrammarGrammar, "fill_bitmask", eos_always)
    n, diffs = compare("structured_output")
    assert len(diffs) >= 20, f"only {len(diffs)} of {n}"


def _generate_cases(spec: bool, models: tuple[str, ...] | None = None) -> list[dict]:
    return [c for c in COMPARISONS["generate"].cases() if c["spec"] == spec and c["model"] in (models or c["model"])]


def test_speculation_keeps_every_constraint_in_vllms_answers():
    """In the recorded generate runs (which minivllm equals, test_minivllm_equals_vllm[generate]), on all three
    model shapes: every greedy row (penalties, allowed_token_ids, bad words, min_tokens, stop strings and ids,
    logprobs, a regex) gives the same tokens with n-gram speculation as without, with drafts accepted; every
    row, seeded ones too, keeps its constraints under speculation (tokens inside allowed_token_ids, no bad word
    completed, no stop id before min_tokens); min_p and logit_bias are refused with vLLM's error."""
    from minivllm.tokenizer import get_tokenizer

    tok = get_tokenizer("data/models/shakespeare-llama")
    answers = {(a["model"], a["spec"]): a for a in recorded("generate")}
    for case in _generate_cases(True):
        plain, spec = answers[(case["model"], False)], answers[(case["model"], True)]
        assert spec["counters"]["spec_decode_num_accepted_tokens"] > 0
        assert [c["error"][0] for c in spec["calls"][2:]] == ["VLLMValidationError"] * 2
        for i, req in enumerate(case["calls"][0]):
            p = req["params"]
            got = spec["calls"][0]["outputs"][i]["completions"]
            if p["temperature"] == 0:
                assert got == plain["calls"][0]["outputs"][i]["completions"], (case["model"], i)
            for c in got:
                ids = c["token_ids"]
                if "allowed_token_ids" in p:
                    assert set(ids) <= set(p["allowed_token_ids"])
                for word in p.get("bad_words", ()):
                    for w in (tok.encode(word.lstrip(), add_special_tokens=False),):
                        assert not any(ids[k:k + len(w)] == w for k in range(len(ids))), (word, ids)
                if p.get("min_tokens"):
                    assert not set(ids[:p["min_tokens"]]) & set(p.get("stop_token_ids", []) + [2])


GENERATE_MUTANTS = {
    # what issue #54 found, put back: (the cases it shows on, the patch)
    "speculation applies min_tokens only": (True, "minivllm.worker.gpu_model_runner.GPUModelRunner._spec_logits"),
    "speculation accepts min_p and logit_bias": (True, "minivllm.engine.input_processor.InputProcessor.process_inputs"),
    "no bad words": (False, "minivllm.sample.sampler.apply_bad_words"),
    "logit_bias clamped offline": (False, "minivllm.engine.input_processor.InputProcessor.process_inputs"),
    "a skipped lookup counted as a query": (False, "minivllm.core.kv_cache_manager.KVCacheManager."
                                                   "record_prefix_cache_stats"),
    "decoded_token left as U+FFFD": (False, "minivllm.engine.output_processor.decoded_tokens"),
}


@pytest.mark.parametrize("mutant", GENERATE_MUTANTS)
def test_the_generate_comparison_catches_each_difference_of_issue_54(mutant, monkeypatch):
    """Each difference issue #54 measured, put back into minivllm, diverges from vLLM's recorded answers (the
    tiny Qwen3's case with speculation or without, as the difference needs: one case keeps make test short)."""
    import msgspec

    import minivllm.core.kv_cache_manager as kvm
    import minivllm.engine.input_processor as proc
    import minivllm.sampling_params as smp
    from minivllm.worker.gpu_model_runner import GPUModelRunner

    spec, target = GENERATE_MUTANTS[mutant]
    if mutant == "speculation applies min_tokens only":
        monkeypatch.setattr(GPUModelRunner, "_spec_logits", lambda self, logits, spec_md, emit: logits)
    elif mutant == "speculation accepts min_p and logit_bias":
        original = proc.InputProcessor.process_inputs

        def no_refusal(self, *args, **kwargs):
            self.speculative_config = None
            return original(self, *args, **kwargs)
        monkeypatch.setattr(proc.InputProcessor, "process_inputs", no_refusal)
    elif mutant == "no bad words":
        monkeypatch.setattr("minivllm.sample.sampler.apply_bad_words", lambda logits, bad_words: None)
    elif mutant == "logit_bias clamped offline":
        original = proc.InputProcessor.process_inputs

        def clamp(self, request_id, prompt, params, *args, **kwargs):
            if params.logit_bias:
                params = smp.SamplingParams.from_optional(**msgspec.structs.asdict(params))
            return original(self, request_id, prompt, params, *args, **kwargs)
        monkeypatch.setattr(proc.InputProcessor, "process_inputs", clamp)
    elif mutant == "a skipped lookup counted as a query":
        monkeypatch.setattr(kvm.KVCacheManager, "record_prefix_cache_stats", lambda self, request, num_hits:
                            self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0))
    else:
        monkeypatch.setattr("minivllm.engine.output_processor.decoded_tokens",
                            lambda tokenizer, ids, context: [tokenizer.decode([t]) for t in ids])
    comparison = COMPARISONS["generate"]
    cases = _generate_cases(spec, ("tiny-qwen3",))
    want = {(a["model"], a["spec"]): a for a in recorded("generate")}
    mine = comparison.minivllm(cases)
    diffs = [d for c, m in zip(cases, mine, strict=True)
             if (d := comparison.first_divergence(want[(c["model"], c["spec"])], m))]
    assert len(diffs) == len(cases), (target, diffs)


def test_repin_lists_every_step_in_order(capsys):
    """`repin --dry-run` names the pinned version and, in order: names list, provenance hashes, goldens (every
    engine comparison and the server), lesson recordings (every lesson), each lesson's diagnosis; it runs none."""
    from autograder.common import discover_lessons
    from autograder.pin import NAMES_LIST, VLLM_VERSION, WHEEL_HASHES

    assert vllm_oracle.main(["repin", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith(f"[repin {VLLM_VERSION}] ") for line in lines)
    assert NAMES_LIST.name in lines[0] and WHEEL_HASHES.name in lines[1]
    assert lines[2].endswith(" ".join(("record", *KINDS, "server")))
    assert lines[3].endswith(" ".join(("record", *vllm_oracle.LESSONS)))
    assert [line.split()[-1] for line in lines[4:]] == discover_lessons()
    with pytest.raises(SystemExit, match="--wheel"):
        vllm_oracle.main(["repin"])


def test_the_pin_is_the_one_place_that_names_vllms_version_and_commit():
    """autograder/pin.py names the pinned vLLM. No other line of the code, the tests, the benchmarks, the lesson
    sources (they write {{VLLM_VERSION}}, build.py fills it in), the Makefile (it reads pin.py once) or the READMEs
    names its version or commit, except two that must equal the pin: the value minivllm's /version serves (the
    engine does not import the autograder) and the README's one statement of the pin."""
    import re
    import subprocess

    from autograder.pin import REPO, VLLM_COMMIT, VLLM_VERSION
    from minivllm.entrypoints.openai.api_server import VLLM_API_VERSION

    literal = re.compile("|".join(map(re.escape, (VLLM_VERSION, VLLM_COMMIT))))
    files = [p for d in ("minivllm", "autograder", "tests", "benchmarks", "solutions") for p in (REPO / d).rglob("*.py")]
    files += [REPO / n for n in ("Makefile", "README.md", "autograder/README.md", ".ci/run", "pyproject.toml")]
    allowed = {("autograder/pin.py", "VLLM_VERSION = "), ("autograder/pin.py", "VLLM_COMMIT = "),
               ("minivllm/entrypoints/openai/api_server.py", "VLLM_API_VERSION = "),
               ("README.md", f"source (pinned to vLLM {VLLM_VERSION}, commit `{VLLM_COMMIT}`")}
    found = [f"{path.relative_to(REPO)}:{i}: {line.strip()}" for path in sorted(files)
             for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if literal.search(line) and not any(path.relative_to(REPO).as_posix() == f and line.lstrip().startswith(
                 start) for f, start in allowed)]
    assert not found, found
    assert VLLM_API_VERSION == VLLM_VERSION  # /version serves the pinned vLLM's API version
    out = subprocess.run(["make", "-s", "--no-print-directory", "--eval", "pin-version: ; @echo $(VLLM_VERSION)",
                          "pin-version"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == VLLM_VERSION, out.stderr
