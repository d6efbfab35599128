"""Helpers shared by the manager, the backend and the runner (vLLM: v1/structured_output/utils.py)."""
from __future__ import annotations

import re

import numpy as np
import torch

_CPP_PREFIX = re.compile(r"^\[[\d:]+\] [^\s:]+:\d+: ")


def choice_as_grammar(choice: list[str]) -> str:
    """EBNF that accepts exactly one of the strings: root ::= "a" | "b"."""
    escaped = (re.sub(r'(["\\])', r"\\\1", c) for c in choice)
    return "root ::= " + " | ".join(f'"{c}"' for c in escaped)


def xgrammar_error(e: Exception) -> str:
    """xgrammar's message without its '[hh:mm:ss] /path/file.cc:83: ' prefix."""
    return _CPP_PREFIX.sub("", str(e).strip()) or type(e).__name__


def apply_grammar_bitmask(grammar_output, logits_req_ids: list[str], logits: torch.Tensor,
                          spec_tokens: dict[str, list[int]] | None = None) -> None:
    """Mask disallowed tokens to -inf in place, in the runner, just before sampling.

    grammar_output.grammar_bitmask has 1 + k rows per structured request (k = its scheduled drafts in
    spec_tokens), in grammar_output's order (the scheduler's); logits has as many rows per sampling
    request, in the runner's batch order. The rows are scattered into a full mask in batch order (-1 =
    every token allowed, for free requests), as vLLM does. Unlike vLLM's, logits here only has rows for
    requests that sample this step, named by logits_req_ids.
    """
    import xgrammar as xgr
    bitmask = grammar_output.grammar_bitmask
    spec_tokens = spec_tokens or {}
    row_of, row = {}, 0
    for req_id in logits_req_ids:
        row_of[req_id] = row
        row += 1 + len(spec_tokens.get(req_id, ()))
    sorted_bitmask = np.full((logits.shape[0], bitmask.shape[1]), -1, dtype=np.int32)
    out_indices = []
    src = 0
    for req_id in grammar_output.structured_output_request_ids:
        n = 1 + len(spec_tokens.get(req_id, ()))
        row = row_of.get(req_id)
        if row is not None:
            sorted_bitmask[row:row + n] = bitmask[src:src + n]
            out_indices.extend(range(row, row + n))
        src += n
    if not out_indices:
        return
    mask = torch.from_numpy(sorted_bitmask).to(logits.device, non_blocking=True)
    indices = None if len(out_indices) == logits.shape[0] else sorted(out_indices)
    if not logits.is_cpu:
        if indices is not None:  # a device tensor, so xgrammar's kernel needs no host sync
            indices = torch.tensor(indices, dtype=torch.int32).to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, mask, indices=indices)
    elif logits.dtype != torch.float32:  # xgrammar's CPU kernel wants float32
        logits32 = logits.float()
        xgr.apply_token_bitmask_inplace(logits32, mask, indices=indices)
        logits.copy_(logits32)
    else:
        xgr.apply_token_bitmask_inplace(logits, mask, indices=indices)
