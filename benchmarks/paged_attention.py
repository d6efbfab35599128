"""Bandwidth of the Triton paged decode-attention kernel (minivllm/attention/ops/triton_decode_attention.py).

Decode attention reads every cached K/V byte of every sequence once per step, so its speed limit is
memory bandwidth. For each (batch, context) this times the kernel with triton.testing.do_bench,
reports the bytes it must read (K/V plus q) per second, and divides by the bandwidth of a plain
device-to-device copy measured in the same run. A torch baseline (gather the blocks into contiguous
K/V, then scaled_dot_product_attention) runs on the same inputs and is checked against the kernel.
For each shape the copy, the kernel and the baseline run interleaved (--pairs rounds, benchmarks/common.py):
the ratios are medians of per-round ratios, with their min-max.

    python benchmarks/paged_attention.py                   # needs a CUDA GPU; exits 0 with a note on CPU
    python benchmarks/paged_attention.py --interpret-smoke # one tiny shape under TRITON_INTERPRET=1 (CPU)

Goal on an H200: >= 70% of copy bandwidth at long context. The kernel runs one program per
(sequence, kv head), so its `programs` column (batch x num_kv_heads) must cover the SMs several times
over to reach it: small batches at long context are what split-KV ("flash decoding") would fix, which
this kernel does not do.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
from common import add_bench_args, environment, environment_line, interleave, ratio, write_json  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--context-lens", type=int, nargs="+", default=[512, 2048, 8192, 32768])
    p.add_argument("--num-heads", type=int, default=32)
    p.add_argument("--num-kv-heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16, choices=[16, 32])
    p.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--max-cache-gib", type=float, default=32.0, help="skip shapes whose K/V cache is larger")
    p.add_argument("--max-baseline-gib", type=float, default=8.0,
                   help="skip the torch baseline above this K/V size (it copies the whole cache first)")
    p.add_argument("--copy-mib", type=int, default=1024, help="size of the reference device-to-device copy")
    p.add_argument("--interpret-smoke", action="store_true",
                   help="run one tiny shape on CPU under TRITON_INTERPRET=1 to check this script's code path")
    add_bench_args(p, warmup=0)
    return p.parse_args(argv)


def make_inputs(batch: int, context: int, args: argparse.Namespace, device: str, dtype, seed: int = 0):
    """A paged cache holding `batch` sequences of `context` tokens in shuffled physical blocks."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = -(context // -args.block_size)
    num_blocks = batch * blocks_per_seq
    block_table = torch.randperm(num_blocks, generator=g, device=device).view(batch, blocks_per_seq)
    block_table = block_table.to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    kv_cache = torch.randn(2, num_blocks, args.block_size, args.num_kv_heads, args.head_size,
                           generator=g, device=device, dtype=dtype)
    query = torch.randn(batch, args.num_heads, args.head_size, generator=g, device=device, dtype=dtype)
    return query, kv_cache, block_table, seq_lens


def torch_gather_sdpa(query, kv_cache, block_table, context: int, scale: float):
    """Baseline: copy each sequence's blocks into contiguous K/V, then SDPA (all sequences are `context` long)."""
    import torch.nn.functional as F

    from minivllm.attention.backends.torch_attn import gather_kv

    k, v = gather_kv(kv_cache, block_table, context)                 # [B, L, Hkv, D]
    q = query.unsqueeze(2)                                           # [B, H, 1, D]
    k, v = k.transpose(1, 2), v.transpose(1, 2)                      # [B, Hkv, L, D]
    if k.shape[1] == q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, scale=scale).squeeze(2)
    try:                                                             # torch >= 2.5 shares kv heads itself
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True).squeeze(2)
    except TypeError:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        return F.scaled_dot_product_attention(q, k, v, scale=scale).squeeze(2)


def bench_ms(fn, on_cuda: bool) -> float:
    """Median milliseconds of fn(): do_bench on CUDA, one wall-clock call under the interpreter."""
    if on_cuda:
        import triton.testing
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def copy_fn_and_bytes(num_bytes: int, device: str):
    """dst.copy_(src): the practical ceiling for a kernel that streams memory (it reads + writes num_bytes)."""
    import torch

    src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * num_bytes


