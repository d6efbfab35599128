"""Lesson 5 — GPUModelRunner：持久批与 varlen 输入准备: the checks behind the grade cells and the engine plug.

The student writes `prepare_inputs(scheduler_output, input_batch, block_size)` -> (input_ids, positions,
query_start_loc, seq_lens, slot_mapping, logits_indices), numpy arrays: the non-speculative part of vLLM's
GPUModelRunner._prepare_inputs, vectorised.

Grade cells and `python -m autograder check lesson05 ...` call the check_* functions here (each docstring says
what it covers).

Input space (each dimension, and the graded part that covers it):
    prefix caching        on in the engine run (prompt 2 hits prompt 0's blocks): main_path, real_engine; a
                          prefix hit ending mid-block: boundary
    chunked prefill       budget 24 / threshold 16 in the engine run: main_path, real_engine; chunks ending
                          mid-prompt, one token short of the end (prompt, and a resumed request's prompt +
                          outputs), at the end: boundary
    async scheduling      off in every part: the exercise is the synchronous _prepare_inputs
    spec decode           off in the demo run; n-gram drafts (up to 3 per row) in a second engine run: decode
                          rows schedule 1 + k tokens, k past num_tokens, laid out as GPUModelRunner._update_states
                          writes them: main_path (every step), real_engine (greedy text, the plug verifies the
                          drafts as the engine does); a crafted draft row crossing a block edge: boundary. The
                          exercise's logits_indices stay one row per sampling request (the bonus row); the plug
                          adds the k draft rows before it, as _prepare_inputs does
    block_size            8 (engine run), 4 (crafted), 16 (16k batch): the argument, never a constant
    row order             persistent-batch rows differ from the scheduler's dict order, from sorted ids and from
                          req_id_to_index's insertion order (swaps, condense): main_path, boundary
    batch shapes          1 request of 1 token; decodes only; prefills only (no logits at all); mixed; 8 x 2k tokens

The reference is the engine itself: GPUModelRunner._prepare_inputs called on the same SchedulerOutput and
InputBatch (it reads only input_batch, block_size and device from the runner).
"""
from __future__ import annotations

import contextlib
import functools
import sys
import types
from dataclasses import dataclass, field
from unittest import mock

import numpy as np
import torch

from autograder.common import (
    DEFAULT_MODEL,
    BlankNotFilled,
    CheckFailed,
    Lesson,
    SourceMap,
    expect,
    graded,
    make_llm,
)
from minivllm.worker.gpu_model_runner import GPUModelRunner

ENGINE_PREPARE_INPUTS = GPUModelRunner._prepare_inputs   # the reference, kept before any plug replaces it

NAMES = ("input_ids", "positions", "query_start_loc", "seq_lens", "slot_mapping", "logits_indices")
BLOCK_SIZE = 8
# Engine run of check_main_path: a token budget of 24 and a long-prefill threshold of 16 chunk the prompts,
# so a request still in prefill sits before a decoding one in the scheduler's order (the runner reorders
# decodes first); prompt 2 repeats prompt 0's opening (a prefix-cache hit); prompts finish at different
# steps and prompt 3 arrives later (holes, condense, rows moved).
ENGINE_KW = dict(block_size=BLOCK_SIZE, max_num_batched_tokens=24, long_prefill_token_threshold=16,
                 max_num_seqs=4, max_model_len=160, enable_prefix_caching=True, num_gpu_blocks=64)
PROMPTS = ["ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun. "
           "Arise, fair sun, and kill the envious moon",
           "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?",
           "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and the pale moon is sick",
           "HAMLET:\nTo be, or not to be"]
MAX_TOKENS = [10, 6, 9, 8]
ARRIVALS = [0, 0, 5, 9]               # the engine step at which each prompt is added
# The speculative run (check_main_path, check_real_engine): the same engine with n-gram drafts of up to 3
# tokens, so decode rows schedule 1 + k tokens, k of them past num_tokens, written there by the runner.
SPEC_KW = dict(ENGINE_KW, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                              "prompt_lookup_min": 2, "prompt_lookup_max": 3})
SPEC_MAX_TOKENS = 16
LINE_BUDGET = 200                     # Python lines fn may run on that batch (a per-token loop runs > 16000)


