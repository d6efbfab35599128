"""Lesson 10 — 分布式执行：张量并行、Executor 与 all-reduce: the checks behind the grade cells.

The student writes the MLP's two parallel layers with minivllm's constructor and loader signatures:
    column_cls(input_size, output_sizes, bias=False)   gate_up_proj; weight_loader(param, w, shard_id)
    row_cls(input_size, output_size, bias=False)       down_proj; param.weight_loader(param, w); forward
Both read self.tp_rank / self.tp_size and call minivllm.distributed.tensor_model_parallel_all_reduce.

Grade cells and `python -m autograder check lesson10 ...` call the same check_* functions here (each docstring
says what it covers).

Input space (each dimension -> the part that covers it):
    tp_size          1 (no group: all-reduce is the identity, every rank holds all) and 2 (gloo ranks)
                                                                              boundary (1), main, real engine (2)
    tp_rank          0 and 1: each rank's own rows / columns (no constant rank or size)        main, boundary
    output_sizes     equal fused projections (gate 40 + up 40) and unequal ones [16, 8]       main, boundary
                     three unequal ones [16, 8, 8] (as QKVParallelLinear loads q, k, v; shard 2's offset
                     is past both earlier shards), TP=1 and both TP=2 ranks                    boundary
                     sizes tp does not divide, [5, 7] at TP=2 (their sum 12 does): the layer must refuse
                     to be built, as vLLM's MergedColumnParallelLinear asserts                 boundary
    input_size       a row layer's input tp does not divide (7 at TP=2): refused too (vLLM: divide)   boundary
    bias             none, and biases on both layers (row bias added exactly once)             main, boundary
    tokens           one token, a batch of tokens, a real engine's prefill and decode steps    boundary, main, engine
    engine           TP=2 greedy output equals TP=1; 2 all-reduces per layer per step (+1 embedding)   real engine
    Not covered: tp_size > 2 (two CPU ranks), pipeline parallelism, quantised weights.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import multiprocessing
import os
import tempfile
import time
import traceback
from unittest import mock

import torch
import torch.nn.functional as F

from autograder.common import BlankNotFilled, CheckFailed, Lesson, SourceMap, ______, expect, graded
from autograder.common import quiet_stderr_fd as quiet_workers  # fd 2 -> /dev/null within

TP = 2
HIDDEN, INTER = 48, 40  # INTER per rank = 20: gate and up halves of 20 rows each
TOL = dict(rtol=1e-4, atol=1e-4)  # float32; sums of <= 48 terms split in two partial sums by the all-reduce
ENGINE = dict(device="cpu", attention_backend="torch", multiprocess=False, max_num_seqs=4)
PROMPTS = ["ROMEO:", "JULIET: O Romeo, Romeo", "First Citizen:\nBefore we proceed"]


# ---------------------------------------------------------------------------------------------- blanks, verdicts
def _blank(e: BaseException) -> bool:
    """The error came from an unfilled ______: it says so, or a frame it passed through holds the blank
    (torch's own errors, e.g. torch.empty(out, ______), only name the argument types)."""
    if isinstance(e, BlankNotFilled) or "_Blank" in str(e) or "______" in str(e):
        return True
    return any(v is ______ for frame, _ in traceback.walk_tb(e.__traceback__) for v in frame.f_locals.values())


def probe(column_cls, row_cls) -> None:
    """Build and run both layers at TP=1 in this process (no group: the all-reduce is the identity), so an
    unfilled ______ shows as one line here instead of an error inside a rank or engine worker."""
    x = torch.zeros(1, 4)
    try:
        with torch.inference_mode():
            col = column_cls(4, [2, 2], bias=False)
            row = row_cls(4, 4, bias=True)
            for i in (0, 1):
                _load(col.weight, torch.zeros(2, 4), i)
            _load(row.weight, torch.zeros(4, 4))
            _load(row.bias, torch.zeros(4))
            outs = (col(x), row(x))
    except (CheckFailed, BlankNotFilled):
        raise
    except Exception as e:
        if _blank(e):
            raise BlankNotFilled(______._MSG) from None
        raise
    if any(o is ______ for o in outs):
        raise BlankNotFilled(______._MSG)
    expect(all(isinstance(o, torch.Tensor) for o in outs),
           f"forward 应返回张量，实际返回 {[type(o).__name__ for o in outs]}（forward 里的 ______ 填了吗？）。")


_VERDICTS: dict = {}


def once(check):
    """A check's verdict per (check, classes): the report cell and the grade cell after it run the two-rank or
    engine work once per kernel. Keyed by the class objects, so re-running the exercise cell checks again;
    errors that are not a verdict (a blank, the time limit) are not kept."""
    @functools.wraps(check)
    def run(column_cls, row_cls):
        __tracebackhide__ = True
        key = (check.__name__, column_cls, row_cls)
        if key in _VERDICTS:
            if _VERDICTS[key] is not None:
                raise CheckFailed(_VERDICTS[key])
            return
        probe(column_cls, row_cls)
        try:
            check(column_cls, row_cls)
        except CheckFailed as e:
            _VERDICTS[key] = str(e)
            raise
        _VERDICTS[key] = None
    return run


# ---------------------------------------------------------------------------------------------- two ranks
def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(10)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {"x": r(6, HIDDEN), "gate": r(INTER, HIDDEN), "up": r(INTER, HIDDEN), "down": r(HIDDEN, INTER),
            "down_bias": r(HIDDEN)}


def shards(t: torch.Tensor, sizes, rank: int, dim: int = -1) -> torch.Tensor:
    """Projections of `sizes` fused along dim: each one's rank-th part of TP, concatenated (what rank holds)."""
    return torch.cat([p.chunk(TP, dim)[rank] for p in t.split(list(sizes), dim)], dim)


def reference_mlp(w: dict[str, torch.Tensor], bias: bool = False) -> torch.Tensor:
    """down(silu(gate x) * up x) (+ b), unsharded, in one process."""
    return F.linear(F.silu(F.linear(w["x"], w["gate"])) * F.linear(w["x"], w["up"]), w["down"],
                    w["down_bias"] if bias else None)


def _load(param, loaded, *shard_id) -> None:
    loader = getattr(param, "weight_loader", None)
    expect(loader is not None, "参数上没有 weight_loader：每个参数都要带上自己的 weight_loader（见 LinearBase）。")
    loader(param, loaded, *shard_id)


def _rank_mlp(rank: int, column_cls, row_cls) -> dict[str, torch.Tensor]:
    w = _weights()
    gate_up = column_cls(HIDDEN, [INTER, INTER], bias=False)
    down = row_cls(INTER, HIDDEN, bias=False)
    _load(gate_up.weight, w["gate"], 0)
    _load(gate_up.weight, w["up"], 1)
    _load(down.weight, w["down"])
    h = gate_up(w["x"])
    d = h.shape[-1] // 2
    return {"gate_up_weight": gate_up.weight.detach().clone(), "down_weight": down.weight.detach().clone(),
            "h": h, "out": down(F.silu(h[..., :d]) * h[..., d:])}


def _spawned_main(payload: bytes, conn) -> None:
    """Target of a fresh process (run_spawned): fn(*args) from the cloudpickled payload; its result, or the
    student's error as one line, goes to the parent on conn."""
    try:
        import cloudpickle
        fn, args = cloudpickle.loads(payload)
        torch.set_num_threads(1)
        buf = io.BytesIO()
        torch.save(fn(*args), buf)
        conn.send(("ok", buf.getvalue()))
    except BaseException as e:
        if _blank(e):
            conn.send(("error", ______._MSG))
        elif _collective_broken(e):  # gloo's own text ("Connection closed by peer ... GLHF") says nothing useful
            conn.send(("collective", ""))
        else:
            conn.send(("error", f"{type(e).__name__}: {_without_traceback(str(e))[:300]}"))
    finally:
        conn.close()
        os._exit(0)


def _without_traceback(text: str) -> str:
    """A TP worker's error (EngineDeadError) carries the worker's traceback: keep its first line and the exception
    it ends with, so the verdict names the student's error and not this checkout's paths."""
    if "Traceback (most recent call last)" not in text:
        return text
    lines = [line for line in text.splitlines() if line.strip()]
    return f"{lines[0]} {lines[-1].strip()}"


COLLECTIVE_TIMEOUT_S = 20  # a rank waiting in an all-reduce its peer skipped gives up well inside the cell limit
SKIPPED_COLLECTIVE = ("{name} 在一次 all-reduce 里等不到另一个 rank（对方已经结束或一直没来）：两个 rank 调用 all-reduce 的"
                      "次数不同，有一个 rank 跳过了它（例如只在 tp_rank == 0 时通信）。每个 rank 都要调用同样次数的集合通信。")


def _collective_broken(e: BaseException) -> bool:
    """A gloo collective that failed because the other rank left it or never came (closed socket, timeout)."""
    text = f"{type(e).__name__}: {e}"
    return any(k in text for k in ("gloo", "Connection closed by peer", "Connection reset", "Timed out", "DistBackendError"))


def run_spawned(calls: list[tuple], timeout_s: float, names: list[str]) -> list:
    """Each (fn, *args) of `calls` in its own fresh process, all at once; their results in order.

    Not forked from the caller: a fork copies the caller's threads' locks (a Jupyter kernel's ZMQ and history
    threads hold some), and a forked child that needs one of them waits forever. Forked instead from
    multiprocessing's forkserver, a single-threaded interpreter started once per caller with torch and these
    checks imported, so a rank costs a fork, not a torch import (lesson 10's five processes per grading: -2.3 s
    of a solution's 10.5 s). The student's classes travel by value with cloudpickle (they live in the
    notebook's __main__, which the server does not have). The children's fd 2 is /dev/null (quiet_workers):
    torch.profiler's C++ side prints start/stop lines there, and a grade cell that writes to stderr scores 0 in
    nbgrader; their errors come back on the pipes."""
    import cloudpickle
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "cloudpickle", __name__])
    pipes = [ctx.Pipe(duplex=False) for _ in calls]
    # Not daemonic: the engine helper starts its own workers. Every child is joined or killed below.
    procs = [ctx.Process(target=_spawned_main, args=(cloudpickle.dumps((c[0], c[1:])), w))
             for c, (_, w) in zip(calls, pipes, strict=True)]
    try:
        with quiet_workers():
            for p in procs:
                p.start()
        for _, w in pipes:
            w.close()
        results, deadline = [], time.monotonic() + timeout_s
        for name, p, (reader, _) in zip(names, procs, pipes, strict=True):
            while not reader.poll(0.2):
                expect(time.monotonic() < deadline, f"{name} 在 {timeout_s:.0f} 秒内没有返回：是否两个 rank 调用的"
                                                    "集合通信（all-reduce）次数不同，导致一方一直在等？")
            try:
                status, payload = reader.recv()
            except EOFError:  # it exited without a word (a crash, os._exit): its pipe closed empty
                p.join(5)
                raise CheckFailed(f"{name} 意外退出（退出码 {p.exitcode}），没有返回结果。") from None
            expect(status != "collective", SKIPPED_COLLECTIVE.format(name=name))
            expect(status == "ok", f"{name} 运行你的层时出错：{payload}")
            results.append(torch.load(io.BytesIO(payload)))
        return results
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()


