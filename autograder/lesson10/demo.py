"""Lesson 10 — 张量并行: what the notebook shows (live runs, tables, figures); no check calls these."""
from __future__ import annotations

import functools
import json
import os
import statistics
import tempfile

import torch

from autograder.common import DEFAULT_MODEL
from autograder.figures import interleaved, vllm_answers
from autograder.lesson10.checks import PROMPTS, TP, quiet_workers, run_two_ranks


# ---------------------------------------------------------------------------- what each rank holds
def _rank_shapes(rank: int, model: str) -> dict:
    from minivllm.attention.selector import get_attn_backend
    from minivllm.model_executor.model_loader import get_model, resolve_model_path
    net = get_model(resolve_model_path(model), torch.float32, "cpu", get_attn_backend("torch", "cpu"))
    shapes = {name: tuple(p.shape) for name, p in net.named_parameters()
              if ".layers.0." in name or "embed" in name or "lm_head" in name}
    return {"shapes": shapes, "params": sum(p.numel() for p in net.parameters()),
            "slices": _checkpoint_slices(net, resolve_model_path(model))}


def _checkpoint_slices(net, path) -> dict:
    """Which checkpoint rows/columns each sharded layer-0 weight and the embedding hold on this rank (matched by
    value, as autograder/lesson10/vllm_view.py records vLLM's)."""
    from pathlib import Path

    from safetensors.torch import load_file

    from autograder.lesson10.vllm_view import _source

    ckpt = {k: v.float() for k, v in load_file(str(Path(path) / "model.safetensors")).items()}
    p = "model.layers.0."
    sources = {"self_attn.qkv_proj": ({n: ckpt[f"{p}self_attn.{n}.weight"] for n in ("q_proj", "k_proj", "v_proj")}, 0),
               "self_attn.o_proj": ({"o_proj": ckpt[f"{p}self_attn.o_proj.weight"]}, 1),
               "mlp.gate_up_proj": ({n: ckpt[f"{p}mlp.{n}.weight"] for n in ("gate_proj", "up_proj")}, 0),
               "mlp.down_proj": ({"down_proj": ckpt[f"{p}mlp.down_proj.weight"]}, 1),
               "embed_tokens": ({"embed_tokens": ckpt["model.embed_tokens.weight"]}, 0)}
    params = dict(net.named_parameters())
    return {k: _source(params["model.embed_tokens.weight" if k == "embed_tokens" else f"{p}{k}.weight"].detach(), s, d)
            for k, (s, d) in sources.items()}


def rank_shards(model: str = DEFAULT_MODEL) -> dict:
    """Parameter shapes of layer 0 (and the embedding) on each of two ranks, and TP=1's, loaded from the
    checkpoint by the engine's own layers and loaders."""
    one = _rank_shapes(0, model)
    two = run_two_ranks(_rank_shapes, model, timeout_s=120)
    return {"tp1": one, "tp2": two}


def print_rank_shards(shards: dict) -> None:
    one, two = shards["tp1"], shards["tp2"]
    print(f"{'parameter':<44}{'TP=1':>14}{'TP=2 rank 0':>14}{'TP=2 rank 1':>14}")
    for name, shape in one["shapes"].items():
        print(f"{name:<44}{str(shape):>14}{str(two[0]['shapes'][name]):>14}{str(two[1]['shapes'][name]):>14}")
    print(f"{'all parameters (numel)':<44}{one['params']:>14,}{two[0]['params']:>14,}{two[1]['params']:>14,}")


# ---------------------------------------------------------------------------- all-reduce share, TP=1 vs TP=2
def _llm(tp: int):
    from minivllm.entrypoints.llm import LLM
    with quiet_workers():
        return LLM(device="cpu", attention_backend="torch", multiprocess=False, max_num_seqs=4,
                   tensor_parallel_size=tp)


def trace_times(trace_path: str) -> dict:
    """Rank 0's Chrome trace: steps, all-reduce calls, and the time (ms) in execute_model and in all-reduces."""
    events = [e for e in json.load(open(trace_path))["traceEvents"] if e.get("ph") == "X"]
    steps = [e for e in events if e["name"] == "execute_model"]
    reduces = [e for e in events if e["name"] == "c10d::allreduce_"]
    return {"steps": len(steps), "all_reduces": len(reduces), "step_ms": sum(e["dur"] for e in steps) / 1e3,
            "all_reduce_ms": sum(e["dur"] for e in reduces) / 1e3}


