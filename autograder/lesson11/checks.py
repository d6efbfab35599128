"""Lesson 11 — CUDA Graph 与动态形状: the checks behind the grade cells and the engine plug.

The exercise pads a decode batch to a capture size, in three small functions (the student's answer):
    choose_capture_size(num_reqs, capture_sizes) -> int | None   smallest size >= num_reqs; None: run eagerly
    fill_static_buffers(bufs, input_ids, positions, slot_mapping, seq_lens, block_table, size) -> None
                                                                  real rows first, then harmless padded rows
    real_rows(hidden, num_reqs) -> hidden states of the real rows only (they go on to compute_logits)

plug() puts them into minivllm's GPUModelRunner in place of CudagraphDispatcher.dispatch and
_pad_for_cudagraph. On CPU the engine's enforce_eager=False path "replays" eagerly from the same static
buffers, so every check here runs on CPU; on a GPU the same plug feeds real CUDA graphs.
Grade cells and `python -m autograder check lesson11 ...` call the same check_* functions here (each docstring
says what it covers; every one is @graded).

Input space (each dimension -> the part that covers it):
    num_reqs        1, between sizes (3, 5, 17, 20, 25, 33), exactly a size (8, 24, 40), above every size (9, 41)
                                                                                        main, boundary
    capture_sizes   vLLM's decode graphs for six settings (defaults at max_num_seqs 20 and 256, interactivity,
                    user lists, sizes above the token budget), every n up to the largest + 1  main (vLLM)
                    powers of two [1, 2, 4, 8]; vLLM's default head [1, 2, 4, 8, 16, 24, 32, 40] (not powers of
                    two: the next power of two is the wrong size); ascending and not in ascending order (the
                    smallest fitting size, not the first); in the engine also [1, 3, 6]     main, boundary
    buffers         fresh (as allocated), stale from a bigger batch (77 everywhere), a block table
                    narrower than the buffer's                                          main, boundary
    padded rows     token 0, position 0 (in range), slot PAD_SLOT_ID (no KV written), seq_len 0, block-table
                    row 0 (vLLM V1 fills NULL_BLOCK_ID, V2 zeroes it); a real row's columns past this batch's
                    table are not checked (V2 leaves them stale; seq_len bounds every read)  main, boundary
    engine          enforce_eager=False with capture sizes [1, 2, 4, 8]: batches of 3 and 8 shrinking as
                    requests finish (every size, padded and exact); with sizes [1, 3, 6]: 5 requests (pad to 6,
                    then 3, 1); KV blocks outside the batch untouched                   real engine, boundary
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from autograder.common import (
    DEFAULT_MODEL,
    CheckFailed,
    Lesson,
    SourceMap,
    ______,
    blank_in_function,
    expect,
    graded,
)
from autograder.pin import VLLM_VERSION
from minivllm.compilation.cuda_graph import PAD_SLOT_ID, BatchDescriptor

CAPTURE_SIZES = [1, 2, 4, 8]
VLLM_HEAD = [1, 2, 4, 8, 16, 24, 32, 40]  # vLLM's default list begins so: [1, 2, 4] + range(8, 256, 8) + ...
ODD_SIZES = [1, 3, 6]                     # the engine run of check_boundary: no size a power of two above 2
MAX_TOKENS = 6


@dataclass
class StaticBuffers:
    """The runner's persistent inputs a captured graph reads (views of GPUModelRunner.cg_*)."""

    input_ids: torch.Tensor     # int64 [max_size]
    positions: torch.Tensor     # int64 [max_size]
    slot_mapping: torch.Tensor  # int64 [max_size]; PAD_SLOT_ID (-1) = write nothing
    seq_lens: torch.Tensor      # int32 [max_size]; 0 = attend to nothing
    block_table: torch.Tensor   # int32 [max_size, max_blocks_per_req]


def buffers_of(runner) -> StaticBuffers:
    return StaticBuffers(runner.cg_input_ids, runner.cg_positions, runner.cg_slot_mapping, runner.cg_seq_lens,
                         runner.cg_block_table)


def runner_of(llm):
    return llm.llm_engine.engine_core.model_executor.driver_worker.model_runner


