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
import time
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
        from minivllm.config import StructuredOutputsConfig
        self.vllm_config = vllm_config
        self.config = vllm_config.structured_outputs_config if vllm_config is not None else StructuredOutputsConfig()
        self.backend = None  # built on the first constrained request (it loads the tokenizer)
        self.max_cached_grammars = max_cached_grammars
        # LRU of CompiledGrammar futures, bounded by entries and by the grammars' memory (config.cache_bytes).
        self.compiled: OrderedDict[StructuredOutputKey, Future] = OrderedDict()
        self.compiled_bytes: dict[StructuredOutputKey, int] = {}
        self.num_compiles = 0
        self._lock = threading.Lock()
        self._grammar_bitmask: torch.Tensor | None = None
        # Compilation is CPU-bound: half the cores, as in vLLM, but at least 2 so one big compile cannot hold
        # every small one (a request waits on its key's compile without holding a pool thread).
        self.executor = ThreadPoolExecutor(max_workers=max(2, ((os.cpu_count() or 2) + 1) // 2),
                                           thread_name_prefix="minivllm-grammar")

    # ------------------------------------------------------------------ compile
    def grammar_init(self, request: Request) -> None:
        """Start (or join) the compile of the request's key; the request holds a Future of its matcher.

        A request whose grammar is not ready within config.compile_timeout_s finishes with an error
        (StructuredOutputRequest checks the deadline when the scheduler polls).
        """
        so_request = request.structured_output_request
        if so_request is None:
            return
        if self.backend is None:
            self.backend = self._make_backend()
        key = so_request.structured_output_key
        with self._lock:
            compiled = self.compiled.get(key)
            if compiled is None:
                self.num_compiles += 1
                compiled = self.compiled[key] = self.executor.submit(self._create_grammar, key, request.request_id)
                self._evict()
            else:
                self.compiled.move_to_end(key)
        matcher: Future = Future()

        def make_matcher(done: Future) -> None:
            if done.cancelled() or done.exception() is not None:
                matcher.set_exception(done.exception() if not done.cancelled() else RuntimeError("cancelled"))
                return
            try:
                matcher.set_result(self.backend.grammar(done.result()))
            except Exception as e:
                matcher.set_exception(e)
        compiled.add_done_callback(make_matcher)
        so_request.grammar = matcher
        so_request.compile_deadline = time.monotonic() + self.config.compile_timeout_s
        so_request.compile_timeout_s = self.config.compile_timeout_s

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

    def _create_grammar(self, key: StructuredOutputKey, request_id: str):
        """On the compile pool: the key's CompiledGrammar, shared by every request with this key."""
        try:
            compiled = self.backend.compile(key)
        except Exception as e:
            logger.error("grammar compilation failed for request %s: %s", request_id, e)
            with self._lock:
                self.compiled.pop(key, None)  # do not cache failures
                self.compiled_bytes.pop(key, None)
            raise
        with self._lock:
            if key in self.compiled:
                self.compiled_bytes[key] = int(getattr(compiled, "memory_size_bytes", 0) or 0)
                self._evict()
        return compiled

    def _evict(self) -> None:
        """Drop least recently used grammars past the entry or byte bound (the newest one always stays)."""
        while len(self.compiled) > 1 and (len(self.compiled) > self.max_cached_grammars or
                                          sum(self.compiled_bytes.values()) > self.config.cache_bytes):
            key, _ = self.compiled.popitem(last=False)
            self.compiled_bytes.pop(key, None)

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
