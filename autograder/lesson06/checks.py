"""Lesson 6 — PagedAttention：Triton decode kernel: the launcher around the student's kernel, the checks behind
the grade cells, the engine plug, the live demo and the figures.

Grade cells and `python -m autograder check lesson06 ...` call the check_* functions here (each docstring says
what it covers).

Input space (each dimension, and the graded part that covers it):
    seq_len               0 (padded row), 1, < a block, exactly 1 block, 1 past it, several blocks: main_path, boundary
    block_size            8, 16, 32: main_path, boundary; the engine's 16: real_engine
    heads                 MHA (ratio 1), GQA 3 / 4 (3 pads the group), MQA 8: main_path, boundary
    head_size             32, 64, 40 (not a power of two: padded dims masked): main_path, boundary
    block table           scattered, rows of different lengths (its stride is the table's width): every part
    cache layout          contiguous [num_blocks, block, heads, dim] K and V: every part; views of one
                          [num_blocks, 2, block, heads, dim] tensor (K and V interleaved block by block: the
                          block stride is twice the contiguous one, so stride_cache_block is not
                          BLOCK_SIZE * stride_cache_slot): main_path, real_engine (the plug hands the kernel the
                          engine's K/V as such views). The pinned vLLM's Triton and FlashAttention backends pack K and
                          V in the last dim instead ((num_blocks, block, heads, 2*dim) in memory, default NHD); a few
                          backends (hpc_attn) use [num_blocks, 2, ...]
    cache contents        NaN past seq_len in the last block; scores in the hundreds (exp overflow): boundary
    dtype / precision     fp32 on CPU (the interpreter computes tl.dot in fp32 whatever the dtype), so every
                          tl.dot's input_precision and COMPUTE_DTYPE casts are checked statically: every part
    engine                Triton backend, two sequences decoding in one batch across a block edge; prefix
                          caching and async scheduling off (they do not reach the kernel); K/V bytes read once:
                          real_engine

The student's kernel has the signature of minivllm's `_paged_decode_attention_kernel`; `launch` is the same
launcher as `paged_decode_attention`. Under the Triton interpreter (CPU) every load and store of the kernel is
bounds-checked against the tensors it was given, so a wrong pointer is a failed check, never a segfault.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import os
import shutil
import textwrap
import time
from dataclasses import dataclass, field
from unittest import mock

if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is first imported: without a GPU its kernels run in the interpreter

import torch  # noqa: E402

from autograder.common import (  # noqa: E402
    DEFAULT_MODEL,
    BlankNotFilled,
    CheckFailed,
    Lesson,
    SourceMap,
    expect,
    graded,
)

# The engine check: two prompts cut to 14 and 6 tokens (BOS included) and 6 greedy tokens, so r0 decodes at
# seq_len 15..19 (a full block at 16, then a second, partial one) while r1 decodes beside it in the same batch.
PROMPTS = ["ROMEO:\nBut soft, what light through yonder window breaks?", "JULIET:\nO Romeo, Romeo!"]
PROMPT_LENS = (14, 6)
MAX_TOKENS = 6
ATOL = 1e-4            # fp32 in, fp32 out: the kernel's own summation order only
HOT = 200.0            # query scale that puts scores in the hundreds: exp overflows fp32 past ~88.7


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def device() -> str:
    return "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"


# ---------------------------------------------------------------------------- bounds-checked interpreter
class OutOfBounds(Exception):
    """A load or store of the kernel touched memory outside every tensor it was given."""


@contextlib.contextmanager
def bounds_checked(tensors, counter: OpCounter | None = None):
    """Under TRITON_INTERPRET=1: every unmasked address a load/store touches must lie inside one of `tensors`.

    The interpreter reads raw addresses, so a wrong pointer would read garbage or crash the process; here it
    raises OutOfBounds instead. With `counter`, also counts loads, stores, dots and exps (the op counts).
    """
    if not interpreting():
        yield
        return
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder

    counter = OpCounter() if counter is None else counter  # counted either way; read only when asked

    ranges = []   # each tensor's own extent (k_cache and v_cache are views of one kv_cache: keep them apart)
    for name, t in tensors.items():
        last = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else -1
        ranges.append((name, t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size(), t.element_size()))

    def owner(ptrs, mask):
        addr = np.asarray(ptrs).astype(np.uint64)
        live = addr[np.broadcast_to(np.asarray(mask, dtype=bool), addr.shape)] if mask is not None else addr.ravel()
        if live.size == 0:
            return None, live
        lo, hi = int(live.min()), int(live.max())
        for name, start, end, _ in ranges:
            if start <= lo and hi < end:
                return name, live
        raise OutOfBounds(f"{live.size} 个地址落在 [{lo:#x}, {hi:#x}]，不在传给内核的任何一个张量之内")

    orig_load, orig_store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store
    orig_dot, orig_exp = InterpreterBuilder.create_dot, InterpreterBuilder.create_exp

    def load(self, ptrs, mask, other, *args):
        name, live = owner(ptrs.data, None if mask is None else mask.data)
        if name is not None:
            counter.loads[name] = counter.loads.get(name, 0) + live.size
            counter.load_bytes[name] = counter.load_bytes.get(name, 0) + live.size * (
                ptrs.get_element_ty().primitive_bitwidth // 8)
        return orig_load(self, ptrs, mask, other, *args)

    def store(self, ptrs, value, mask, *args):
        name, live = owner(ptrs.data, None if mask is None else mask.data)
        if name is not None:
            counter.stores[name] = counter.stores.get(name, 0) + live.size
        return orig_store(self, ptrs, value, mask, *args)

    def dot(self, a, b, d, *args):
        m, k = a.data.shape[-2:]
        counter.dot_flops += 2 * m * k * b.data.shape[-1]
        counter.dots += 1
        return orig_dot(self, a, b, d, *args)

    def exp(self, arg):
        counter.exps += int(np.asarray(arg.data).size)
        return orig_exp(self, arg)

    with mock.patch.multiple(InterpreterBuilder, create_masked_load=load, create_masked_store=store, create_dot=dot,
                             create_exp=exp):
        yield


@dataclass
class OpCounter:
    """What one launch did under the interpreter: elements/bytes loaded per tensor, stores, dots, exps."""

    loads: dict = field(default_factory=dict)        # tensor -> elements loaded (mask true)
    load_bytes: dict = field(default_factory=dict)   # tensor -> bytes loaded
    stores: dict = field(default_factory=dict)
    dots: int = 0
    dot_flops: int = 0
    exps: int = 0
    programs: int = 0
    iterations: int = 0                              # block-loop iterations over all programs


# ---------------------------------------------------------------------------- launcher
KERNEL_BLANK = "还有空 ______ 没有填写：把内核里每个 ______ 换成正确的表达式后再运行。"


def _require_filled(kernel) -> None:
    """A kernel whose code still names `______` fails before it is compiled or launched."""
    if "______" in getattr(getattr(getattr(kernel, "fn", kernel), "__code__", None), "co_names", ()):
        raise BlankNotFilled(KERNEL_BLANK)


def _is_compute_cast(node) -> bool:
    """`x.to(COMPUTE_DTYPE)`."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "to"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == "COMPUTE_DTYPE")


