"""Lesson 10 — 分布式执行：张量并行、Executor 与 all-reduce: the checks behind the grade cells.

The student writes the MLP's two parallel layers with minivllm's constructor and loader signatures:
    column_cls(input_size, output_sizes, bias=False)   gate_up_proj; weight_loader(param, w, shard_id)
    row_cls(input_size, output_size, bias=False)       down_proj; param.weight_loader(param, w); forward
Both read self.tp_rank / self.tp_size and call minivllm.distributed.tensor_model_parallel_all_reduce.

    check_mlp(column_cls, row_cls)          two gloo ranks (forked, so they see the notebook's classes):
                                            the shards each rank holds, and the MLP equals the unsharded one
    check_real_engine(column_cls, row_cls)  the classes patched into minivllm's Llama, TP=2 in forked
                                            workers: greedy equals TP=1; the profiler counts 2 all-reduces
                                            per layer per step (+1 for the vocab-parallel embedding)
"""
from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import tempfile

import torch
import torch.nn.functional as F

from autograder.common import expect

TP = 2
HIDDEN, INTER = 48, 40  # INTER per rank = 20: gate and up halves of 20 rows each
TOL = dict(rtol=1e-4, atol=1e-4)  # float32; sums of <= 48 terms split in two partial sums by the all-reduce
PROMPTS = ["ROMEO:", "JULIET: O Romeo, Romeo", "First Citizen:\nBefore we proceed"]


# ---------------------------------------------------------------------------------------------- two ranks
def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(10)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {"x": r(6, HIDDEN), "gate": r(INTER, HIDDEN), "up": r(INTER, HIDDEN), "down": r(HIDDEN, INTER),
            "down_bias": r(HIDDEN)}


def reference_mlp(w: dict[str, torch.Tensor]) -> torch.Tensor:
    """down(silu(gate x) * up x) + b, unsharded, in one process."""
    return F.linear(F.silu(F.linear(w["x"], w["gate"])) * F.linear(w["x"], w["up"]), w["down"], w["down_bias"])


def _load(param, loaded, *shard_id) -> None:
    loader = getattr(param, "weight_loader", None)
    expect(loader is not None, "参数上没有 weight_loader：每个参数都要带上自己的 weight_loader（见 LinearBase）。")
    loader(param, loaded, *shard_id)


def _rank_mlp(rank: int, column_cls, row_cls) -> dict[str, torch.Tensor]:
    w = _weights()
    gate_up = column_cls(HIDDEN, [INTER, INTER], bias=False)
    down = row_cls(INTER, HIDDEN, bias=True)
    _load(gate_up.weight, w["gate"], 0)
    _load(gate_up.weight, w["up"], 1)
    _load(down.weight, w["down"])
    _load(down.bias, w["down_bias"])
    h = gate_up(w["x"])
    d = h.shape[-1] // 2
    return {"gate_up_weight": gate_up.weight.detach().clone(), "down_weight": down.weight.detach().clone(),
            "h": h, "out": down(F.silu(h[..., :d]) * h[..., d:])}


def _rank_main(rank: int, port: int, fn, args, conn) -> None:
    from minivllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    try:
        torch.set_num_threads(1)
        init_distributed_environment(TP, rank, f"tcp://127.0.0.1:{port}", "gloo", timeout_s=60)
        initialize_model_parallel(TP)
        with torch.inference_mode():
            buf = io.BytesIO()
            torch.save(fn(rank, *args), buf)
        conn.send(("ok", buf.getvalue()))
    except BaseException as e:  # the student's error, as one line, to the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()
        os._exit(0)


