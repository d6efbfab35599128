"""Structured outputs (xgrammar) through the real engine, on the default model (a real byte-level BPE tokenizer).

Oracles: json + jsonschema for JSON outputs, `re.fullmatch` for regexes, the `regex` package's partial
matching for length-capped prefixes, a constraint-free run for the free requests of a mixed batch, and
HF transformers with a mask built bit by bit from a fresh xgrammar matcher for the constrained greedy tokens.
"""
from __future__ import annotations

import json
import re
import threading
import time
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest
import regex
import torch

from minivllm import LLM, SamplingParams
from minivllm.config import DEFAULT_MODEL, EngineArgs
from minivllm.core.sched.output import GrammarOutput
from minivllm.engine import EngineCoreRequest
from minivllm.engine.core import EngineCore
from minivllm.request import RequestStatus
from minivllm.sampling_params import StructuredOutputsParams as SO
from minivllm.structured_output.backend_types import StructuredOutputOptions
from minivllm.structured_output.utils import apply_grammar_bitmask
from minivllm.tokenizer import get_tokenizer

ENGINE = dict(device="cpu", attention_backend="torch", max_model_len=256)
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "role"],
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "role": {"enum": ["king", "queen", "fool"]}}}
PROMPTS = ["ROMEO:", "JULIET:", "KING HENRY:", "First Citizen:\nBefore we proceed", "HAMLET:\nTo be"]
CHOICES = ["yes", "no", "perchance", "never, my lord"]
PATTERN = r"(Act|Scene) [IVX]{1,4}: [a-z]{3,10}"


def person(**kw) -> SamplingParams:
    return SamplingParams(max_tokens=64, structured_outputs=SO(json=PERSON, disable_any_whitespace=True), **kw)


@pytest.fixture(scope="module")
def llm():
    return LLM(multiprocess=False, trace=True, **ENGINE)


@pytest.fixture(scope="module")
def tokenizer():
    return get_tokenizer(DEFAULT_MODEL)


def core_of(llm: LLM) -> EngineCore:
    return llm.llm_engine.engine_core.engine_core


def texts(outs) -> list[tuple[str, str]]:
    return [(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]


def test_json_schema_outputs_parse_and_validate(llm):
    params = [person(temperature=0.0)] * 2 + [person(temperature=1.0, seed=s) for s in range(6)]
    prompts = (PROMPTS * 2)[:len(params)]
    outs = texts(llm.generate(prompts, params, use_tqdm=False))
    assert all(reason == "stop" for _, reason in outs), outs
    for text, _ in outs:
        jsonschema.validate(json.loads(text), PERSON)
    # The schema's own keywords did the work: free runs of the same prompts are not JSON at all.
    free = texts(llm.generate(prompts[:2], SamplingParams(max_tokens=20, temperature=0.0), use_tqdm=False))
    assert not any(t.startswith("{") for t, _ in free)


def test_json_object_and_schema_as_string(llm):
    outs = llm.generate(PROMPTS[:2], [
        SamplingParams(max_tokens=80, temperature=0.0, structured_outputs=SO(json=json.dumps(PERSON),
                                                                          disable_any_whitespace=True)),
        SamplingParams(max_tokens=80, temperature=0.0, structured_outputs=SO(json_object=True,
                                                                          disable_any_whitespace=True))],
        use_tqdm=False)
    (text, reason), (obj_text, obj_reason) = texts(outs)
    assert reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)
    if obj_reason == "stop":
        assert isinstance(json.loads(obj_text), dict)
    else:
        assert obj_text.startswith("{")


def test_choice_outputs_are_a_choice(llm):
    params = [SamplingParams(max_tokens=16, temperature=t, seed=s, structured_outputs=SO(choice=CHOICES))
              for t, s in [(0.0, None), (1.0, 0), (1.0, 1), (1.5, 2), (1.5, 3)]]
    outs = texts(llm.generate(PROMPTS, params, use_tqdm=False))
    assert all(reason == "stop" and text in CHOICES for text, reason in outs), outs


