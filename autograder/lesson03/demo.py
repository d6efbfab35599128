"""Lesson 3 — BlockPool 与 Prefix Caching: what the notebook shows (live demos, tables, figures); no check calls these."""
from __future__ import annotations

import random
from statistics import median_high

from autograder.figures import vllm_answers
from autograder.lesson03.checks import (
    BLOCK,
    COMMON,
    EngineRun,
    _add,
    _computed_blocks,
    _drive,
    _tokens,
    make_core,
    make_manager,
    make_request,
    run_sequential,
)
from autograder.pin import VLLM_VERSION


# ---------------------------------------------------------------------------- demos
def block_table_snapshot(num_requests: int = 3, system_tokens: int = 40, seed: int = 11) -> dict:
    """Three requests sharing a 40-token system prompt, run to the end of their first step; returns each one's
    block table (ids, ref counts, hashed or not) as the KVCacheManager holds it, and its hit."""
    rng = random.Random(seed)
    system = _tokens(rng, system_tokens)
    prompts = [system + _tokens(rng, n) for n in (10, 27, 3)][:num_requests]
    core = make_core(True, num_gpu_blocks=32)
    run = EngineRun()
    for i, p in enumerate(prompts):
        _add(core, f"r{i}", p, 4)
    _drive(core, run, max_steps=1, until="r0")
    kv = core.scheduler.kv_cache_manager
    table = {rid: [(b.block_id, b.ref_cnt, b.block_hash is not None) for b in blocks]
             for rid, blocks in kv.req_to_blocks.items()}
    lengths = {f"r{i}": len(p) for i, p in enumerate(prompts)}
    core.shutdown()
    return {"table": table, "cached": dict(run.cached), "lengths": lengths, "system": system_tokens}


def print_block_table(snap: dict) -> None:
    print(f"{'request':<8}{'prompt':>7}{'hit':>5}  block table (id:ref_cnt, * = full block with a hash)")
    for rid, row in snap["table"].items():
        cells = " ".join(f"{bid}:{ref}{'*' if hashed else ' '}" for bid, ref, hashed in row)
        print(f"{rid:<8}{snap['lengths'][rid]:>7}{snap['cached'].get(rid, 0):>5}  {cells}")


def plot_block_tables(snap: dict):
    """Figure 3-1: each request's block table after one step; shared blocks (ref_cnt > 1) in one color."""
    import matplotlib.pyplot as plt

    rows = list(snap["table"].items())
    fig, ax = plt.subplots(figsize=(8, 1.1 + 0.7 * len(rows)), layout="tight")
    for y, (rid, row) in enumerate(reversed(rows)):
        for x, (bid, ref, hashed) in enumerate(row):
            color = "#DD8452" if ref > 1 else ("#4C72B0" if hashed else "#CCCCCC")
            ax.add_patch(plt.Rectangle((x, y + 0.1), 0.92, 0.8, facecolor=color, edgecolor="black",
                                       hatch=None if hashed else "//", linewidth=0.6))
            ax.text(x + 0.46, y + 0.5, f"block {bid}\nref={ref}", ha="center", va="center", fontsize=8,
                    bbox=None if hashed else dict(facecolor="white", edgecolor="none", pad=1))
        n, hit = snap["lengths"][rid], snap["cached"].get(rid, 0)
        ax.text(-0.15, y + 0.5, f"{rid}: {n} tokens\nhit {hit}", ha="right", va="center", fontsize=8)
    width = max(len(r) for _, r in rows)
    ax.set(xlim=(-1.6, width + 0.2), ylim=(0, len(rows)))
    ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black", hatch=h) for c, h in
               (("#DD8452", None), ("#4C72B0", None), ("#CCCCCC", "//"))]
    ax.legend(handles, ["shared (ref_cnt > 1)", "own full block (hashed)", "partial block (no hash)"],
              fontsize=8, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, frameon=False)
    ax.set_title(f"Figure 3-1  block tables after step 1 ({snap['system']}-token shared system prompt, "
                 f"block_size={BLOCK})", fontsize=9, loc="left")
    return fig