def _rank_main(rank: int, port: int, fn, *args):
    from minivllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    init_distributed_environment(TP, rank, f"tcp://127.0.0.1:{port}", "gloo", timeout_s=COLLECTIVE_TIMEOUT_S)
    initialize_model_parallel(TP)
    with torch.inference_mode():
        return fn(rank, *args)


def run_two_ranks(fn, *args, timeout_s: float = 60.0) -> list:
    """fn(rank, *args) on two gloo ranks, each in a fresh process (the student's classes sent by value)."""
    from minivllm.distributed.parallel_state import get_open_port
    port = get_open_port()
    return run_spawned([(_rank_main, r, port, fn, *args) for r in range(TP)], timeout_s,
                       [f"rank {r}" for r in range(TP)])


@graded
@once
def check_mlp(column_cls, row_cls) -> None:
    """Each rank holds [gate_r; up_r] rows and down's column slice r; the two-rank MLP equals the unsharded one."""
    w = _weights()
    outs = run_two_ranks(_rank_mlp, column_cls, row_cls)
    n = INTER // TP
    for rank, out in enumerate(outs):
        gu = out["gate_up_weight"]
        expect(tuple(gu.shape) == (2 * n, HIDDEN),
               f"rank {rank} 的 gate_up_proj.weight 形状应是 {(2 * n, HIDDEN)}（输出维切分：gate 和 up 各 "
               f"{n} 行），实际 {tuple(gu.shape)}。")
        expect(torch.equal(gu, shards(torch.cat([w["gate"], w["up"]]), (INTER, INTER), rank, 0)),
               f"rank {rank} 的 gate_up_proj.weight 应是 [gate 的第 {rank} 段; up 的第 {rank} 段]：gate 和 up "
               "要各自切分，而不是把 [gate; up] 整块切开（否则 SiluAndMul 会把不同 rank 的 gate/up 配错）。")
        dw = out["down_weight"]
        expect(tuple(dw.shape) == (HIDDEN, n),
               f"rank {rank} 的 down_proj.weight 形状应是 {(HIDDEN, n)}（输入维切分），实际 {tuple(dw.shape)}。")
        expect(torch.equal(dw, shards(w["down"], (INTER,), rank)),
               f"rank {rank} 的 down_proj.weight 应是 down 的第 {rank} 段列（与本 rank 的中间维对应）。")
        h = shards(torch.cat([F.linear(w["x"], w["gate"]), F.linear(w["x"], w["up"])], -1), (INTER, INTER), rank)
        expect(torch.allclose(out["h"], h, **TOL),
               f"rank {rank} 的 gate_up_proj 输出应只是本 rank 的那一段（列并行层之后不需要通信）。")
    ref = reference_mlp(w)
    for rank, out in enumerate(outs):
        err = (out["out"] - ref).abs().max().item()
        expect(torch.allclose(out["out"], ref, **TOL),
               f"rank {rank} 的 MLP 输出与不切分的 MLP 不一致（最大误差 {err:.3g}）：行并行层每个 rank 只算出部分和，"
               "要用一次 all-reduce 把它们加起来。")