def test_regex_outputs_fullmatch(llm):
    params = [SamplingParams(max_tokens=40, temperature=t, seed=s, structured_outputs=SO(regex=PATTERN))
              for t, s in [(0.0, None), (1.0, 0), (1.0, 1), (0.8, 2)]]
    outs = texts(llm.generate(PROMPTS[:4], params, use_tqdm=False))
    assert all(reason == "stop" and re.fullmatch(PATTERN, text) for text, reason in outs), outs


def test_length_capped_output_is_a_valid_prefix(llm):
    outs = llm.generate(PROMPTS[:3], [
        SamplingParams(max_tokens=3, temperature=0.0, structured_outputs=SO(regex=PATTERN)),
        SamplingParams(max_tokens=4, temperature=1.0, seed=7, structured_outputs=SO(regex=PATTERN)),
        SamplingParams(max_tokens=5, temperature=0.0, structured_outputs=SO(json=PERSON,
                                                                         disable_any_whitespace=True))],
        use_tqdm=False)
    for out in outs[:2]:
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "length"
        assert regex.fullmatch(PATTERN, text, partial=True) and not re.fullmatch(PATTERN, text), text
    json_prefix = outs[2].outputs[0].text
    assert outs[2].outputs[0].finish_reason == "length" and json_prefix.startswith('{"name')
    # A valid prefix: some completion of it validates (close the string and add the other fields).
    full = llm.generate({"prompt_token_ids": outs[2].prompt_token_ids + outs[2].outputs[0].token_ids},
                        person(temperature=0.0), use_tqdm=False)[0].outputs[0]
    assert full.finish_reason == "stop"


def test_free_requests_equal_a_run_without_constrained_ones(llm):
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    alone = llm.generate(PROMPTS, free, use_tqdm=False)
    constrained = [person(temperature=0.0), SamplingParams(max_tokens=16, temperature=0.0,
                                                           structured_outputs=SO(choice=CHOICES)),
                   SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=SO(regex=PATTERN))]
    mixed_prompts, mixed_params = [], []
    for i, p in enumerate(PROMPTS):  # interleave: constrained rows sit between free rows in the batch
        mixed_prompts += [p, PROMPTS[-1 - i]]
        mixed_params += [free, constrained[i % len(constrained)]]
    mixed = llm.generate(mixed_prompts, mixed_params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[::2]] == [o.outputs[0].token_ids for o in alone]
    for out, sp in zip(mixed[1::2], mixed_params[1::2], strict=True):
        text, so = out.outputs[0].text, sp.structured_outputs
        if so.json is not None:
            jsonschema.validate(json.loads(text), PERSON)
        elif so.choice is not None:
            assert text in CHOICES
        else:
            assert re.fullmatch(PATTERN, text)


def test_constrained_greedy_equals_hf_with_an_xgrammar_mask(llm, tokenizer):
    """Token for token: HF's logits, masked by a fresh matcher's bitmask unpacked bit by bit, argmax."""
    import xgrammar as xgr
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32).eval()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=hf.config.vocab_size)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(PERSON), any_whitespace=False)
    prompt = PROMPTS[1]
    ours = llm.generate([PROMPTS[0], prompt], [SamplingParams(max_tokens=8, temperature=0.0), person(temperature=0.0)],
                        use_tqdm=False)[1].outputs[0].token_ids
    matcher, ids = xgr.GrammarMatcher(compiled), tokenizer.encode(prompt)
    bitmask = xgr.allocate_token_bitmask(1, hf.config.vocab_size)
    expected = []
    with torch.no_grad():
        while not matcher.is_terminated() and len(expected) < 64:
            logits = hf(torch.tensor([ids + expected])).logits[0, -1]
            matcher.fill_next_token_bitmask(bitmask)
            words = bitmask[0].to(torch.int64) & 0xFFFFFFFF
            allowed = ((words[:, None] >> torch.arange(32)) & 1).flatten()[:hf.config.vocab_size].bool()
            token = int(logits.masked_fill(~allowed, float("-inf")).argmax())
            assert matcher.accept_token(token)
            expected.append(token)
    assert ours == expected