def ttft_runs(num_requests: int = 8, system_tokens: int = 512, question_tokens: int = 16, seed: int = 7,
              repeats: int = 3) -> dict:
    """Requests sharing a long system prompt, one at a time, caching on and off. The pair of runs is repeated
    `repeats` times, interleaved (on, off, on, off, ...), so a busy machine slows both sides alike; runs[on] is the
    first run (its stats), runs["all"][on] every run (their TTFTs)."""
    rng = random.Random(seed)
    system = _tokens(rng, system_tokens)
    prompts = [system + _tokens(rng, question_tokens) for _ in range(num_requests)]
    out = {"all": {True: [], False: []}, "prompt_tokens": system_tokens + question_tokens}
    for _ in range(repeats):
        for on in (True, False):
            out["all"][on].append(run_sequential(None, on, prompts, max_tokens=1, num_gpu_blocks=256,
                                                 measure_ttft=True))
    out[True], out[False] = out["all"][True][0], out["all"][False][0]
    return out


def computed_tokens(runs: dict, on: bool) -> list[int]:
    """Prompt tokens each request actually ran through the model: its length minus its prefix-cache hit."""
    return [runs["prompt_tokens"] - c for c in runs[on].cached.values()]


def _ttft_stats(runs: dict, on: bool) -> list[tuple[float, float, float]]:
    """Per request: (median, min, max) TTFT over the interleaved repeats."""
    per_req = list(zip(*(list(r.ttft_ms.values()) for r in runs["all"][on]), strict=True))
    return [(median_high(ts), min(ts), max(ts)) for ts in per_req]

def plot_hit_rate(runs: dict):
    """Figure 3-2: cumulative hit rate and prefill tokens saved vs number of requests (engine stats)."""
    import matplotlib.pyplot as plt

    on = runs[True].after_step
    n = list(range(1, len(on) + 1))
    rate = [h / q if q else 0 for q, h in on]
    saved = [h for _, h in on]
    fig, ax = plt.subplots(figsize=(7, 3.4), layout="tight")
    ax.plot(n, [r * 100 for r in rate], "o-", color="#4C72B0", label="hit rate (hits / queries)")
    ax.set_xlabel("requests served (same system prompt)")
    ax.set_ylabel("prefix-cache hit rate (%)", color="#4C72B0")
    ax.set_ylim(0, 100)
    ax2 = ax.twinx()
    ax2.bar(n, saved, alpha=0.3, color="#DD8452", label="prefill tokens saved (cumulative hits)")
    ax2.set_ylabel("prefill tokens saved", color="#DD8452")
    fig.legend(fontsize=8, loc="lower right", bbox_to_anchor=(0.88, 0.18))
    ax.set_title(f"Figure 3-2  minivllm SchedulerStats: {runs['prompt_tokens']}-token prompts sharing a system "
                 "prompt", fontsize=9, loc="left")
    return fig


