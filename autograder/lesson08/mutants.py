"""Lesson 8's wrong answers: each a few edits of the solution cell l08_choice_bitmask, with the misconception.

Instructor side only (`python -m autograder release` leaves this file out). tests/test_mutants.py grades each
one as a whole submission: it must score less than the solution and fail (at least) its `fails` parts.
"""
from autograder.mutation import Mutant

CELL = "l08_choice_bitmask"

MUTANTS = {
    "bits_reversed": Mutant(CELL, (
        ("token // 32, token % 32", "token // 32, 31 - token % 32"),
    ), "Packs token 32w+j into bit 31-j: the bit order within a word reversed.",
        fails={"l08_main_path", "l08_real_engine"}),
    "rows_in_scheduler_order": Mutant(CELL, (
        ("rows = batch_req_ids", "rows = list(generated)"),
    ), "Rows follow the scheduler's dict order instead of the runner's batch order.",
        fails={"l08_main_path", "l08_real_engine"}),
    "mask_after_sampling": Mutant(CELL, (
        ('    masked = logits.masked_fill(~allowed, float("-inf"))\n    return sample(masked)',
         '    tokens = sample(logits)\n    logits.masked_fill_(~allowed, float("-inf"))\n    return tokens'),
    ), "Samples first and masks afterwards: the sampler saw every token.",
        fails={"l08_boundary"}),
    "no_eos_when_complete": Mutant(CELL, (
        ("eos_allowed = done in choices[req_id]", "eos_allowed = False"),
    ), "Never allows EOS, even once the bytes equal a choice.",
        fails={"l08_main_path", "l08_boundary"}),
    "first_character_fits": Mutant(CELL, (
        ("allowed.update(trie.prefixes_of(rest))",
         "allowed.update(t for t, p in enumerate(trie.token_bytes) if p and rest and p[:1] == rest[:1])"),
    ), "Allows a token because its first byte fits, not all of its bytes.",
        fails={"l08_main_path", "l08_real_engine"}),
}