# ---------------------------------------------------------------------------- calling the student's function
def call(fn, so, batch, block_size=BLOCK_SIZE) -> dict:
    """fn's six arrays as int64 numpy, checked for type and length."""
    try:
        res = fn(so, batch, block_size)
    except (BlankNotFilled, CheckFailed):
        raise
    except Exception as e:
        if "______" in str(e) or "_Blank" in repr(e):
            raise BlankNotFilled("还有空 ______ 没有填写：把它换成正确的表达式后再运行。") from None
        raise
    expect(isinstance(res, tuple) and len(res) == 6,
           f"prepare_inputs 应返回 6 个数组 {NAMES}，实际 {type(res).__name__}。")
    out = {}
    for name, a in zip(NAMES, res, strict=True):
        if isinstance(a, torch.Tensor):
            a = a.cpu().numpy()
        expect(isinstance(a, np.ndarray) and a.ndim == 1, f"{name} 应是一维 numpy 数组（或张量），实际 {type(a).__name__}。")
        out[name] = a.astype(np.int64)
    return out


def engine_inputs(so, batch, block_size=BLOCK_SIZE) -> dict:
    """The engine's own arrays: GPUModelRunner._prepare_inputs on a runner that holds only what it reads."""
    runner = types.SimpleNamespace(input_batch=batch, block_size=block_size, device=torch.device("cpu"))
    input_ids, positions, md, emit, logits_indices, _ = ENGINE_PREPARE_INPUTS(runner, so)
    if so.scheduled_spec_decode_tokens:  # the exercise's rows: each sampling request's last (bonus) row
        logits_indices = md.query_start_loc_cpu[torch.from_numpy(emit + 1)] - 1
    arrays = (input_ids, positions, md.query_start_loc_cpu, md.seq_lens_cpu, md.slot_mapping, logits_indices)
    return {name: a.numpy().astype(np.int64) for name, a in zip(NAMES, arrays, strict=True)}


def first_difference(got: dict, want: dict) -> str | None:
    for name in NAMES:
        a, b = got[name], want[name]
        if a.shape != b.shape:
            return f"{name} 长度 {len(a)}，引擎的是 {len(b)}（你的 {a[:12].tolist()}，引擎 {b[:12].tolist()}）"
        bad = np.nonzero(a != b)[0]
        if len(bad):
            i = int(bad[0])
            return (f"{name}[{i}] = {a[i]}，引擎的是 {b[i]}（你的 {a[max(0, i - 3):i + 5].tolist()}，"
                    f"引擎 {b[max(0, i - 3):i + 5].tolist()}）")
    return None


# ---------------------------------------------------------------------------- snapshots of the persistent batch
def snapshot(batch):
    """A copy of an InputBatch's rows (what _prepare_inputs reads), still an InputBatch."""
    from minivllm.worker.gpu_input_batch import InputBatch

    snap = object.__new__(InputBatch)
    for k, v in vars(batch).items():  # sampling state (generators, min_tokens) is not read: left out
        setattr(snap, k, {} if k in ("generators", "min_tokens") else v.copy() if hasattr(v, "copy") else v)
    return snap


@dataclass
class Step:
    """One recorded engine step: the scheduler's output, the batch after _update_states, the engine's arrays."""

    so: object
    batch: object
    want: dict
    features: set = field(default_factory=set)


def step_features(so, batch, prev_rows: dict) -> set:
    """What this step's batch holds: new prefill, prefix hit, chunk ending mid-prompt, decode, moved row."""
    feats = set()
    for new in so.scheduled_new_reqs:
        feats.add("new_prefill")
        if new.num_computed_tokens > 0:
            feats.add("prefix_hit")
    for r in batch.req_ids[:batch.num_reqs]:
        i = batch.req_id_to_index[r]
        n = so.num_scheduled_tokens[r]
        end = batch.num_computed_tokens_cpu[i] + n
        if n == 1 and end == batch.num_tokens[i]:
            feats.add("decode")
        if end < batch.num_tokens[i]:
            feats.add("partial_chunk")
        if n > 1 and end == batch.num_tokens[i] and batch.num_computed_tokens_cpu[i] > 0:
            feats.add("final_chunk")
        if r in prev_rows and prev_rows[r] != i:
            feats.add("moved_row")
    if [r for r in batch.req_ids[:batch.num_reqs]] != list(so.num_scheduled_tokens):
        feats.add("order_differs")
    return feats