def run_two_ranks(fn, *args, timeout_s: float = 60.0) -> list:
    """fn(rank, *args) on two gloo ranks in forked processes (they inherit the notebook's classes)."""
    from minivllm.distributed.parallel_state import get_open_port
    ctx = multiprocessing.get_context("fork")
    port = get_open_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(TP)]
    procs = [ctx.Process(target=_rank_main, args=(r, port, fn, args, pipes[r][1]), daemon=True) for r in range(TP)]
    for p in procs:
        p.start()
    try:
        results = []
        for r, (reader, writer) in enumerate(pipes):
            writer.close()
            expect(reader.poll(timeout_s), f"rank {r} 在 {timeout_s:.0f} 秒内没有返回：是否两个 rank 调用的集合通信"
                                           "（all-reduce）次数不同，导致一方一直在等？")
            status, payload = reader.recv()
            expect(status == "ok", f"rank {r} 运行你的层时出错：{payload}")
            results.append(torch.load(io.BytesIO(payload)))
        return results
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()


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
        want = torch.cat([w["gate"][rank * n:(rank + 1) * n], w["up"][rank * n:(rank + 1) * n]])
        expect(torch.equal(gu, want),
               f"rank {rank} 的 gate_up_proj.weight 应是 [gate 的第 {rank} 段; up 的第 {rank} 段]：gate 和 up "
               "要各自切分，而不是把 [gate; up] 整块切开（否则 SiluAndMul 会把不同 rank 的 gate/up 配错）。")
        dw = out["down_weight"]
        expect(tuple(dw.shape) == (HIDDEN, n),
               f"rank {rank} 的 down_proj.weight 形状应是 {(HIDDEN, n)}（输入维切分），实际 {tuple(dw.shape)}。")
        expect(torch.equal(dw, w["down"][:, rank * n:(rank + 1) * n]),
               f"rank {rank} 的 down_proj.weight 应是 down 的第 {rank} 段列（与本 rank 的中间维对应）。")
        full_h = torch.cat([F.linear(w["x"], w["gate"]), F.linear(w["x"], w["up"])], -1)
        h_rank = torch.cat([full_h[:, rank * n:(rank + 1) * n], full_h[:, INTER + rank * n:INTER + (rank + 1) * n]], -1)
        expect(torch.allclose(out["h"], h_rank, **TOL),
               f"rank {rank} 的 gate_up_proj 输出应只是本 rank 的那一段（列并行层之后不需要通信）。")
    ref = reference_mlp(w)
    for rank, out in enumerate(outs):
        err = (out["out"] - ref).abs().max().item()
        expect(torch.allclose(out["out"], ref, **TOL),
               f"rank {rank} 的 MLP 输出与不切分的 MLP 不一致（最大误差 {err:.3g}）：行并行层要在 all-reduce 之后"
               "得到完整的和，bias 只能加一次（只在 rank 0 加）。")


# ---------------------------------------------------------------------------------------------- the engine
_TP1_TOKENS: dict[str, list[list[int]]] = {}


@contextlib.contextmanager
def _patched_llama(column_cls, row_cls):
    """minivllm's Llama builds its MLP (and o_proj) from the student's classes; workers fork to see it."""
    import minivllm.model_executor.models.llama as llama
    saved = llama.MergedColumnParallelLinear, llama.RowParallelLinear, os.environ.get("MINIVLLM_WORKER_MULTIPROC_METHOD")
    llama.MergedColumnParallelLinear, llama.RowParallelLinear = column_cls, row_cls
    os.environ["MINIVLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    try:
        yield
    finally:
        llama.MergedColumnParallelLinear, llama.RowParallelLinear = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("MINIVLLM_WORKER_MULTIPROC_METHOD", None)
        else:
            os.environ["MINIVLLM_WORKER_MULTIPROC_METHOD"] = saved[2]


def count_all_reduces(trace_path: str) -> tuple[int, int]:
    """(execute_model steps, c10d all-reduce calls) in a rank's Chrome trace."""
    events = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    return (sum(e["name"] == "execute_model" for e in events), sum(e["name"] == "c10d::allreduce_" for e in events))


def check_real_engine(column_cls, row_cls, max_tokens: int = 8) -> None:
    """TP=2 with the student's layers equals TP=1 token for token; 2 all-reduces per layer per step."""
    from minivllm.entrypoints.llm import LLM
    from minivllm.sampling_params import SamplingParams
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    kw = dict(device="cpu", attention_backend="torch", multiprocess=False, max_num_seqs=4)
    key = f"default:{max_tokens}"
    if key not in _TP1_TOKENS:
        llm1 = LLM(**kw)
        _TP1_TOKENS[key] = [o.outputs[0].token_ids for o in llm1.generate(PROMPTS, sp, use_tqdm=False)]
        llm1.llm_engine.shutdown()
    with _patched_llama(column_cls, row_cls):
        llm = LLM(tensor_parallel_size=TP, **kw)
    try:
        path = os.path.join(tempfile.mkdtemp(prefix="lesson10-"), "tp2.json")
        llm.start_profile(path)
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp, use_tqdm=False)]
        trace = llm.stop_profile()
        num_layers = _num_layers(llm)
    finally:
        llm.llm_engine.shutdown()
    expect(got == _TP1_TOKENS[key], f"TP=2 的贪心输出与 TP=1 不同：第一条提示词 TP=1 {_TP1_TOKENS[key][0]}，"
                                    f"TP=2 {got[0]}。")
    steps, calls = count_all_reduces(trace)
    per_step = calls / max(steps, 1)
    expect(calls == steps * (2 * num_layers + 1),
           f"rank 0 的 profiler 记录到每步 {per_step:.2f} 次 all-reduce，应是 {2 * num_layers + 1}："
           f"{num_layers} 层 × 2（注意力的 o_proj、MLP 的 down_proj）+ 1（词表并行的 embedding）。")


def _num_layers(llm) -> int:
    from minivllm.model_executor.model_loader import load_hf_config, resolve_model_path
    return load_hf_config(resolve_model_path(llm.llm_engine.vllm_config.model_config.model)).num_hidden_layers