# ---------------------------------------------------------------------------------------------- the engine
@contextlib.contextmanager
def _patched_llama(column_cls, row_cls):
    """minivllm's Llama builds its MLP (and o_proj) from the student's classes; TP workers fork to see it."""
    import minivllm.model_executor.models.llama as llama
    with mock.patch.multiple(llama, MergedColumnParallelLinear=column_cls, RowParallelLinear=row_cls), \
            mock.patch.dict(os.environ, MINIVLLM_WORKER_MULTIPROC_METHOD="fork"):
        yield


def count_all_reduces(trace_path: str) -> tuple[int, int]:
    """(execute_model steps, c10d all-reduce calls) in a rank's Chrome trace."""
    events = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    return (sum(e["name"] == "execute_model" for e in events), sum(e["name"] == "c10d::allreduce_" for e in events))


def _tp2_run(column_cls, row_cls, max_tokens: int) -> dict:
    """In a fresh helper (run_spawned): the Llama patched with the student's classes at TP=2 (its workers fork
    from this single-purpose process, so they see the patch); the greedy tokens and rank 0's all-reduce count."""
    from minivllm.entrypoints.llm import LLM
    with _patched_llama(column_cls, row_cls):
        llm = LLM(tensor_parallel_size=TP, **ENGINE)
    try:
        path = os.path.join(tempfile.mkdtemp(prefix="lesson10-"), "tp2.json")
        llm.start_profile(path)
        tokens = greedy_tokens(llm, max_tokens)
        steps, calls = count_all_reduces(llm.stop_profile())
        return {"tokens": tokens, "steps": steps, "calls": calls, "num_layers": _num_layers(llm)}
    finally:
        llm.llm_engine.shutdown()