@contextlib.contextmanager
def recording(steps: list):
    """Within: every runner's _prepare_inputs also records (so, batch snapshot, its own arrays)."""
    original = GPUModelRunner._prepare_inputs
    prev: dict = {}

    def _prepare_inputs(self, so):
        batch = self.input_batch
        snap = snapshot(batch)
        steps.append(Step(so, snap, engine_inputs(so, snapshot(batch), self.block_size),
                          step_features(so, batch, prev)))
        prev.clear()
        prev.update(batch.req_id_to_index)
        return original(self, so)

    with mock.patch.object(GPUModelRunner, "_prepare_inputs", _prepare_inputs):
        yield


@contextlib.contextmanager
def plugged(fn):
    """Within: GPUModelRunner._prepare_inputs builds the step's inputs from fn's six arrays."""
    from minivllm.attention import AttentionMetadata
    from minivllm.utils import cdiv

    def _prepare_inputs(self, so):
        a = call(fn, so, self.input_batch, self.block_size)
        batch, dev = self.input_batch, self.device
        num_reqs = batch.num_reqs
        qsl = a["query_start_loc"].astype(np.int32)
        num_sched = np.diff(qsl)
        seq_lens = a["seq_lens"].astype(np.int32)
        expect(len(qsl) == num_reqs + 1 and len(seq_lens) == num_reqs,
               f"query_start_loc 应有 {num_reqs + 1} 项、seq_lens 应有 {num_reqs} 项。")
        max_blocks = cdiv(int(seq_lens.max()), self.block_size)
        num_decodes = int((num_sched == 1).sum())
        md = AttentionMetadata(
            num_actual_tokens=int(qsl[-1]), max_query_len=int(num_sched.max()),
            query_start_loc=torch.from_numpy(qsl).to(dev), max_seq_len=int(seq_lens.max()),
            seq_lens=torch.from_numpy(seq_lens).to(dev),
            block_table=torch.from_numpy(batch.block_table[:num_reqs, :max_blocks].copy()).to(dev),
            slot_mapping=torch.from_numpy(a["slot_mapping"]).to(dev),
            num_decodes=num_decodes, num_decode_tokens=num_decodes, num_prefills=num_reqs - num_decodes,
            query_start_loc_cpu=torch.from_numpy(qsl), seq_lens_cpu=torch.from_numpy(seq_lens))
        logits_indices = a["logits_indices"]
        emit = np.searchsorted(qsl, logits_indices, side="right") - 1   # the row each logits index falls in
        spec_md = None
        if so.scheduled_spec_decode_tokens:  # as the engine's: k draft rows before each sampling row
            from minivllm.sample.rejection_sampler import SpecDecodeMetadata

            drafts = [so.scheduled_spec_decode_tokens.get(batch.req_ids[i], []) for i in emit]
            spec_md = SpecDecodeMetadata.make(drafts, dev)
            k = np.array([len(d) for d in drafts], dtype=np.int64)
            logits_indices = np.concatenate([np.arange(i - n, i + 1) for i, n in zip(logits_indices, k, strict=True)]) \
                if len(k) else logits_indices
        return (torch.from_numpy(a["input_ids"]).to(dev), torch.from_numpy(a["positions"]).to(dev), md, emit,
                torch.from_numpy(logits_indices).to(dev), spec_md)

    with mock.patch.object(GPUModelRunner, "_prepare_inputs", _prepare_inputs):
        yield


_CACHE: dict = {}


@dataclass
class EngineRun:
    tokens: list
    steps: list          # recorded Steps (recording runs only)
    trace: list          # the tracer's events
    prompt_ids: list


def shared_llm(key: str = "llm"):
    """One in-process LLM per process and kind ("llm", "spec_llm": SPEC_KW) (building it dominates a run); runs
    reset its prefix cache. A run that failed drops it (drop_llm), so a broken answer cannot leave rows behind
    for the next run."""
    if key not in _CACHE:
        _CACHE[key] = make_llm(trace=True, **(SPEC_KW if key == "spec_llm" else ENGINE_KW))
    return _CACHE[key]


