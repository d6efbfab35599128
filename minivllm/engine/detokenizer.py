"""IncrementalDetokenizer (vLLM: v1/engine/detokenizer.py): token ids -> text, one token at a time.

tokenizers' DecodeStream holds back bytes until they form whole UTF-8 characters, so a multi-byte
character split across tokens never shows up as U+FFFD in a stream. Stop strings are checked only in
the newly added text (plus a tail as long as the longest stop string).
"""
from __future__ import annotations

from tokenizers.decoders import DecodeStream

from minivllm.sampling_params import SamplingParams


class IncrementalDetokenizer:
    """Text of one request's output, grown as tokens arrive; finds stop strings."""

    def __init__(self, tokenizer, params: SamplingParams, prompt_token_ids: list[int]) -> None:
        self._tokenizer = tokenizer._tokenizer  # the Rust tokenizer behind the HF fast tokenizer
        self.stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)
        self.stop = params.stop or []
        self.include_stop = params.include_stop_str_in_output
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self.output_text = ""
        self._sent = 0

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        """Append tokens' text; returns the stop string that ended the request, if one matched.

        A token that ended the request by stop_token_ids/EOS (stop_terminated) adds no text.
        """
        ids = new_token_ids[:-1] if stop_terminated else new_token_ids
        for token_id in ids:
            start = len(self.output_text)
            piece = self.stream.step(self._tokenizer, token_id)
            if piece:
                self.output_text += piece
            if self.stop:
                hit = self._check_stop(start)
                if hit is not None:
                    return hit
        return None

    def _check_stop(self, new_start: int) -> str | None:
        text = self.output_text
        search_from = max(0, new_start - self.max_stop_len + 1)
        for s in self.stop:
            i = text.find(s, search_from)
            if i != -1:
                self.output_text = text[:i + len(s)] if self.include_stop else text[:i]
                return s
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """Whole text, or only what is new since the last call (for streaming).

        While running, the last max_stop_len - 1 characters are held back: they may yet become a stop.
        """
        end = len(self.output_text) if finished or not self.stop else max(
            self._sent, len(self.output_text) - self.max_stop_len + 1)
        if not delta:
            return self.output_text[:end]
        text = self.output_text[self._sent:end]
        self._sent = end
        return text