def gpu_portability_problems(kernel) -> list[str]:
    """What the CPU interpreter lets through but a GPU does not, read statically from the kernel's source.

    The interpreter ignores tl.dot's input_precision and computes in fp32 whatever the operand dtypes, so a
    tl.dot without input_precision=DOT_PRECISION (tf32 on a GPU: fp32 products lose precision) or with an
    operand not cast to COMPUTE_DTYPE (fp32 probs against a bf16 V: a compile error on a GPU) passes every
    numeric check here. Every tl.dot operand must be `x.to(COMPUTE_DTYPE)` (under tl.trans), or a name that
    is assigned one.
    """
    src = getattr(kernel, "src", None)
    if src is None:
        src = inspect.getsource(getattr(kernel, "fn", kernel))
    tree = ast.parse(textwrap.dedent(src))
    cast_names = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and _is_compute_cast(node.value)
                  for t in node.targets if isinstance(t, ast.Name)}
    problems = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dot"):
            continue
        call = ast.unparse(node)
        precision = {k.arg: k.value for k in node.keywords}.get("input_precision")
        if not (isinstance(precision, ast.Name) and precision.id == "DOT_PRECISION"):
            problems.append(f"`{call}` 没有写 input_precision=DOT_PRECISION：CPU 解释器忽略这个参数，GPU 上 fp32 "
                            "输入默认走 tf32，精度不够。")
        for arg in node.args[:2]:
            inner = arg
            while (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "trans"
                   and inner.args):
                inner = inner.args[0]
            if not (_is_compute_cast(inner) or (isinstance(inner, ast.Name) and inner.id in cast_names)):
                problems.append(f"`{call}` 的操作数 `{ast.unparse(arg)}` 没有转成 COMPUTE_DTYPE"
                                "（`.to(COMPUTE_DTYPE)`）：CPU 解释器一律按 fp32 算，GPU 上 bf16 cache 时 fp32 与 "
                                "bf16 相乘编译不过。")
    return problems