def test_apply_grammar_bitmask_puts_rows_in_batch_order():
    """The bitmask arrives in the scheduler's order; each row must land on its request's logits row."""
    vocab = 70  # 3 int32 words, the last one partly padding
    logits = torch.randn(4, vocab)
    allowed = {"c": [0, 31, 32, 69], "a": [5], "d": list(range(40, 70))}
    words = torch.zeros(3, 3, dtype=torch.int64)
    for i, req_id in enumerate(allowed):
        for t in allowed[req_id]:
            words[i, t // 32] |= 1 << (t % 32)
    bitmask = words.to(torch.int32).numpy()  # bit 31 set -> a negative int32, as xgrammar stores it
    out = logits.clone()
    apply_grammar_bitmask(GrammarOutput(list(allowed), bitmask), ["a", "b", "c", "d"], out)
    for row, req_id in enumerate(["a", "b", "c", "d"]):
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[allowed.get(req_id, range(vocab))] = True
        assert torch.equal(out[row], logits[row].masked_fill(~keep, float("-inf"))), req_id


def test_bad_constraints_fail_in_the_frontend_naming_the_problem(llm):
    cases = [(SO(regex="(unclosed"), r"structured_outputs\.regex: .*parenthesis"),
             (SO(json={"type": "objekt"}), r"structured_outputs\.json: invalid JSON schema"),
             (SO(json="{not json"), r"structured_outputs\.json: the schema is not valid JSON"),
             (SO(json={"type": "integer", "multipleOf": 3}), r"multipleOf"),
             (SO(grammar="root ::= "), r"structured_outputs\.grammar: .*EBNF"),
             (SO(choice=[]), r"choice must not be empty")]
    for so, message in cases:
        with pytest.raises(ValueError, match=message):
            llm.generate("ROMEO:", SamplingParams(max_tokens=4, structured_outputs=so), use_tqdm=False)
    with pytest.raises(ValueError, match="exactly one kind of constraint"):
        SO(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="exactly one kind of constraint"):
        SO()
    assert llm.generate("ROMEO:", SamplingParams(max_tokens=4), use_tqdm=False)[0].outputs[0].token_ids


def test_grammar_phase_overlaps_the_forward_in_the_trace(llm):
    core = core_of(llm)
    core.tracer.clear()
    llm.generate(PROMPTS * 2, [person(temperature=0.0), SamplingParams(max_tokens=20, temperature=0.0)] * 5,
                 use_tqdm=False)
    events = core.tracer.events
    span = {(e.step, e.phase): e for e in events}
    steps = sorted({e.step for e in events if e.phase == "grammar" and (e.step, "forward") in span})
    assert len(steps) > 5
    grammar_thread = {span[s, "grammar"].thread for s in steps}
    assert grammar_thread.isdisjoint({span[s, "forward"].thread for s in steps})  # two threads
    overlapped = [s for s in steps if span[s, "grammar"].start < span[s, "forward"].end]
    assert len(overlapped) >= 0.8 * len(steps), "the grammar phase should run while the forward pass does"
    assert all(span[s, "grammar"].end <= span[s, "sample"].start for s in steps if (s, "sample") in span)


# ---------------------------------------------------------------------------- the engine's grammar lifecycle
@pytest.fixture
def core():
    c = EngineCore.from_engine_args(EngineArgs(**ENGINE))
    yield c
    c.shutdown()


def add(core: EngineCore, req_id: str, prompt: str, sp: SamplingParams, tokenizer) -> None:
    core.add_request(EngineCoreRequest(req_id, tokenizer.encode(prompt), sp, tokenizer.eos_token_id))


def run(core: EngineCore, until=lambda: False, max_steps: int = 2000) -> dict[str, list]:
    """Step until `until()` or no request is left; a step that ran nothing (a grammar still compiling on a
    loaded machine) waits 10 ms, so the bound is on steps and idle time alike."""
    got: dict[str, list] = {}
    for _ in range(max_steps):
        if until() or not core.scheduler.has_requests():
            break
        outputs, ran = core.step()
        for o in outputs.outputs:
            got.setdefault(o.request_id, []).append(o)
        if not ran:
            time.sleep(0.01)
    return got


def test_requests_wait_for_their_grammar_while_others_run(core, tokenizer):
    manager = core.structured_output_manager
    add(core, "warm", "ROMEO:", person(temperature=0.0), tokenizer)  # builds the backend
    run(core)
    release = threading.Event()
    compile_ = manager.backend.compile

    def slow_compile(key):
        assert release.wait(60)
        return compile_(key)
    manager.backend.compile = slow_compile
    add(core, "json", "JULIET:", SamplingParams(max_tokens=64, temperature=0.0, structured_outputs=SO(
        json={"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]},
        disable_any_whitespace=True)), tokenizer)
    add(core, "gone", "HAMLET:", SamplingParams(max_tokens=8, structured_outputs=SO(regex="[a-z]+")), tokenizer)
    add(core, "free", "ROMEO:", SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), tokenizer)
    request = core.scheduler.requests["json"]
    got = run(core, until=lambda: "free" not in core.scheduler.requests)
    assert sum(len(o.new_token_ids) for o in got["free"]) == 6 and got["free"][-1].finished
    assert request.status == RequestStatus.WAITING_FOR_FSM == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    assert request.num_computed_tokens == 0 and "json" not in got
    core.abort_requests("gone")  # aborted while its grammar compiles: leaves at once, the compile is dropped
    run(core, max_steps=1)
    assert "gone" not in core.scheduler.requests and core.scheduler.num_structured_output_reqs == 1
    release.set()
    got = run(core)
    assert "gone" not in got and core.scheduler.num_structured_output_reqs == 0
    text = tokenizer.decode([t for o in got["json"] for t in o.new_token_ids], skip_special_tokens=True)
    assert got["json"][-1].finish_reason is not None and json.loads(text) in ({"x": True}, {"x": False})


def test_grammars_compile_once_per_key(core, tokenizer):
    manager = core.structured_output_manager
    for i in range(3):
        add(core, f"p{i}", PROMPTS[i], person(temperature=0.0), tokenizer)
    add(core, "c", "ROMEO:", SamplingParams(max_tokens=8, structured_outputs=SO(choice=CHOICES)), tokenizer)
    add(core, "c2", "HAMLET:", SamplingParams(max_tokens=8, structured_outputs=SO(choice=CHOICES)), tokenizer)
    run(core)
    assert manager.num_compiles == 2 and len(manager.compiled) == 2


def test_a_grammar_that_fails_to_compile_ends_only_its_request(core, tokenizer):
    """The frontend validates, but a compile can still fail in the core: an error output, not a dead engine."""
    add(core, "warm", "ROMEO:", SamplingParams(max_tokens=2, structured_outputs=SO(choice=["a"])), tokenizer)
    run(core)

    def broken(key):
        raise RuntimeError("[04:15:46] /project/cpp/grammar_compiler.cc:1: out of memory")
    core.structured_output_manager.backend.compile = broken
    add(core, "bad", "ROMEO:", SamplingParams(max_tokens=8, structured_outputs=SO(regex="[0-9]+")), tokenizer)
    add(core, "free", "JULIET:", SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True), tokenizer)
    got = run(core)
    assert [o.finish_reason for o in got["bad"]] == [RequestStatus.get_finished_reason(RequestStatus.FINISHED_ERROR)]
    assert got["bad"][0].stop_reason == "grammar compilation failed: out of memory" and not got["bad"][0].new_token_ids
    assert sum(len(o.new_token_ids) for o in got["free"]) == 5
    assert not core.scheduler.has_requests() and core.scheduler.num_structured_output_reqs == 0