def drop_llm(key: str = "llm") -> None:
    llm = _CACHE.pop(key, None)
    if llm is not None:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()


def run_engine(fn=None, record: bool = False, max_tokens=None, arrivals=ARRIVALS, spec: bool = False) -> EngineRun:
    """Greedy generation of PROMPTS, each added at its arrival step; fn plugged in if given; spec: on the
    speculative engine (SPEC_KW: n-gram drafts), every prompt at step 0 for SPEC_MAX_TOKENS tokens."""
    from minivllm.sampling_params import SamplingParams

    steps: list = []
    ctx = plugged(fn) if fn is not None else recording(steps) if record else contextlib.nullcontext()
    key = "spec_llm" if spec else "llm"
    if spec:
        max_tokens, arrivals = SPEC_MAX_TOKENS, [0] * len(PROMPTS)
    llm = shared_llm(key)
    llm.reset_prefix_cache()
    tracer = llm.llm_engine.engine_core.tracer
    tracer.clear()
    try:
        tok = llm.get_tokenizer()
        prompt_ids = [tok.encode(t) for t in PROMPTS]
        engine = llm.llm_engine
        done: dict = {}
        with ctx:
            step = 0
            while step < 500 and (step <= max(arrivals) or engine.has_unfinished_requests()):
                for i, at in enumerate(arrivals):
                    if at == step:
                        n = max_tokens or MAX_TOKENS[i]
                        engine.add_request(str(i), prompt_ids[i],
                                           SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
                for o in engine.step():
                    if o.finished:
                        done[o.request_id] = list(o.outputs[0].token_ids)
                step += 1
        expect(not engine.has_unfinished_requests(), "引擎在 500 步内没有跑完这批请求。")
        trace = list(tracer.events)
    except BaseException:
        drop_llm(key)
        raise
    runner = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
    if runner.input_batch.num_reqs or runner.requests:
        drop_llm(key)                  # rows left behind by a wrong answer: the next run starts afresh
    return EngineRun([done.get(str(i), []) for i in range(len(PROMPTS))], steps, trace, prompt_ids)


@functools.cache
def reference_run() -> EngineRun:
    """The engine's own run, recorded once per process (it does not depend on the student). Its greedy tokens
    equal HF transformers' (tests/test_lesson05_grading.py), so a plugged run is held to them without loading
    the HF model in every grading process."""
    return run_engine(record=True)


def recorded_steps() -> list:
    return reference_run().steps


@functools.cache
def spec_reference_run() -> EngineRun:
    """The speculative engine's own run (n-gram drafts scheduled), recorded once per process."""
    return run_engine(record=True, spec=True)


def hf_greedy(prompt_ids: list, max_tokens: int) -> list:
    """HF transformers' greedy continuation of each prompt (cached)."""
    key = ("hf", tuple(map(tuple, prompt_ids)), max_tokens)
    if key not in _CACHE:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL, dtype=torch.float32).eval()
        outs = []
        with torch.inference_mode():
            for ids in prompt_ids:
                x = torch.tensor([ids])
                for _ in range(max_tokens):
                    nxt = model(x).logits[0, -1].argmax()
                    x = torch.cat([x, nxt.view(1, 1)], dim=1)
                outs.append(x[0, len(ids):].tolist())
        _CACHE[key] = outs
    return _CACHE[key]


# ---------------------------------------------------------------------------- main path: the engine's batches
@graded
def check_main_path(fn) -> list:
    """Every step of the recorded engine run (prefix caching on, chunked prefill, condense): fn's arrays equal
    the engine's. Covers: prefix hits, chunks, decodes, moved rows, block_size 8."""
    steps = recorded_steps()
    _compare_steps(fn, steps, "引擎")
    spec = spec_reference_run().steps
    expect(any(st.so.scheduled_spec_decode_tokens for st in spec), "投机解码的引擎运行里没有调度草稿 token（检查本身的问题）。")
    _compare_steps(fn, spec, "投机解码（n-gram 草稿，每行最多 3 个，写在已知 token 之后）的引擎")
    return steps