def make_engine(enforce_eager: bool, max_num_seqs: int = 8, capture_sizes=tuple(CAPTURE_SIZES), **kw):
    from minivllm.entrypoints.llm import LLM
    return LLM(DEFAULT_MODEL, device="cpu", attention_backend="torch", multiprocess=False, enforce_eager=enforce_eager,
               cudagraph_capture_sizes=list(capture_sizes), max_num_seqs=max_num_seqs, **kw)


def surfaced(llm, hook):
    """hook, with its first exception kept on llm.check_errors: the engine ends a failed step's requests with
    an error instead of raising (EngineCore), so generate() re-raises it for the check to report."""
    def run(*args):
        try:
            return hook(*args)
        except BaseException as e:
            llm.check_errors.append(e)
            raise
    return run


def plug(llm, choose_capture_size, fill_static_buffers, real_rows,
         sizes=tuple(CAPTURE_SIZES)) -> list[tuple[int, int | None]]:
    """Route the engine's padded path through the student's functions (the engine was built with capture sizes
    `sizes`); returns (num_reqs, size) per decode step."""
    runner, seen, sizes = runner_of(llm), [], list(sizes)
    llm.check_errors = []
    max_model_len = runner.max_model_len

    def dispatch(num_tokens: int, uniform_decode: bool):
        if not uniform_decode or num_tokens == 0:
            return None
        size = choose_capture_size(num_tokens, list(sizes))
        seen.append((num_tokens, size))
        if size is None:
            return None
        expect(isinstance(size, int) and size in sizes and size >= num_tokens,
               f"choose_capture_size({num_tokens}, {sizes}) 应返回列表里一个 >= {num_tokens} 的捕获尺寸或 None，"
               f"得到 {size!r}")
        return BatchDescriptor(size, size, True)

    def pad(desc, input_ids, positions, md):
        n, size = md.num_actual_tokens, desc.num_tokens
        runner.cg_attn_metadata[size].backend_cache.clear()  # the runner's bookkeeping, as in _pad_for_cudagraph
        fill_static_buffers(buffers_of(runner), input_ids, positions, md.slot_mapping, md.seq_lens, md.block_table,
                            size)
        pos = runner.cg_positions[:size]
        expect(bool(((pos >= 0) & (pos < max_model_len)).all()),
               f"填充行的 position 越界：应在 [0, {max_model_len})，得到 {pos[n:size].tolist()}")
        return runner.cg_input_ids[:size], pos, runner.cg_attn_metadata[size]

    forward = runner._model_forward

    def model_forward(desc, input_ids, positions, md):
        hidden = forward(desc, input_ids, positions, md)
        if desc is None:
            return hidden
        n = int((md.seq_lens > 0).sum())
        rows = real_rows(hidden, n)
        expect(tuple(rows.shape) == (n, hidden.shape[1]),
               f"real_rows 应只返回 {n} 个真实行，得到形状 {tuple(rows.shape)}（填充行的输出不能交给采样）")
        return rows

    runner.cudagraph_dispatcher.dispatch = surfaced(llm, dispatch)
    runner._pad_for_cudagraph = surfaced(llm, pad)
    runner._model_forward = surfaced(llm, model_forward)
    return seen


def prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(4, 4000) for _ in range(rng.randint(3, 30))] for _ in range(n)]


def generate(llm, batch: list[list[int]]) -> list[list[int]]:
    from minivllm.sampling_params import SamplingParams
    params = [SamplingParams(max_tokens=MAX_TOKENS + i, temperature=0.0, ignore_eos=True) for i in range(len(batch))]
    outs = [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]
    if getattr(llm, "check_errors", None):
        raise llm.check_errors[0]
    return outs


def stale_case() -> tuple[StaticBuffers, tuple]:
    """Buffers of size 8 left full of 77 by an earlier batch, and a 3-request decode batch to pad to 4:
    (bufs, (input_ids, positions, slot_mapping, seq_lens, block_table))."""
    bufs = StaticBuffers(torch.full((8,), 77), torch.full((8,), 77), torch.full((8,), 77),
                         torch.full((8,), 77, dtype=torch.int32), torch.full((8, 4), 77, dtype=torch.int32))
    return bufs, (torch.tensor([5, 6, 7]), torch.tensor([3, 17, 40]), torch.tensor([51, 97, 168]),
                  torch.tensor([4, 18, 41], dtype=torch.int32),
                  torch.tensor([[3, 0, 0], [5, 6, 0], [9, 10, 11]], dtype=torch.int32))