def test_grammar_requests_survive_preemption_and_prefix_caching(tokenizer):
    """Few KV blocks force preemption by recompute; the grammars keep their state and the greedy outputs
    equal a roomy run. A shared long prompt hits the prefix cache."""
    prompt = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak."
    params = [person(temperature=0.0), SamplingParams(max_tokens=40, temperature=0.0, structured_outputs=SO(
        regex=PATTERN)), person(temperature=0.8, seed=3),
        SamplingParams(max_tokens=12, temperature=0.0, structured_outputs=SO(choice=CHOICES))]
    roomy = LLM(multiprocess=False, **ENGINE)
    expected = [o.outputs[0].token_ids for o in roomy.generate([prompt] * 4, params, use_tqdm=False)]
    roomy.llm_engine.engine_core.shutdown()
    tight = LLM(multiprocess=False, num_gpu_blocks=14, block_size=8, **ENGINE)
    outs = tight.generate([prompt] * 4, params, use_tqdm=False)
    sched = core_of(tight).scheduler
    assert sched.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert max(o.num_cached_tokens for o in outs) >= 8  # the shared prompt's full blocks were reused
    for out, sp in zip(outs, params, strict=True):
        text = out.outputs[0].text
        if sp.structured_outputs.json is not None:
            jsonschema.validate(json.loads(text), PERSON)
        elif sp.structured_outputs.regex is not None:
            assert re.fullmatch(PATTERN, text)
        else:
            assert text in CHOICES
    tight.llm_engine.engine_core.shutdown()


