"""IncrementalDetokenizer (vLLM: v1/engine/detokenizer.py): token ids -> text, one token at a time.

tokenizers' DecodeStream holds back bytes until they form whole UTF-8 characters, so a multi-byte
character split across tokens never shows up as U+FFFD in a stream. As vLLM's FastIncrementalDetokenizer,
the stream is primed with the prompt's ids (a SentencePiece/Metaspace decoder drops the leading space of
the first token of a sequence, which the first output token is not), and it is started afresh, unprimed,
when tokenizers reports an invalid prefix (a decoder that rewrites earlier text). Stop strings are checked only in
the newly added text (plus a tail as long as the longest stop string), as vLLM does:
- the text of the first min_tokens tokens cannot end the request (nor can any stop string before then);
- when several stop strings match, the one that completes earliest in the text wins (ties: list order),
  so the kept text holds none of them, whatever tokens the text arrived in;
- a token that ended the request by EOS / stop_token_ids adds text only with include_stop_str_in_output.
"""
from __future__ import annotations

import logging
import sys

from tokenizers.decoders import DecodeStream

from minivllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
INVALID_PREFIX_ERR_MSG = "Invalid prefix encountered"  # tokenizers' DecodeStream error (vLLM: same constant)


def check_stop_strings(output_text: str, new_char_count: int, stop: list[str],
                       include_in_output: bool) -> tuple[str, int] | None:
    """(matched stop string, length to cut the text to, or -1) for the earliest-completing match."""
    if not new_char_count or not stop:
        return None
    best, best_start, best_end = None, 0, sys.maxsize
    for s in stop:
        i = output_text.find(s, max(0, len(output_text) + 1 - new_char_count - len(s)))
        if i != -1 and i + len(s) < best_end:
            best, best_start, best_end = s, i, i + len(s)
    if best is None:
        return None
    if include_in_output:
        return best, (-1 if best_end >= len(output_text) else best_end)
    return best, best_start


class IncrementalDetokenizer:
    """Text of one request's output, grown as tokens arrive; finds stop strings."""

    def __init__(self, tokenizer, params: SamplingParams, prompt_token_ids: list[int]) -> None:
        self._tokenizer = tokenizer._tokenizer  # the Rust tokenizer behind the HF fast tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.stream = DecodeStream(ids=list(prompt_token_ids), skip_special_tokens=self.skip_special_tokens)
        self.stop = params.stop or []
        self.min_tokens = params.min_tokens
        self.include_stop = params.include_stop_str_in_output
        # Characters held back from a stream while they may still become (excluded) stop-string text.
        self.stop_buffer_length = max((len(s) for s in self.stop), default=1) - 1 if not self.include_stop else 0
        self.num_output_tokens = 0
        self.output_text = ""
        self._sent = 0

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Append tokens' text; returns the stop string that ended the request, if one matched."""
        if not new_token_ids:
            return None
        skip_last = stop_terminated and not self.include_stop
        ids = new_token_ids[:-1] if skip_last else new_token_ids
        check_from = len(self.output_text)
        for token_id in ids:
            piece = self._step(token_id)
            if piece:
                self.output_text += piece
            self.num_output_tokens += 1
            if self.min_tokens and self.num_output_tokens <= self.min_tokens:
                check_from = len(self.output_text)  # text within min_tokens never ends the request
        self.num_output_tokens += len(new_token_ids) - len(ids)
        if not self.stop or self.num_output_tokens <= self.min_tokens:
            return None
        hit = check_stop_strings(self.output_text, len(self.output_text) - check_from, self.stop, self.include_stop)
        if hit is None:
            return None
        stop_str, cut = hit
        if cut != -1:
            self.output_text = self.output_text[:cut]
        return stop_str

    def _step(self, token_id: int) -> str | None:
        """DecodeStream.step; on an invalid prefix, a fresh unprimed stream goes on (vLLM: _protected_step)."""
        try:
            return self.stream.step(self._tokenizer, token_id)
        except Exception as e:
            if not str(e).startswith(INVALID_PREFIX_ERR_MSG):
                raise
            logger.warning("invalid prefix in incremental detokenization: resetting the decode stream")
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            return self.stream.step(self._tokenizer, token_id)

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """Whole text, or only what is new since the last call (for streaming).

        While running, the last stop_buffer_length characters are held back: they may yet become a stop.
        """
        end = len(self.output_text) - (0 if finished else self.stop_buffer_length)
        if not delta:
            return self.output_text[:max(end, 0)]
        if end <= self._sent:
            return ""
        text = self.output_text[self._sent:end]
        self._sent = end
        return text