def fresh_case() -> tuple[StaticBuffers, tuple]:
    """Buffers of size 8 as the runner allocates them (zeros, slots PAD_SLOT_ID) and a 5-request decode batch
    to pad to 8: (bufs, (input_ids, positions, slot_mapping, seq_lens, block_table))."""
    bufs = StaticBuffers(torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64),
                         torch.full((8,), PAD_SLOT_ID, dtype=torch.int64), torch.zeros(8, dtype=torch.int32),
                         torch.zeros((8, 3), dtype=torch.int32))
    return bufs, (torch.tensor([11, 12, 13, 14, 15]), torch.tensor([0, 4, 16, 20, 33]),
                  torch.tensor([16, 36, 64, 84, 113]), torch.tensor([1, 5, 17, 21, 34], dtype=torch.int32),
                  torch.tensor([[1, 0, 0], [2, 0, 0], [3, 4, 0], [5, 6, 0], [7, 8, 9]], dtype=torch.int32))


def _expect_size(choose_capture_size, n: int, sizes: list[int], why: str = "") -> None:
    fits = [s for s in sizes if s >= n]
    want = min(fits) if fits else None
    got = choose_capture_size(n, list(sizes))
    if want is None:
        expect(got is None, f"{n} 个请求超过最大捕获尺寸 {max(sizes)}：choose_capture_size({n}, {sizes}) 应返回 None"
               f"（走 eager），而不是截断或越界，得到 {got!r}")
    elif want == n:
        expect(got == want, f"{n} 个请求正好是捕获尺寸 {n}，不需要填充：choose_capture_size({n}, {sizes}) 应返回 {n}"
               f"（能装下的最小尺寸），得到 {got!r}" + why)
    else:
        expect(got == want, f"choose_capture_size({n}, {sizes}) 应为能装下的最小尺寸 {want}，得到 {got!r}" + why)


def check_against_vllm(choose_capture_size) -> None:
    """choose_capture_size against the pinned vLLM's own CudagraphDispatcher.dispatch (recorded: grading never needs
    vLLM): for each setting of autograder/lesson11/vllm_view.py, given the decode graphs vLLM captured (in
    reverse order for every other setting), every batch of 1 .. max_cudagraph_capture_size + 1 requests must run
    at vLLM's size, or eagerly (None) where vLLM runs it without a graph."""
    from autograder.lesson11.vllm_view import SCENARIOS
    from autograder.vllm_oracle import recorded

    for i, name in enumerate(SCENARIOS):
        ans = recorded("lesson11", name)
        sizes = ans["decode_capture_sizes"][::-1] if i % 2 else list(ans["decode_capture_sizes"])
        for n, mode, rows in ans["decode_padding"]:
            want = rows if mode == "FULL" else None
            got = choose_capture_size(n, list(sizes))
            expect(got == want, f"与 vLLM {VLLM_VERSION} 的 CudagraphDispatcher.dispatch 不同（设置 {name}，vLLM 为 decode 捕获的"
                   f"尺寸 {sizes}）：{n} 个请求 vLLM " + (f"填充到 {want} 行" if want is not None else "不用图、eager 运行")
                   + f"，choose_capture_size 得到 {got!r}")