# ------------------------------------------------------------------ structured outputs with n-gram speculation
# vLLM validates each request's drafts against its grammar (validate_tokens) and masks every verified
# position: the bitmask has one row per draft plus the bonus row. Prompts that repeat what the grammar
# wants give the n-gram proposer drafts to offer.
SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
SPEC_PROMPTS = ['{"name": "Romeo", "age": 16, "role": "fool"}\n{"name": "Juliet", "age": 14, "role": "queen"}\n',
                "ROMEO:", "Act IV: scene Act IV: scene", "JULIET:", "yes, no, perchance; never, my lord"]


def spec_params(temperature=0.0, seed=None) -> list[SamplingParams]:
    kw = dict(temperature=temperature, seed=seed)
    return [person(**kw), person(**kw), SamplingParams(max_tokens=40, structured_outputs=SO(regex=PATTERN), **kw),
            SamplingParams(max_tokens=16, structured_outputs=SO(choice=CHOICES), **kw),
            SamplingParams(max_tokens=16, structured_outputs=SO(choice=CHOICES), **kw)]


@pytest.fixture(scope="module")
def spec_llm():
    spec = LLM(multiprocess=False, speculative_config=SPEC, **ENGINE)
    yield spec
    spec.llm_engine.engine_core.shutdown()


def assert_valid(outs, params) -> None:
    for out, sp in zip(outs, params, strict=True):
        text, so = out.outputs[0].text, sp.structured_outputs
        assert out.outputs[0].finish_reason == "stop", (text, out.outputs[0].finish_reason)
        if so.json is not None:
            jsonschema.validate(json.loads(text), PERSON)
        elif so.regex is not None:
            assert re.fullmatch(PATTERN, text), text
        else:
            assert text in CHOICES, text


def spec_totals(llm: LLM) -> tuple[int, int]:
    sd = llm.llm_engine.engine_core.get_stats().spec_decoding_stats
    return sd.num_draft_tokens, sd.num_accepted_tokens


def test_greedy_structured_outputs_with_speculation_equal_without(llm, spec_llm):
    params = spec_params()
    drafted0, accepted0 = spec_totals(spec_llm)
    with_spec = spec_llm.generate(SPEC_PROMPTS, params, use_tqdm=False)
    drafted, accepted = (a - b for a, b in zip(spec_totals(spec_llm), (drafted0, accepted0), strict=True))
    assert drafted > 0 and accepted > 0  # drafts ran through the grammar, and some were verified
    plain = llm.generate(SPEC_PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in with_spec] == [o.outputs[0].token_ids for o in plain]
    assert_valid(with_spec, params)


def test_sampled_structured_outputs_with_speculation_are_valid(spec_llm):
    for seed in range(3):
        params = spec_params(temperature=1.0, seed=seed)
        assert_valid(spec_llm.generate(SPEC_PROMPTS, params, use_tqdm=False), params)