def tp_comparison(max_tokens: int = 16, pairs: int = 3) -> dict:
    """TP=1 and TP=2 on the same greedy batch: one warm-up each, then A B A B (`pairs` pairs), medians;
    then one profiled TP=2 run for the all-reduce share of a step."""
    from minivllm.sampling_params import SamplingParams
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    print("[1/3] 启动 TP=1 与 TP=2 两个引擎（2 核机器上约半分钟到一分钟）……", flush=True)
    llms = {1: _llm(1), 2: _llm(TP)}
    try:
        out = {tp: [o.outputs[0].token_ids for o in llm.generate(PROMPTS, sp, use_tqdm=False)]
               for tp, llm in llms.items()}
        print(f"[2/3] 交替计时 {pairs} 对（TP=1、TP=2）……", flush=True)
        walls = interleaved({tp: functools.partial(llm.generate, PROMPTS, sp, use_tqdm=False)
                             for tp, llm in llms.items()}, pairs, warmup=0)  # the run above warmed both up
        print("[3/3] TP=2 再跑一次，rank 0 上开 profiler 数 all-reduce……", flush=True)
        path = os.path.join(tempfile.mkdtemp(prefix="lesson10-demo-"), "tp2.json")
        llms[2].start_profile(path)
        llms[2].generate(PROMPTS, sp, use_tqdm=False)
        trace = trace_times(llms[2].stop_profile())
    finally:
        for llm in llms.values():
            llm.llm_engine.shutdown()
    tokens = len(PROMPTS) * max_tokens
    med = {tp: statistics.median(w) for tp, w in walls.items()}
    return {"same": out[1] == out[2], "walls": walls, "median": med, "tokens": tokens, "trace": trace,
            "share": trace["all_reduce_ms"] / max(trace["step_ms"], 1e-9)}


def print_tp_comparison(cmp: dict) -> None:
    """What holds on every run first (counts from the profiler and the model's shapes), then this machine's
    timings, labelled as such: two ranks share the same 2 cores, so their ratio follows the machine's load."""
    t = cmp["trace"]
    per_step = t["all_reduces"] / max(t["steps"], 1)
    print(f"greedy tokens TP=2 == TP=1: {cmp['same']}")
    print(f"every run: {t['steps']} steps, {t['all_reduces']} all-reduces on rank 0 = {per_step:.0f} per step "
          f"(2 per layer x 4 layers + 1 for the embedding); each all-reduce moves T x hidden 256 float32 = T KiB "
          f"(T = tokens in the step), whatever tp is; each rank computes half of every sharded matmul")
    print("this machine only (2 shared cores; the ratio follows the load, 0.5x-12x seen under load):")
    for tp in (1, 2):
        runs = ", ".join(f"{w:.3f}" for w in cmp["walls"][tp])
        print(f"TP={tp}: median {cmp['median'][tp]:.3f} s for {cmp['tokens']} tokens "
              f"({cmp['tokens'] / cmp['median'][tp]:.0f} tok/s)   runs: {runs}")
    print(f"TP=2 / TP=1 wall time: {cmp['median'][2] / cmp['median'][1]:.2f}x")
    print(f"rank 0 profile: execute_model {t['step_ms']:.1f} ms, all-reduce {t['all_reduce_ms']:.1f} ms "
          f"= {cmp['share']:.0%} of it (the rest: the other rank's compute on the same cores, the broadcast of "
          "execute_model, Python)")
    print("GPU: no recording of TP on GPUs yet; this lesson draws no conclusion from these ms (Q3).")


