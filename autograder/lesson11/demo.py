"""Lesson 11 — what the notebook shows (never called by a check): padding waste and launch counts.

No CPU timing of padded vs unpadded forwards: on a shared 2-core CPU the tiny model's forward is dominated by
dispatch overhead and the ratio swung from 0.13 to 3.60 between runs (41 interleaved pairs still gave a
10th-90th percentile spread of 0.2-6); the lesson reasons about padding's cost from figure 11-1 and the GPU.
"""
from __future__ import annotations

import torch

from autograder.figures import vllm_answers
from autograder.lesson11.checks import DEFAULT_MODEL, runner_of
from minivllm.compilation.cuda_graph import BatchDescriptor, CudagraphDispatcher


def padding_table(capture_sizes: list[int], max_num_reqs: int) -> list[dict]:
    """Rows wasted by padding each batch size to its capture size (None: above every size, runs eagerly)."""
    d = CudagraphDispatcher(capture_sizes)
    rows = []
    for n in range(1, max_num_reqs + 1):
        size = d.padded_size(n)
        rows.append({"num_reqs": n, "size": size, "wasted": None if size is None else size - n})
    return rows


def launch_counts(batch_size: int = 8) -> dict | None:
    """CUDA runtime calls of one decode forward: eager launches every kernel, a graph replays once. None on CPU."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    from minivllm.entrypoints.llm import LLM
    llm = LLM(DEFAULT_MODEL, device="cuda", multiprocess=False, max_num_seqs=batch_size, cudagraph_capture_sizes=[batch_size])
    runner = runner_of(llm)
    desc = BatchDescriptor(batch_size, batch_size, True)
    ids, pos, md = runner._pad_for_cudagraph(desc, None, None, None)
    counts = {}
    with torch.inference_mode():
        for name, fn in (("eager", lambda: runner.model(ids, pos, runner.kv_caches, md)),
                         ("graph", lambda: runner._model_forward(desc, ids, pos, md))):
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            names = [e.name for e in prof.events()]
            counts[name] = {"kernel_launches": sum("LaunchKernel" in n for n in names),
                            "graph_launches": sum(n == "cudaGraphLaunch" for n in names)}
    return counts


def plot_padding(table: list[dict], capture_sizes: list[int]):
    """Figure 11-1: the size each batch runs at, and the share of its rows that are padding."""
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4), layout="tight")
    n = [r["num_reqs"] for r in table]
    sizes = [r["size"] if r["size"] is not None else float("nan") for r in table]
    ax1.step(n, sizes, where="mid", label="capture size it runs at")
    ax1.plot(n, n, "k:", lw=1, label="num_reqs (no padding)")
    ax1.set(xlabel="decode batch size (num_reqs)", ylabel="rows computed", title="padded size")
    ax1.legend(fontsize=8)
    waste = [r["wasted"] / r["size"] if r["size"] else float("nan") for r in table]
    ax2.bar(n, waste, color="tab:orange")
    ax2.set(xlabel="decode batch size (num_reqs)", ylabel="padded rows / rows computed", ylim=(0, 0.6),
            title=f"padding waste, capture sizes {capture_sizes}")
    return fig


def print_launch_counts(counts: dict | None) -> None:
    if counts is None:
        print("没有 CUDA：CPU 上没有 kernel launch 可数，也没有 CUDA graph 可录制，这张表只在 GPU 上出现"
              "（eager 每个 kernel 一次 cudaLaunchKernel，graph 整个前向一次 cudaGraphLaunch）。")
        return
    print(f"{'path':>6} {'cudaLaunchKernel':>17} {'cudaGraphLaunch':>16}")
    for name, c in counts.items():
        print(f"{name:>6} {c['kernel_launches']:>17} {c['graph_launches']:>16}")


# ---------------------------------------------------------------------------- the same thing in the pinned vLLM
def vllm_side_by_side(choose_capture_size, show: str = "default_20_seqs") -> dict:
    """The pinned vLLM's capture lists for the lesson's settings next to minivllm's (CompilationConfig.
    set_cudagraph_sizes), then, for one setting, each decode batch's rows in minivllm, in vLLM and by your
    choose_capture_size given vLLM's decode graphs."""
    from autograder.lesson11.vllm_view import SCENARIOS
    from minivllm.config import CompilationConfig

    got = vllm_answers("lesson11")
    mini = {}
    for name, s in SCENARIOS.items():
        if s["performance_mode"] is not None:       # minivllm has no performance_mode
            continue
        cc = CompilationConfig(cudagraph_capture_sizes=s["cudagraph_capture_sizes"])
        cc.set_cudagraph_sizes(s["max_num_seqs"])
        mini[name] = cc.cudagraph_capture_sizes

    def short(sizes):
        return str(sizes) if len(sizes) <= 9 else f"[{', '.join(map(str, sizes[:5]))}, ... {sizes[-1]}] ({len(sizes)})"

    print(f"{'setting':<26}{'max_num_seqs':>13}  {'vLLM captures (GPU)':<34}{'vLLM decode graphs':<34}"
          f"{'vLLM on CPU':<13}minivllm")
    for name, s in SCENARIOS.items():
        a = got[name]
        print(f"{name:<26}{s['max_num_seqs']:>13}  {short(a['cudagraph_capture_sizes']):<34}"
              f"{short(a['decode_capture_sizes']):<34}{short(a['on_cpu']['cudagraph_capture_sizes']):<13}"
              f"{short(mini[name]) if name in mini else '(no performance_mode)'}")
    a = got[show]
    d = CudagraphDispatcher(mini[show])
    print(f"\n{show}: rows each decode batch runs at (eager = no graph)")
    print(f"{'requests':<10}{'minivllm':>10}{'vLLM':>10}{'yours':>10}")
    for n, mode, rows in a["decode_padding"][:SCENARIOS[show]["max_num_seqs"]]:
        vllm = rows if mode == "FULL" else None
        mine = d.padded_size(n)
        yours = choose_capture_size(n, list(a["decode_capture_sizes"]))
        print(f"{n:<10}{str(mine or 'eager'):>10}{str(vllm or 'eager'):>10}{str(yours or 'eager'):>10}")
    return {"vllm": got, "minivllm": mini}
