"""Lesson 7 on the pinned vLLM: its Sampler (v1/sample/sampler.py) on the lesson's row of real logits, stage by stage,
and on the grading batches: the masks its top-k/top-p step applied, the tokens it drew from each request's own
torch.Generator, and the raw logprobs it reported. Runs under .venv-vllm (imports vllm, never minivllm).

The Sampler gets the SamplingMetadata its InputBatch would build and the MinP logits processor fed through
BatchUpdate, as autograder/vllm_oracle/vllm_side.py _sampler does. Grading batches seed every non-greedy row:
unseeded rows draw from the global RNG and have no answer to compare. A batch mixing greedy and seeded rows
runs TopKTopPSampler.forward_native, since forward_cpu then draws every row from the global RNG (lesson 7's
list of differences).
"""
from __future__ import annotations

from pathlib import Path

MODEL = str(Path(__file__).resolve().parents[2] / "data" / "models" / "shakespeare-llama")

# The lesson's demo: "JULIET:\nO Romeo", greedy, the logits of the 6th generated token, then T, min_p, top_k, top_p.
LESSON = {"prompt": "JULIET:\nO Romeo", "position": 5, "temperature": 0.8, "min_p": 0.1, "top_k": 12, "top_p": 0.6,
          "top": 8}


def _row(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None, logprobs=None):
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "seed": seed,
            "logprobs": logprobs}


# Grading batches (input space of autograder/lesson07/checks.py): logits drawn by case_logits from `seed`.
GRADING = {
    "mixed": {"seed": 11, "vocab": 48, "scale": 2.0, "ties": False, "gaps": False, "rows": [
        _row(0.7, top_k=3, seed=101, logprobs=2), _row(1.0, top_p=0.5, seed=102, logprobs=0),
        _row(1.3, top_k=5, top_p=0.8, seed=103), _row(0.9, min_p=0.2, seed=104, logprobs=3),
        _row(1.0, seed=105), _row(1.0, min_p=1.0, seed=106), _row(0.0, logprobs=1),
        _row(0.5, top_k=48, top_p=0.95, min_p=0.05, seed=107)]},
    "top_k_only_ties": {"seed": 12, "vocab": 24, "scale": 2.0, "ties": True, "gaps": False, "rows": [
        _row(1.0, top_k=1, seed=201), _row(1.0, top_k=4, seed=202, logprobs=0), _row(2.0, top_k=24, seed=203),
        _row(1.0, top_k=0, seed=204), _row(0.8, top_k=7, min_p=0.3, seed=205)]},
    "top_p_only": {"seed": 13, "vocab": 64, "scale": 3.0, "ties": False, "gaps": False, "rows": [
        _row(1.0, top_p=0.01, seed=301), _row(1.0, top_p=0.3, seed=302), _row(1.5, top_p=0.9, seed=303, logprobs=4),
        _row(1.0, top_p=1.0, seed=304)]},
    "gaps_and_tiny_temperatures": {"seed": 14, "vocab": 16, "scale": 1.0, "ties": False, "gaps": True, "rows": [
        _row(1e-6, logprobs=0), _row(1e-4, seed=401, logprobs=2), _row(1.0, top_k=2, seed=402, logprobs=4),
        _row(1.0, top_p=0.9, seed=403)]},
    "all_greedy": {"seed": 15, "vocab": 40, "scale": 2.0, "ties": False, "gaps": False, "rows": [
        _row(0.0, logprobs=3), _row(0.0), _row(0.0, logprobs=0)]},
    "all_seeded_large": {"seed": 16, "vocab": 512, "scale": 4.0, "ties": False, "gaps": False, "rows": [
        _row(0.6, top_k=40, top_p=0.7, seed=501), _row(1.0, top_k=10, seed=502, logprobs=5),
        _row(1.2, min_p=0.05, seed=503), _row(0.9, top_p=0.5, seed=504), _row(1.0, seed=505),
        _row(0.7, top_k=1, top_p=0.2, min_p=0.5, seed=506)]},
}

SCENARIOS = {"lesson": LESSON, **{f"grade_{name}": case for name, case in GRADING.items()}}


def case_logits(case: dict):
    """The batch's logits, drawn by torch from the case's seed (same torch under either venv). `ties` rounds
    them to halves (ties at the k-th value); `gaps` puts the rows' tokens 110 to 180 nats apart near 120."""
    import torch

    g = torch.Generator().manual_seed(case["seed"])
    logits = torch.randn(len(case["rows"]), case["vocab"], generator=g) * case["scale"]
    if case["ties"]:
        logits = (logits * 2).round() / 2
    if case["gaps"]:
        logits[:, : 3] = torch.tensor([120.0, 119.0, 5.0])
        logits[:, 3:] -= 60.0
    return logits


