"""Lesson 12's wrong answers: each a few edits of the solution cell l12_streaming_detokenizer, with the
misconception. Instructor side only (`python -m autograder release` leaves this file out)."""
from autograder.mutation import Mutant

CELL = "l12_streaming_detokenizer"

MUTANTS = {
    "no_hold_back": Mutant(CELL, (
        ("end = len(self.output_text) - self.stop_buffer_length", "end = len(self.output_text)"),
    ), "Streams every character at once: the first part of a stop string leaks before the string completes.",
        fails={"l12_main_path", "l12_real_server"}),
    "decode_each_token_alone": Mutant(CELL, (
        ("piece = self.stream.step(self.rust_tokenizer, token_id)",
         "piece = self.rust_tokenizer.decode([token_id], skip_special_tokens=True)"),
    ), "Decodes each token on its own: a character whose UTF-8 bytes span tokens becomes U+FFFD.",
        fails={"l12_main_path"}),
    "disconnect_not_sent_to_core": Mutant(CELL, (
        ("engine.engine_core.abort_requests(aborted)", "pass"),
    ), "Forgets the stream in the frontend only: the EngineCore keeps generating and holds the KV blocks.",
        fails={"l12_boundary"}),
    "final_delta_twice": Mutant(CELL, (
        ("end = len(self.output_text)\n", "end, self.sent = len(self.output_text), 0\n"),
    ), "Flushes the whole text at the end instead of what is left: the final delta repeats text already sent.",
        fails={"l12_main_path", "l12_real_server", "l12_boundary"}),
    "text_after_stop_kept": Mutant(CELL, (
        ("self.output_text = self.output_text[:best_end if self.include_stop else best_start]",
         "self.output_text = self.output_text[:best_start] + self.output_text[best_end:]"),
    ), "Removes the stop string but keeps the text that arrived after it in the same step.",
        fails={"l12_main_path", "l12_boundary"}),
    "search_only_new_text": Mutant(CELL, (
        ("i = self.output_text.find(s, max(0, start - len(s) + 1))", "i = self.output_text.find(s, start)"),
    ), "Looks for stop strings only in this step's text: one split across steps is never found.",
        fails={"l12_main_path", "l12_real_server"}),
}
