"""InputBatch: the persistent batch (vLLM: v1/worker/gpu_input_batch.py).

Rows persist across steps, so a decode step only writes what changed (one token, maybe a block id)
instead of rebuilding every request's state. The runner is its only writer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minivllm.sample.metadata import Penalties
from minivllm.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    """The worker's own copy of a request: enough to rebuild its row after preemption."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    generator: torch.Generator | None
    block_ids: list[int]
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    eos_token_id: int | None = None
    # prompt position -> ({token: logprob}, the prompt token's rank), filled as the prefill runs
    prompt_logprobs: dict[int, tuple[dict[int, float], int]] = field(default_factory=dict)
    prompt_logprobs_sent: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)


class InputBatch:
    """Fixed-capacity rows of token ids, block tables and sampling params; holes are condensed away."""

    def __init__(self, max_num_reqs: int, max_model_len: int, block_size: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.max_num_blocks_per_req = -(max_model_len // -block_size)
        self.req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_table = np.zeros((max_num_reqs, self.max_num_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        self.temperature = np.ones(max_num_reqs, dtype=np.float32)
        self.top_p = np.ones(max_num_reqs, dtype=np.float32)
        self.top_k = np.zeros(max_num_reqs, dtype=np.int64)
        self.min_p = np.zeros(max_num_reqs, dtype=np.float32)
        # Penalties (vLLM's InputBatch keeps the same three arrays); the output tokens they count are the
        # row's token_ids_cpu past its prompt.
        self.presence_penalty = np.zeros(max_num_reqs, dtype=np.float32)
        self.frequency_penalty = np.zeros(max_num_reqs, dtype=np.float32)
        self.repetition_penalty = np.ones(max_num_reqs, dtype=np.float32)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.has_penalties: set[int] = set()
        self.logit_bias: dict[int, dict[int, float]] = {}  # row -> token id -> bias
        self.allowed_token_ids: dict[int, list[int]] = {}  # row -> the only ids it may sample
        self.bad_words: dict[int, list[list[int]]] = {}  # row -> its bad words' token ids
        self.prompt_logprobs_reqs: set[str] = set()  # requests that want prompt logprobs (vLLM: num_prompt_logprobs)
        self.num_logprobs: list[int | None] = [None] * max_num_reqs
        self.generators: dict[int, torch.Generator] = {}
        # row -> (min_tokens, prompt length, ids masked until then): vLLM's MinTokensLogitsProcessor state
        self.min_tokens: dict[int, tuple[int, int, list[int]]] = {}
        # Bumped whenever a row's request or sampling parameters change: the runner rebuilds its cached
        # SamplingMetadata only then (vLLM: InputBatch.refresh_metadata on a batch update).
        self.version = 0

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, state: CachedRequestState) -> int:
        self.version += 1
        if None in self.req_ids:
            idx = self.req_ids.index(None)
            self.req_ids[idx] = state.req_id
        else:
            idx = len(self.req_ids)
            if idx >= self.max_num_reqs:
                raise RuntimeError(f"InputBatch is full ({self.max_num_reqs} rows)")
            self.req_ids.append(state.req_id)
        self.req_id_to_index[state.req_id] = idx
        n_prompt = len(state.prompt_token_ids)
        self.token_ids_cpu[idx, :n_prompt] = state.prompt_token_ids
        self.token_ids_cpu[idx, n_prompt:state.num_tokens] = state.output_token_ids
        self.num_tokens[idx] = state.num_tokens
        self.num_computed_tokens_cpu[idx] = state.num_computed_tokens
        self.num_blocks[idx] = 0
        self.append_block_ids(idx, state.block_ids)
        sp = state.sampling_params
        self.temperature[idx] = sp.temperature
        self.top_p[idx] = sp.top_p
        self.top_k[idx] = sp.top_k
        self.min_p[idx] = sp.min_p
        self.presence_penalty[idx] = sp.presence_penalty
        self.frequency_penalty[idx] = sp.frequency_penalty
        self.repetition_penalty[idx] = sp.repetition_penalty
        self.num_prompt_tokens[idx] = n_prompt
        if sp.has_penalties:
            self.has_penalties.add(idx)
        if sp.prompt_logprobs is not None:
            self.prompt_logprobs_reqs.add(state.req_id)
        if sp.logit_bias:
            self.logit_bias[idx] = sp.logit_bias
        if sp.allowed_token_ids:
            self.allowed_token_ids[idx] = sp.allowed_token_ids
        if sp.bad_words_token_ids:
            self.bad_words[idx] = sp.bad_words_token_ids
        self.num_logprobs[idx] = sp.logprobs
        if state.generator is not None:
            self.generators[idx] = state.generator
        # vLLM's all_stop_token_ids: EOS is in it even with ignore_eos (update_from_generation_config adds it
        # regardless), so min_tokens holds EOS back either way; ignore_eos only stops EOS from ending the request.
        stop_ids = set(sp.stop_token_ids or ())
        if state.eos_token_id is not None:
            stop_ids.add(state.eos_token_id)
        if sp.min_tokens > 0 and stop_ids:
            self.min_tokens[idx] = (sp.min_tokens, n_prompt, sorted(stop_ids))
        return idx

    def history_fields(self, rows: np.ndarray, device: torch.device, num_drafts: np.ndarray | None = None,
                       min_tokens_drafts: np.ndarray | None = None) -> dict:
        """The SamplingMetadata fields that follow the output so far, for rows whose history is their output plus
        num_drafts[i] of their draft tokens (none by default): min_tokens (counted with min_tokens_drafts[i],
        default the same), bad words and penalties."""
        if num_drafts is None:
            num_drafts = np.zeros(len(rows), dtype=np.int64)
        if min_tokens_drafts is None:
            min_tokens_drafts = num_drafts
        min_tokens, bad_words = {}, {}  # rows still below min_tokens: their stop ids and EOS are masked
        for i, r in enumerate(rows.tolist()):
            mt = self.min_tokens.get(r)
            if mt is not None and self.num_tokens[r] + min_tokens_drafts[i] - mt[1] < mt[0]:
                min_tokens[i] = mt[2]
            if r in self.bad_words:
                bad_words[i] = (self.bad_words[r], self.output_tokens(r, int(num_drafts[i])))
        return {"min_tokens": min_tokens or None, "bad_words": bad_words or None,
                "penalties": self.penalties(rows, device, num_drafts)}

    def output_tokens(self, row: int, num_drafts: int = 0) -> list[int]:
        """The row's output tokens so far, then its first num_drafts draft tokens (written after them)."""
        end = min(int(self.num_tokens[row]) + num_drafts, self.max_model_len)
        return self.token_ids_cpu[row, self.num_prompt_tokens[row]:end].tolist()

    def penalties(self, rows: np.ndarray, device: torch.device, num_drafts: np.ndarray | int = 0) -> Penalties | None:
        """The rows' penalties with their prompt and output tokens so far, the output followed by num_drafts[i]
        of row i's draft tokens (built every step: outputs grow); None when no row has any."""
        if not self.has_penalties.intersection(rows.tolist()):
            return None
        n_prompt = self.num_prompt_tokens[rows]
        n_total = np.minimum(self.num_tokens[rows] + num_drafts, self.max_model_len)
        prompt = np.full((len(rows), max(int(n_prompt.max()), 1)), -1, dtype=np.int64)
        output = np.full((len(rows), max(int((n_total - n_prompt).max()), 1)), -1, dtype=np.int64)
        for i, r in enumerate(rows.tolist()):
            prompt[i, :n_prompt[i]] = self.token_ids_cpu[r, :n_prompt[i]]
            output[i, :n_total[i] - n_prompt[i]] = self.token_ids_cpu[r, n_prompt[i]:n_total[i]]
        return Penalties(*(torch.from_numpy(a).to(device) for a in (
            self.presence_penalty[rows], self.frequency_penalty[rows], self.repetition_penalty[rows], prompt, output)))

    def append_block_ids(self, idx: int, block_ids: list[int]) -> None:
        start = self.num_blocks[idx]
        self.block_table[idx, start:start + len(block_ids)] = block_ids
        self.num_blocks[idx] = start + len(block_ids)

    def append_token(self, idx: int, token_id: int) -> None:
        n = self.num_tokens[idx]
        if n < self.max_model_len:
            self.token_ids_cpu[idx, n] = token_id
        self.num_tokens[idx] = n + 1

    def remove_request(self, req_id: str) -> int | None:
        idx = self.req_id_to_index.pop(req_id, None)
        if idx is None:
            return None
        self.version += 1
        self.req_ids[idx] = None
        self.generators.pop(idx, None)
        self.min_tokens.pop(idx, None)
        self.has_penalties.discard(idx)
        self.prompt_logprobs_reqs.discard(req_id)
        self.logit_bias.pop(idx, None)
        self.allowed_token_ids.pop(idx, None)
        self.bad_words.pop(idx, None)
        self.num_logprobs[idx] = None
        return idx

    def swap_states(self, i: int, j: int) -> None:
        self.version += 1
        ri, rj = self.req_ids[i], self.req_ids[j]
        self.req_ids[i], self.req_ids[j] = rj, ri
        if ri is not None:
            self.req_id_to_index[ri] = j
        if rj is not None:
            self.req_id_to_index[rj] = i
        for arr in (self.token_ids_cpu, self.num_tokens, self.num_computed_tokens_cpu, self.block_table,
                    self.num_blocks, self.temperature, self.top_p, self.top_k, self.min_p, self.presence_penalty,
                    self.frequency_penalty, self.repetition_penalty, self.num_prompt_tokens):
            arr[[i, j]] = arr[[j, i]]
        self.num_logprobs[i], self.num_logprobs[j] = self.num_logprobs[j], self.num_logprobs[i]
        for per_row in (self.generators, self.min_tokens, self.logit_bias, self.allowed_token_ids, self.bad_words):
            vi, vj = per_row.pop(i, None), per_row.pop(j, None)
            if vj is not None:
                per_row[i] = vj
            if vi is not None:
                per_row[j] = vi
        pi, pj = i in self.has_penalties, j in self.has_penalties
        self.has_penalties.difference_update((i, j))
        self.has_penalties.update(([i] if pj else []) + ([j] if pi else []))

    def condense(self) -> None:
        """Move the last rows into holes so rows [0, num_reqs) are all live."""
        holes = [i for i, r in enumerate(self.req_ids) if r is None]
        for hole in holes:
            while self.req_ids and self.req_ids[-1] is None:
                self.req_ids.pop()
            if hole >= len(self.req_ids):
                break
            self.swap_states(hole, len(self.req_ids) - 1)
            self.req_ids.pop()
        while self.req_ids and self.req_ids[-1] is None:
            self.req_ids.pop()
