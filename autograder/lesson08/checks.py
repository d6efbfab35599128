"""Lesson 8 checks: a `choice` constraint's next-token bitmask, built from a token trie, applied before sampling.

The student writes two functions (no xgrammar inside them):

    choice_bitmask(batch_req_ids, generated, choices, trie, eos_token_id, vocab_size) -> torch.int32 tensor
        [len(batch_req_ids), ceil(vocab_size / 32)]; row i is request batch_req_ids[i] (the runner's batch
        order, not the order of the `generated` dict); bit j of word w allows token 32 * w + j; a token is
        allowed when the bytes generated so far plus all of its bytes are a prefix of one of the request's
        choices; EOS is allowed once the bytes equal a choice.
    apply_bitmask_and_sample(logits, bitmask, sample) -> sample(masked logits): disallowed tokens get -inf
        before sampling.

The references are xgrammar's (GrammarMatcher.fill_next_token_bitmask over the EBNF vLLM builds for a
choice, and apply_token_bitmask_inplace). The real-engine check plugs choice_bitmask into minivllm's
StructuredOutputManager, so the engine's xgrammar matchers (advanced with every sampled token) judge it.

Input space (each dimension -> the part that covers it):
    batch order       runner's rows vs the scheduler's dict order, 1 to 4 rows            main, real engine
    progress          empty prefix, mid-choice, mid-UTF-8 character, exactly a choice      main
                      mid-UTF-8 where dropping the partial character leaves another choice ("caf\\xc3"
                      with caf / café: EOS only on bytes, not on decoded text)           main, boundary
    choices           one a prefix of another, listed shorter-first and longer-first (not in
                      ascending order), completion on a choice other than the first,
                      quotes / backslashes / multi-byte characters                          main, boundary
    EOS               allowed exactly when the bytes equal a choice, also when a longer one continues;
                      not when the bytes only end with a choice (on / non, the prefix of nonce)   main, boundary
    bit layout        bit 31 (the int32 sign bit): tokens 31 ("<", word 0) and 63 ("\\") allowed, in a
                      scenario and as the only first token of an engine request's choices; a vocabulary not
                      a multiple of 32                                                      main, real engine, boundary
    masking           disallowed -> -inf before the sampler, allowed logits unchanged       boundary
    engine            free and constrained requests in one batch, greedy and seeded rows, the
                      bitmask computed between launching the forward and waiting for it     real engine
    pinned vLLM       its StructuredOutputManager.grammar_bitmask rows on the same batches (scheduler order,
                      reordered by request id) and three choice lists walked token by token to EOS, one
                      with choices that start or end with a space                            main
    Not covered: speculative drafts (one bitmask row per draft position); the plug serves one position.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from functools import lru_cache

import torch

from autograder.common import BlankNotFilled, CheckFailed, Lesson, SourceMap, expect, graded
from autograder.pin import VLLM_VERSION
from minivllm.structured_output import StructuredOutputManager
from minivllm.structured_output.utils import choice_as_grammar


# ---------------------------------------------------------------------------- what the student is given
class TokenTrie:
    """Every token's bytes in one trie: prefixes_of(rest) = the tokens whose bytes are a non-empty prefix of rest.

    Walking `rest` byte by byte visits exactly those tokens, so one walk per choice replaces a scan of the
    whole vocabulary (a scan is 4096 startswith calls per choice here, 150k on a real model).
    """

    def __init__(self, token_bytes: list[bytes]) -> None:
        self.token_bytes = token_bytes
        self.root: dict = {}
        for token, piece in enumerate(token_bytes):
            if not piece:
                continue  # special tokens: never text
            node = self.root
            for byte in piece:
                node = node.setdefault(byte, {})
            node.setdefault(None, []).append(token)

    def prefixes_of(self, rest: bytes) -> list[int]:
        found, node = [], self.root
        for byte in rest:
            node = node.get(byte)
            if node is None:
                break
            found.extend(node.get(None, ()))
        return found


@lru_cache(maxsize=2)
def _tokenizer_and_info(model: str):
    import xgrammar as xgr

    from minivllm.model_executor.model_loader import load_hf_config, resolve_model_path
    from minivllm.tokenizer import get_tokenizer
    tok = get_tokenizer(model)
    vocab_size = load_hf_config(resolve_model_path(model)).vocab_size
    return tok, xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size), vocab_size


@dataclass
class Vocab:
    """The default model's tokens as bytes (special tokens as b""), its EOS id and the logits width."""

    token_bytes: list[bytes]
    eos_token_id: int
    vocab_size: int
    trie: TokenTrie = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.trie = TokenTrie(self.token_bytes)

    def encode(self, text: str) -> list[int]:
        return _tokenizer_and_info(_default_model())[0].encode(text)


