"""Lesson 3 — BlockPool 与 Prefix Caching: what the notebook shows (live demos, tables, figures); no check calls these."""
from __future__ import annotations

import random

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
    fig, ax = plt.subplots(figsize=(8, 1.1 + 0.7 * len(rows)))
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
    ax.set_xlim(-1.6, width + 0.2)
    ax.set_ylim(0, len(rows))
    ax.axis("off")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black", hatch=h) for c, h in
               (("#DD8452", None), ("#4C72B0", None), ("#CCCCCC", "//"))]
    ax.legend(handles, ["shared (ref_cnt > 1)", "own full block (hashed)", "partial block (no hash)"],
              fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, frameon=False)
    ax.set_title(f"Figure 3-1  block tables after step 1 ({snap['system']}-token shared system prompt, "
                 f"block_size={BLOCK})", fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def ttft_runs(num_requests: int = 8, system_tokens: int = 512, question_tokens: int = 16, seed: int = 7) -> dict:
    """Requests sharing a long system prompt, one at a time, caching on and off: TTFT and stats per request."""
    rng = random.Random(seed)
    system = _tokens(rng, system_tokens)
    prompts = [system + _tokens(rng, question_tokens) for _ in range(num_requests)]
    out = {}
    for on in (True, False):
        out[on] = run_sequential(None, on, prompts, max_tokens=1, num_gpu_blocks=256, measure_ttft=True)
    out["prompt_tokens"] = system_tokens + question_tokens
    return out


def plot_hit_rate(runs: dict):
    """Figure 3-2: cumulative hit rate and prefill tokens saved vs number of requests (engine stats)."""
    import matplotlib.pyplot as plt

    on = runs[True].after_step
    n = list(range(1, len(on) + 1))
    rate = [h / q if q else 0 for q, h in on]
    saved = [h for _, h in on]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot(n, [r * 100 for r in rate], "o-", color="#4C72B0", label="hit rate (hits / queries)")
    ax.set_xlabel("requests served (same system prompt)")
    ax.set_ylabel("prefix-cache hit rate (%)", color="#4C72B0")
    ax.set_ylim(0, 100)
    ax2 = ax.twinx()
    ax2.bar(n, saved, alpha=0.3, color="#DD8452", label="prefill tokens saved (cumulative hits)")
    ax2.set_ylabel("prefill tokens saved", color="#DD8452")
    fig.legend(fontsize=7, loc="lower right", bbox_to_anchor=(0.88, 0.18))
    ax.set_title(f"Figure 3-2  minivllm SchedulerStats: {runs['prompt_tokens']}-token prompts sharing a system "
                 "prompt", fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def plot_ttft(runs: dict):
    """Figure 3-3: measured TTFT per request, prefix caching on vs off."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    for on, color in ((False, "#C44E52"), (True, "#55A868")):
        t = list(runs[on].ttft_ms.values())
        ax.plot(range(1, len(t) + 1), t, "o-", color=color, label=f"prefix caching {'on' if on else 'off'}")
    ax.set_xlabel("request (arrives after the previous one finished)")
    ax.set_ylabel("TTFT (ms, wall clock)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"Figure 3-3  TTFT, {runs['prompt_tokens']}-token prompts, CPU (request 1 includes warm-up)",
                 fontsize=9, loc="left")
    fig.tight_layout()
    return fig


def ttft_summary(runs: dict) -> str:
    on = list(runs[True].ttft_ms.values())[1:]
    off = list(runs[False].ttft_ms.values())[1:]
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return (f"TTFT 中位数（去掉第 1 个请求）：关闭 {med(off):.1f} ms，开启 {med(on):.1f} ms，"
            f"约 {med(off) / med(on):.1f} 倍；开启时共命中 {runs[True].hits} 个 token（查询 {runs[True].queries}）。")


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