def _compare_steps(fn, steps: list, what: str) -> None:
    for k, st in enumerate(steps):
        got = call(fn, st.so, snapshot(st.batch))
        diff = first_difference(got, st.want)
        if diff:
            rows = [(r, st.so.num_scheduled_tokens[r], int(st.batch.num_computed_tokens_cpu[i]), int(st.batch.num_tokens[i]))
                    for i, r in enumerate(st.batch.req_ids[:st.batch.num_reqs])]
            drafts = f"；草稿 {st.so.scheduled_spec_decode_tokens}" if st.so.scheduled_spec_decode_tokens else ""
            raise CheckFailed(f"{what}第 {k + 1} 步（{', '.join(sorted(st.features))}；行 (req, 本步 token, 已算, 已知) = "
                              f"{rows}{drafts}）：{diff}。")


# ---------------------------------------------------------------------------- real engine, trace and cost
def share_of_step(trace: list) -> dict:
    """Seconds per phase over the run (prepare_inputs / forward / sample) and prepare's share of the three."""
    tot: dict = {}
    for ev in trace:
        if ev.phase in ("prepare_inputs", "forward", "sample"):
            tot[ev.phase] = tot.get(ev.phase, 0.0) + ev.end - ev.start
    s = sum(tot.values()) or 1.0
    return dict(tot, share=tot.get("prepare_inputs", 0.0) / s)


