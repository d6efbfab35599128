"""In-process vs multiprocess EngineCore: the same offline workload through LLM, and the IPC it costs.

    python benchmarks/inproc_vs_mp.py [--model PATH] [--num-prompts 64] [--output-len 32] [--pairs 3]

Both engines stay up and run in turn (in-process, multiprocess, in-process, ...; a warm-up round first),
one ratio per pair. Prints both throughputs and the median ratio with its min-max (goal: multiprocess
>= 0.95 x in-process), then the per-step
IPC cost: a utility round trip (frontend -> core -> frontend), and msgpack encode+decode of one step's
EngineCoreOutputs at this batch size. The multiprocess core steps while the frontend detokenizes, so
the ratio can exceed 1 when detokenization is a noticeable share of a step.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import msgspec
from common import add_bench_args, environment, environment_line, interleave, ratio, spread, write_json

from minivllm.engine import EngineCoreOutput, EngineCoreOutputs
from minivllm.entrypoints.llm import LLM
from minivllm.metrics.stats import SchedulerStats
from minivllm.sampling_params import SamplingParams


def workload(n: int, input_len: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 4000) for _ in range(rng.randint(input_len // 2, input_len))] for _ in range(n)]


def run_once(llm: LLM, prompts, params) -> tuple[float, int]:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--attention-backend", default="torch")
    add_bench_args(p)
    args = p.parse_args()
    env_before = environment()
    kw = dict(device=args.device, attention_backend=args.attention_backend, max_num_seqs=args.max_num_seqs)
    if args.model:
        kw["model"] = args.model
    prompts = workload(args.num_prompts, args.input_len)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)

    inproc, mp = LLM(multiprocess=False, **kw), LLM(multiprocess=True, **kw)
    counts: dict[str, int] = {}

    def side(name: str, llm: LLM):
        def fn() -> float:
            t, counts[name] = run_once(llm, prompts, params)
            return t
        return fn

    steps0 = inproc.llm_engine.engine_core.step_counter
    times = interleave({"in-process": side("in-process", inproc), "multiprocess": side("multiprocess", mp)},
                       args.pairs, args.warmup)
    steps = (inproc.llm_engine.engine_core.step_counter - steps0) // (args.pairs + args.warmup)
    n_tok = counts["in-process"]
    assert n_tok == counts["multiprocess"], counts
    del inproc

    core = mp.llm_engine.engine_core
    rtts = []
    for _ in range(200):
        t0 = time.perf_counter()
        core.call_utility("sleep_for_test", 0.0)
        rtts.append(time.perf_counter() - t0)
    batch = EngineCoreOutputs(outputs=[EngineCoreOutput(f"req-{i}", [1234]) for i in range(args.max_num_seqs)],
                              scheduler_stats=SchedulerStats(num_running_reqs=args.max_num_seqs))
    enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(EngineCoreOutputs)
    t0 = time.perf_counter()
    for _ in range(2000):
        dec.decode(enc.encode(batch))
    codec_us = (time.perf_counter() - t0) / 2000 * 1e6
    mp.llm_engine.shutdown()

    t_in, t_mp = statistics.median(times["in-process"]), statistics.median(times["multiprocess"])
    r = ratio("throughput multiprocess / in-process", times["in-process"], times["multiprocess"],
              "the in-process EngineCore on the same workload (goal >= 0.95)")
    print(f"workload: {args.num_prompts} prompts x {args.output_len} tokens, max_num_seqs {args.max_num_seqs}, "
          f"{steps} steps, {n_tok} tokens; {environment_line(env_before)}")
    print(f"in-process   : {spread(times['in-process'])} s  {n_tok / t_in:9.1f} tok/s  "
          f"{t_in / steps * 1e3:6.2f} ms/step (medians)")
    print(f"multiprocess : {spread(times['multiprocess'])} s  {n_tok / t_mp:9.1f} tok/s  "
          f"{t_mp / steps * 1e3:6.2f} ms/step")
    print(r.line())
    print(f"per-step IPC: utility round trip p50 {statistics.median(rtts) * 1e6:.0f} us "
          f"(p99 {sorted(rtts)[int(len(rtts) * 0.99)] * 1e6:.0f} us); msgpack encode+decode of a "
          f"{args.max_num_seqs}-request step output {codec_us:.1f} us; wall-time difference per step "
          f"{(t_mp - t_in) / steps * 1e6:+.0f} us")
    print(f"after: {environment_line()}")
    write_json(args.json_out, "inproc_vs_mp", [r], {"utility_rtt_p50_us": statistics.median(rtts) * 1e6,
                                                    "msgpack_step_output_us": codec_us}, env_before)

if __name__ == "__main__":
    main()
