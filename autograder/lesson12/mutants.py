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


def _m(edits, why, fails, hint=""):
    return Mutant(CELL, edits, why, fails=set(fails), hint=hint)


MUTANTS = {
    "hold_back_of_stripped_stop": _m(((HOLD, "self.stop_buffer_length = max((len(s.strip()) for s in self.stop), "
                                             "default=1) - 1"),),
                                     "Sizes the hold-back from the stop strings with whitespace stripped: a stop that "
                                     "starts with a space (\" breaks\") leaks that space before the stop completes.",
                                     {"l12_main_path", "l12_real_server"},
                                     hint="hold-back 要盖住停止串的哪几个字符？停止串开头的空格也会先于其余部分出现在输出里。"),
    # the decoder (TODO 1, 3)
    "stream_not_primed": _m(((STREAM, "self.stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)"),),
                            "Starts the stream empty: a SentencePiece/Metaspace first output token loses its space.",
                            {"l12_main_path"},
                            hint="流式解码开始时的状态对第一个 token 的空格有什么影响？"),
    "stream_primed_with_last_token": _m(((STREAM, "self.stream = DecodeStream(ids=list(prompt_token_ids)[-1:], "
                                                  "skip_special_tokens=params.skip_special_tokens)"),),
                                        "Primes with the last prompt token only: enough for a Metaspace space, but a "
                                        "character whose first bytes end the prompt comes out as U+FFFD.",
                                        {"l12_main_path"},
                                        hint="prompt 以半个多字节字符结尾时，解码流需要看到 prompt 的多少？"),
    "stream_primed_with_last_two_tokens": _m(((STREAM, "self.stream = DecodeStream(ids=list(prompt_token_ids)[-2:], "
                                                       "skip_special_tokens=params.skip_special_tokens)"),),
                                             "Primes with a window of two tokens: a 4-byte character with 3 bytes in "
                                             "the prompt loses its first byte.",
                                             {"l12_main_path"},
                                             hint="一个字符最多有几个字节会落在 prompt 的结尾？"),
    "stream_primed_without_first_token": _m(((STREAM, "self.stream = DecodeStream(ids=list(prompt_token_ids)[1:], "
                                                      "skip_special_tokens=params.skip_special_tokens)"),),
                                            "Leaves the first prompt token out of the priming (taking it for BOS): a "
                                            "prompt whose first character spans tokens decodes to U+FFFD.",
                                            {"l12_main_path"},
                                            hint="prompt 的第一个 token 一定是 BOS 吗？"),
    "special_tokens_always_skipped": _m(((STREAM, "self.stream = DecodeStream(ids=list(prompt_token_ids), "
                                                  "skip_special_tokens=True)"),),
                                        "Hard-codes skip_special_tokens=True: the request's own setting is ignored.",
                                        {"l12_boundary"},
                                        hint="是否跳过特殊 token 应由谁决定？"),
    "special_tokens_never_skipped": _m(((STREAM, "self.stream = DecodeStream(ids=list(prompt_token_ids))"),),
                                       "Leaves out skip_special_tokens: special tokens inside the output show as text.",
                                       {"l12_boundary"},
                                       hint="请求要求跳过特殊 token 时，输出里还会出现它们吗？"),
    "decode_each_token_alone": _m((("piece = self.stream.step(self.rust_tokenizer, token_id)",
                                    "piece = self.rust_tokenizer.decode([token_id], skip_special_tokens=True)"),),
                                  "Decodes each token on its own: a character whose UTF-8 bytes span tokens becomes U+FFFD.",
                                  {"l12_main_path"},
                                  hint="一个字符的 UTF-8 字节跨越多个 token 时，逐个解码会怎样？"),
    # the hold-back (TODO 2, 6)
    "no_hold_back": _m(((END, "end = len(self.output_text)"),),
                       "Streams every character at once: the first part of a stop string leaks before the string completes.",
                       {"l12_main_path", "l12_real_server"},
                       hint="停止串还没出现完整时，它的前半部分会不会先被发出去？"),
    "hold_back_shortest_stop": _m(((HOLD, "self.stop_buffer_length = min((len(s) for s in self.stop), default=1) - 1"),),
                                  "Holds back for the shortest stop string: a prefix of a longer one leaks.",
                                  {"l12_main_path"},
                                  hint="按最短的停止串保留，较长停止串的前缀会不会泄露？"),
    "hold_back_first_stop": _m(((HOLD, "self.stop_buffer_length = len(self.stop[0]) - 1 if self.stop else 0"),),
                               "Holds back for the first stop string in the list, not the longest.", {"l12_main_path"},
                               hint="保留长度应按哪个停止串计算？只看列表中的第一个吗？"),
    "hold_back_lexicographic_max": _m(((HOLD, 'self.stop_buffer_length = len(max(self.stop, default="")) - 1'),),
                                      "Takes max() of the strings (alphabetical order), not of their lengths.",
                                      {"l12_main_path"},
                                      hint="取“最长”的停止串时，比较的是什么？"),
    "hold_back_whole_stop": _m(((HOLD, "self.stop_buffer_length = max((len(s) for s in self.stop), default=0)"),),
                               "Holds back len(stop) characters: one more than can still become a stop string.",
                               {"l12_main_path"},
                               hint="最多有多少个字符还可能成为停止串的一部分？"),
    "hold_back_one_more": _m(((END, "end = len(self.output_text) - self.stop_buffer_length - 1"),),
                             "Keeps back one character too many while running: the stream lags vLLM's.",
                             {"l12_main_path"},
                             hint="运行中保留的字符是否多了一个？"),
    "final_delta_twice": _m((("end = len(self.output_text)\n", "end, self.sent = len(self.output_text), 0\n"),),
                            "Flushes the whole text at the end instead of what is left: the final delta repeats text already sent.",
                            {"l12_main_path", "l12_real_server", "l12_boundary"},
                            hint="结束时发出的最后增量里，有没有重复已经发过的文本？"),
    # the stop-string search and cut (TODO 4, 5)
    "search_only_new_text": _m(((FIND, "i = self.output_text.find(s, start)"),),
                               "Looks for stop strings only in this step's text: one split across steps is never found.",
                               {"l12_main_path", "l12_real_server"},
                               hint="一个停止串被拆在两步里时，还能找到吗？检查搜索起点。"),
    "search_skips_one_char": _m(((FIND, "i = self.output_text.find(s, max(0, start - len(s) + 2))"),),
                                "Starts the search one character late: a stop whose last character arrives alone is missed.",
                                {"l12_boundary"},
                                hint="搜索起点是否晚了一个字符？"),
    "search_negative_start": _m(((FIND, "i = self.output_text.find(s, start - len(s) + 1)"),),
                                "Drops the clamp at 0: a negative start counts from the end of the text.",
                                {"l12_boundary"},
                                hint="搜索起点可能是负数吗？负下标在 Python 里意味着什么？"),
    "search_last_piece_only": _m(((FIND, "i = self.output_text.find(s, max(0, len(self.output_text) - len(piece or '') "
                                         "- len(s) + 1))"),),
                                 "Searches around the last token only: a stop inside a many-token step is missed.",
                                 {"l12_boundary"},
                                 hint="一步产生多个 token 时，搜索范围覆盖了全部新文本吗？"),
    "search_last_occurrence": _m(((FIND, "i = self.output_text.rfind(s, max(0, start - len(s) + 1))"),),
                                 "Finds the last occurrence: with a stop repeated in one step, text with the stop is kept.",
                                 {"l12_boundary"},
                                 hint="一步里停止串出现多次时，应在哪一次截断？"),
    "text_after_stop_kept": _m(((CUT, "self.output_text = self.output_text[:best_start] + self.output_text[best_end:]"),),
                               "Removes the stop string but keeps the text that arrived after it in the same step.",
                               {"l12_main_path", "l12_real_server", "l12_boundary"},
                               hint="同一步里停止串之后到达的文本应保留吗？"),
    "include_stop_ignored": _m(((CUT, "self.output_text = self.output_text[:best_start]"),),
                               "Always cuts before the stop string: include_stop_str_in_output=True loses it.",
                               {"l12_main_path", "l12_real_server"},
                               hint="include_stop_str_in_output 的设置有没有被用到？"),
    "include_keeps_text_after_stop": _m(((CUT, "self.output_text = self.output_text if self.include_stop "
                                               "else self.output_text[:best_start]"),),
                                        "With include_stop_str_in_output keeps everything, also text after the stop.",
                                        {"l12_boundary"},
                                        hint="包含停止串时，停止串之后的文本还应保留吗？"),
    "cut_at_last_searched_stop": _m(((CUT, "self.output_text = self.output_text[:i + len(s) if self.include_stop else i]"),),
                                    "Cuts where the last stop in the list was searched, not where the match is.",
                                    {"l12_main_path"},
                                    hint="截断的位置是匹配到的位置，还是最后搜索的那个停止串？"),
    # the delta (TODO 7)
    "delta_without_guard": _m(((DELTA, "text = self.output_text[self.sent:end]"),),
                              "Slices with a negative end when the text is shorter than the hold-back: it leaks from the front.",
                              {"l12_boundary"},
                              hint="文本比保留长度还短时，切片的结果是什么？"),
    "delta_is_cumulative": _m(((DELTA, "text = self.output_text[:end]"),),
                              "Sends the whole text so far each time: the stream repeats itself.",
                              {"l12_main_path", "l12_real_server"},
                              hint="每次发送的是新增文本，还是至今为止的全部文本？"),
    "delta_ignores_hold_back": _m(((DELTA, "text = self.output_text[self.sent:]"),),
                                  "Computes the hold-back end but sends everything new: a stop prefix leaks.",
                                  {"l12_main_path", "l12_real_server"},
                                  hint="算出的保留长度有没有真的用于本次发送的增量？"),
    # the abort (TODO 8)
    "disconnect_not_sent_to_core": _m(((ABORT, "pass"),),
                                      "Forgets the stream in the frontend only: the EngineCore keeps generating and holds the KV blocks.",
                                      {"l12_boundary"},
                                      hint="客户端断开后，EngineCore 知道这个请求不再需要了吗？"),
    "abort_id_as_string": _m(((ABORT, "engine.engine_core.abort_requests(request_id)"),),
                             "Sends the id as a bare string: the core reads a list of characters and aborts nothing.",
                             {"l12_boundary"},
                             hint="发给 EngineCore 的取消消息里，请求 id 的类型对吗？"),
    "abort_frontend_twice": _m(((ABORT, "engine.output_processor.abort_requests(aborted)"),),
                               "Aborts in the frontend again instead of the core.", {"l12_boundary"},
                               hint="断开连接时，取消请求应发给谁？"),
}