def _default_model() -> str:
    from minivllm.config import default_model
    return default_model()


@lru_cache(maxsize=1)
def default_vocab() -> Vocab:
    tok, info, vocab_size = _tokenizer_and_info(_default_model())
    special = set(tok.all_special_ids)
    pieces = [b"" if t in special else bytes(p) for t, p in enumerate(info.decoded_vocab)]
    return Vocab(pieces + [b""] * (vocab_size - len(pieces)), tok.eos_token_id, vocab_size)


# ---------------------------------------------------------------------------- references (xgrammar)
def xgrammar_choice_bitmask(batch_req_ids, generated: dict[str, bytes], choices: dict[str, list[bytes]],
                            vocab: Vocab) -> torch.Tensor:
    """What xgrammar allows next, row per request in batch order (the engine's own backend)."""
    import xgrammar as xgr
    compiler = _compiler(_default_model())
    bitmask = xgr.allocate_token_bitmask(len(batch_req_ids), vocab.vocab_size)
    for row, req_id in enumerate(batch_req_ids):
        grammar = choice_as_grammar([c.decode() for c in choices[req_id]])
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
        assert not generated[req_id] or matcher.accept_string(generated[req_id])  # bytes: may end mid-character
        matcher.fill_next_token_bitmask(bitmask, row)
    return bitmask