def run_sampler(logits, rows: list[dict]) -> dict:
    """vLLM's Sampler on one batch: the top-k/top-p step's survivors per row, sampled tokens, raw logprobs."""
    from types import SimpleNamespace

    import torch
    import vllm.v1.sample.ops.topk_topp_sampler as tts
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    from autograder.vllm_oracle.vllm_side import logprob_rows, sampler_inputs

    n, vocab = logits.shape
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=64))
    min_p = MinPLogitsProcessor(config, torch.device("cpu"), False)
    params = [SamplingParams(temperature=r["temperature"], min_p=r["min_p"], max_tokens=16) for r in rows]
    min_p.update_state(BatchUpdate(batch_size=n, removed=[], moved=[],
                                   added=[(i, sp, None, []) for i, sp in enumerate(params)]))
    generators = {i: torch.Generator().manual_seed(r["seed"]) for i, r in enumerate(rows) if r["seed"] is not None}
    md, sampler, path = sampler_inputs(rows, vocab, generators, [[] for _ in rows], [min_p])
    masks: list = []
    original = tts.apply_top_k_top_p

    def capture(x, k, p):
        out = original(x, k, p)
        masks.append(torch.isfinite(out).clone())
        return out

    tts.apply_top_k_top_p = capture
    try:
        out = sampler(logits.clone(), md)
    finally:
        tts.apply_top_k_top_p = original
    kept = None if not masks else [torch.nonzero(m).view(-1).tolist() for m in masks[0]]
    lp = None
    if out.logprobs_tensors is not None:
        t = out.logprobs_tensors
        lp = logprob_rows(t.logprob_token_ids.tolist(), t.logprobs.tolist(), t.selected_token_ranks.tolist(),
                          [r["logprobs"] for r in rows])
    return {"path": path, "kept": kept, "sampled": out.sampled_token_ids.view(-1).tolist(), "logprobs": lp}


def lesson_row(case: dict):
    """The lesson's row of logits: the shipped checkpoint in HF transformers (float32), greedy to `position`."""
    import torch
    from transformers import AutoModelForCausalLM
    from vllm.tokenizers import get_tokenizer

    ids = list(get_tokenizer(MODEL).encode(case["prompt"]))
    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for _ in range(case["position"]):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        return ids, model(torch.tensor([ids])).logits[0, -1].float()


def lesson_stages(case: dict) -> dict:
    """The row after each step, in the Sampler's order, through vLLM's own pieces: Sampler.apply_temperature,
    MinPLogitsProcessor.apply, apply_top_k_top_p (top-k alone, then top-p alone, as the lesson's figure)."""
    from types import SimpleNamespace

    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.sample.sampler import Sampler

    ids, row = lesson_row(case)
    order = row.argsort(descending=True)[: case["top"]]
    min_p = MinPLogitsProcessor(SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=8)),
                                torch.device("cpu"), False)
    min_p.update_state(BatchUpdate(batch_size=1, removed=[], moved=[],
                                   added=[(0, SamplingParams(min_p=case["min_p"]), None, [])]))
    x = row.unsqueeze(0).clone()
    stages = {"raw": x.clone()}
    x = Sampler.apply_temperature(x, torch.tensor([case["temperature"]]), all_random=True)
    stages[f"temperature {case['temperature']}"] = x.clone()
    x = min_p.apply(x)
    stages[f"min_p {case['min_p']}"] = x.clone()
    x = apply_top_k_top_p(x, torch.tensor([case["top_k"]]), None)
    stages[f"top_k {case['top_k']}"] = x.clone()
    x = apply_top_k_top_p(x, None, torch.tensor([case["top_p"]]))
    stages[f"top_p {case['top_p']}"] = x.clone()
    raw = Sampler.compute_logprobs(row.unsqueeze(0))[0]
    return {"prompt_ids": ids, "top_ids": order.tolist(),
            "raw_logprobs": [round(float(raw[t]), 5) for t in order],
            "stages": {name: {"kept": int(torch.isfinite(v).sum()),
                              "probs": [round(float(p), 5) for p in v.softmax(-1)[0][order]]}
                       for name, v in stages.items()}}


def vllm_answer(name: str, payload: dict):
    if name == "lesson":
        return lesson_stages(payload)
    return run_sampler(case_logits(payload), payload["rows"])
