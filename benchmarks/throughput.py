"""Offline throughput: minivllm vs HF transformers generate on the same prompts, interleaved in one run.

The nano-vllm workload scaled to a 2-core CPU: N prompts, input and output lengths uniform in
[min-len, max-len], ignore_eos, seed 0, the default model. HF runs greedy generate on left-padded batches
(each batch generates up to its longest requested output; only requested tokens are counted for either
engine). Both engines stay loaded and run in turn (minivllm, HF bs=a, HF bs=b, minivllm, ...); each
round's ratio is against that round's fastest HF batch size. Also prints where minivllm's step time goes:
the forward pass vs everything else (schedule, input preparation, sampling, update), the CPU overhead
lesson 1 is about.

    .venv/bin/python benchmarks/throughput.py                       # 24 prompts, lengths 16..128, 3 pairs
    .venv/bin/python benchmarks/throughput.py --num-prompts 64 --max-len 256 --pairs 5   # the bigger run
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from common import add_bench_args, environment, environment_line, interleave, ratio, spread, write_json


def make_workload(n: int, vocab: int, seed: int, lo: int, hi: int):
    rng = random.Random(seed)
    prompts = [[rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]
    out_lens = [rng.randint(lo, hi) for _ in range(n)]
    return prompts, out_lens


def step_shares(tracer) -> tuple[list[float], list[float], dict[str, float]]:
    """Per step with a forward: its wall time (first phase start to last phase end) and forward time."""
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
    return step_wall, fwd, phase_tot


class MinivllmSide:
    def __init__(self, model: str, prompts, out_lens, **engine_kwargs) -> None:
        from minivllm import LLM, SamplingParams
        self.llm = LLM(model, multiprocess=False, trace=True, max_num_seqs=len(prompts), device="cpu",
                       **engine_kwargs)
        self.prompts, self.out_lens = prompts, out_lens
        self.params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in out_lens]
        self.outside: list[float] = []  # share of step time outside the forward, one per round
        self.outside_wall: list[float] = []  # share of the run's wall time outside any forward
        self.phases: dict[str, float] = {}
        self.steps = 0

    def __call__(self) -> float:
        tracer = self.llm.llm_engine.engine_core.tracer
        tracer.clear()
        t0 = time.perf_counter()
        outs = self.llm.generate(self.prompts, self.params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        assert [len(o.outputs[0].token_ids) for o in outs] == self.out_lens
        step_wall, fwd, self.phases = step_shares(tracer)
        self.outside.append(1 - sum(fwd) / sum(step_wall))
        self.outside_wall.append(1 - sum(fwd) / elapsed)
        self.steps = len(step_wall)
        tracer.clear()
        return elapsed


class HFSide:
    def __init__(self, model, prompts, out_lens, batch_size: int) -> None:
        self.model, self.prompts, self.out_lens, self.batch_size = model, prompts, out_lens, batch_size

    def __call__(self) -> float:
        m, pad = self.model, self.model.config.pad_token_id or 0
        t0 = time.perf_counter()
        with torch.inference_mode():
            for i in range(0, len(self.prompts), self.batch_size):
                batch, lens = self.prompts[i:i + self.batch_size], self.out_lens[i:i + self.batch_size]
                width = max(map(len, batch))
                ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
                mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
                m.generate(ids, attention_mask=mask, max_new_tokens=max(lens), do_sample=False, pad_token_id=pad)
        return time.perf_counter() - t0


def main() -> None:
    import transformers

    from minivllm.config import default_model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--hf-batch-sizes", default="8,24",
                    help="HF padded batch sizes to run; each round's ratio is against its fastest")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--async-scheduling", action="store_true", help="run minivllm with async_scheduling=True")
    add_bench_args(ap)
    args = ap.parse_args()
    env_before = environment()
    torch.manual_seed(args.seed)
    vocab = transformers.AutoConfig.from_pretrained(args.model).vocab_size
    prompts, out_lens = make_workload(args.num_prompts, vocab, args.seed, args.min_len, args.max_len)
    total_out = sum(out_lens)
    print(f"workload: {len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens, {total_out} output tokens "
          f"(lengths uniform in [{args.min_len}, {args.max_len}]); {environment_line(env_before)}")
    mini = MinivllmSide(args.model, prompts, out_lens, async_scheduling=args.async_scheduling)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    hf_model.generation_config.eos_token_id = None
    sides = {"minivllm": mini}
    for bs in (int(x) for x in args.hf_batch_sizes.split(",")):
        sides[f"HF bs={bs}"] = HFSide(hf_model, prompts, out_lens, bs)
    times = interleave(sides, args.pairs, args.warmup,
                       on_round=lambda i, m: print(f"  round {i}: " + ", ".join(
                           f"{k} {total_out / v:.0f} tok/s" for k, v in m.items()), flush=True))
    for name, ts in times.items():
        print(f"{name:12s}: {spread(ts)} s   {total_out / statistics.median(ts):8.1f} output tok/s (median)")
    hf_names = [n for n in times if n != "minivllm"]
    fastest_hf = [min(times[n][i] for n in hf_names) for i in range(args.pairs)]
    r = ratio("throughput minivllm / fastest HF generate", fastest_hf, times["minivllm"],
              f"HF transformers generate, fastest of batch sizes {args.hf_batch_sizes} in the same round "
              "(goal >= 3x)")
    print(r.line())
    outside = mini.outside[args.warmup:]
    print(f"minivllm steps per run: {mini.steps}; share of step time outside the forward pass: median "
          f"{statistics.median(outside):.1%} (min {min(outside):.1%}, max {max(outside):.1%}; goal <= 3%)")
    wall = mini.outside_wall[args.warmup:]
    print(f"share of the run's wall time outside any forward pass (frontend included): median "
          f"{statistics.median(wall):.1%} (min {min(wall):.1%}, max {max(wall):.1%})")
    print("time per phase, last round (s): " + ", ".join(
        f"{k}={v:.3f}" for k, v in sorted(mini.phases.items(), key=lambda x: -x[1])))
    print(f"after: {environment_line()}")
    figures = {"minivllm tok/s": total_out / statistics.median(times["minivllm"]),
               "share outside forward": {"median": statistics.median(outside), "min": min(outside),
                                         "max": max(outside), "goal": 0.03},
               "share of wall time outside forward": {"median": statistics.median(wall), "min": min(wall),
                                                      "max": max(wall)}}
    write_json(args.json_out, "throughput", [r], figures, env_before)


if __name__ == "__main__":
    main()