@lru_cache(maxsize=2)
def _compiler(model: str):
    import xgrammar as xgr
    return xgr.GrammarCompiler(_tokenizer_and_info(model)[1], max_threads=1)


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [rows, vocab_size]: bit j of word w -> token 32 * w + j (two's complement words, as int32)."""
    words = bitmask.to(torch.int64) & 0xFFFFFFFF
    return ((words[:, :, None] >> torch.arange(32)) & 1).flatten(1)[:, :vocab_size].bool()


# ---------------------------------------------------------------------------- scenarios
@dataclass
class Scenario:
    """One batch: the runner's row order, the bytes each request generated so far, each request's choices."""

    name: str
    batch_req_ids: list[str]
    generated: dict[str, bytes]  # deliberately not in batch order (the scheduler's order)
    choices: dict[str, list[bytes]]


def _scenario(name: str, rows: list[tuple[str, str, list[str]]]) -> Scenario:
    batch = [r for r, _, _ in rows]
    order = sorted(batch, key=lambda r: (len(r), r), reverse=True)  # a different order than the batch's
    gen = {r: g.encode() for r, g, _ in rows}
    ch = {r: [c.encode() for c in cs] for r, _, cs in rows}
    return Scenario(name, batch, {r: gen[r] for r in order}, {r: ch[r] for r in order})


SCENARIOS = [
    _scenario("刚开始生成（空前缀）", [("a", "", ["yes", "no", "perchance"])]),
    _scenario("生成到一半", [("a", "per", ["yes", "no", "perchance"]), ("b", "y", ["yes", "no"])]),
    _scenario("一个选项是另一个的前缀（no / none）", [("r2", "no", ["no", "none"]), ("r10", "n", ["no", "none"])]),
    _scenario("一个选项是另一个选项某个前缀的后缀（on 与 nonce 的前缀 non）",
              [("u", "non", ["nonce", "on"]), ("v", "on", ["nonce", "on"]), ("w2", "ache", ["he", "achieve", "ache"])]),
    _scenario("已完整生成一个选项", [("x", "yes", ["yes", "no"]), ("y", "never, my lord", ["never, my lord", "nay"]),
                             ("z", "nay", ["never, my lord", "nay"])]),
    _scenario("一个选项是另一个的前缀，短的排在后面", [("s", "no", ["none", "no"]), ("t", "non", ["nothing", "none", "no"])]),
    _scenario("批内顺序与调度顺序不同", [("req-3", "", ["alas"]), ("req-1", "al", ["alas", "anon"]),
                                   ("req-22", "", ["forsooth", "anon", "alack"]), ("req-4", "anon", ["anon"])]),
    _scenario("引号、反斜杠与多字节字符", [("q", "", ['say "hi"', "a\\b", "是的", "否"]), ("w", "是", ["是的", "否"])]),
    Scenario("已生成的字节停在一个多字节字符中间", ["m", "n"], {"n": "否".encode()[:2], "m": "是".encode()[:1]},
             {"n": [c.encode() for c in ("否", "否则")], "m": [c.encode() for c in ("是的", "否")]}),
    # b"caf\xc3" is "caf" plus the first byte of "é": as text (errors ignored) it equals the choice "caf", as bytes
    # it equals no choice, so EOS must wait (xgrammar matches bytes).
    Scenario("停在多字节字符中间，去掉半个字符后恰好是另一个选项（caf / café）", ["k", "c"],
             {"c": b"caf", "k": "café".encode()[:4]},
             {"c": [c.encode() for c in ("caf", "café")], "k": [c.encode() for c in ("caf", "café")]}),
    # token 31 is b"<" and token 63 b"\\": bit 31 of words 0 and 1, the int32 sign bit.
    _scenario("允许的 token 在一个字的第 31 位（int32 的符号位：token 31 '<'、63 '\\'）",
              [("g", "", ["<yes>", "<no>"]), ("h", "a", ["a\\b", "ab"])]),
]


# ---------------------------------------------------------------------------- checks
def _call_bitmask(choice_bitmask, sc: Scenario, vocab: Vocab) -> torch.Tensor:
    __tracebackhide__ = True
    try:
        got = choice_bitmask(list(sc.batch_req_ids), dict(sc.generated), {k: list(v) for k, v in sc.choices.items()},
                             vocab.trie, vocab.eos_token_id, vocab.vocab_size)
    except (CheckFailed, BlankNotFilled):
        raise
    except Exception as e:
        raise CheckFailed(f"场景「{sc.name}」：choice_bitmask 抛出 {type(e).__name__}: {e}") from None
    words = (vocab.vocab_size + 31) // 32
    expect(isinstance(got, torch.Tensor), f"场景「{sc.name}」：choice_bitmask 应返回 torch.Tensor，实际 {type(got).__name__}。")
    expect(got.dtype == torch.int32, f"场景「{sc.name}」：bitmask 的 dtype 应为 torch.int32（vLLM 的布局），实际 {got.dtype}。")
    expect(tuple(got.shape) == (len(sc.batch_req_ids), words),
           f"场景「{sc.name}」：bitmask 形状应为 ({len(sc.batch_req_ids)}, {words})，实际 {tuple(got.shape)}。")
    return got


def _describe(vocab: Vocab, token: int) -> str:
    return "EOS" if token == vocab.eos_token_id else repr(vocab.token_bytes[token])


@graded
def check_choice_bitmask(choice_bitmask) -> None:
    """Equal to xgrammar's bitmask, word for word, in every scenario (batch order, progress, choice lists,
    bit layout); a failure names the row and token."""
    __tracebackhide__ = True
    vocab = default_vocab()
    for sc in SCENARIOS:
        got = _call_bitmask(choice_bitmask, sc, vocab)
        want = xgrammar_choice_bitmask(sc.batch_req_ids, sc.generated, sc.choices, vocab)
        if torch.equal(got, want):
            continue
        g, w = unpack(got, vocab.vocab_size), unpack(want, vocab.vocab_size)
        row = int((g != w).any(dim=1).nonzero()[0])
        req_id = sc.batch_req_ids[row]
        extra = (g[row] & ~w[row]).nonzero().flatten().tolist()
        missing = (w[row] & ~g[row]).nonzero().flatten().tolist()
        detail = []
        if extra:
            detail.append(f"多允许了 {len(extra)} 个 token，例如 {extra[0]}（{_describe(vocab, extra[0])}）")
        if missing:
            detail.append(f"漏掉了 {len(missing)} 个应允许的 token，例如 {missing[0]}（{_describe(vocab, missing[0])}）")
        if not detail:
            detail.append("允许集合相同，但打包后的 int32 字不同（检查位序与符号位）")
        raise CheckFailed(f"场景「{sc.name}」第 {row} 行（请求 {req_id!r}，已生成 {sc.generated[req_id]!r}，"
                          f"选项 {sc.choices[req_id]}）与 xgrammar 不一致：" + "；".join(detail) + "。")
    check_vllm_bitmask(choice_bitmask)


def vllm_rows_in_batch_order(answer: dict, batch_req_ids: list[str]) -> torch.Tensor:
    """vLLM's recorded rows (scheduler order, as grammar_bitmask fills them) moved to the batch's rows by
    request id, as its runner's apply_grammar_bitmask does."""
    by_id = dict(zip(answer["order"], answer["rows"], strict=True))
    return torch.tensor([by_id[r] for r in batch_req_ids], dtype=torch.int32)


def vllm_walk_steps(answer: dict, choices: list[bytes], vocab: Vocab):
    """(step, bytes generated before it, vLLM's row) of a recorded walk, until EOS."""
    done = b""
    for k, step in enumerate(answer["steps"]):
        yield k, done, torch.tensor([step["row"]], dtype=torch.int32)
        done += vocab.token_bytes[step["token"]]


def check_vllm_bitmask(choice_bitmask) -> None:
    """Equal to the pinned vLLM's StructuredOutputManager.grammar_bitmask, word for word (recorded in
    data/vllm_views/lesson08.json.xz): the lesson's batches, and three requests walked token by token."""
    __tracebackhide__ = True
    from autograder.vllm_oracle import recorded, scenarios

    vocab = default_vocab()
    for name, case in scenarios("lesson08").items():
        want = recorded("lesson08", name)
        if name.startswith("batch_"):
            generated = {r: bytes(case["generated"][r]) for r in case["scheduled"]}
            choices = {r: [c.encode() for c in case["choices"][r]] for r in case["scheduled"]}
            sc = Scenario(name, list(case["batch"]), generated, choices)
            got = _call_bitmask(choice_bitmask, sc, vocab)
            expect(torch.equal(got, vllm_rows_in_batch_order(want, sc.batch_req_ids)),
                   f"批 {name}（批内行 {sc.batch_req_ids}）：与 vLLM {VLLM_VERSION} 的 grammar_bitmask 按请求 id 重排后的行不同。")
            continue
        choices = [c.encode() for c in case["choices"]]
        for k, done, row in vllm_walk_steps(want, choices, vocab):
            sc = Scenario(name, ["r"], {"r": done}, {"r": list(choices)})
            got = unpack(_call_bitmask(choice_bitmask, sc, vocab), vocab.vocab_size)[0]
            w = unpack(row, vocab.vocab_size)[0]
            extra, missing = (got & ~w).nonzero().flatten().tolist(), (w & ~got).nonzero().flatten().tolist()
            expect(not extra and not missing,
                   f"选项 {choices}、已生成 {done!r}（第 {k} 步）：vLLM {VLLM_VERSION} 的 grammar_bitmask 允许 {int(w.sum())} 个 "
                   f"token，你的多允许 {[_describe(vocab, t) for t in extra[:3]]}、漏掉 "
                   f"{[_describe(vocab, t) for t in missing[:3]]}。")


def check_apply_bitmask(apply_bitmask_and_sample) -> None:
    """The sampler must see the masked logits: disallowed -> -inf, allowed unchanged, rows untouched otherwise."""
    __tracebackhide__ = True
    gen = torch.Generator().manual_seed(8)
    vocab_size = 70  # 3 words, the last one partly padding
    logits = torch.randn(4, vocab_size, generator=gen)
    allowed = torch.rand(4, vocab_size, generator=gen) < 0.3
    allowed[:, 31] = True  # bit 31: a negative int32 word
    allowed[2] = True  # a free row
    words = torch.zeros(4, 3, dtype=torch.int64)
    for row, token in allowed.nonzero().tolist():
        words[row, token // 32] |= 1 << (token % 32)
    bitmask = words.to(torch.int32)
    seen = []

    def sample(x):
        seen.append(x.clone())
        return x.argmax(dim=-1)
    try:
        tokens = apply_bitmask_and_sample(logits.clone(), bitmask.clone(), sample)
    except BlankNotFilled:
        raise
    except Exception as e:
        raise CheckFailed(f"apply_bitmask_and_sample 抛出 {type(e).__name__}: {e}") from None
    want = logits.masked_fill(~allowed, float("-inf"))
    expect(len(seen) == 1, f"sample 应被调用恰好一次，实际 {len(seen)} 次。")
    expect(seen[0].shape == want.shape, f"传给 sample 的 logits 形状应为 {tuple(want.shape)}，实际 {tuple(seen[0].shape)}。")
    leaked = (torch.isfinite(seen[0]) & ~allowed).nonzero().tolist()
    expect(not leaked, f"sample 看到的 logits 中，不允许的 token 仍是有限值（例如 行 {leaked[0][0]}、token "
                       f"{leaked[0][1]}）：mask 必须在采样之前作用于 logits。" if leaked else "")
    expect(torch.equal(seen[0], want), "允许的 token 的 logits 必须保持原值，不允许的为 -inf。")
    expect(torch.equal(torch.as_tensor(tokens), want.argmax(dim=-1)), "返回值应是 sample(被 mask 后的 logits) 的结果。")


# ---------------------------------------------------------------------------- the real engine
class StudentChoiceManager(StructuredOutputManager):
    """minivllm's manager with the bitmask filled by the student's choice_bitmask (choice requests only).

    Compilation, WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR and the xgrammar matchers stay the engine's: every
    sampled token still advances the real matcher, which rejects (FINISHED_ERROR) any token a wrong mask let in.
    """

    def __init__(self, vllm_config, choice_bitmask, vocab: Vocab) -> None:
        super().__init__(vllm_config)
        self.choice_bitmask, self.vocab = choice_bitmask, vocab

    def grammar_bitmask(self, requests, structured_output_request_ids, scheduled_spec_decode_tokens):
        ids = list(structured_output_request_ids)
        tb = self.vocab.token_bytes
        generated = {r: b"".join(tb[t] for t in requests[r].output_token_ids) for r in reversed(ids)}
        choices = {r: [c.encode() for c in requests[r].structured_output_request.params.choice] for r in reversed(ids)}
        bitmask = self.choice_bitmask(ids, generated, choices, self.vocab.trie, self.vocab.eos_token_id,
                                      self.vocab.vocab_size)
        return bitmask.numpy().copy()


@dataclass
class EngineRun:
    outputs: dict[str, str]  # request id -> text
    finish: dict[str, str]
    free_alone: dict[str, list[int]]
    free_mixed: dict[str, list[int]]
    events: list
    choices: dict[str, list[str]]


CHOICE_SETS = [["yes", "no", "perchance"], ["alas", "anon", "alack", "forsooth"], ["no", "none", "nothing"],
               ["是的", "否"], ["<yes>", "<no>"]]  # the last: only token 31 ("<", bit 31 of word 0) may start it
PROMPTS = ["ROMEO:", "JULIET:", "KING HENRY:", "HAMLET:\nTo be", "First Citizen:"]


def run_engine(choice_bitmask=None) -> EngineRun:
    """Free requests alone, then a mixed batch with choice requests (greedy and seeded), on the plugged engine."""
    from minivllm.config import EngineArgs
    from minivllm.engine import EngineCoreRequest
    from minivllm.engine.core import EngineCore
    from minivllm.sampling_params import SamplingParams, StructuredOutputsParams
    vocab = default_vocab()
    core = EngineCore.from_engine_args(EngineArgs(device="cpu", attention_backend="torch", max_model_len=128,
                                                  trace=True))
    if choice_bitmask is not None:  # None: the engine's own xgrammar bitmask (the demo)
        manager = StudentChoiceManager(core.vllm_config, choice_bitmask, vocab)
        core.structured_output_manager.shutdown()
        core.structured_output_manager = core.scheduler.structured_output_manager = manager

    def drain() -> tuple[dict[str, list], dict[str, list[int]]]:
        """Every request's outputs, and its tokens."""
        got: dict[str, list] = {}
        while core.scheduler.has_requests():
            for o in core.step()[0].outputs:
                got.setdefault(o.request_id, []).append(o)
        return got, {r: [t for o in outs for t in o.new_token_ids] for r, outs in got.items()}

    def add(req_id, prompt, sp):
        core.add_request(EngineCoreRequest(req_id, vocab.encode(prompt), sp, vocab.eos_token_id))
    try:
        free = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        for i, p in enumerate(PROMPTS):
            add(f"free{i}", p, free)
        alone = drain()[1]
        core.tracer.clear()
        choices = {}
        for i, p in enumerate(PROMPTS):
            add(f"free{i}", p, free)
            cs = CHOICE_SETS[i % len(CHOICE_SETS)]
            sp = SamplingParams(max_tokens=16, temperature=0.0 if i % 2 else 1.0, seed=i,
                                structured_outputs=StructuredOutputsParams(choice=cs))
            add(f"choice{i}", PROMPTS[-1 - i], sp)
            choices[f"choice{i}"] = cs
        # the grammars compile on the engine's thread pool; a request joins the batch once its grammar is ready.
        # Wait for all of them, so every run has the same batches whatever the machine's speed (a wrong mask's
        # garbage, and so its verdict, would otherwise depend on which compile finished first)
        compiling = [r.structured_output_request for r in core.scheduler.requests.values()
                     if r.structured_output_request is not None]
        while not all(so.is_grammar_ready for so in compiling):
            time.sleep(0.002)
        got, toks = drain()
    finally:
        core.shutdown()
    tb = vocab.token_bytes
    texts = {r: b"".join(tb[t] for t in toks[r]).decode("utf-8", "replace") for r in choices}
    finish = {r: str(got[r][-1].finish_reason) for r in choices}
    return EngineRun(texts, finish, alone, {r: toks[r] for r in alone}, list(core.tracer.events), choices)


def judge_engine_run(run: EngineRun) -> None:
    __tracebackhide__ = True
    for req_id, text in run.outputs.items():
        expect(text in run.choices[req_id],
               f"接入真实引擎后，请求 {req_id} 的输出 {text!r}（finish_reason={run.finish[req_id]}）不是选项 "
               f"{run.choices[req_id]} 之一：bitmask 放行了 xgrammar 不接受的 token，或没有在完成时放行 EOS。")
    for req_id, tokens in run.free_alone.items():
        expect(run.free_mixed[req_id] == tokens,
               f"自由请求 {req_id} 与受约束请求同批时输出变了：{run.free_mixed[req_id]} != {tokens}"
               "（bitmask 的行是否按批内顺序排列？）")
    span = {(e.step, e.phase): e for e in run.events}
    steps = [s for (s, p) in span if p == "grammar" and (s, "execute") in span and (s, "wait") in span]
    expect(steps, "trace 中没有需要 bitmask 的步骤。")
    out_of_order = [s for s in steps if not (span[s, "execute"].end <= span[s, "grammar"].start
                                                        <= span[s, "grammar"].end <= span[s, "wait"].start)]
    expect(not out_of_order, f"第 {out_of_order[:3]} 步的 bitmask 不在“发出 forward”与“等待 forward”之间计算："
           "它应与 forward 重叠（同一线程上的事件顺序，与机器快慢无关）。")


@graded
def check_real_engine(choice_bitmask) -> EngineRun:
    __tracebackhide__ = True
    _call_bitmask(choice_bitmask, SCENARIOS[0], default_vocab())  # blanks first: the engine would bury them
    try:
        run = run_engine(choice_bitmask)
    except (CheckFailed, BlankNotFilled):
        raise
    except Exception as e:
        raise CheckFailed(f"接入真实引擎时 choice_bitmask 出错：{type(e).__name__}: {e}") from None
    judge_engine_run(run)
    return run


# ---------------------------------------------------------------------------- source mapping
# Names in the pinned vLLM's v1/structured_output/ (utils.py, __init__.py, backend_types.py, request.py) that the
# lesson does not print; SourceMap says how they are stored.
SOURCE = SourceMap(["escape", "parallel_fill", "terminated", "ready"], {
    "escape": {"1949ed5622e14050"},
    "parallel_fill": {"c7cca724a0d1f1fa"},
    "terminated": {"5cec899047cf5c5b"},
    "ready": {"d1bc5626ae4f101f", "bc7f49111cb03d65"},  # the method, or its public wrapper
}, unmapped="这些空没有映射到 vLLM 结构化输出中对应的对象或方法",
    name=lambda s: re.sub(r"\(.*\)", "", str(s)).strip().strip("`").replace(" ", "").split(".")[-1].lower(),
    title="代码·映射回源码对象")


@graded
def check_boundary(choice_bitmask, apply_bitmask_and_sample) -> None:
    """Covers EOS and masking: EOS exactly when the bytes equal a choice (any choice, also when a longer one
    continues, in either list order), and the mask before the sampler."""
    __tracebackhide__ = True
    vocab = default_vocab()
    for sc in [s for s in SCENARIOS if s.name.startswith(("一个选项", "已完整", "停在多字节"))]:
        got = unpack(_call_bitmask(choice_bitmask, sc, vocab), vocab.vocab_size)
        for row, req_id in enumerate(sc.batch_req_ids):
            complete = sc.generated[req_id] in sc.choices[req_id]
            expect(bool(got[row, vocab.eos_token_id]) == complete,
                   f"请求 {req_id!r} 已生成 {sc.generated[req_id]!r}（选项 {sc.choices[req_id]}）："
                   f"EOS {'应当' if complete else '不应'}被允许。")
    check_apply_bitmask(apply_bitmask_and_sample)


LESSON = Lesson(
    lesson_id="lesson08",
    title="结构化输出：grammar bitmask 与 CPU/GPU 重叠",
    answer=("choice_bitmask",),
    code={
        "main_path": ("代码·主路径：bitmask 与 xgrammar 逐字相同", check_choice_bitmask),
        "real_engine": ("代码·接入真实引擎（输出总是选项、自由请求不变、与 forward 重叠）", check_real_engine),
        "boundary": ("代码·边界：选项完成时的 EOS、mask 先于采样", check_boundary, ("choice_bitmask", "apply_bitmask_and_sample")),
    },
    source_map=SOURCE,
    questions=("bitmask 为何与 forward 并行", "编译延迟与 WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR", "投机解码时变什么"),
)
check_source_map = SOURCE.check