def run(args: argparse.Namespace, device: str) -> list[dict]:
    import torch

    from minivllm.attention.ops.triton_decode_attention import paged_decode_attention

    on_cuda = device.startswith("cuda")
    dtype = getattr(torch, args.dtype)
    elt = torch.finfo(dtype).bits // 8
    scale = args.head_size ** -0.5
    copy_fn, copy_bytes = copy_fn_and_bytes(args.copy_mib << 20, device)
    copy_gbs = copy_bytes / (bench_ms(copy_fn, on_cuda) * 1e-3) / 1e9
    if on_cuda:
        props = torch.cuda.get_device_properties(device)
        device_name = f"{props.name} ({props.multi_processor_count} SMs)"
    else:
        device_name = "cpu (TRITON_INTERPRET=1)"
    print(f"device: {device_name}; {environment_line()}; "
          f"heads {args.num_heads}/{args.num_kv_heads} kv, head_size {args.head_size}, block_size "
          f"{args.block_size}, {args.dtype}; device-to-device copy: {copy_gbs:.0f} GB/s; {args.pairs} rounds")
    print(f"{'batch':>6} {'context':>8} {'programs':>8} {'KV MiB':>8} {'triton us':>10} {'GB/s':>8} "
          f"{'% copy (min-max)':>18} {'torch us':>10} {'speedup (min-max)':>20} {'max err':>8}")
    rows = []
    for batch in args.batch_sizes:
        for context in args.context_lens:
            kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_size * elt
            if kv_bytes > args.max_cache_gib * (1 << 30):
                continue
            query, kv_cache, block_table, seq_lens = make_inputs(batch, context, args, device, dtype)
            out = torch.empty_like(query)
            k_cache, v_cache = kv_cache[0], kv_cache[1]

            def triton_fn(out=out, query=query, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                          seq_lens=seq_lens):
                paged_decode_attention(out, query, k_cache, v_cache, block_table, seq_lens, scale)

            def torch_fn(query=query, kv_cache=kv_cache, block_table=block_table, context=context):
                return torch_gather_sdpa(query, kv_cache, block_table, context, scale)

            triton_fn()
            sides = {"copy": lambda: bench_ms(copy_fn, on_cuda), "triton": lambda: bench_ms(triton_fn, on_cuda)}
            err = float("nan")
            if kv_bytes <= args.max_baseline_gib * (1 << 30):
                err = (out.float() - torch_fn().float()).abs().max().item()
                sides["torch"] = lambda: bench_ms(torch_fn, on_cuda)
            ms = interleave(sides, args.pairs, args.warmup)
            read_bytes = kv_bytes + query.numel() * elt
            frac = ratio(f"paged decode b={batch} ctx={context}: kernel GB/s / copy GB/s",
                         [read_bytes / t for t in ms["triton"]], [copy_bytes / t for t in ms["copy"]],
                         "a device-to-device copy in the same round (goal >= 0.70 at long context)")
            triton_ms = sorted(ms["triton"])[len(ms["triton"]) // 2]
            gbs = read_bytes / (triton_ms * 1e-3) / 1e9
            speedup = (ratio(f"paged decode b={batch} ctx={context}: torch gather+SDPA time / kernel time",
                             ms["torch"], ms["triton"], "torch gather + scaled_dot_product_attention, same round")
                       if "torch" in ms else None)
            torch_ms = sorted(ms["torch"])[len(ms["torch"]) // 2] if "torch" in ms else float("nan")
            row = dict(batch=batch, context=context, kv_mib=kv_bytes / (1 << 20), triton_us=triton_ms * 1e3,
                       gbs=gbs, frac_copy=frac.median, torch_us=torch_ms * 1e3,
                       speedup=speedup.median if speedup else float("nan"), max_err=err,
                       ratios=[frac] + ([speedup] if speedup else []))
            rows.append(row)
            sp = f"{speedup.median:.2f}x ({speedup.min:.2f}-{speedup.max:.2f})" if speedup else "-"
            print(f"{batch:>6} {context:>8} {batch * args.num_kv_heads:>8} {row['kv_mib']:>8.1f} "
                  f"{row['triton_us']:>10.1f} {gbs:>8.0f} "
                  f"{f'{100 * frac.median:.1f}% ({100 * frac.min:.0f}-{100 * frac.max:.0f})':>18} "
                  f"{row['torch_us']:>10.1f} {sp:>20} {err:>8.1e}")
            del query, kv_cache, block_table, seq_lens, out, k_cache, v_cache
            if on_cuda:
                torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env_before = environment()
    if args.interpret_smoke:
        os.environ["TRITON_INTERPRET"] = "1"          # before triton is first imported
        args.batch_sizes, args.context_lens = [2], [40]
        args.num_heads, args.num_kv_heads, args.head_size, args.dtype = 4, 2, 64, "float32"
        args.copy_mib = 16
        rows = run(args, "cpu")
        assert rows and rows[0]["max_err"] < 1e-4, rows
        print("smoke ok (interpreter timings say nothing about a GPU)")
        return 0

    import torch
    if not torch.cuda.is_available():
        print("benchmarks/paged_attention.py needs a CUDA GPU: it measures the decode kernel's memory "
              "bandwidth. Nothing to measure on CPU; --interpret-smoke checks the script under the "
              "Triton interpreter.")
        return 0
    rows = run(args, "cuda")
    write_json(args.json_out, "paged_attention", [r for row in rows for r in row["ratios"]], {}, env_before)
    if not rows:
        print("every shape was over --max-cache-gib; nothing measured")
        return 0
    longest = max(r["context"] for r in rows)
    best = max((r for r in rows if r["context"] == longest), key=lambda r: r["frac_copy"])
    verdict = "meets" if best["frac_copy"] >= 0.7 else "misses"
    print(f"\nlong context ({longest} tokens): best {100 * best['frac_copy']:.1f}% of copy bandwidth at batch "
          f"{best['batch']} ({verdict} the >= 70% goal)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
