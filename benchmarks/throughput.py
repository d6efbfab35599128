"""Offline throughput: minivllm vs HF transformers generate on the same prompts, in one run.

The nano-vllm workload scaled to a 2-core CPU: N prompts, input and output lengths uniform in
[16, 256], ignore_eos, seed 0, the default model. HF runs greedy generate on left-padded batches
(each batch generates up to its longest requested output; only requested tokens are counted for either
engine). Also prints where minivllm's step time goes: the forward pass vs everything else
(schedule, input preparation, sampling, update) — the CPU overhead lesson 1 is about.

    .venv/bin/python benchmarks/throughput.py [--num-prompts 64] [--hf-batch-sizes 16,64]
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch


def make_workload(n: int, vocab: int, seed: int, lo: int, hi: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    out_lens = [rng.randint(lo, hi) for _ in range(n)]
    return prompts, out_lens


def run_minivllm(model: str, prompts, out_lens):
    from minivllm import LLM, SamplingParams
    llm = LLM(model, multiprocess=False, trace=True, max_num_seqs=len(prompts), device="cpu")
    llm.generate([prompts[0]], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)  # warm-up
    tracer = llm.llm_engine.engine_core.tracer
    tracer.clear()
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in out_lens]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    assert [len(o.outputs[0].token_ids) for o in outs] == out_lens
    steps: dict[int, list] = {}
    for e in tracer.events:
        steps.setdefault(e.step, []).append(e)
    step_wall, fwd = [], []
    for evs in steps.values():
        f = [e for e in evs if e.phase == "forward"]
        if not f:
            continue
        step_wall.append(max(e.end for e in evs) - min(e.start for e in evs))
        fwd.append(sum(e.end - e.start for e in f))
    phase_tot: dict[str, float] = {}
    for e in tracer.events:
        phase_tot[e.phase] = phase_tot.get(e.phase, 0.0) + (e.end - e.start)
    return elapsed, step_wall, fwd, phase_tot


def run_hf(model: str, prompts, out_lens, batch_size: int) -> float:
    import transformers
    m = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    m.generation_config.eos_token_id = None
    pad = m.config.pad_token_id or 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompts), batch_size):
            batch, lens = prompts[i:i + batch_size], out_lens[i:i + batch_size]
            width = max(map(len, batch))
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
            m.generate(ids, attention_mask=mask, max_new_tokens=max(lens), do_sample=False, pad_token_id=pad)
    return time.perf_counter() - t0


def main() -> None:
    from minivllm.config import default_model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--hf-batch-sizes", default="16,64",
                    help="HF padded batch sizes to try; the ratio is against the fastest")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    import transformers
    vocab = transformers.AutoConfig.from_pretrained(args.model).vocab_size
    prompts, out_lens = make_workload(args.num_prompts, vocab, args.seed, args.min_len, args.max_len)
    total_out = sum(out_lens)
    print(f"workload: {len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens, {total_out} output tokens "
          f"(lengths uniform in [{args.min_len}, {args.max_len}]), torch threads={torch.get_num_threads()}")
    t_mini, step_wall, fwd, phases = run_minivllm(args.model, prompts, out_lens)
    print(f"minivllm   : {t_mini:7.2f} s  {total_out / t_mini:8.1f} output tok/s")
    t_hf = {}
    for bs in (int(x) for x in args.hf_batch_sizes.split(",")):
        t_hf[bs] = run_hf(args.model, prompts, out_lens, bs)
        print(f"HF (bs={bs:3d}): {t_hf[bs]:7.2f} s  {total_out / t_hf[bs]:8.1f} output tok/s")
    best = min(t_hf, key=t_hf.get)
    print(f"ratio minivllm / fastest HF (bs={best}): {t_hf[best] / t_mini:.2f}x  (goal >= 3x)")
    outside = [1 - f / w for f, w in zip(fwd, step_wall, strict=True) if w > 0]
    print(f"steps: {len(step_wall)}, median step {statistics.median(step_wall) * 1e3:.2f} ms, "
          f"median forward {statistics.median(fwd) * 1e3:.2f} ms")
    print(f"share of step time outside the forward pass: median {statistics.median(outside):.1%}, "
          f"overall {1 - sum(fwd) / sum(step_wall):.1%}")
    print("time per phase (s): " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(phases.items(), key=lambda x: -x[1])))


if __name__ == "__main__":
    main()
