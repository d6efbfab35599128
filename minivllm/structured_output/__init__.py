"""StructuredOutputManager (vLLM: v1/structured_output/__init__.py): grammars for constrained decoding.

Three moments in a request's life:
  * grammar_init (EngineCore.add_request): the grammar compiles on a thread pool, cached by key, while the
    request waits in WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR (the scheduler polls, other requests run);
  * grammar_bitmask (the step's grammar phase, while the worker runs the forward pass): int32 rows for
    each constrained request that samples this step (one per scheduled draft, plus one), bit j of word w
    allowing token 32 * w + j;
  * accept_tokens (Scheduler.update_from_output): each sampled token advances the request's matcher;
    validate_tokens (Scheduler.update_draft_token_ids): drafts are cut to the grammar's longest prefix.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from minivllm.structured_output.backend_types import StructuredOutputKey

if TYPE_CHECKING:
    import numpy as np

    from minivllm.config import VllmConfig
    from minivllm.request import Request

logger = logging.getLogger(__name__)


class StructuredOutputManager:
    """Compiles grammars off the engine loop and fills the batch's next-token bitmask."""

    def __init__(self, vllm_config: VllmConfig | None = None, max_cached_grammars: int = 256) -> None:
        self.vllm_config = vllm_config
        self.backend = None  # built on the first constrained request (it loads the tokenizer)
        self.max_cached_grammars = max_cached_grammars
        self.compiled: OrderedDict[StructuredOutputKey, Future] = OrderedDict()  # LRU of CompiledGrammar futures
        self.num_compiles = 0
        self._lock = threading.Lock()
        self._grammar_bitmask: torch.Tensor | None = None
        # Compilation is CPU-bound: half the cores, as in vLLM (1 here, on 2 cores).
        self.executor = ThreadPoolExecutor(max_workers=max(1, ((os.cpu_count() or 2) + 1) // 2),
                                           thread_name_prefix="minivllm-grammar")

    # ------------------------------------------------------------------ compile
    def grammar_init(self, request: Request) -> None:
        """Start compiling the request's grammar; the request holds the Future until it resolves."""
        if request.structured_output_request is None:
            return
        if self.backend is None:
            self.backend = self._make_backend()
        request.structured_output_request.grammar = self.executor.submit(self._create_grammar, request)

    def _make_backend(self):
        from minivllm.model_executor.model_loader import load_hf_config, resolve_model_path
        from minivllm.structured_output.backend_xgrammar import XgrammarBackend
        from minivllm.tokenizer import get_tokenizer
        if self.vllm_config is None:
            raise ValueError("structured outputs need a StructuredOutputManager built with the engine's VllmConfig")
        mc = self.vllm_config.model_config
        tokenizer = get_tokenizer(mc.tokenizer)
        vocab_size = getattr(load_hf_config(resolve_model_path(mc.model)), "vocab_size", None) or len(tokenizer)
        return XgrammarBackend(tokenizer, vocab_size)

    def _create_grammar(self, request: Request):
        """On the compile pool: the cached CompiledGrammar for the key (compiled once), then a fresh matcher."""
        key = request.structured_output_request.structured_output_key
        with self._lock:
            future = self.compiled.get(key)
            owner = future is None
            if owner:
                future = self.compiled[key] = Future()
                self.num_compiles += 1
                while len(self.compiled) > self.max_cached_grammars:
                    self.compiled.popitem(last=False)
            else:
                self.compiled.move_to_end(key)
        if owner:
            try:
                future.set_result(self.backend.compile(key))
            except Exception as e:
                logger.error("grammar compilation failed for request %s: %s", request.request_id, e)
                with self._lock:
                    self.compiled.pop(key, None)  # do not cache failures
                future.set_exception(e)
        # A non-owner waits only on a compile submitted before it (FIFO pool), which is running or done.
        return self.backend.grammar(future.result())

    # ------------------------------------------------------------------ bitmask
    def grammar_bitmask(self, requests: dict[str, Request], structured_output_request_ids: list[str],
                        scheduled_spec_decode_tokens: dict[str, list[int]]) -> np.ndarray | None:
        """Rows in structured_output_request_ids order; a terminated grammar's row allows everything.

        A request with k scheduled drafts gets k + 1 rows (vLLM's layout): row i is the grammar's state
        after its first i drafts (the matcher advances over them, then rolls back), the last one the
        bonus position's. A placeholder draft (-1) does not advance it. Returns a copy (not a view of the
        reused buffer): the message to the worker owns its data.
        """
        if not structured_output_request_ids:
            return None
        if self._grammar_bitmask is None:
            cfg = self.vllm_config
            max_num_seqs = cfg.scheduler_config.max_num_seqs if cfg else 1024
            spec = cfg.speculative_config if cfg else None
            self._grammar_bitmask = self.backend.allocate_token_bitmask(
                max_num_seqs * (1 + (spec.num_speculative_tokens if spec else 0)))
        bitmask = self._grammar_bitmask
        row = 0
        for req_id in structured_output_request_ids:
            grammar = requests[req_id].structured_output_request.grammar
            advanced = 0
            for token in (*scheduled_spec_decode_tokens.get(req_id, ()), None):
                if grammar.is_terminated():
                    bitmask[row].fill_(-1)
                else:
                    grammar.fill_bitmask(bitmask, row)
                row += 1
                if token is not None and token >= 0 and not grammar.is_terminated():
                    if not grammar.accept_tokens(req_id, [token]):
                        raise AssertionError(f"request {req_id}: scheduled draft {token} was validated "
                                             "against its grammar but the grammar rejects it")
                    advanced += 1
            if advanced:
                grammar.rollback(advanced)
        return bitmask[:row].numpy().copy()

    def should_advance(self, request: Request) -> bool:
        """Whether sampled tokens advance the grammar (vLLM also skips reasoning tokens here)."""
        return request.structured_output_request is not None

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