def greedy_tokens(llm, max_tokens: int) -> list[list[int]]:
    from minivllm.sampling_params import SamplingParams
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp, use_tqdm=False)]


@functools.cache
def tp1_tokens(max_tokens: int) -> list[list[int]]:
    """The unpatched Llama at TP=1 (cached: it does not depend on the answer)."""
    from minivllm.entrypoints.llm import LLM
    llm = LLM(**ENGINE)
    tokens = greedy_tokens(llm, max_tokens)
    llm.llm_engine.shutdown()
    return tokens


@graded
@once
def check_real_engine(column_cls, row_cls, max_tokens: int = 8) -> None:
    """TP=2 with the student's layers equals TP=1 token for token; 2 all-reduces per layer per step."""
    want = tp1_tokens(max_tokens)
    (run,) = run_spawned([(_tp2_run, column_cls, row_cls, max_tokens)], 100.0, ["TP=2 引擎"])
    got = run["tokens"]
    expect(got == want, f"TP=2 的贪心输出与 TP=1 不同：第一条提示词 TP=1 {want[0]}，TP=2 {got[0]}。")
    steps, calls, num_layers = run["steps"], run["calls"], run["num_layers"]
    per_step = calls / max(steps, 1)
    expect(calls == steps * (2 * num_layers + 1),
           f"rank 0 的 profiler 记录到每步 {per_step:.2f} 次 all-reduce，应是 {2 * num_layers + 1}："
           f"{num_layers} 层 × 2（注意力的 o_proj、MLP 的 down_proj）+ 1（词表并行的 embedding）。")


def _num_layers(llm) -> int:
    from minivllm.model_executor.model_loader import load_hf_config, resolve_model_path
    return load_hf_config(resolve_model_path(llm.llm_engine.vllm_config.model_config.model)).num_hidden_layers


