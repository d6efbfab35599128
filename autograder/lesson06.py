"""Lesson 6 — PagedAttention：Triton decode kernel: the launcher around the student's kernel, the checks behind
the grade cells, the engine plug, the live demo and the figures.

Grade cells and `python -m autograder check lesson06 ...` call the same functions here:
    check_main_path(kernel)    scattered blocks, lengths across block boundaries, GQA ratios vs the torch oracle
    check_real_engine(kernel)  the kernel as the Triton backend's decode kernel: same greedy tokens as ours
    check_boundary(kernel)     empty row, one token, exactly one block, NaN in unwritten slots, huge logits
    check_source_map(SOURCE_MAP) each blank named by its variable in vLLM's kernel_paged_attention_2d

The student's kernel has the signature of minivllm's `_paged_decode_attention_kernel`; `launch` is the same
launcher as `paged_decode_attention`. Under the Triton interpreter (CPU) every load and store of the kernel is
bounds-checked against the tensors it was given, so a wrong pointer is a failed check, never a segfault.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import os
import shutil
import textwrap
import time
from dataclasses import dataclass, field

if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is first imported (DESIGN.md §5)

import torch  # noqa: E402

from autograder.common import REPO, BlankNotFilled, CheckFailed, Lesson, Part, check_name_map, expect  # noqa: E402

DEFAULT_MODEL = str(REPO / "data" / "models" / "shakespeare-llama")
# The engine check: two prompts cut to 14 and 6 tokens (BOS included) and 6 greedy tokens, so r0 decodes at
# seq_len 15..19 (a full block at 16, then a second, partial one) while r1 decodes beside it in the same batch.
PROMPTS = ["ROMEO:\nBut soft, what light through yonder window breaks?", "JULIET:\nO Romeo, Romeo!"]
PROMPT_LENS = (14, 6)
MAX_TOKENS = 6
BLANKS = ["physical_block", "token_mask", "kv_offsets", "new_max", "rescale", "probs", "running_sum", "acc"]
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
        if counter is not None and name is not None:
            counter.add_load(name, live.size, ptrs.get_element_ty().primitive_bitwidth // 8)
        return orig_load(self, ptrs, mask, other, *args)

    def store(self, ptrs, value, mask, *args):
        name, live = owner(ptrs.data, None if mask is None else mask.data)
        if counter is not None and name is not None:
            counter.stores[name] = counter.stores.get(name, 0) + live.size
        return orig_store(self, ptrs, value, mask, *args)

    def dot(self, a, b, d, *args):
        if counter is not None:
            m, k = a.data.shape[-2:]
            counter.dot_flops += 2 * m * k * b.data.shape[-1]
            counter.dots += 1
        return orig_dot(self, a, b, d, *args)

    def exp(self, arg):
        if counter is not None:
            counter.exps += int(np.asarray(arg.data).size)
        return orig_exp(self, arg)

    InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store = load, store
    InterpreterBuilder.create_dot, InterpreterBuilder.create_exp = dot, exp
    try:
        yield
    finally:
        InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store = orig_load, orig_store
        InterpreterBuilder.create_dot, InterpreterBuilder.create_exp = orig_dot, orig_exp


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

    def add_load(self, name: str, n: int, elt: int) -> None:
        self.loads[name] = self.loads.get(name, 0) + n
        self.load_bytes[name] = self.load_bytes.get(name, 0) + n * elt


# ---------------------------------------------------------------------------- launcher
def _is_blank(kernel) -> bool:
    fn = getattr(kernel, "fn", kernel)
    code = getattr(fn, "__code__", None)
    return code is not None and "______" in code.co_names


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

    if _is_blank(kernel):
        raise BlankNotFilled("还有空 ______ 没有填写：把内核里每个 ______ 换成正确的表达式后再运行。")
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
            raise CheckFailed(f"内核访问越界：{cause}。检查 physical_block（读块表的哪一行、哪一列）和 kv_offsets"
                              "（块、槽位、kv 头、维度四项步长）。") from None
        if "_Blank" in repr(cause) or isinstance(cause, BlankNotFilled):
            raise BlankNotFilled("还有空 ______ 没有填写：把内核里每个 ______ 换成正确的表达式后再运行。") from None
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
        return (f"seq_lens={self.seq_lens.tolist()}, block_size={self.block_size}, heads {self.query.shape[1]}/"
                f"{self.kv_cache.shape[3]} kv (GQA {self.queries_per_kv}), head_size {self.query.shape[2]}")


def make_case(seq_lens, num_heads=8, num_kv_heads=2, head_size=32, block_size=16, seed=0, q_scale=1.0,
              garbage=0.0) -> DecodeCase:
    """Every sequence's blocks are a random, non-monotone choice of physical blocks (plus a few unowned ones).
    `garbage` fills the unwritten slots past each sequence's length (NaN: what an unwritten cache may hold)."""
    g = torch.Generator().manual_seed(seed)
    dev = device()
    blocks = [max(1, -(s // -block_size)) for s in seq_lens]
    num_blocks = sum(blocks) + 3
    perm = torch.randperm(num_blocks, generator=g)
    if perm[0] == 0:                              # keep logical 0 != physical 0 for the first sequence
        perm = perm.roll(1)
    table = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    start = 0
    for i, n in enumerate(blocks):
        table[i, :n] = perm[start:start + n]
        start += n
    kv = torch.randn(2, num_blocks, block_size, num_kv_heads, head_size, generator=g)
    for i, s in enumerate(seq_lens):
        for pos in range(s, blocks[i] * block_size):   # the tail of each sequence's last block
            kv[:, table[i, pos // block_size], pos % block_size] = garbage
    query = torch.randn(len(seq_lens), num_heads, head_size, generator=g) * q_scale
    return DecodeCase(query.to(dev), kv.to(dev), table.to(dev),
                      torch.tensor(seq_lens, dtype=torch.int32, device=dev), head_size ** -0.5)


def reference(case: DecodeCase) -> torch.Tensor:
    """minivllm's torch oracle (attention/backends/torch_attn.py: paged_attention_ref), decodes only."""
    from minivllm.attention.backends.abstract import AttentionMetadata
    from minivllm.attention.backends.torch_attn import paged_attention_ref

    n = case.query.shape[0]
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
    assert n == out.shape[0]
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


def check_main_path(kernel) -> None:
    """Scattered blocks, lengths that cross block boundaries, GQA ratios 4, 1 and 8, block sizes 16 and 32."""
    _compare(kernel, make_case(**VISIBLE), "可见断言的用例")
    _compare(kernel, make_case([23, 9, 33], num_heads=4, num_kv_heads=4, head_size=32, seed=1), "MHA（每个 kv 头 1 个 query 头）")
    _compare(kernel, make_case([50, 3], num_heads=8, num_kv_heads=1, head_size=64, seed=2), "MQA（8 个 query 头共享 1 个 kv 头）")
    _compare(kernel, make_case([70, 31], num_heads=4, num_kv_heads=2, head_size=32, block_size=32, seed=3),
             "block_size=32")


def check_boundary(kernel) -> None:
    """An empty (padded) row gives zeros; 1 token; exactly one full block; one past it; NaN in the unwritten
    tail of the last block; logits in the hundreds (exp overflows without the running max); GQA ratio 3."""
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


# The accepted names, as sha256 prefixes of the lower-cased name (so the answer is not one `import` away):
# the variables of kernel_paged_attention_2d in vLLM's v1/attention/ops/chunked_prefill_paged_decode.py; where
# kernel_unified_attention (triton_unified_attention.py) names the same thing differently, that name too.
SOURCE_HASHES = {
    "physical_block": {"53b974776d48d0b5", "737606eac498021b"},
    "token_mask": {"bf851d58bdf28bb5", "62f8b74af42ddb05", "5cc75d02ab50aa32"},
    "kv_offsets": {"c1066f76f19592c1", "640268017b8d9b81"},
    "new_max": {"c879cfab2bd64d1b"},
    "rescale": {"8ed3f6ad685b959e"},
    "probs": {"148de9c5a7a44d19"},
    "running_sum": {"acac86c0e609ca90"},
    "acc": {"414322309db5c06d"},
}


def name_hash(name: str) -> str:
    return hashlib.sha256(normalize_name(name).lower().encode()).hexdigest()[:16]


def normalize_name(name: str) -> str:
    """'`p_block_idx`' / 'kernel_paged_attention_2d.alpha' / ' M ' -> 'p_block_idx' / 'alpha' / 'M'."""
    s = str(name).strip().strip("`").replace(" ", "")
    return s.rsplit(".", 1)[-1]


def check_source_map(source_map) -> None:
    """Each blank -> the variable that holds the same quantity in vLLM's kernel_paged_attention_2d."""
    check_name_map(source_map, BLANKS, SOURCE_HASHES, name_hash, "这些空没有映射到 vLLM kernel_paged_attention_2d 中存放同一个量的变量")


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
        else:
            launch(kernel, out, query, k_cache, v_cache, block_table, seq_lens, scale, num_warps=num_warps)
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

    backend.paged_decode_attention = decode
    try:
        yield
    finally:
        backend.paged_decode_attention = original


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


_REFERENCE_RUN: EngineRun | None = None


def reference_run() -> EngineRun:
    """minivllm's own decode kernel on PROMPTS (computed once per process; the last call keeps its inputs)."""
    global _REFERENCE_RUN
    if _REFERENCE_RUN is None:
        _REFERENCE_RUN = run_engine(None, keep_last=True)
    return _REFERENCE_RUN


def judge_engine_run(run: EngineRun, ref: EngineRun) -> None:
    expect(run.calls, "真实引擎没有调用你的 decode 内核（没有 decode 步）。")
    bad = [(i, c) for i, c in enumerate(run.calls) if not c.max_err <= ATOL]
    if bad:
        i, c = bad[0]
        raise CheckFailed(f"引擎里第 {i + 1} 次 decode 内核调用（共 {len(run.calls)} 次；seq_lens={c.seq_lens}，"
                          f"block_table={c.block_table}）的输出与 torch 参考实现差 {c.max_err:.3g}（容差 {ATOL}）。")
    expect(run.tokens == ref.tokens,
           f"接入 Triton 后端后贪心生成的 token 与参考内核不同：你的 {run.tokens}，参考 {ref.tokens}。")


def check_real_engine(kernel) -> EngineRun:
    """The student's kernel as the Triton backend's decode kernel: every call matches the oracle, and greedy
    generation on the default model equals the reference kernel's."""
    if _is_blank(kernel):
        raise BlankNotFilled("还有空 ______ 没有填写：把内核里每个 ______ 换成正确的表达式后再运行。")
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


def print_engine_run(run: EngineRun, ref: EngineRun | None = None) -> None:
    for i, (prompt, text, toks) in enumerate(zip(run.prompts, run.texts, run.tokens, strict=True)):
        same = "" if ref is None else ("  == 参考内核" if toks == ref.tokens[i] else f"  != 参考内核 {ref.tokens[i]}")
        print(f"r{i}: {prompt!r} -> {text!r}  tokens={toks}{same}")
    errs = [c.max_err for c in run.calls]
    print(f"decode 内核调用 {len(run.calls)} 次（每步 4 层各 1 次），与 torch 参考实现的最大误差 {max(errs):.2e}；"
          f"用时 {run.seconds:.1f} s")


# ---------------------------------------------------------------------------- figures
def plot_block_tables(run: EngineRun):
    """Figure 6-1: the block tables the engine handed the decode kernel, step by step: which physical block
    holds each logical block of each request, and how full its last block is."""
    import matplotlib.pyplot as plt

    steps = run.calls[::4]                        # one call per step (layer 0)
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.55 * len(steps) * len(steps[0].seq_lens)))
    y, labels = 0, []
    bs = 16
    for s, call in enumerate(steps):
        for r, (table, n) in enumerate(zip(call.block_table, call.seq_lens, strict=True)):
            used = -(n // -bs)
            for b in range(used):
                fill = min(bs, n - b * bs) / bs
                ax.barh(y, fill, left=b, height=0.7, color="#55A868" if fill == 1 else "#CCB974", edgecolor="black")
                ax.barh(y, 1 - fill, left=b + fill, height=0.7, color="white", edgecolor="black", hatch="//")
                ax.text(b + 0.03, y, f"physical block {table[b]}", ha="left", va="center", fontsize=8,
                        bbox=dict(facecolor="white", edgecolor="none", pad=1))
            labels.append(f"step {s + 1} r{r} (seq_len {n})")
            y += 1
        y += 0.4
    ax.set_yticks([i + 0.4 * (i // len(steps[0].seq_lens)) for i in range(len(labels))], labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xticks(range(max(-(n // -bs) for c in steps for n in c.seq_lens) + 1))
    ax.set_xlabel("logical block (16 tokens each); hatched = slots past seq_len, must be masked")
    ax.set_title("Figure 6-1  Block tables seen by the decode kernel in the real engine", fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def online_softmax_trace(call: DecodeCall, seq: int = 0, head: int = 0):
    """Replay the kernel's block loop in torch for one (sequence, query head) of a captured engine call:
    per block, the running max, the rescale factor and the denominator; and the final output vs softmax."""
    n = call.seq_lens[seq]
    bs = call.k_cache.shape[1]
    qpk = call.query.shape[1] // call.k_cache.shape[2]
    kv_head = head // qpk
    q = call.query[seq, head].float()
    m, l_sum, acc, rows = float("-inf"), 0.0, torch.zeros_like(q), []
    scores_all = []
    for b in range(-(n // -bs)):
        phys = call.block_table[seq][b]
        take = min(bs, n - b * bs)
        k = call.k_cache[phys, :take, kv_head].float()
        v = call.v_cache[phys, :take, kv_head].float()
        s = (k @ q) * call.scale
        scores_all.append(s)
        new_m = max(m, float(s.max()))
        rescale = torch.exp(torch.tensor(m - new_m)).item()
        p = torch.exp(s - new_m)
        l_sum = l_sum * rescale + float(p.sum())
        acc = acc * rescale + p @ v
        rows.append(dict(block=b, physical=phys, tokens=take, block_max=float(s.max()), running_max=new_m,
                         rescale=rescale, running_sum=l_sum))
        m = new_m
    scores = torch.cat(scores_all)
    full = torch.softmax(scores, 0) @ torch.cat([call.v_cache[call.block_table[seq][b], :min(bs, n - b * bs), kv_head]
                                                  for b in range(-(n // -bs))]).float()
    return rows, scores, float((acc / l_sum - full).abs().max())


def pick_head(call: DecodeCall, seq: int = 0) -> int:
    """A query head whose running max rises in a later block (so the rescale is visible), else head 0."""
    for head in range(call.query.shape[1]):
        rows, _, _ = online_softmax_trace(call, seq, head)
        if any(r["rescale"] < 1 for r in rows[1:]):
            return head
    return 0


def plot_online_softmax(call: DecodeCall, seq: int = 0, head: int | None = None):
    """Figure 6-2: the scores of one query head over its context, block by block, with the running max."""
    import matplotlib.pyplot as plt

    head = pick_head(call, seq) if head is None else head
    rows, scores, err = online_softmax_trace(call, seq, head)
    bs = call.k_cache.shape[1]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
    for r in rows:
        x = range(r["block"] * bs, r["block"] * bs + r["tokens"])
        ax.scatter(list(x), scores[r["block"] * bs:r["block"] * bs + r["tokens"]].tolist(), s=12,
                   color=colors[r["block"] % 4], label=f"block {r['block']} (phys {r['physical']})")
        ax.hlines(r["running_max"], r["block"] * bs, r["block"] * bs + r["tokens"] - 1, color="black", lw=2)
        last = r["block"] == rows[-1]["block"] and len(rows) > 1
        ax.annotate(f"after block {r['block']}: m={r['running_max']:.3f}, rescale={r['rescale']:.3f}",
                    (r["block"] * bs + (r["tokens"] - 1 if last else 0), r["running_max"]), xytext=(0, 4),
                    textcoords="offset points", fontsize=7, ha="right" if last else "left")
    lo, hi = float(scores.min()), float(scores.max())
    ax.set_ylim(lo - 0.1 * (hi - lo), hi + 0.35 * (hi - lo))
    ax.set_xlabel("token position in the sequence")
    ax.set_ylabel("score q.k * scale")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"Figure 6-2  Online softmax over blocks (engine call, seq {seq}, head {head}); "
                 f"|online - full softmax| = {err:.1e}", fontsize=9, loc="left")
    fig.tight_layout()
    return fig, head, rows


def decode_intensity(queries_per_kv: int, elt: int) -> float:
    """FLOP per byte of decode attention: 4*D FLOPs per (query head, token), 2*D*elt bytes per (kv head, token)."""
    return 4 * queries_per_kv / (2 * elt)


def plot_roofline(points=None, peak_tflops: float = 989.0, bw_tbs: float = 3.35, device_name: str = "H100 SXM (figure 1-1)"):
    """Figure 6-3: the roofline of figure 1-1 with decode attention on it; `points` = measured
    (label, FLOP/B, TFLOP/s) on a GPU."""
    import matplotlib.pyplot as plt
    import numpy as np

    ai = np.logspace(-1, 4, 200)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.loglog(ai, np.minimum(peak_tflops, ai * bw_tbs), color="black",
              label=f"roofline {device_name}: {peak_tflops:.0f} TFLOP/s, {bw_tbs:.2f} TB/s")
    ax.axvline(peak_tflops / bw_tbs, color="gray", linestyle="--", label=f"ridge ~{peak_tflops / bw_tbs:.0f} FLOP/B")
    for qpk, elt, name in ((4, 2, "GQA 4, bf16"), (1, 2, "MHA, bf16"), (8, 2, "GQA 8, bf16")):
        x = decode_intensity(qpk, elt)
        ax.scatter([x], [x * bw_tbs], marker="s", color="#8172B2", zorder=3)
        ax.annotate(f"decode attention {name}: {x:g} FLOP/B", (x, x * bw_tbs), fontsize=7, xytext=(5, -10),
                    textcoords="offset points")
    for label, x, y in points or []:
        ax.scatter([x], [y], color="#C44E52", zorder=4)
        ax.annotate(label, (x, y), fontsize=7, xytext=(5, 4), textcoords="offset points", color="#C44E52")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=7, loc="upper left")
    title = "measured points in red" if points else "no GPU: the measured points need one"
    ax.set_title(f"Figure 6-3  Decode attention on the roofline ({title})", fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def interpreter_profile(kernel, seq_lens=(40, 40), num_heads=8, num_kv_heads=2, head_size=32):
    """Op counts of one launch under the interpreter, for the grouped kernel (one program per kv head) and for
    the same kernel run one program per query head (K/V expanded, as a per-head kernel reads it)."""
    case = make_case(list(seq_lens), num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size, seed=8)
    grouped = OpCounter()
    run_decode(kernel, case, grouped)
    qpk = num_heads // num_kv_heads
    per_head = DecodeCase(case.query, case.kv_cache.repeat_interleave(qpk, dim=3).contiguous(), case.block_table,
                          case.seq_lens, case.scale)
    per_head_counter = OpCounter()
    run_decode(kernel, per_head, per_head_counter)
    elt = case.kv_cache.element_size()
    minimum = 2 * sum(seq_lens) * num_kv_heads * head_size * elt
    return case, grouped, per_head_counter, minimum


def op_count_table(grouped: OpCounter, per_head: OpCounter, minimum: int) -> str:
    def kv(c):
        return c.load_bytes.get("k_cache", 0) + c.load_bytes.get("v_cache", 0)
    rows = [("", "grouped (kv head / program)", "per query head"),
            ("programs", grouped.programs, per_head.programs),
            ("block-loop iterations", grouped.iterations, per_head.iterations),
            ("K/V bytes loaded", kv(grouped), kv(per_head)),
            ("  / minimum (each K/V byte once)", f"{kv(grouped) / minimum:.2f}x", f"{kv(per_head) / minimum:.2f}x"),
            ("block-table entries loaded", grouped.loads.get("block_table", 0), per_head.loads.get("block_table", 0)),
            ("query / out elements", f"{grouped.loads.get('query', 0)} / {grouped.stores.get('out', 0)}",
             f"{per_head.loads.get('query', 0)} / {per_head.stores.get('out', 0)}"),
            ("tl.dot calls (MACs x2 incl. padding)", f"{grouped.dots} ({grouped.dot_flops})",
             f"{per_head.dots} ({per_head.dot_flops})"),
            ("exp evaluated (incl. padded rows)", grouped.exps, per_head.exps)]
    return "\n".join(f"{a:<38}{b!s:>28}{c!s:>18}" for a, b, c in rows)


def plot_op_counts(grouped: OpCounter, per_head: OpCounter, minimum: int):
    """Figure 6-4 (CPU): bytes each launch loaded, counted by the interpreter."""
    import matplotlib.pyplot as plt

    names = ["k_cache", "v_cache", "query", "block_table"]
    fig, ax = plt.subplots(figsize=(7, 3))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [grouped.load_bytes.get(n, 0) for n in names], 0.4, label="grouped: one program per kv head")
    ax.bar([i + 0.2 for i in x], [per_head.load_bytes.get(n, 0) for n in names], 0.4, label="one program per query head")
    ax.axhline(minimum / 2, color="gray", linestyle="--", label="K (or V) bytes if read once")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("bytes loaded (interpreter count)")
    ax.legend(fontsize=7)
    ax.set_title("Figure 6-4  What one decode launch reads (CPU: counted by the interpreter)", fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def measure_bandwidth(kernel, batch_sizes=(1, 8, 32, 128), context: int = 4096, num_heads: int = 32,
                      num_kv_heads: int = 8, head_size: int = 128, dtype=None, bench=None):
    """GPU: the kernel's achieved bandwidth per batch size with triton.testing.do_bench, the copy bandwidth of
    the same device, and the matmul peak, for the roofline. `bench` (fn -> ms) replaces do_bench in tests.
    dtype defaults to bf16, or fp16 before sm_80 (a Colab T4), where Triton's tl.dot has no bf16."""
    import triton

    dev = device()
    if dtype is None:
        old = dev == "cuda" and torch.cuda.get_device_capability()[0] < 8
        dtype = torch.float16 if old else torch.bfloat16
    if bench is None:
        import triton.testing
        bench = lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")  # noqa: E731
    src = torch.empty(256 << 20 if dev == "cuda" else 1 << 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_gbs = 2 * src.numel() / (bench(lambda: dst.copy_(src)) * 1e-3) / 1e9
    n = 8192 if dev == "cuda" else 64
    a = torch.randn(n, n, device=dev, dtype=dtype)
    peak_tflops = 2 * n ** 3 / (bench(lambda: a @ a) * 1e-3) / 1e12
    rows = [_bench_batch(kernel, batch, context, num_heads, num_kv_heads, head_size, dtype, dev, bench)
            for batch in batch_sizes]
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    return dict(device=name, copy_gbs=copy_gbs, peak_tflops=peak_tflops, rows=rows, triton=triton.__version__,
                dtype=str(dtype).removeprefix("torch."))


def _bench_batch(kernel, batch, context, num_heads, num_kv_heads, head_size, dtype, dev, bench) -> dict:
    """One row of measure_bandwidth: `batch` sequences of `context` tokens in shuffled 16-token blocks."""
    bs, elt = 16, torch.finfo(dtype).bits // 8
    blocks = -(context // -bs)
    g = torch.Generator(device=dev).manual_seed(0)
    table = torch.randperm(batch * blocks, generator=g, device=dev).view(batch, blocks).to(torch.int32)
    kv = torch.randn(2, batch * blocks, bs, num_kv_heads, head_size, device=dev, dtype=dtype, generator=g)
    q = torch.randn(batch, num_heads, head_size, device=dev, dtype=dtype, generator=g)
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    out = torch.empty_like(q)

    def fn():
        launch(kernel, out, q, kv[0], kv[1], table, lens, head_size ** -0.5)
    fn()
    ms = bench(fn)
    read = 2 * batch * context * num_kv_heads * head_size * elt + q.numel() * elt
    flops = 4 * batch * num_heads * context * head_size
    return dict(batch=batch, us=ms * 1e3, gbs=read / (ms * 1e-3) / 1e9, tflops=flops / (ms * 1e-3) / 1e12,
                ai=flops / read)


def print_bandwidth(result) -> None:
    print(f"{result['device']}: copy {result['copy_gbs']:.0f} GB/s, {result['dtype']} matmul "
          f"{result['peak_tflops']:.0f} TFLOP/s")
    print(f"{'batch':>6} {'us':>9} {'GB/s':>8} {'% copy':>7} {'TFLOP/s':>8} {'FLOP/B':>7}")
    for r in result["rows"]:
        print(f"{r['batch']:>6} {r['us']:>9.1f} {r['gbs']:>8.0f} {100 * r['gbs'] / result['copy_gbs']:>6.1f}% "
              f"{r['tflops']:>8.2f} {r['ai']:>7.2f}")


LESSON = Lesson(
    lesson_id="lesson06",
    title="PagedAttention：Triton decode kernel",
    parts=[
        Part("l06_main_path", "主路径·对照 torch", 1, check_main_path, ("paged_decode_kernel",)),
        Part("l06_real_engine", "主路径·真实引擎", 1, check_real_engine, ("paged_decode_kernel",)),
        Part("l06_boundary", "边界条件", 1, check_boundary, ("paged_decode_kernel",)),
        Part("l06_source_map", "映射回源码对象", 1, check_source_map, ("SOURCE_MAP",)),
        Part("l06_q1", "Q1 带宽与最少读取", 2, group="manual"),
        Part("l06_q2", "Q2 online softmax", 2, group="manual"),
        Part("l06_q3", "Q3 GQA 分组", 2, group="manual"),
    ],
)

