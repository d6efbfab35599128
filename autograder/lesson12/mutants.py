"""Lesson 12's wrong answers: each a few edits of the solution cell l12_streaming_detokenizer, with the
misconception. Instructor side only (`python -m autograder release` leaves this file out)."""
from autograder.mutation import Mutant

CELL = "l12_streaming_detokenizer"
STREAM = "self.stream = DecodeStream(ids=list(prompt_token_ids), skip_special_tokens=params.skip_special_tokens)"
HOLD = "self.stop_buffer_length = max((len(s) for s in self.stop), default=1) - 1"
FIND = "i = self.output_text.find(s, max(0, start - len(s) + 1))"
CUT = "self.output_text = self.output_text[:best_end if self.include_stop else best_start]"
END = "end = len(self.output_text) - self.stop_buffer_length"
DELTA = 'text = self.output_text[self.sent:end] if end > self.sent else ""'
ABORT = "engine.engine_core.abort_requests(aborted)"


def _m(edits, why, fails):
    return Mutant(CELL, edits, why, fails=set(fails))


MUTANTS = {
    # the decoder (TODO 1, 3)
    "stream_not_primed": _m(((STREAM, "self.stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)"),),
                            "Starts the stream empty: a SentencePiece/Metaspace first output token loses its space.",
                            {"l12_main_path"}),
    "special_tokens_always_skipped": _m(((STREAM, "self.stream = DecodeStream(ids=list(prompt_token_ids), "
                                                  "skip_special_tokens=True)"),),
                                        "Hard-codes skip_special_tokens=True: the request's own setting is ignored.",
                                        {"l12_boundary"}),
    "special_tokens_never_skipped": _m(((STREAM, "self.stream = DecodeStream(ids=list(prompt_token_ids))"),),
                                       "Leaves out skip_special_tokens: special tokens inside the output show as text.",
                                       {"l12_boundary"}),
    "decode_each_token_alone": _m((("piece = self.stream.step(self.rust_tokenizer, token_id)",
                                    "piece = self.rust_tokenizer.decode([token_id], skip_special_tokens=True)"),),
                                  "Decodes each token on its own: a character whose UTF-8 bytes span tokens becomes U+FFFD.",
                                  {"l12_main_path"}),
    # the hold-back (TODO 2, 6)
    "no_hold_back": _m(((END, "end = len(self.output_text)"),),
                       "Streams every character at once: the first part of a stop string leaks before the string completes.",
                       {"l12_main_path", "l12_real_server"}),
    "hold_back_shortest_stop": _m(((HOLD, "self.stop_buffer_length = min((len(s) for s in self.stop), default=1) - 1"),),
                                  "Holds back for the shortest stop string: a prefix of a longer one leaks.",
                                  {"l12_main_path"}),
    "hold_back_first_stop": _m(((HOLD, "self.stop_buffer_length = len(self.stop[0]) - 1 if self.stop else 0"),),
                               "Holds back for the first stop string in the list, not the longest.", {"l12_main_path"}),
    "hold_back_lexicographic_max": _m(((HOLD, 'self.stop_buffer_length = len(max(self.stop, default="")) - 1'),),
                                      "Takes max() of the strings (alphabetical order), not of their lengths.",
                                      {"l12_main_path"}),
    "hold_back_whole_stop": _m(((HOLD, "self.stop_buffer_length = max((len(s) for s in self.stop), default=0)"),),
                               "Holds back len(stop) characters: one more than can still become a stop string.",
                               {"l12_main_path"}),
    "hold_back_one_more": _m(((END, "end = len(self.output_text) - self.stop_buffer_length - 1"),),
                             "Keeps back one character too many while running: the stream lags vLLM's.",
                             {"l12_main_path"}),
    "final_delta_twice": _m((("end = len(self.output_text)\n", "end, self.sent = len(self.output_text), 0\n"),),
                            "Flushes the whole text at the end instead of what is left: the final delta repeats text already sent.",
                            {"l12_main_path", "l12_real_server", "l12_boundary"}),
    # the stop-string search and cut (TODO 4, 5)
    "search_only_new_text": _m(((FIND, "i = self.output_text.find(s, start)"),),
                               "Looks for stop strings only in this step's text: one split across steps is never found.",
                               {"l12_main_path", "l12_real_server"}),
    "search_skips_one_char": _m(((FIND, "i = self.output_text.find(s, max(0, start - len(s) + 2))"),),
                                "Starts the search one character late: a stop whose last character arrives alone is missed.",
                                {"l12_boundary"}),
    "search_negative_start": _m(((FIND, "i = self.output_text.find(s, start - len(s) + 1)"),),
                                "Drops the clamp at 0: a negative start counts from the end of the text.",
                                {"l12_boundary"}),
    "search_last_piece_only": _m(((FIND, "i = self.output_text.find(s, max(0, len(self.output_text) - len(piece or '') "
                                         "- len(s) + 1))"),),
                                 "Searches around the last token only: a stop inside a many-token step is missed.",
                                 {"l12_boundary"}),
    "search_last_occurrence": _m(((FIND, "i = self.output_text.rfind(s, max(0, start - len(s) + 1))"),),
                                 "Finds the last occurrence: with a stop repeated in one step, text with the stop is kept.",
                                 {"l12_boundary"}),
    "text_after_stop_kept": _m(((CUT, "self.output_text = self.output_text[:best_start] + self.output_text[best_end:]"),),
                               "Removes the stop string but keeps the text that arrived after it in the same step.",
                               {"l12_main_path", "l12_real_server", "l12_boundary"}),
    "include_stop_ignored": _m(((CUT, "self.output_text = self.output_text[:best_start]"),),
                               "Always cuts before the stop string: include_stop_str_in_output=True loses it.",
                               {"l12_main_path", "l12_real_server"}),
    "include_keeps_text_after_stop": _m(((CUT, "self.output_text = self.output_text if self.include_stop "
                                               "else self.output_text[:best_start]"),),
                                        "With include_stop_str_in_output keeps everything, also text after the stop.",
                                        {"l12_boundary"}),
    "cut_at_last_searched_stop": _m(((CUT, "self.output_text = self.output_text[:i + len(s) if self.include_stop else i]"),),
                                    "Cuts where the last stop in the list was searched, not where the match is.",
                                    {"l12_main_path"}),
    # the delta (TODO 7)
    "delta_without_guard": _m(((DELTA, "text = self.output_text[self.sent:end]"),),
                              "Slices with a negative end when the text is shorter than the hold-back: it leaks from the front.",
                              {"l12_boundary"}),
    "delta_is_cumulative": _m(((DELTA, "text = self.output_text[:end]"),),
                              "Sends the whole text so far each time: the stream repeats itself.",
                              {"l12_main_path", "l12_real_server"}),
    "delta_ignores_hold_back": _m(((DELTA, "text = self.output_text[self.sent:]"),),
                                  "Computes the hold-back end but sends everything new: a stop prefix leaks.",
                                  {"l12_main_path", "l12_real_server"}),
    # the abort (TODO 8)
    "disconnect_not_sent_to_core": _m(((ABORT, "pass"),),
                                      "Forgets the stream in the frontend only: the EngineCore keeps generating and holds the KV blocks.",
                                      {"l12_boundary"}),
    "abort_id_as_string": _m(((ABORT, "engine.engine_core.abort_requests(request_id)"),),
                             "Sends the id as a bare string: the core reads a list of characters and aborts nothing.",
                             {"l12_boundary"}),
    "abort_frontend_twice": _m(((ABORT, "engine.output_processor.abort_requests(aborted)"),),
                               "Aborts in the frontend again instead of the core.", {"l12_boundary"}),
}
