"""IncrementalDetokenizer / OutputProcessor: streamed text is exact for multi-byte UTF-8, stop strings cut right.

The default model's tokenizer is byte-level BPE, so accented letters, CJK and emoji span several tokens:
a naive per-token decode would emit U+FFFD halves. No engine runs here; outputs are hand-made.
"""
from __future__ import annotations

import pytest
from tiny_models import DEFAULT_MODEL

from minivllm.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.output_processor import OutputProcessor, RequestOutputCollector
from minivllm.metrics.stats import IterationStats
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import get_tokenizer

TEXT = "héllo wörld — 你好 🎉 naïve café, ROMEO: ½ ∑ ok"


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer(str(DEFAULT_MODEL))


def test_multibyte_chars_span_tokens(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "the fixture must split a character across tokens"


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_streamed_deltas_equal_full_decode(tok, chunk):
    ids = tok.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, SamplingParams(), [1])
    deltas = []
    for i in range(0, len(ids), chunk):
        assert detok.update(ids[i:i + chunk], False) is None
        deltas.append(detok.get_next_output_text(False, delta=True))
    deltas.append(detok.get_next_output_text(True, delta=True))
    assert all("\ufffd" not in d for d in deltas), deltas
    assert "".join(deltas) == TEXT == detok.output_text


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_tokens(tok, include):
    ids = tok.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, SamplingParams(stop=["你好"], include_stop_str_in_output=include), [1])
    hit, streamed = None, ""
    for t in ids:
        hit = detok.update([t], False)
        streamed += detok.get_next_output_text(hit is not None, delta=True)
        if hit:
            break
    assert hit == "你好"
    expected = TEXT[:TEXT.index("你好")] + ("你好" if include else "")
    assert detok.output_text == expected and streamed == expected


def test_stop_string_held_back_while_streaming(tok):
    """A prefix of a stop string must not be streamed before we know whether the stop completes."""
    detok = IncrementalDetokenizer(tok, SamplingParams(stop=["wörld!"]), [1])
    ids = tok.encode("héllo wörld", add_special_tokens=False)
    detok.update(ids, False)
    streamed = detok.get_next_output_text(False, delta=True)
    assert "wörld"[:3] not in streamed and TEXT.startswith(streamed)
    assert detok.get_next_output_text(True, delta=True) == "héllo wörld"[len(streamed):]


def _request(tok, rid: str, params: SamplingParams) -> EngineCoreRequest:
    return EngineCoreRequest(rid, tok.encode("ROMEO:"), params, tok.eos_token_id, 100.0)


def test_output_processor_stop_string_aborts_and_collector_merges(tok):
    op = OutputProcessor(tok)
    collector = RequestOutputCollector(delta=True)
    op.add_request(_request(tok, "a", SamplingParams(stop=["🎉"])), "ROMEO:", True, collector)
    ids = tok.encode(TEXT, add_special_tokens=False)
    stats = IterationStats()
    aborts = []
    for k, t in enumerate(ids):  # the reader lags: nothing is read until the end, deltas merge
        res = op.process_outputs([EngineCoreOutput("a", [t])], now=101.0 + k, iteration_stats=stats)
        aborts += res.reqs_to_abort
        if "a" not in op.request_states:
            break
    assert aborts == ["a"], "a stop string must ask the caller to abort the request in the core"
    out = collector.get_nowait()
    assert out.finished and out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == "🎉"
    assert out.outputs[0].text == TEXT[:TEXT.index("🎉")]
    assert out.outputs[0].token_ids == ids[:len(out.outputs[0].token_ids)]
    assert collector.get_nowait() is None
    assert stats.time_to_first_tokens == [1.0] and stats.e2e_latencies == [float(len(out.outputs[0].token_ids))]
    assert stats.inter_token_latencies == [1.0] * (len(out.outputs[0].token_ids) - 1)


def test_eos_token_adds_no_text_and_abort_notifies_stream(tok):
    op = OutputProcessor(tok)
    c1, c2 = RequestOutputCollector(False), RequestOutputCollector(False)
    op.add_request(_request(tok, "x", SamplingParams()), None, False, c1)
    op.add_request(_request(tok, "y", SamplingParams()), None, False, c2)
    hi = tok.encode("hi", add_special_tokens=False)
    op.process_outputs([EngineCoreOutput("x", hi + [tok.eos_token_id], finish_reason=FinishReason.STOP)])
    out = c1.get_nowait()
    assert out.finished and out.outputs[0].text == "hi"
    assert op.abort_requests(["y", "nope"]) == ["y"]
    assert c2.get_nowait().outputs[0].finish_reason == "abort"
    op.add_request(_request(tok, "z", SamplingParams()), None, False, c1)
    op.propagate_error(RuntimeError("dead"))
    with pytest.raises(RuntimeError, match="dead"):
        c1.get_nowait()
    assert op.get_num_unfinished_requests() == 0


# ---------------------------------------------------------------- stop semantics as vLLM at the pin
def _finish(tok, params: SamplingParams, outputs: list[EngineCoreOutput]):
    op = OutputProcessor(tok)
    collector = RequestOutputCollector(delta=False)
    op.add_request(_request(tok, "r", params), None, False, collector)
    aborts = []
    for out in outputs:
        aborts += op.process_outputs([out]).reqs_to_abort
    return collector.get_nowait().outputs[0], aborts


