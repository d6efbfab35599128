"""Lesson 7's wrong answers: each a few edits of the solution cell l07_sampler, with the misconception.

Instructor side only (`python -m autograder release` leaves this file out). Every mutant must score less
than the solution and fail the parts in `fails` (tests/test_mutants.py, tests/test_lesson07_grading.py).
"""
from autograder.mutation import Mutant

CELL = "l07_sampler"
MAIN, ENGINE, BOUNDARY = "l07_main_path", "l07_real_engine", "l07_boundary"

MUTANTS = {
    "temperature_after_softmax": Mutant(CELL, (
        ("x = logits / temp.unsqueeze(1)", "x = logits"),
        ("probs = x.softmax(dim=-1)", "probs = x.softmax(dim=-1) / temp.unsqueeze(1)"),
    ), "Divides the probabilities by T after softmax: a per-row scale the race ignores, so T has no effect.",
        fails={MAIN, ENGINE}),
    "top_p_drops_crossing_token": Mutant(CELL, (
        ("drop = cum <= 1 - p.unsqueeze(1)", "drop = cum - probs_sort <= 1 - p.unsqueeze(1)"),
    ), "Keeps only tokens strictly inside p: drops the token whose probability crosses p.",
        fails={MAIN, BOUNDARY}),
    "top_p_before_top_k_renormalisation": Mutant(CELL, (
        ("probs_sort = logits_sort.softmax(dim=-1)", "probs_sort = logits.sort(dim=-1).values.softmax(dim=-1)"),
    ), "Takes top-p over the whole vocabulary's probabilities, not over the top-k survivors renormalised.",
        fails={MAIN}),
    "min_p_against_sum": Mutant(CELL, (
        ("probs.amax(dim=-1, keepdim=True)", "probs.sum(dim=-1, keepdim=True)"),
    ), "Scales min_p by the sum of the probabilities (1) instead of the top token's probability.",
        fails={MAIN, BOUNDARY}),
    "one_generator_for_the_batch": Mutant(CELL, (
        ("q[i].exponential_(generator=gen)", "q[i].exponential_(generator=next(iter(generators.values())))"),
    ), "Draws every seeded row from one generator: a seeded request's tokens depend on who shares its batch.",
        fails={MAIN, ENGINE}),
    "logprobs_after_temperature": Mutant(CELL, (
        ("raw_logprobs = logits.log_softmax(dim=-1)",
         "raw_logprobs = (logits / md.temperature.clamp(min=SAMPLING_EPS).unsqueeze(1)).log_softmax(dim=-1)"),
    ), "Reports logprobs of the temperature-scaled distribution instead of the model's raw logits.",
        fails={MAIN, ENGINE}),
    "sort_for_top_k": Mutant(CELL, (
        ("kth = logits.topk(int(k_idx.max()) + 1, dim=-1).values",
         "kth = logits.sort(dim=-1, descending=True).values"),
    ), "Sorts the whole vocabulary for top-k alone: right masks, but the fast path is gone.",
        fails={ENGINE, BOUNDARY}),
    "multiply_by_noise": Mutant(CELL, (
        ("return (probs / q).argmax(dim=-1)", "return (probs * q).argmax(dim=-1)"),
    ), "Multiplies by the exponential noise instead of dividing: argmax(p * q) is not a draw from p.",
        fails={MAIN}),
}