def big_batch(num_reqs: int = 8, tokens_per_req: int = 2048, block_size: int = 16, seed: int = 0):
    """A 16k-token prefill batch with a prefix hit per row and scattered blocks (for the cost check)."""
    from minivllm.core.sched.output import CachedRequestData, SchedulerOutput
    from minivllm.worker.gpu_input_batch import InputBatch

    rng = np.random.default_rng(seed)
    max_len = 4096
    batch = InputBatch(num_reqs, max_len, block_size)
    blocks = rng.permutation(num_reqs * max_len // block_size)
    per = max_len // block_size
    sched = {}
    for i in range(num_reqs):
        r = f"r{i}"
        batch.req_ids.append(r)
        batch.req_id_to_index[r] = i
        n_prompt = tokens_per_req + 16 * (i + 1)
        batch.token_ids_cpu[i, :n_prompt] = rng.integers(0, 1000, n_prompt)
        batch.num_tokens[i] = n_prompt
        batch.num_computed_tokens_cpu[i] = 16 * (i + 1)
        batch.block_table[i, :per] = blocks[i * per:(i + 1) * per]
        sched[r] = tokens_per_req
    so = SchedulerOutput([], CachedRequestData(), sched, sum(sched.values()))
    return so, batch


def count_lines(fn, *args) -> int:
    """Python line events executed in the code of fn's file (deterministic: no timing)."""
    filename = fn.__code__.co_filename
    n = 0

    def local(frame, event, arg):
        nonlocal n
        if event == "line":
            n += 1
        return local

    def glob(frame, event, arg):
        return local if frame.f_code.co_filename == filename else None

    old = sys.gettrace()
    sys.settrace(glob)
    try:
        fn(*args)
    finally:
        sys.settrace(old)
    return n


def check_vectorised(fn) -> int:
    """Right arrays on a 16k-token batch within LINE_BUDGET Python lines: a count, not a clock (deterministic)."""
    so, batch = big_batch()
    got = call(fn, so, batch, 16)
    diff = first_difference(got, engine_inputs(so, batch, 16))
    expect(diff is None, f"16k token 的大批次上：{diff}。")
    lines = count_lines(fn, so, batch, 16)
    expect(lines <= LINE_BUDGET,
           f"在 {batch.num_reqs} 个请求、{so.total_num_scheduled_tokens} 个 token 的批上，你的函数执行了 {lines} 行 "
           f"Python（上限 {LINE_BUDGET}）：有按 token 的 Python 循环。用 np.repeat / np.cumsum / 花式索引向量化。")
    return lines


@graded
def check_real_engine(fn) -> EngineRun:
    """fn inside the engine: same greedy tokens, a prepare_inputs span per forward, no per-token loop (Python
    line count on 8 x 2k tokens, block_size 16)."""
    recorded = recorded_steps()
    call(fn, recorded[0].so, snapshot(recorded[0].batch))     # blanks first, before the slow parts
    runs = []
    for spec, ref, key, engine in ((False, reference_run, "llm", ""),
                                   (True, spec_reference_run, "spec_llm", "投机解码（n-gram 草稿）的")):
        try:
            runs.append(run_engine(fn, spec=spec))
        except (CheckFailed, BlankNotFilled):
            raise
        except Exception as e:
            raise CheckFailed(f"接入{engine}引擎后生成出错：{type(e).__name__}: {e}") from None
        _same_tokens(runs[-1].tokens, ref().tokens, key, f"在{engine}引擎里，" if spec else "")
    run = runs[0]
    prepare_steps = {ev.step for ev in run.trace if ev.phase == "prepare_inputs"}
    forward_steps = {ev.step for ev in run.trace if ev.phase == "forward"}
    expect(forward_steps and forward_steps <= prepare_steps,
           "步骤追踪里每个有前向的步都应有 prepare_inputs 阶段（trace=True）。")
    check_vectorised(fn)
    return run


def _same_tokens(got: list, want: list, key: str, where: str) -> None:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a != b:
            drop_llm(key)
            j = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            raise CheckFailed(f"{where}接入你的 prepare_inputs 后，prompt {i} 的贪心输出在第 {j} 个 token 处与引擎自己的 "
                              f"_prepare_inputs（== HF transformers 贪心）不同（接入后 {a[j:j + 4]}，参考 {b[j:j + 4]}；长度 {len(a)} vs {len(b)}）。")


# ---------------------------------------------------------------------------- boundary: crafted batches
def crafted_batch(rows: list[dict], block_size: int = 4, max_len: int = 64, reverse: bool = True):
    """An InputBatch and SchedulerOutput from rows {req, tokens, computed, blocks, sched}; the scheduler's dict
    lists the requests in reversed row order (reverse=False: in row order)."""
    from minivllm.core.sched.output import CachedRequestData, SchedulerOutput
    from minivllm.worker.gpu_input_batch import InputBatch

    batch = InputBatch(len(rows) + 2, max_len, block_size)
    for i, r in enumerate(rows):
        batch.req_ids.append(r["req"])
        batch.req_id_to_index[r["req"]] = i
        toks = list(r["tokens"])
        batch.token_ids_cpu[i, :len(toks)] = toks
        batch.num_tokens[i] = len(toks)
        batch.num_computed_tokens_cpu[i] = r["computed"]
        batch.append_block_ids(i, r["blocks"])
        draft = r.get("draft", [])  # as GPUModelRunner._update_states writes drafts: right after the known tokens
        batch.token_ids_cpu[i, len(toks):len(toks) + len(draft)] = draft
    sched = {r["req"]: r["sched"] for r in (reversed(rows) if reverse else rows)}
    spec = {r["req"]: list(r["draft"]) for r in rows if r.get("draft")}
    return SchedulerOutput([], CachedRequestData(), sched, sum(sched.values()), scheduled_spec_decode_tokens=spec), batch


def boundary_cases():
    """(name, so, batch): each isolates one decision of the exercise."""
    t = lambda n, base: list(range(base, base + n))  # noqa: E731
    cases = []
    # A decode (row 0), a chunk that stops mid-prompt (row 1), a final chunk after a prefix hit that ends
    # mid-block (row 2); blocks scattered and out of order. No case uses block 0: vLLM reserves it (the null block).
    cases.append(("mixed", *crafted_batch([
        dict(req="dec", tokens=t(7, 100), computed=6, blocks=[9, 2], sched=1),
        dict(req="chunk", tokens=t(13, 200), computed=4, blocks=[5, 11, 14, 7], sched=5),
        dict(req="final", tokens=t(10, 300), computed=6, blocks=[3, 8, 12], sched=4),
    ])))
    # Only prefill chunks, none reaching its end: no logits at all.
    cases.append(("no_logits", *crafted_batch([
        dict(req="a", tokens=t(20, 400), computed=0, blocks=[6, 1, 4], sched=9),
        dict(req="b", tokens=t(15, 500), computed=8, blocks=[10, 2, 13, 14], sched=4),
    ])))
    # A batch whose rows were swapped (decodes first): row order != the scheduler's dict order.
    so, batch = crafted_batch([
        dict(req="p", tokens=t(9, 600), computed=0, blocks=[4, 1, 7], sched=9),
        dict(req="d1", tokens=t(5, 700), computed=4, blocks=[2, 3], sched=1),
        dict(req="d2", tokens=t(3, 800), computed=2, blocks=[15], sched=1),
    ], reverse=False)
    batch.swap_states(0, 2)
    cases.append(("swapped", so, batch))
    # One request, one token at position 0 in block 5 (the smallest batch).
    cases.append(("single", *crafted_batch([dict(req="x", tokens=[42], computed=0, blocks=[5], sched=1)])))
    # Chunks that end exactly one token before the end: of a prompt, and of a request resumed after preemption
    # (re-prefilling its prompt and outputs); next to a chunk that reaches the end: only that one samples.
    cases.append(("one_short", *crafted_batch([
        dict(req="short", tokens=t(13, 900), computed=4, blocks=[7, 3, 9, 1], sched=8),
        dict(req="resumed", tokens=t(12, 1000), computed=0, blocks=[2, 11, 4], sched=11),
        dict(req="ends", tokens=t(6, 1100), computed=0, blocks=[5, 6], sched=6),
    ])))
    # Rows in an order that is neither the scheduler's, nor sorted by id, nor req_id_to_index's insertion order.
    so, batch = crafted_batch([
        dict(req="m", tokens=t(6, 1200), computed=5, blocks=[3, 1], sched=1),
        dict(req="c", tokens=t(9, 1300), computed=4, blocks=[10, 2, 6], sched=5),
        dict(req="x", tokens=t(4, 1400), computed=0, blocks=[8], sched=4),
    ], reverse=False)
    batch.swap_states(0, 2)
    cases.append(("reordered", so, batch))
    # Speculative drafts (as the runner lays them out: after the known tokens): a decode row with 3 drafts whose
    # positions cross a block edge past num_tokens, a chunk that stops mid-prompt, a decode row with no draft.
    cases.append(("drafts", *crafted_batch([
        dict(req="spec", tokens=t(7, 1500), computed=6, blocks=[4, 9, 1], sched=4, draft=[77, 78, 79]),
        dict(req="chunk", tokens=t(11, 1600), computed=0, blocks=[6, 12, 3], sched=5),
        dict(req="plain", tokens=t(5, 1700), computed=4, blocks=[2, 8], sched=1),
    ])))
    return cases


@graded
def check_boundary(fn) -> None:
    """Crafted batches, block_size 4. Covers: chunk boundaries (mid, one short, at the end), resumed
    re-prefill, prefix hit mid-block, rows reordered by swaps, the one-token batch."""
    for name, so, batch in boundary_cases():
        got = call(fn, so, snapshot(batch), batch.block_table.shape[1] and 4)
        diff = first_difference(got, engine_inputs(so, snapshot(batch), 4))
        expect(diff is None, f"构造的批 “{name}”（block_size=4）：{diff}。")


# ---------------------------------------------------------------------------- source map
# Accepted names, as sha256 prefixes of the lower-cased last dotted component (never the names themselves: this
# file ships to students), checked against the pinned vLLM (vllm/v1/worker/block_table.py, gpu_input_batch.py,
# gpu_model_runner.py).
SOURCE = SourceMap(["block_tables", "condense_rows", "swap_pair", "sample_rows", "flat_offsets"], {
    "block_tables": {"7009e17b0a246888"},
    "condense_rows": {"ae12635d87e19134"},
    "swap_pair": {"bf35445f6fa3a76e"},
    "sample_rows": {"afa780bbc5b6a763"},
    "flat_offsets": {"02ba63e671fe3b2b"},
})


LESSON = Lesson(
    lesson_id="lesson05",
    title="GPUModelRunner：持久批与 varlen 输入准备",
    answer=("prepare_inputs",),
    code={
        "main_path": ("主路径·引擎的混合批", check_main_path),
        "real_engine": ("主路径·真实引擎与向量化", check_real_engine),
        "boundary": ("边界条件", check_boundary),
    },
    source_map=SOURCE,
    questions=("为什么要持久批", "为什么用扁平 varlen 而不是 padding", "异步调度下为什么仍要向量化"),
)
check_source_map = SOURCE.check