def test_stop_string_completed_by_the_last_allowed_token_finishes_with_stop(tok):
    ids = tok.encode("hello world", add_special_tokens=False)
    out, aborts = _finish(tok, SamplingParams(stop=["world"], max_tokens=len(ids)),
                          [EngineCoreOutput("r", ids[:-1]),
                           EngineCoreOutput("r", ids[-1:], finish_reason=FinishReason.LENGTH)])
    assert (out.finish_reason, out.stop_reason, out.text) == ("stop", "world", "hello ")
    assert aborts == [], "the core already finished it: nothing to abort"


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_text_kept_with_include_stop_str_in_output(tok, include):
    ids = tok.encode("hello", add_special_tokens=False)
    stop_id = tok.encode(" world", add_special_tokens=False)[0]
    out, _ = _finish(tok, SamplingParams(stop_token_ids=[stop_id], include_stop_str_in_output=include),
                     [EngineCoreOutput("r", ids + [stop_id], finish_reason=FinishReason.STOP, stop_reason=stop_id)])
    assert out.text == "hello" + (tok.decode([stop_id]) if include else "")
    assert out.stop_reason == stop_id and out.token_ids[-1] == stop_id


def test_stop_string_does_not_end_before_min_tokens(tok):
    ids = tok.encode("ab ab ab ab", add_special_tokens=False)
    first_ab = len(tok.encode("ab", add_special_tokens=False))
    for min_tokens in (0, first_ab + 1):
        detok = IncrementalDetokenizer(tok, SamplingParams(stop=["ab"], min_tokens=min_tokens), [1])
        hit = None
        for t in ids:
            if (hit := detok.update([t], False)) is not None:
                break
        assert hit == "ab"
        # "ab" and " ab" are one token each: those inside the first min_tokens tokens never stop it
        assert detok.output_text == ("" if min_tokens == 0 else "ab " * min_tokens)


def test_several_stop_strings_stop_at_the_earliest_completion(tok):
    """vLLM's check_stop_strings at the pin: the stop that completes earliest wins (ties: list order), so
    several tokens arriving at once (spec decode, a lagging update) still leave no stop string in the text."""
    ids = tok.encode("one two three four", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, SamplingParams(stop=["three", "e t"]), [1])
    assert detok.update(ids, False) == "e t"  # list order would pick "three" and leak "e t" into the text
    assert detok.output_text == "on"
    for stops, text in ((["four", "two"], "one "), (["ne two", "e t"], "on"), (["two", "o"], "")):
        detok = IncrementalDetokenizer(tok, SamplingParams(stop=stops, include_stop_str_in_output=False), [1])
        detok.update(ids, False)
        assert detok.output_text == text and not any(s in detok.output_text for s in stops)


# ---------------------------------------------------------------- priming and reset (vLLM's FastIncrementalDetokenizer)
def metaspace_tokenizer(decoder=None):
    """A SentencePiece-like tokenizer built offline: a Unigram model with a Metaspace pre-tokenizer and decoder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    pieces = ["<unk>", "<s>", "</s>", "▁Hello", "▁world", "▁the", "▁sun", "!", "a", "b", "ab"]
    rust = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=0))
    rust.pre_tokenizer = pre_tokenizers.Metaspace()
    rust.decoder = decoder or decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=rust, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _stream(tok, prompt_ids, output_ids, params=None):
    detok = IncrementalDetokenizer(tok, params or SamplingParams(), prompt_ids)
    deltas = []
    for t in output_ids:
        detok.update([t], False)
        deltas.append(detok.get_next_output_text(False, delta=True))
    return deltas, detok


def test_metaspace_first_output_token_keeps_its_space():
    """Unprimed, a Metaspace decoder strips the space of the first token it sees: ' world' came out 'world'."""
    tok = metaspace_tokenizer()
    prompt, out = tok.encode("Hello"), tok.encode("world the sun!", add_special_tokens=False)
    deltas, detok = _stream(tok, prompt, out)
    assert deltas[0] == " world"
    full = tok.decode(prompt + out, skip_special_tokens=True)
    assert detok.output_text == full[len(tok.decode(prompt, skip_special_tokens=True)):] == " world the sun!"


def test_byte_level_priming_leaves_text_unchanged(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    for prompt in ([1], tok.encode("ROMEO:"), tok.encode("你好")):
        deltas, detok = _stream(tok, prompt, ids)
        assert "".join(deltas) + detok.get_next_output_text(True, True) == TEXT


def test_invalid_prefix_resets_the_stream():
    """A decoder that rewrites earlier text ('a' then 'ab' -> 'X') makes DecodeStream raise 'Invalid prefix';
    vLLM starts a fresh stream and goes on instead of failing the request."""
    from tokenizers import decoders
    tok = metaspace_tokenizer(decoders.Sequence([decoders.Fuse(), decoders.Replace("ab", "X")]))
    a, b, sun = tok.convert_tokens_to_ids(["a", "b", "▁sun"])
    deltas, detok = _stream(tok, [a], [b, a, sun])  # 'Xa' does not start with the prefix 'a': reset at the 2nd
    assert deltas == ["", "a", "▁sun"] and detok.output_text == "a▁sun"