@graded
def check_main_path(choose_capture_size, fill_static_buffers, real_rows) -> None:
    """Covers num_reqs 1 to 33 against powers of two and vLLM's default head, ascending and unordered; fresh
    buffers; the real rows; then every batch size of the recorded vLLM settings against vLLM's dispatcher."""
    for sizes in (CAPTURE_SIZES, [8, 2, 4, 1], [4, 8, 1, 2]):
        for n in (1, 3, 5, 8):
            _expect_size(choose_capture_size, n, sizes, "（尺寸列表不一定按升序排列）" if sizes != CAPTURE_SIZES else "")
    for sizes in (VLLM_HEAD, [40, 24, 8, 1, 32, 16, 4, 2]):
        for n in (3, 9, 17, 20, 25, 33):
            _expect_size(choose_capture_size, n, sizes, "（尺寸不一定是 2 的幂：vLLM 的默认列表里有 24、40……）")
    for n in (9, 17, 33):
        _expect_size(choose_capture_size, n, [1, 2, 4, 8, 16, 32, 64], "（相邻尺寸的间隔不一定是 8）")
    bufs, batch = fresh_case()
    fill_static_buffers(bufs, *batch, 8)
    for name, want in (("input_ids", [11, 12, 13, 14, 15, 0, 0, 0]), ("positions", [0, 4, 16, 20, 33, 0, 0, 0]),
                       ("slot_mapping", [16, 36, 64, 84, 113] + [PAD_SLOT_ID] * 3),
                       ("seq_lens", [1, 5, 17, 21, 34, 0, 0, 0])):
        got = getattr(bufs, name).tolist()
        expect(got == want, f"5 个请求填充到 8 行后 {name} 应为 {want}，得到 {got}"
               + ("（填充行必须不写 KV）" if name == "slot_mapping" else ""))
    expect(bufs.block_table[:5].tolist() == batch[4].tolist() and not bufs.block_table[5:].any(),
           f"block_table 应为本批的块表、填充行全 0，得到 {bufs.block_table.tolist()}")
    hidden = torch.arange(16.0).view(8, 2)
    rows = real_rows(hidden, 5)
    expect(isinstance(rows, torch.Tensor) and rows.tolist() == hidden[:5].tolist(),
           f"real_rows(8 行 hidden states, 5) 应只返回前 5 个真实行，得到 {rows!r}")
    check_against_vllm(choose_capture_size)


@graded
def check_real_engine(choose_capture_size, fill_static_buffers, real_rows) -> None:
    """3 requests (pad to 4) and 8 (a capture size), shrinking as they finish: tokens equal the unpadded run."""
    got = choose_capture_size(3, list(CAPTURE_SIZES))
    if got is ______:
        raise blank_in_function(choose_capture_size)
    expect(isinstance(got, int), f"choose_capture_size(3, {CAPTURE_SIZES}) 应返回一个整数尺寸，得到 {got!r}")
    eager, padded = make_engine(True), make_engine(False)
    seen = plug(padded, choose_capture_size, fill_static_buffers, real_rows)
    for n, seed in ((3, 1), (8, 2)):
        batch = prompts(n, seed)
        ref, out = generate(eager, batch), generate(padded, batch)
        for i, (a, b) in enumerate(zip(ref, out, strict=True)):
            expect(a == b, f"{n} 个请求的批次，第 {i} 个请求：不填充时生成 {a}，填充后生成 {b}")
    expect(any(size is not None and size > n for n, size in seen), "没有任何 decode 批次被填充：plug 未生效？")


def _pad_fault(name: str, got: list, want: list, n: int) -> str:
    """What is wrong in the padded rows of one field, named by the value found there."""
    pad = got[n:]
    if any(v == 77 for v in pad):
        return f"填充行还留着上一批的 77（{name} 的第 {n} 行起每步都要重写）"
    if any(v < 0 for v in pad) and name == "positions":
        return f"填充行的 position 是 {min(pad)}：rotary 用它查 cos/sin 表，应在 [0, max_model_len) 之内"
    return f"填充行应为 {want[n:]}，得到 {pad}" if got[:n] == want[:n] else f"真实行应为 {want[:n]}，得到 {got[:n]}"