def launch(kernel, out, query, k_cache, v_cache, block_table, seq_lens, scale, num_warps=4, counter=None):
    """minivllm's paged_decode_attention with `kernel` in place of ours (same arguments, same grid)."""
    import triton

    from minivllm.attention.ops.triton_decode_attention import check_kv_cache, dot_config, head_dim_pad

    _require_filled(kernel)
    expect(hasattr(kernel, "fn") and hasattr(kernel, "__getitem__"),
           f"paged_decode_kernel 应是 @triton.jit 内核，实际是 {type(kernel).__name__}。")
    problems = gpu_portability_problems(kernel)
    expect(not problems, "内核在 CPU 上能算对，到 GPU 上却不行：" + "；".join(problems))
    num_seqs, num_heads, head_size = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    check_kv_cache(k_cache, v_cache)
    if num_seqs == 0:
        return out
    qpk = num_heads // num_kv_heads
    compute_dtype, dot_precision = dot_config(k_cache.dtype, query.device)
    tensors = dict(out=out, query=query, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                   seq_lens=seq_lens)
    if counter is not None:
        counter.programs += num_seqs * num_kv_heads
        counter.iterations += int(sum(-(int(s) // -block_size) for s in seq_lens[:num_seqs].tolist())) * num_kv_heads
    try:
        with bounds_checked(tensors, counter):
            kernel[(num_seqs, num_kv_heads)](
                out, query, k_cache, v_cache, block_table, seq_lens, scale,
                out.stride(0), out.stride(1), query.stride(0), query.stride(1),
                k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_table.stride(0), head_size,
                QUERIES_PER_KV=qpk, GROUP_PAD=max(16, triton.next_power_of_2(qpk)),
                HEAD_DIM_PAD=head_dim_pad(head_size), BLOCK_SIZE=block_size,
                COMPUTE_DTYPE=compute_dtype, DOT_PRECISION=dot_precision, num_warps=num_warps)
    except Exception as e:  # the interpreter wraps what the kernel raised: unwrap it into one line
        cause = e
        while cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, OutOfBounds):
            raise CheckFailed(f"内核访问越界：{cause}。检查 physical_block：读的是块表的哪一行、哪一列？") from None
        if "_Blank" in repr(cause) or isinstance(cause, BlankNotFilled):
            raise BlankNotFilled(KERNEL_BLANK) from None
        raise CheckFailed(f"内核运行出错：{type(cause).__name__}: {cause}") from None
    return out


# ---------------------------------------------------------------------------- cases and the torch oracle
@dataclass
class DecodeCase:
    """One decode batch: a paged cache whose blocks are scattered, the block table and lengths, the query."""

    query: torch.Tensor          # [num_seqs, num_heads, head_size]
    kv_cache: torch.Tensor       # [2, num_blocks, block_size, num_kv_heads, head_size]
    block_table: torch.Tensor    # [num_seqs, max_blocks] int32
    seq_lens: torch.Tensor       # [num_seqs] int32
    scale: float

    @property
    def k_cache(self):
        return self.kv_cache[0]

    @property
    def v_cache(self):
        return self.kv_cache[1]

    @property
    def block_size(self) -> int:
        return self.kv_cache.shape[2]

    @property
    def queries_per_kv(self) -> int:
        return self.query.shape[1] // self.kv_cache.shape[3]

    def describe(self) -> str:
        k = self.k_cache
        layout = "" if k.is_contiguous() else f", K/V cache 块步长 {k.stride(0)}（不是 block×heads×dim = {k.stride(0) // 2}）"
        return (f"seq_lens={self.seq_lens.tolist()}, block_size={self.block_size}, heads {self.query.shape[1]}/"
                f"{self.kv_cache.shape[3]} kv (GQA {self.queries_per_kv}), head_size {self.query.shape[2]}{layout}")


def interleaved_kv(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same K and V as views of one [num_blocks, 2, block_size, num_kv_heads, head_size] tensor: a block's
    K is followed by its V, so the block stride is twice the contiguous one (the slot, head and dim strides stay)."""
    both = torch.stack([k_cache, v_cache], dim=1)
    return both[:, 0], both[:, 1]


def make_case(seq_lens, num_heads=8, num_kv_heads=2, head_size=32, block_size=16, seed=0, q_scale=1.0,
              garbage=0.0, interleaved: bool = False) -> DecodeCase:
    """Every sequence's blocks are a random, non-monotone choice of physical blocks (plus a few unowned ones).
    `garbage` fills the unwritten slots past each sequence's length (NaN: what an unwritten cache may hold).
    interleaved: K and V are views of one [num_blocks, 2, ...] tensor (interleaved_kv), not contiguous."""
    from autograder.lesson06.vllm_view import case_tensors

    dev = device()
    spec = {"seq_lens": list(seq_lens), "num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_size": head_size,
            "block_size": block_size, "seed": seed}
    query, kv, table, _ = case_tensors(spec, garbage)
    query = query * q_scale
    if interleaved:
        kv = torch.stack([kv[0], kv[1]], dim=1).transpose(0, 1)  # [2, blocks, ...] view of [blocks, 2, ...]
    return DecodeCase(query.to(dev), kv.to(dev), table.to(dev),
                      torch.tensor(seq_lens, dtype=torch.int32, device=dev), head_size ** -0.5)


def reference(case: DecodeCase) -> torch.Tensor:
    """minivllm's torch oracle (attention/backends/torch_attn.py: paged_attention_ref), decodes only."""
    from minivllm.attention.backend import AttentionMetadata
    from minivllm.attention.backends.torch_attn import paged_attention_ref

    lens = case.seq_lens.cpu()
    live = lens > 0
    out = torch.zeros_like(case.query)
    if not bool(live.any()):
        return out
    idx = live.nonzero().flatten().to(case.query.device)
    qsl = torch.arange(int(live.sum()) + 1, dtype=torch.int32)
    md = AttentionMetadata(num_actual_tokens=int(live.sum()), max_query_len=1, query_start_loc=qsl,
                           max_seq_len=int(lens.max()), seq_lens=case.seq_lens[idx], block_table=case.block_table[idx],
                           slot_mapping=torch.empty(0, dtype=torch.int64), num_decodes=int(live.sum()),
                           num_decode_tokens=int(live.sum()), query_start_loc_cpu=qsl, seq_lens_cpu=lens[live])
    kv = torch.nan_to_num(case.kv_cache.float(), nan=0.0)   # the oracle masks by length; NaN*0 would still be NaN
    out[idx] = paged_attention_ref(case.query[idx].float(), kv, md, case.scale).to(out.dtype)
    return out


def run_decode(kernel, case: DecodeCase, counter: OpCounter | None = None) -> torch.Tensor:
    """The student's kernel on a case; rows it never writes stay NaN."""
    out = torch.full_like(case.query, float("nan"))
    launch(kernel, out, case.query, case.k_cache, case.v_cache, case.block_table, case.seq_lens, case.scale,
           counter=counter)
    return out


def max_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    err = (out.float() - ref.float()).abs()
    return float("inf") if bool(torch.isnan(err).any()) else float(err.max())


def _compare(kernel, case: DecodeCase, what: str) -> None:
    out, ref = run_decode(kernel, case), reference(case)
    err = (out.float() - ref.float()).abs()
    if bool(torch.isnan(out).any()) or float(err.max()) > ATOL:
        bad = torch.nonzero(torch.isnan(err) | (err > ATOL))
        seq, head = int(bad[0, 0]), int(bad[0, 1])
        got = "NaN" if bool(torch.isnan(out).any()) else f"{float(err.max()):.3g}"
        raise CheckFailed(f"{what}：与 torch 参考实现（paged_attention_ref）不一致，最大误差 {got}（容差 {ATOL}）；"
                          f"第一个出错的是序列 {seq}（seq_len={int(case.seq_lens[seq])}）的 query 头 {head}。"
                          f"用例：{case.describe()}。")


# ---------------------------------------------------------------------------- part checks
VISIBLE = dict(seq_lens=[5, 16, 17, 40], num_heads=8, num_kv_heads=2, head_size=32, block_size=16, seed=0)


@graded
def check_main_path(kernel) -> None:
    """Scattered blocks, lengths that cross block boundaries, GQA ratios 4, 1 and 8, block sizes 16 and 32,
    head sizes 32 and 64."""
    _compare(kernel, make_case(**VISIBLE), "可见断言的用例")
    _compare(kernel, make_case([23, 9, 33], num_heads=4, num_kv_heads=4, head_size=32, seed=1), "MHA（每个 kv 头 1 个 query 头）")
    _compare(kernel, make_case([50, 3], num_heads=8, num_kv_heads=1, head_size=64, seed=2), "MQA（8 个 query 头共享 1 个 kv 头）")
    _compare(kernel, make_case([70, 31], num_heads=4, num_kv_heads=2, head_size=32, block_size=32, seed=3),
             "block_size=32")
    _compare(kernel, make_case([29, 16, 45], seed=10, interleaved=True),
             "K/V 块步长不连续（K 与 V 按块交错存放，块步长 stride_cache_block 是连续布局的两倍）")


@graded
def check_boundary(kernel) -> None:
    """An empty (padded) row gives zeros; 1 token; exactly one full block; one past it; NaN in the unwritten
    tail of the last block; logits in the hundreds (exp overflows without the running max); GQA ratio 3;
    head_size 40 (padded dims) with block_size 8."""
    case = make_case([0, 1, 16, 17], seed=4)
    out = run_decode(kernel, case)
    expect(not bool(torch.isnan(out[0]).any()) and bool((out[0] == 0).all()),
           "seq_len=0 的行（批次里的填充行）应输出全 0：分母为 0 的行由给定代码置 0，你的循环不应读任何块。")
    _compare(kernel, case, "边界长度 0/1/16/17")
    _compare(kernel, make_case([3, 18, 33], garbage=float("nan"), seed=5),
             "最后一个块里 seq_len 之后的槽位是 NaN（未写入的 cache 可能是任何值）")
    _compare(kernel, make_case([20, 37], q_scale=HOT, seed=6),
             "打分在几百量级（不减去 running max 时 exp 会溢出成 inf）")
    _compare(kernel, make_case([19, 34], num_heads=6, num_kv_heads=2, seed=7), "GQA 比例 3（非 2 的幂，组被补到 16 行）")
    _compare(kernel, make_case([13, 41], num_heads=4, num_kv_heads=2, head_size=40, block_size=8, seed=8),
             "head_size=40（不是 2 的幂，维度被补到 64）、block_size=8")


# The accepted names, as sha256 prefixes of the lower-cased name (so the answer is not one `import` away):
# the variables of kernel_paged_attention_2d in vLLM's v1/attention/ops/chunked_prefill_paged_decode.py; where
# kernel_unified_attention (triton_unified_attention.py) names the same thing differently, that name too. Each
# blank but acc (the same name there), in the lines the reading table shows (L147–L167, L228–L251).
SOURCE = SourceMap(["physical_block", "token_mask", "rescale", "probs", "running_sum"], {
    "physical_block": {"53b974776d48d0b5", "737606eac498021b"},
    "token_mask": {"bf851d58bdf28bb5", "62f8b74af42ddb05", "5cc75d02ab50aa32"},
    "rescale": {"8ed3f6ad685b959e"},
    "probs": {"148de9c5a7a44d19"},
    "running_sum": {"acac86c0e609ca90"},
}, unmapped="这些空没有映射到 vLLM kernel_paged_attention_2d 中存放同一个量的变量",
    name=lambda s: str(s).strip().strip("`").replace(" ", "").rsplit(".", 1)[-1].lower())


# ---------------------------------------------------------------------------- the real engine
@dataclass
class DecodeCall:
    """One call of the decode kernel inside the engine (layer order: 4 calls per step for 4 layers)."""

    seq_lens: list
    block_table: list
    max_err: float                  # vs the torch oracle on the same inputs (nan when not compared)
    query: torch.Tensor | None = None
    k_cache: torch.Tensor | None = None
    v_cache: torch.Tensor | None = None
    scale: float = 0.0


@dataclass
class EngineRun:
    tokens: list                    # greedy token ids per prompt
    texts: list
    calls: list                     # DecodeCall per decode-kernel call
    seconds: float
    prompts: list = field(default_factory=list)


@contextlib.contextmanager
def decode_kernel_in_engine(kernel, calls: list | None = None, keep_last: bool = False, compare: bool = True):
    """Swap the decode kernel the Triton backend calls (minivllm/attention/backends/triton_attn.py looks up
    `paged_decode_attention` in its module at every forward) for `kernel`, launched like ours; restore it on
    exit. Each call is logged in `calls` with its error against the torch oracle (and, with keep_last, the
    last call keeps copies of its inputs, for replaying it)."""
    import minivllm.attention.backends.triton_attn as backend

    original = backend.paged_decode_attention

    def decode(out, query, k_cache, v_cache, block_table, seq_lens, scale, num_warps=4):
        if kernel is None:
            original(out, query, k_cache, v_cache, block_table, seq_lens, scale, num_warps=num_warps)
        else:  # the engine's K/V as interleaved views (interleaved_kv): the block stride is an argument
            launch(kernel, out, query, *interleaved_kv(k_cache, v_cache), block_table, seq_lens, scale,
                   num_warps=num_warps)
        if calls is not None:
            n = query.shape[0]
            err = float("nan")
            if compare:
                case = DecodeCase(query, torch.stack([k_cache, v_cache]), block_table[:n], seq_lens[:n], scale)
                err = max_error(out, reference(case))
            if keep_last and calls:
                calls[-1].query = calls[-1].k_cache = calls[-1].v_cache = None
            calls.append(DecodeCall(seq_lens[:n].tolist(), block_table[:n].tolist(), err,
                                    query.clone() if keep_last else None, k_cache.clone() if keep_last else None,
                                    v_cache.clone() if keep_last else None, scale))
        return out

    with mock.patch.object(backend, "paged_decode_attention", decode):
        yield


def run_engine(kernel=None, prompts=None, max_tokens: int = MAX_TOKENS, keep_last: bool = False,
               compare: bool = True) -> EngineRun:
    """Greedy generation on the default model with the Triton backend; kernel=None runs minivllm's own kernel."""
    import logging

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from minivllm.entrypoints.llm import LLM
    from minivllm.sampling_params import SamplingParams

    calls: list = []
    t = time.perf_counter()
    with decode_kernel_in_engine(kernel, calls, keep_last, compare):
        llm = LLM(DEFAULT_MODEL, multiprocess=False, attention_backend="triton", max_model_len=64, max_num_seqs=4,
                  enable_prefix_caching=False)
        if prompts is None:
            tok = llm.get_tokenizer()
            ids = [tok(text).input_ids[:n] for text, n in zip(PROMPTS, PROMPT_LENS, strict=True)]
            prompts = [{"prompt": tok.decode(i, skip_special_tokens=True), "prompt_token_ids": i} for i in ids]
        outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                            use_tqdm=False)
    return EngineRun([list(o.outputs[0].token_ids) for o in outs], [o.outputs[0].text for o in outs], calls,
                     time.perf_counter() - t, [o.prompt for o in outs])


@functools.cache
def reference_run() -> EngineRun:
    """minivllm's own decode kernel on PROMPTS (computed once per process; the last call keeps its inputs)."""
    return run_engine(None, keep_last=True)


def judge_engine_run(run: EngineRun, ref: EngineRun) -> None:
    expect(run.calls, "真实引擎没有调用你的 decode 内核（没有 decode 步）。")
    bad = [(i, c) for i, c in enumerate(run.calls) if not c.max_err <= ATOL]
    if bad:
        i, c = bad[0]
        raise CheckFailed(f"引擎里第 {i + 1} 次 decode 内核调用（共 {len(run.calls)} 次；seq_lens={c.seq_lens}，"
                          f"block_table={c.block_table}）的输出与 torch 参考实现差 {c.max_err:.3g}（容差 {ATOL}）。")
    expect(run.tokens == ref.tokens,
           f"接入 Triton 后端后贪心生成的 token 与参考内核不同：你的 {run.tokens}，参考 {ref.tokens}。")


@graded
def check_real_engine(kernel) -> EngineRun:
    """The student's kernel as the Triton backend's decode kernel: every call matches the oracle, and greedy
    generation on the default model equals the reference kernel's. Covers: the engine's block_size 16, two
    sequences decoding in one batch across a block edge, K/V bytes read once (interpreter counts)."""
    _require_filled(kernel)
    ref = reference_run()
    run = run_engine(kernel)
    judge_engine_run(run, ref)
    check_reads_once(kernel)
    return run


def check_reads_once(kernel) -> OpCounter | None:
    """The profiler side (CPU: the interpreter's counts): one launch loads each cached K/V byte of the batch
    exactly once and nothing past seq_len. On a GPU the engine check above is the whole check."""
    if not interpreting():
        return None
    case = make_case([15, 17, 40], seed=9)
    counter = OpCounter()
    run_decode(kernel, case, counter)
    got = counter.load_bytes.get("k_cache", 0) + counter.load_bytes.get("v_cache", 0)
    want = 2 * int(case.seq_lens.sum()) * case.kv_cache.shape[3] * case.kv_cache.shape[4] * case.kv_cache.element_size()
    expect(got == want, f"解释器计数：一次 launch 从 K/V cache 读了 {got} 字节，应恰好是这批序列的 K/V 各读一次 "
                        f"{want} 字节（{case.describe()}）。多读说明掩码漏了 seq_len 之后的槽位或重复读了块。")
    return counter


LESSON = Lesson(
    lesson_id="lesson06",
    title="PagedAttention：Triton decode kernel",
    answer=("paged_decode_kernel",),
    code={
        "main_path": ("主路径·对照 torch", check_main_path),
        "real_engine": ("主路径·真实引擎", check_real_engine),
        "boundary": ("边界条件", check_boundary),
    },
    source_map=SOURCE,
    questions=("带宽限制", "减去 max", "GQA 分组"),
)
check_source_map = SOURCE.check

