"""Lesson 6 — PagedAttention：Triton decode kernel: what the notebook shows (live demos, tables, figures); no check calls these."""
from __future__ import annotations

import os
import shutil

if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is first imported: without a GPU its kernels run in the interpreter

import torch  # noqa: E402

from autograder.figures import vllm_answers
from autograder.lesson06.checks import (
    DecodeCall,
    DecodeCase,
    EngineRun,
    OpCounter,
    device,
    interpreting,
    launch,
    make_case,
    run_decode,
)


def print_engine_run(run: EngineRun, ref: EngineRun | None = None) -> None:
    for i, (prompt, text, toks) in enumerate(zip(run.prompts, run.texts, run.tokens, strict=True)):
        same = "" if ref is None else ("  == 参考内核" if toks == ref.tokens[i] else f"  != 参考内核 {ref.tokens[i]}")
        print(f"r{i}: {prompt!r} -> {text!r}  tokens={toks}{same}")
    errs = [c.max_err for c in run.calls]
    print(f"decode 内核调用 {len(run.calls)} 次（每步 4 层各 1 次），与 torch 参考实现的最大误差 {max(errs):.2e}；"
          f"用时 {run.seconds:.1f} s" + ("（本机 CPU 上的 Triton 解释器，不代表 GPU）" if interpreting() else ""))


# ---------------------------------------------------------------------------- figures
def plot_block_tables(run: EngineRun):
    """Figure 6-1: the block tables the engine handed the decode kernel, step by step: which physical block
    holds each logical block of each request, and how full its last block is."""
    import matplotlib.pyplot as plt

    steps = run.calls[::4]                        # one call per step (layer 0)
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.55 * len(steps) * len(steps[0].seq_lens)), layout="tight")
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
    ax.set(xticks=range(max(-(n // -bs) for c in steps for n in c.seq_lens) + 1),
           xlabel="logical block (16 tokens each); hatched = slots past seq_len, must be masked")
    ax.set_title("Figure 6-1  Block tables seen by the decode kernel in the real engine", fontsize=9, loc="left")
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
    fig, ax = plt.subplots(figsize=(9, 3.2), layout="tight")
    colors = ["#4C72B0", "#DD8452", "#55A868", "#C44E52"]
    for r in rows:
        x = range(r["block"] * bs, r["block"] * bs + r["tokens"])
        ax.scatter(list(x), scores[r["block"] * bs:r["block"] * bs + r["tokens"]].tolist(), s=12,
                   color=colors[r["block"] % 4], label=f"block {r['block']} (phys {r['physical']})")
        ax.hlines(r["running_max"], r["block"] * bs, r["block"] * bs + r["tokens"] - 1, color="black", lw=2)
        last = r["block"] == rows[-1]["block"] and len(rows) > 1
        ax.annotate(f"after block {r['block']}: m={r['running_max']:.3f}, rescale={r['rescale']:.3f}",
                    (r["block"] * bs + (r["tokens"] - 1 if last else 0), r["running_max"]), xytext=(0, 4),
                    textcoords="offset points", fontsize=8, ha="right" if last else "left")
    lo, hi = float(scores.min()), float(scores.max())
    ax.set(ylim=(lo - 0.1 * (hi - lo), hi + 0.35 * (hi - lo)), xlabel="token position in the sequence",
           ylabel="score q.k * scale")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(f"Figure 6-2  Online softmax over blocks (engine call, seq {seq}, head {head}); "
                 f"|online - full softmax| = {err:.1e}", fontsize=9, loc="left")
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
    fig, ax = plt.subplots(figsize=(7, 3.8), layout="tight")
    ax.loglog(ai, np.minimum(peak_tflops, ai * bw_tbs), color="black",
              label=f"roofline {device_name}: {peak_tflops:.0f} TFLOP/s, {bw_tbs:.2f} TB/s")
    ax.axvline(peak_tflops / bw_tbs, color="gray", linestyle="--", label=f"ridge ~{peak_tflops / bw_tbs:.0f} FLOP/B")
    for qpk, elt, name in ((4, 2, "GQA 4, bf16"), (1, 2, "MHA, bf16"), (8, 2, "GQA 8, bf16")):
        x = decode_intensity(qpk, elt)
        ax.scatter([x], [x * bw_tbs], marker="s", color="#8172B2", zorder=3)
        ax.annotate(f"decode attention {name}: {x:g} FLOP/B", (x, x * bw_tbs), fontsize=8, xytext=(5, -10),
                    textcoords="offset points")
    for label, x, y in points or []:
        ax.scatter([x], [y], color="#C44E52", zorder=4)
        ax.annotate(label, (x, y), fontsize=8, xytext=(5, 4), textcoords="offset points", color="#C44E52")
    ax.set(xlabel="arithmetic intensity (FLOP / byte)", ylabel="TFLOP/s")
    ax.legend(fontsize=8, loc="upper left")
    title = "measured points in red" if points else "no GPU: the measured points need one"
    ax.set_title(f"Figure 6-3  Decode attention on the roofline ({title})", fontsize=9, loc="left")
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
    fig, ax = plt.subplots(figsize=(7, 3), layout="tight")
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [grouped.load_bytes.get(n, 0) for n in names], 0.4, label="grouped: one program per kv head")
    ax.bar([i + 0.2 for i in x], [per_head.load_bytes.get(n, 0) for n in names], 0.4, label="one program per query head")
    ax.axhline(minimum / 2, color="gray", linestyle="--", label="K (or V) bytes if read once")
    ax.set(xticks=list(x), xticklabels=names, ylabel="bytes loaded (interpreter count)")
    ax.legend(fontsize=8)
    ax.set_title("Figure 6-4  What one decode launch reads (CPU: counted by the interpreter)", fontsize=9, loc="left")
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


# ---------------------------------------------------------------------------- the same batch on the pinned vLLM
def vllm_side_by_side(kernel) -> dict:
    """The pinned vLLM's CPU attention op (its Triton kernels need a GPU) on the lesson's paged decode batches, beside
    minivllm's torch reference and your kernel: the largest difference between each pair."""
    from autograder import vllm_oracle
    from autograder.lesson06.checks import make_case, reference, run_decode

    answers = vllm_answers("lesson06")
    print(f"{'batch':<10}{'seq_lens':<20}{'H/KVH/D':<10}{'isa':<7}{'|vLLM-ref|':>11}{'|yours-ref|':>12}{'|yours-vLLM|':>13}")
    shown = {}
    for name, spec in vllm_oracle.scenarios("lesson06").items():
        case = make_case(seq_lens=spec["seq_lens"], num_heads=spec["num_heads"], num_kv_heads=spec["num_kv_heads"],
                         head_size=spec["head_size"], block_size=spec["block_size"], seed=spec["seed"])
        n = len(spec["seq_lens"])
        ref = reference(case).float().cpu().reshape(n, -1)
        yours = run_decode(kernel, case).float().cpu().reshape(n, -1)
        v = torch.tensor(answers[name]["output"])
        errs = [float((a - b).abs().max()) for a, b in ((v, ref), (yours, ref), (yours, v))]
        shown[name] = errs
        shape = f"{spec['num_heads']}/{spec['num_kv_heads']}/{spec['head_size']}"
        print(f"{name:<10}{str(spec['seq_lens']):<20}{shape:<10}{answers[name]['isa']:<7}"
              + "".join(f"{e:>12.1e}" for e in errs))
    return shown