def plot_tp_comparison(cmp: dict):
    """Figure 10-1: wall time per run for TP=1 and TP=2 (interleaved), and the all-reduce share of a step."""
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4), layout="tight")
    for tp, color in ((1, "tab:blue"), (2, "tab:orange")):
        a.plot(range(1, len(cmp["walls"][tp]) + 1), cmp["walls"][tp], "o-", color=color, label=f"TP={tp}")
    a.set_xticks(range(1, len(cmp["walls"][1]) + 1))
    a.set(xlabel="pair (A B A B order)", ylabel="generate() wall time (s)")
    a.set_title(f"this machine only: {len(PROMPTS)} prompts x {cmp['tokens'] // len(PROMPTS)} tokens, greedy,\n"
                "2 shared CPU cores (the TP=2 / TP=1 ratio follows the load)", fontsize=9)
    a.legend(fontsize=8)
    t = cmp["trace"]
    b.bar(["steps", "all-reduces"], [t["steps"], t["all_reduces"]], color=["tab:gray", "tab:red"])
    b.set_ylabel("count on rank 0 (every run)")
    b.set_title(f"TP=2: {t['all_reduces'] / max(t['steps'], 1):.0f} all-reduces per step, each T x 256 float32",
                fontsize=9)
    return fig


# ---------------------------------------------------------------------------- the all-reduce in the wrong place
def _rank_mlp_without_all_reduce(rank: int, column_cls, row_cls) -> dict:
    """The student's MLP on this rank with the TP group's all-reduce made the identity (this rank process only)."""
    from autograder.lesson10.checks import _rank_mlp
    from minivllm.distributed import get_tp_group
    get_tp_group().all_reduce = lambda t: t
    return _rank_mlp(rank, column_cls, row_cls)


def misplaced_all_reduce(column_cls, row_cls) -> dict[str, float]:
    """The student's MLP on two ranks as written, with an all-reduce added after the column-parallel layer, and
    with every all-reduce left out: rank 0's max error against the unsharded MLP."""
    from autograder.lesson10.checks import _rank_mlp, _weights, reference_mlp
    from minivllm.distributed import tensor_model_parallel_all_reduce

    class ReduceAfterColumn(column_cls):
        def forward(self, x):
            return tensor_model_parallel_all_reduce(super().forward(x))

    ref = reference_mlp(_weights())
    runs = {"column -> row -> all-reduce (yours)": (_rank_mlp, column_cls),
            "all-reduce after the column layer": (_rank_mlp, ReduceAfterColumn),
            "no all-reduce at all": (_rank_mlp_without_all_reduce, column_cls)}
    return {name: (run_two_ranks(fn, c, row_cls)[0]["out"] - ref).abs().max().item()
            for name, (fn, c) in runs.items()}


# ---------------------------------------------------------------------------- the same thing in the pinned vLLM
def vllm_side_by_side(shards: dict) -> dict:
    """The pinned vLLM's own layers loading the same checkpoint per rank (live or recorded): each shard's shape and
    the checkpoint rows/columns it holds, next to minivllm's shapes from rank_shards()."""

    got = vllm_answers("lesson10")
    a = got["layer0_and_embedding"]
    two = shards["tp2"]

    def where(x):
        return " + ".join(f"{n}[{','.join(f'{s}:{e}' for s, e in r)}]" for n, r in x["source"]) + \
            (" rows" if x["source_dim"] == 0 else " cols")

    same = True
    print(f"{'parameter (vLLM class)':<48}{'rank':>5}  {'vLLM shape':<12}{'minivllm':<12}{'slice':<7}"
          "checkpoint slice (vLLM)")
    for k in a["tp2_rank0"]:
        mini_name = "model.embed_tokens.weight" if k == "embed_tokens" else f"model.layers.0.{k}.weight"
        for rank in (0, 1):
            x = a[f"tp2_rank{rank}"][k]
            mine = list(two[rank]["shapes"][mini_name])
            sliced = two[rank]["slices"][k] == x["source"]
            same &= mine == x["shape"] and sliced
            label = f"{k} ({x['class']})" if rank == 0 else ""
            print(f"{label:<48}{rank:>5}  {str(x['shape']):<12}{str(mine):<12}{'same' if sliced else 'OTHER':<7}"
                  f"{where(x)}")
    print("minivllm's ranks hold the same shapes and the same checkpoint slices as vLLM's:", same)
    return {"vllm": got, "same_shapes": same}
