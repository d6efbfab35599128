"""N-gram speculative decoding vs plain decoding: output tokens/s, interleaved in one run.

Two workloads at batch 1 on the default model: "repetitive" is greedy decoding from speaker prompts,
where the tiny model falls into loops of stage directions and names, so its own n-grams repeat (it is
too small to copy a quoted passage faithfully, which is the textbook case); "novel" samples from
random-token prompts at temperature 1 (n-grams rarely repeat, so speculation mostly costs a lookup).
Both engines stay loaded and run in turn; each round's ratio is speculative / plain tokens per second.

    .venv/bin/python benchmarks/spec_decode.py                  # k=4, lookup 3..5, 128 tokens, 3 pairs
    .venv/bin/python benchmarks/spec_decode.py --k 5 --max-tokens 256 --pairs 5
"""
from __future__ import annotations

import argparse
import random
import time

from common import add_bench_args, environment, environment_line, interleave, ratio, spread, write_json

SPEAKERS = ["ROMEO:", "JULIET:\nO Romeo", "KING RICHARD III:\nNow is the winter", "HAMLET:", "MACBETH:",
            "PORTIA:\nThe quality of mercy", "First Citizen:", "OTHELLO:"]


def workloads(tokenizer, n: int, seed: int):
    """(name, prompts, sampling kwargs) for the repetitive and the novel workload."""
    rng = random.Random(seed)
    repetitive = [tokenizer.encode(SPEAKERS[i % len(SPEAKERS)]) for i in range(n)]
    vocab = tokenizer.get_vocab_size() if hasattr(tokenizer, "get_vocab_size") else len(tokenizer)
    novel = [[rng.randrange(4, vocab) for _ in range(64)] for _ in range(n)]
    return [("repetitive", repetitive, {"temperature": 0.0}), ("novel", novel, {"temperature": 1.0, "seed": seed})]


class Side:
    def __init__(self, llm, prompts, max_tokens: int, sampling: dict) -> None:
        from minivllm import SamplingParams
        self.llm, self.prompts = llm, prompts
        self.params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **sampling)

    def __call__(self) -> float:
        t0 = time.perf_counter()
        outs = []
        for p in self.prompts:  # batch 1: one request at a time
            outs += self.llm.generate([p], self.params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--prompt-lookup-max", type=int, default=5)
    ap.add_argument("--prompt-lookup-min", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    add_bench_args(ap)
    args = ap.parse_args()
    from minivllm import LLM
    env = environment()
    spec_cfg = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": args.prompt_lookup_max,
                "prompt_lookup_min": args.prompt_lookup_min}
    plain = LLM(multiprocess=False, device="cpu")
    spec = LLM(multiprocess=False, device="cpu", speculative_config=spec_cfg)
    print(f"speculative_config={spec_cfg}; {environment_line(env)}")
    ratios, figures = [], {}
    for name, prompts, sampling in workloads(plain.get_tokenizer(), args.num_prompts, args.seed):
        core = spec.llm_engine.engine_core
        before = core.get_stats().spec_decoding_stats
        drafts0, accepted0, draft_tokens0 = before.num_drafts, before.num_accepted_tokens, before.num_draft_tokens
        res = interleave({"spec": Side(spec, prompts, args.max_tokens, sampling),
                          "plain": Side(plain, prompts, args.max_tokens, sampling)}, args.pairs, args.warmup)
        after = core.get_stats().spec_decoding_stats
        n_draft_tokens = after.num_draft_tokens - draft_tokens0
        acceptance = (after.num_accepted_tokens - accepted0) / n_draft_tokens if n_draft_tokens else 0.0
        goal = ">= 1.5x" if name == "repetitive" else ">= 0.95x"
        r = ratio(f"spec/plain tok/s, {name}, batch 1", res["spec"], res["plain"], f"plain decoding (goal {goal})")
        ratios.append(r)
        figures[name] = {"spec_tok_s": spread(res["spec"]), "plain_tok_s": spread(res["plain"]),
                         "drafts": after.num_drafts - drafts0, "acceptance_rate": round(acceptance, 3)}
        print(f"{name}: spec {spread(res['spec'])} tok/s, plain {spread(res['plain'])} tok/s, "
              f"{figures[name]['drafts']} drafts, acceptance rate {acceptance:.1%}")
        print("  " + r.line())
    print(environment_line())
    write_json(args.json_out, "spec_decode", ratios, figures, env)


if __name__ == "__main__":
    main()