# ---------------------------------------------------------------------------------------------- boundary
B_HIDDEN, B_SIZES, B_OUT = 24, (16, 8), 40  # fused projections of unequal size; an o_proj-shaped row layer
B_SIZES3 = (16, 8, 8)  # three fused projections, as QKVParallelLinear loads q, k, v: shard 2 starts after 16 + 8
UNEVEN_SIZES, UNEVEN_INPUT = (5, 7), 7  # at TP=2 neither 5 nor 7 splits (their sum does); nor does a row input of 7


def _boundary_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    a, b = B_SIZES
    w = {"x": r(1, B_HIDDEN), "wa": r(a, B_HIDDEN), "wb": r(b, B_HIDDEN), "ba": r(a), "bb": r(b),
         "row_x": r(1, a + b), "row_w": r(B_OUT, a + b), "row_b": r(B_OUT)}
    w["w3"] = [r(n, B_HIDDEN) for n in B_SIZES3]
    return w


def _three_projections(column_cls, w) -> torch.Tensor:
    """A fused layer of three unequal projections B_SIZES3, shards loaded 0, 1, 2 (as q, k, v)."""
    col = column_cls(B_HIDDEN, list(B_SIZES3), bias=False)
    for shard_id, wi in enumerate(w["w3"]):
        _load(col.weight, wi, shard_id)
    return col(w["x"])


def _boundary_layers(column_cls, row_cls, w) -> dict[str, torch.Tensor]:
    col = column_cls(B_HIDDEN, list(B_SIZES), bias=True)
    _load(col.weight, w["wa"], 0)
    _load(col.weight, w["wb"], 1)
    _load(col.bias, w["ba"], 0)
    _load(col.bias, w["bb"], 1)
    row = row_cls(sum(B_SIZES), B_OUT, bias=True)
    _load(row.weight, w["row_w"])
    _load(row.bias, w["row_b"])
    n = sum(B_SIZES) // row.tp_size
    return {"col": col(w["x"]), "row": row(w["row_x"][:, row.tp_rank * n:(row.tp_rank + 1) * n]),
            "col3": _three_projections(column_cls, w)}


def _expect_three(got: torch.Tensor, want: torch.Tensor, where: str) -> None:
    ok = tuple(got.shape) == tuple(want.shape) and torch.allclose(got, want, **TOL)
    bad = "" if ok or got.shape != want.shape else \
        f"，第一处不符在第 {int(((got - want).abs() > 1e-3).any(0).nonzero()[0])} 列"
    expect(ok, f"三段大小不等的融合投影 {list(B_SIZES3)}（像 QKVParallelLinear 装 q、k、v，shard_id 0、1、2），{where}："
               f"输出应是每段在本 rank 的那一份依次拼接，形状 {tuple(want.shape)}；实际形状 {tuple(got.shape)}{bad}。"
               "检查每一段在本 rank 参数里的起点。")


def _refuses(build) -> bool:
    """Whether building a layer raises (any exception: vLLM asserts, minivllm's divide raises ValueError)."""
    try:
        build()
    except Exception:
        return True
    return False


def _rank_boundary(rank: int, column_cls, row_cls) -> dict:
    out = _boundary_layers(column_cls, row_cls, _boundary_weights())
    out["refused_column"] = _refuses(lambda: column_cls(B_HIDDEN, list(UNEVEN_SIZES), bias=False))
    out["refused_row"] = _refuses(lambda: row_cls(UNEVEN_INPUT, B_OUT, bias=False))
    return out


