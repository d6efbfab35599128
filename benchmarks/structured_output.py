"""Structured outputs: throughput with half the batch JSON-constrained vs none, and how much grammar work
the forward pass hides, measured in one run.

A = every request free; B = the same prompts, every other one constrained by a JSON schema whose string
must be long (so both sides generate exactly max_tokens per request and only the grammar differs). The
sides alternate A B A B after a warm-up round (benchmarks/common.py); each pair gives a ratio B/A of tokens/s, and the
median ratio is printed with its min-max (goal >= 0.9). From B's trace: the grammar phase (bitmask on the
EngineCore thread) against the forward span (worker thread) of the same step. "Hidden" is the share of
grammar time spent before that forward ended (it delayed no sampling: the worker was still busy with the
step); "inside the forward" is the stricter share that overlapped the forward span itself.

    .venv/bin/python benchmarks/structured_output.py [--batch 32] [--max-tokens 64] [--pairs 3] [--device cpu]
"""
from __future__ import annotations

import argparse
import statistics
import time

from common import add_bench_args, environment, environment_line, interleave, ratio, spread, write_json

SCHEMA = {"type": "object", "required": ["speaker", "speech"], "additionalProperties": False,
          "properties": {"speaker": {"enum": ["ROMEO", "JULIET", "HAMLET"]},
                         "speech": {"type": "string", "minLength": 2000}}}
PROMPTS = ["ROMEO:", "JULIET:", "KING HENRY:", "First Citizen:", "HAMLET:", "MACBETH:", "LADY MACBETH:", "OTHELLO:"]


def run_side(llm, prompts, params) -> tuple[float, int, list]:
    tracer = llm.llm_engine.engine_core.engine_core.tracer
    tracer.clear()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outs), list(tracer.events)


def overlap(events) -> tuple[float, float, float, float, int]:
    """(grammar s, of which before the forward ended, of which inside the forward, forward s, steps)."""
    span = {(e.step, e.phase): e for e in events}
    grammar = hidden = inside = forward = 0.0
    steps = 0
    for (step, phase), g in span.items():
        f = span.get((step, "forward"))
        if phase != "grammar" or f is None or (step, "sample") not in span:
            continue  # only steps whose sampling waited for a bitmask
        steps += 1
        grammar += g.end - g.start
        forward += f.end - f.start
        hidden += (g.end - g.start) - max(0.0, g.end - max(g.start, f.end))
        inside += max(0.0, min(g.end, f.end) - max(g.start, f.start))
    return grammar, hidden, inside, forward, steps


def forward_ms(traces) -> float:
    """Mean forward span per step: if the grammar held the GIL, B's forward would be slower than A's."""
    spans = [e.end - e.start for events in traces for e in events if e.phase == "forward"]
    return statistics.mean(spans) * 1e3 if spans else float("nan")


def main() -> None:
    from minivllm import LLM, SamplingParams
    from minivllm.sampling_params import StructuredOutputsParams
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="auto")
    add_bench_args(ap)
    args = ap.parse_args()
    env = environment()
    llm = LLM(args.model, multiprocess=False, trace=True, device=args.device, max_num_seqs=args.batch,
              max_model_len=args.max_tokens + 32)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch)]
    free = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    json_sp = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True,
                             structured_outputs=StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True))
    params = {"A": [free] * args.batch, "B": [json_sp if i % 2 else free for i in range(args.batch)]}
    traces: dict[str, list] = {"A": [], "B": []}

    def side(name: str):
        def run() -> float:
            elapsed, tokens, events = run_side(llm, prompts, params[name])
            assert tokens == args.batch * args.max_tokens, f"side {name}: {tokens} tokens (a grammar ended early?)"
            traces[name].append(events)
            return tokens / elapsed
        return run

    rates = interleave({"A": side("A"), "B": side("B")}, args.pairs, args.warmup)
    for name in traces:  # the warm-up rounds compiled the grammar and filled caches: leave them out
        traces[name] = traces[name][args.warmup:]
    r = ratio("tok/s, half the batch JSON-constrained / none", rates["B"], rates["A"],
              "no constrained request (goal >= 0.9)")
    totals = [0.0, 0.0, 0.0, 0.0, 0]
    for events in traces["B"]:
        totals = [a + b for a, b in zip(totals, overlap(events), strict=True)]
    grammar, hidden, inside, forward, steps = totals
    device = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.device
    print(f"device {device}, batch {args.batch} ({args.batch // 2} JSON-constrained on side B), "
          f"{args.max_tokens} tokens each; {environment_line(env)}")
    print(f"  A none constrained:      {spread(rates['A'])} tok/s")
    print(f"  B half JSON-constrained: {spread(rates['B'])} tok/s")
    print("  " + r.line())
    print(f"  forward pass: A {forward_ms(traces['A']):.3f} ms/step, B {forward_ms(traces['B']):.3f} ms/step")
    figures = {}
    if steps:
        figures = {"grammar_ms_per_step": grammar / steps * 1e3, "hidden_share": hidden / grammar,
                   "inside_forward_share": inside / grammar}
        print(f"  grammar phase: {grammar / steps * 1e3:.3f} ms/step vs forward {forward / steps * 1e3:.3f} ms/step "
              f"over {steps} steps; hidden (before the forward ended): {hidden / grammar:.1%}, inside the forward span: "
              f"{inside / grammar:.1%}")
    write_json(args.json_out, "structured_output", [r], figures, env)


if __name__ == "__main__":
    main()