@graded
def check_boundary(choose_capture_size, fill_static_buffers, real_rows) -> None:
    """Covers exactly a capture size and above every size (in either list order, powers of two or not), stale
    buffers from a bigger batch with a narrower block table, an engine with sizes [1, 3, 6], untouched KV blocks."""
    for sizes in (CAPTURE_SIZES, [8, 4, 2, 1]):
        _expect_size(choose_capture_size, 8, sizes)
        _expect_size(choose_capture_size, 9, sizes)
    for sizes in (VLLM_HEAD, [40, 24, 8, 1, 32, 16, 4, 2]):
        for n in (24, 40, 41):
            _expect_size(choose_capture_size, n, sizes)
    bufs, batch = stale_case()
    fill_static_buffers(bufs, *batch, 4)
    for name, want in (("input_ids", [5, 6, 7, 0]), ("positions", [3, 17, 40, 0]),
                       ("slot_mapping", [51, 97, 168, PAD_SLOT_ID]), ("seq_lens", [4, 18, 41, 0])):
        got = getattr(bufs, name)[:4].tolist()
        expect(got == want, f"{name} 的前 4 行应为 {want}，得到 {got}：" + _pad_fault(name, got, want, 3)
               + ("；填充行必须不写 KV" if name == "slot_mapping" else ""))
    table = bufs.block_table[:4]
    expect(table[:3, :3].tolist() == batch[4].tolist(),
           f"block_table 真实行的前 3 列应为本批的块表 {batch[4].tolist()}，得到 {table[:3, :3].tolist()}")
    expect(not table[3].any(), f"block_table 的填充行（第 3 行）应全为 0，不能留上一批残留的块号，得到 {table[3].tolist()}")
    padded = make_engine(False, capture_sizes=ODD_SIZES)
    plug(padded, choose_capture_size, fill_static_buffers, real_rows, sizes=ODD_SIZES)
    guard = kv_guard(padded)
    generate(padded, prompts(5, 3))
    expect(guard and max(guard) > 0, "没有检查到任何带填充行的 decode 步")


def kv_guard(llm) -> list[int]:
    """Around every padded forward: KV blocks outside the real rows' block tables keep their checksum."""
    runner, padded_rows = runner_of(llm), []
    forward = runner._model_forward

    def guarded(desc, input_ids, positions, md):
        if desc is None:
            return forward(desc, input_ids, positions, md)
        n = int((md.seq_lens > 0).sum())
        used = set(md.block_table[:n].flatten().tolist()) - {0}
        outside = [b for b in range(runner.kv_caches[0].shape[1]) if b not in used]
        before = [kv[:, outside].double().sum((0, 2, 3, 4)) for kv in runner.kv_caches]
        out = forward(desc, input_ids, positions, md)
        for layer, (kv, b) in enumerate(zip(runner.kv_caches, before, strict=True)):
            changed = [outside[i] for i in (kv[:, outside].double().sum((0, 2, 3, 4)) != b).nonzero().flatten().tolist()]
            if changed:
                raise CheckFailed(f"第 {layer} 层：填充行写入了不属于本批的 KV 块 {changed}（填充行的 slot 应为 {PAD_SLOT_ID}）")
        padded_rows.append(desc.num_tokens - n)
        return out
    runner._model_forward = surfaced(llm, guarded)
    return padded_rows


# ---------------------------------------------------------------------------- source map
FUNCTIONS = ["choose_capture_size", "fill_static_buffers", "real_rows"]
# Checked in the pinned vLLM (v1/cudagraph_dispatcher.py, config/compilation.py, v1/worker/gpu_model_runner.py),
# stored as SourceMap says. The lesson's text does not print them; its show_vllm cells print the fetched source,
# where padded_descriptor's answer is a call in dispatch (L303): a pointed look, which is the point. sorted_sizes
# and uniform_check: one look at the line the item names (the call).
SOURCE = SourceMap(["padded_descriptor", "sorted_sizes", "uniform_check"], {
    "padded_descriptor": {"10bb46f1dea3d9e8"},
    "sorted_sizes": {"a37fa3f3bae89541"},
    "uniform_check": {"6903cdc0453c0158"},
}, unmapped="这些概念没有映射到 vLLM 中对应的对象（方法或属性名）",
    name=lambda s: s.strip().strip("`").removesuffix("()").split(".")[-1].lower())


LESSON = Lesson(
    lesson_id="lesson11",
    title="CUDA Graph 与动态形状",
    answer=tuple(FUNCTIONS),
    code={
        "main_path": ("主路径·选尺寸、填静态缓冲、只取真实行", check_main_path),
        "real_engine": ("主路径·接入真实引擎", check_real_engine),
        "boundary": ("边界：正好一个尺寸、超过最大尺寸、残留缓冲、KV 不被写", check_boundary),
    },
    source_map=SOURCE,
    questions=("CUDA graph 省掉哪部分时间", "混合批次为何不录整图、上限之上为何不录", "填充的代价"),
)
check_source_map = SOURCE.check