@graded
@once
def check_boundary(column_cls, row_cls) -> None:
    """TP=1 (no group: all-reduce is the identity) equals plain linears; two ranks with biases, unequal fused
    projections [16, 8] and one token: each rank's column slice, and the row output with the bias once; at
    TP=2 a fused layer of [5, 7] and a row layer of input 7 are refused (vLLM refuses them too)."""
    w = _boundary_weights()
    col_ref = torch.cat([F.linear(w["x"], w["wa"], w["ba"]), F.linear(w["x"], w["wb"], w["bb"])], -1)
    row_ref = F.linear(w["row_x"], w["row_w"], w["row_b"])
    with torch.inference_mode():
        one = _boundary_layers(column_cls, row_cls, w)
    expect(tuple(one["col"].shape) == tuple(col_ref.shape) and torch.allclose(one["col"], col_ref, **TOL),
           "TP=1 时列并行层应等于不切分的 [gate; up] 线性层（每个 rank 持有全部行，带 bias）。")
    expect(tuple(one["row"].shape) == tuple(row_ref.shape) and torch.allclose(one["row"], row_ref, **TOL),
           "TP=1 时行并行层应等于不切分的线性层（bias 加一次）。")
    col3_ref = torch.cat([F.linear(w["x"], wi) for wi in w["w3"]], -1)
    _expect_three(one["col3"], col3_ref, "TP=1")
    outs = run_two_ranks(_rank_boundary, column_cls, row_cls)
    for rank, out in enumerate(outs):
        _expect_three(out["col3"], shards(col3_ref, B_SIZES3, rank), f"rank {rank}")
    for rank, out in enumerate(outs):
        want = shards(col_ref, B_SIZES, rank)
        expect(tuple(out["col"].shape) == tuple(want.shape) and torch.allclose(out["col"], want, **TOL),
               f"两个 rank、大小不等的两段投影 {list(B_SIZES)}（带 bias）：rank {rank} 的列并行输出应是 "
               f"[第一段的第 {rank} 份; 第二段的第 {rank} 份]，形状 {tuple(want.shape)}；实际形状 "
               f"{tuple(out['col'].shape)}。每段投影按自己的大小切分，bias 与权重切法相同。")
        err = (out["row"] - row_ref).abs().max().item() if out["row"].shape == row_ref.shape else float("nan")
        expect(out["row"].shape == row_ref.shape and torch.allclose(out["row"], row_ref, **TOL),
               f"两个 rank、带 bias 的行并行层（单个 token）：rank {rank} 的输出与不切分的线性层不一致（最大误差 "
               f"{err:.3g}）。部分和要 all-reduce 才完整；bias 只能加一次：all-reduce 会把每个 rank 加的 bias 都加起来。")
    for rank, out in enumerate(outs):
        expect(out["refused_column"],
               f"两个 rank、融合投影 {list(UNEVEN_SIZES)}：每段都不能被 tp=2 整除（只有总和 {sum(UNEVEN_SIZES)} 能），"
               f"rank {rank} 却把层建成了，每个 rank 会拿错 gate/up 的行。每段各自 divide(size, tp)，不能整除时应报错"
               "（vLLM 的 MergedColumnParallelLinear 在构造时断言每段都能整除）。")
        expect(out["refused_row"],
               f"两个 rank、行并行层的输入维 {UNEVEN_INPUT}：不能被 tp=2 整除，rank {rank} 却把层建成了，输入的一部分"
               "没有任何 rank 持有。用 divide(input_size, tp)，不能整除时应报错（vLLM 同样用 divide）。")


# ---------------------------------------------------------------------------------------------- source map
# Names the lesson does not print, checked in the pinned vLLM (model_executor/layers/linear.py, distributed/utils.py,
# distributed/communication_op.py, distributed/parallel_state.py, v1/executor/multiproc_executor.py), stored as
# SourceMap says. gather_outputs takes two names: the function the column layer calls and the GroupCoordinator
# method it calls in turn (both gather, both vLLM's). output_rank takes the one method vLLM has: the same name
# without its leading underscore is not a vLLM name and is refused (tests/test_lesson10_grading.py).
SOURCE = SourceMap(["no_split", "shard_widths", "divisible", "split_input", "gather_outputs", "output_rank"], {
    "no_split": {"ebcd3b0c1f397658"},
    "shard_widths": {"c377f479fec9a65b"},
    "divisible": {"f2fc4a548e90296a"},
    "split_input": {"ec16cf4d20937dec"},
    "gather_outputs": {"26d3d9ca0982b985", "ea943e5666f04f15"},
    "output_rank": {"96e1a9e03ef8464d"},
})


NEEDS = ("MergedColumnParallelLinear", "RowParallelLinear")
LESSON = Lesson(
    lesson_id="lesson10",
    title="分布式执行：张量并行、Executor 与 all-reduce",
    answer=NEEDS,
    code={
        "main_path": ("主路径·两个 rank 的 MLP", check_mlp),
        "real_engine": ("主路径·真实引擎 TP=2", check_real_engine),
        "boundary": ("边界条件（TP=1、bias、不等长或不能整除的投影、单 token）", check_boundary),
    },
    source_map=SOURCE,
    questions=("all-reduce 为何在行并行层之后", "TP=4 时 kv 头的复制", "tp 增大时通信占比为何上升"),
)
check_source_map = SOURCE.check