def test_grammar_bitmask_has_a_row_per_draft_position(tokenizer):
    """Row i is the grammar after the first i drafts (vLLM's layout), and the matcher is rolled back after."""
    import xgrammar as xgr

    from minivllm.structured_output import StructuredOutputManager
    from minivllm.structured_output.backend_xgrammar import XgrammarBackend
    vocab = len(tokenizer)
    manager = StructuredOutputManager()
    manager.backend = XgrammarBackend(tokenizer, vocab)
    key = (StructuredOutputOptions.REGEX, PATTERN, True)
    compiled = manager.backend.compile(key)
    grammar = manager.backend.grammar(compiled)
    draft = tokenizer.encode("Act IV: abc", add_special_tokens=False)[:3]
    requests = {"free": None, "c": SimpleNamespace(structured_output_request=SimpleNamespace(grammar=grammar))}
    other = manager.backend.grammar(compiled)
    requests["o"] = SimpleNamespace(structured_output_request=SimpleNamespace(grammar=other))
    rows = manager.grammar_bitmask(requests, ["o", "c"], {"c": draft})
    assert rows.shape[0] == 1 + len(draft) + 1
    fresh, expected = xgr.GrammarMatcher(compiled), xgr.allocate_token_bitmask(len(draft) + 1, vocab)
    for i in range(len(draft) + 1):
        fresh.fill_next_token_bitmask(expected, i)
        if i < len(draft):
            assert fresh.accept_token(draft[i])
    assert (rows[1:] == expected.numpy()).all()
    assert not (rows[1] == rows[2]).all()  # the state moved between positions
    assert grammar.num_processed_tokens == 0 and not grammar.is_terminated()
    again = manager.grammar_bitmask(requests, ["c"], {})
    assert (again[0] == rows[1]).all()  # rolled back: the next step starts from the same state


def test_drafts_are_cut_to_what_the_grammar_accepts(spec_llm, tokenizer):
    """Scheduler.update_draft_token_ids keeps the longest grammar-valid prefix (vLLM's validate_tokens)."""
    from minivllm.structured_output.backend_xgrammar import XgrammarBackend
    sched = core_of(spec_llm).scheduler
    backend = XgrammarBackend(tokenizer, len(tokenizer))
    grammar = backend.grammar(backend.compile((StructuredOutputOptions.REGEX, PATTERN, True)))
    request = SimpleNamespace(status=RequestStatus.RUNNING, spec_token_ids=[],
                              structured_output_request=SimpleNamespace(grammar=grammar))
    good = tokenizer.encode("Act IV: ab", add_special_tokens=False)
    bad = tokenizer.encode("!!", add_special_tokens=False)
    sched.requests["cut"] = request
    try:
        sched.update_draft_token_ids(["cut"], [good + bad + good])
    finally:
        del sched.requests["cut"]
    assert request.spec_token_ids == good
    assert grammar.num_processed_tokens == 0  # validating does not advance the grammar


def test_apply_grammar_bitmask_with_draft_rows():
    """k drafts give k + 1 logits rows per request; each bitmask row lands on its position's row."""
    vocab = 40
    logits = torch.randn(6, vocab)  # a: 3 rows (2 drafts), b: 2 rows (free, 1 draft), c: 1 row
    bitmask = np.zeros((4, 2), dtype=np.int32)  # scheduler order: c, then a's three rows
    allowed = [[7], [1, 2], [3], [39]]
    for i, toks in enumerate(allowed):
        for t in toks:
            bitmask[i, t // 32] |= 1 << (t % 32)
    out = logits.clone()
    apply_grammar_bitmask(GrammarOutput(["c", "a"], bitmask), ["a", "b", "c"], out, {"a": [1, 3], "b": [5]})
    expect = {0: allowed[1], 1: allowed[2], 2: allowed[3], 5: allowed[0]}
    for row in range(6):
        keep = torch.zeros(vocab, dtype=torch.bool)
        keep[expect.get(row, range(vocab))] = True
        assert torch.equal(out[row], logits[row].masked_fill(~keep, float("-inf"))), row


def test_structured_outputs_with_async_scheduling_and_speculation(llm):
    """Async scheduling runs grammars (equal greedy outputs, valid ones); with speculation it is still refused
    at startup, naming both settings (minivllm's limit: vLLM combines them)."""
    params = spec_params()
    fast = LLM(multiprocess=False, async_scheduling=True, **ENGINE)
    try:
        outs = fast.generate(SPEC_PROMPTS, params, use_tqdm=False)
    finally:
        fast.llm_engine.engine_core.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in
                                                      llm.generate(SPEC_PROMPTS, params, use_tqdm=False)]
    assert_valid(outs, params)
    with pytest.raises(ValueError, match="async_scheduling with speculative_config"):
        LLM(multiprocess=False, async_scheduling=True, speculative_config=SPEC, **ENGINE)
