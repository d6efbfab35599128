"""Lesson 8's checks can pass and can fail: a right answer (xgrammar's own bitmask and kernel, standing in for
the student's trie code, which lives in solutions/ only) passes; each misconception the issue lists fails.

The wrong answers are written here as transformations of the right one (the notebook's mutants table, as edits
of the solution cell, comes with the lesson source).
"""
from __future__ import annotations

import pytest
import torch

from autograder.common import CheckFailed
from autograder.lesson08 import checks as L08


def right(batch_req_ids, generated, choices, trie, eos_token_id, vocab_size):
    return L08.xgrammar_choice_bitmask(batch_req_ids, generated, choices, L08.default_vocab())


def bits_reversed(*args):
    words = right(*args).to(torch.int64) & 0xFFFFFFFF
    rev = sum(((words >> j) & 1) << (31 - j) for j in range(32))
    return rev.to(torch.int32)


def rows_in_scheduler_order(batch_req_ids, generated, *rest):
    return right(list(generated), generated, *rest)


def no_eos_when_complete(batch_req_ids, generated, choices, trie, eos, vocab_size):
    out = right(batch_req_ids, generated, choices, trie, eos, vocab_size)
    for row, req_id in enumerate(batch_req_ids):
        if generated[req_id] in choices[req_id]:
            out[row, eos // 32] &= ~(1 << (eos % 32))
    return out


def first_character_fits(batch_req_ids, generated, choices, trie, eos, vocab_size):
    words = torch.zeros(len(batch_req_ids), (vocab_size + 31) // 32, dtype=torch.int64)
    for row, req_id in enumerate(batch_req_ids):
        done = generated[req_id]
        allowed = {t for c in choices[req_id] if c.startswith(done) and len(c) > len(done)
                   for t, piece in enumerate(trie.token_bytes) if piece[:1] == c[len(done):len(done) + 1]}
        if done in choices[req_id]:
            allowed.add(eos)
        for t in allowed:
            words[row, t // 32] |= 1 << (t % 32)
    return words.to(torch.int32)


def test_token_trie_finds_exactly_the_prefix_tokens():
    vocab = L08.default_vocab()
    rest = b"perchance"
    want = sorted(t for t, p in enumerate(vocab.token_bytes) if p and rest.startswith(p))
    assert sorted(vocab.trie.prefixes_of(rest)) == want and len(want) > 2


def test_right_bitmask_passes():
    L08.check_choice_bitmask(right)


@pytest.mark.parametrize("wrong", [bits_reversed, rows_in_scheduler_order, no_eos_when_complete, first_character_fits])
def test_wrong_bitmasks_fail(wrong):
    with pytest.raises(CheckFailed):
        L08.check_choice_bitmask(wrong)


def test_apply_mask_before_sampling_passes_and_after_fails():
    import xgrammar as xgr

    def right_apply(logits, bitmask, sample):
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        return sample(logits)

    def after_sampling(logits, bitmask, sample):
        tokens = sample(logits)
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        return tokens
    L08.check_apply_bitmask(right_apply)
    with pytest.raises(CheckFailed, match="之前"):
        L08.check_apply_bitmask(after_sampling)


def test_real_engine_accepts_the_right_bitmask_and_rejects_misordered_rows():
    run = L08.check_real_engine(right)
    assert set(run.outputs) == {f"choice{i}" for i in range(len(L08.PROMPTS))}
    with pytest.raises(CheckFailed, match="不是选项"):
        L08.check_real_engine(rows_in_scheduler_order)