def plot_ttft(runs: dict):
    """Figure 3-3: (a) prompt tokens computed per request, from the engine (deterministic); (b) TTFT per request,
    median of the interleaved runs with their min-max range."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4), layout="tight")
    for on, color in ((False, "#C44E52"), (True, "#55A868")):
        label = f"prefix caching {'on' if on else 'off'}"
        n = computed_tokens(runs, on)
        ax1.plot(range(1, len(n) + 1), n, "o-", color=color, label=label)
        stats = _ttft_stats(runs, on)
        x = range(1, len(stats) + 1)
        ax2.plot(x, [m for m, _, _ in stats], "o-", color=color, label=f"{label} (median)")
        ax2.fill_between(x, [lo for _, lo, _ in stats], [hi for _, _, hi in stats], color=color, alpha=0.2)
    ax1.set(xlabel="request", ylabel="prompt tokens computed", ylim=(0, runs["prompt_tokens"] * 1.1))
    ax1.legend(fontsize=8)
    ax1.set_title("(a) tokens computed per request (engine)", fontsize=9, loc="left")
    ax2.set(xlabel="request (arrives after the previous one finished)", ylabel="TTFT (ms, wall clock, log scale)",
            yscale="log")
    ax2.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax2.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax2.legend(fontsize=8)
    ax2.set_title(f"(b) TTFT: median and range of {len(runs['all'][True])} interleaved runs", fontsize=9, loc="left")
    fig.suptitle(f"Figure 3-3  {runs['prompt_tokens']}-token prompts sharing a system prompt, CPU "
                 "(request 1 includes warm-up)", fontsize=9, x=0.01, ha="left")
    return fig


def ttft_caption(runs: dict) -> str:
    """What this run of Figure 3-3 showed, in numbers (printed under the figure, so the caption never claims
    more than the student's machine measured)."""
    off_n, on_n = computed_tokens(runs, False), computed_tokens(runs, True)
    off, on = _ttft_stats(runs, False)[1:], _ttft_stats(runs, True)[1:]
    m_off, m_on = median_high([m for m, _, _ in off]), median_high([m for m, _, _ in on])
    ratio = m_off / m_on
    apart = sum(a[2] < b[1] for a, b in zip(on, off, strict=True))  # requests whose cached range lies wholly below the uncached
    verdict = (f"开启缓存的 TTFT 中位数是关闭时的 1/{ratio:.1f}" if ratio > 1 else "开启缓存后 TTFT 没有变短")
    return (f"本次运行：关闭缓存时每个请求计算 {median_high(off_n[1:])} 个 prompt token，开启后从第 2 个请求起只算 "
            f"{median_high(on_n[1:])} 个（图 a，引擎统计，与机器无关）。TTFT（图 b，第 2～{len(off) + 1} 个请求，"
            f"{len(runs['all'][True])} 次交替运行的中位数）：关闭 {m_off:.1f} ms"
            f"（范围 {min(lo for _, lo, _ in off):.1f}–{max(hi for _, _, hi in off):.1f}），开启 {m_on:.1f} ms"
            f"（范围 {min(lo for _, lo, _ in on):.1f}–{max(hi for _, _, hi in on):.1f}）；{verdict}"
            + f"；{len(on)} 个请求中有 {apart} 个的开启范围整个低于关闭范围"
            + ("。" if apart == len(on) else "：范围有重叠的请求说明这台机器此刻很忙，倍数只是粗略的。"))

def ttft_summary(runs: dict) -> str:
    return f"开启缓存时共命中 {runs[True].hits} 个 token（查询 {runs[True].queries}）；TTFT 见图 3-3 下方的实测说明。"


def full_hit_demo(request_block_hasher=None, get_computed_blocks=None, get_new_blocks=None) -> dict:
    """检查方法: the same 48-token prompt (3 full blocks) twice on a KVCacheManager; what the second one gets."""
    manager = make_manager(11, get_computed_blocks, get_new_blocks)
    first = make_request("first", COMMON, request_block_hasher)
    computed, n = _computed_blocks(manager, first)
    manager.allocate_slots(first, 48, n, computed)
    second = make_request("second", COMMON, request_block_hasher)
    computed, n = _computed_blocks(manager, second)
    new = manager.allocate_slots(second, 48 - n, n, computed)
    return {"first": manager.get_block_ids("first"), "hit_blocks": computed.get_block_ids(), "hit_tokens": n,
            "to_compute": 48 - n, "new_blocks": new.get_block_ids() if new else None,
            "second": manager.get_block_ids("second"), "cached_hashes": len(manager.cached_hashes())}


# ---------------------------------------------------------------------------- the same scenarios on the pinned vLLM
def vllm_side_by_side(names=("demo_prefill", "demo_evict")) -> None:
    """The pinned vLLM's KVCacheManager and BlockPool and minivllm's on the same operations: block hashes (numbered
    by first appearance), hits, new blocks and the free queue; the last column says whether they are equal."""
    from autograder.lesson03.checks import run_vllm_view

    answers = vllm_answers("lesson03", names)
    for name in names:
        print(f"\n{name}")
        print(f"{'操作':<12}{'vLLM ' + VLLM_VERSION:<40}{'minivllm':<40}同")
        for v, m in zip(answers[name], run_vllm_view(name), strict=True):
            cells = [" ".join(str(x) for x in r[2:]) for r in (v, m)]
            print(f"{v[0] + ' ' + v[1]:<12}{cells[0]:<40}{cells[1]:<40}{'✓' if v == m else '✗'}")
