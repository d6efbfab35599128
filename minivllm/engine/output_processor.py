"""OutputProcessor (vLLM: v1/engine/output_processor.py): EngineCoreOutputs -> RequestOutputs.

The frontend's half of a request: it owns detokenization, stop strings and the per-request stream.
When a stop string matches, the request is finished here and its id returned, so the caller aborts
it in the core (the core cannot see text). For AsyncLLM each request has a RequestOutputCollector, the
mailbox its generate() reads; for metrics, process_outputs fills an IterationStats.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from minivllm.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from minivllm.engine.detokenizer import IncrementalDetokenizer
from minivllm.engine.exceptions import EngineGenerateError
from minivllm.logprobs import Logprob, context_ids, decoded_tokens, entry_ranks
from minivllm.metrics.stats import IterationStats
from minivllm.outputs import CompletionOutput, RequestOutput


class RequestOutputCollector:
    """One request's mailbox between the output handler and its generate(): holds at most one output.

    If the reader lags, new deltas are merged into the waiting one (vLLM does the same), so a slow
    stream costs one merged message rather than a growing queue.
    """

    def __init__(self, delta: bool) -> None:
        self.delta = delta
        self.output: RequestOutput | BaseException | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput | BaseException) -> None:
        if self.output is None or isinstance(output, BaseException):
            self.output = output
            self.ready.set()
        elif isinstance(self.output, RequestOutput):
            if self.delta:
                _merge_delta(self.output, output)
            else:
                self.output = output

    async def get(self) -> RequestOutput:
        while self.output is None:
            await self.ready.wait()
        return self._take()

    def get_nowait(self) -> RequestOutput | None:
        return None if self.output is None else self._take()

    def _take(self) -> RequestOutput:
        output, self.output = self.output, None
        self.ready.clear()
        if isinstance(output, BaseException):
            raise output
        return output


def _merge_delta(into: RequestOutput, new: RequestOutput) -> None:
    a, b = into.outputs[0], new.outputs[0]
    a.text += b.text
    a.token_ids = a.token_ids + b.token_ids
    if a.logprobs is not None and b.logprobs is not None:
        a.logprobs = a.logprobs + b.logprobs
    a.cumulative_logprob, a.finish_reason, a.stop_reason = b.cumulative_logprob, b.finish_reason, b.stop_reason
    into.finished, into.num_cached_tokens, into.metrics = new.finished, new.num_cached_tokens, new.metrics


@dataclass
class RequestState:
    """Frontend-side state of one request."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    detokenizer: IncrementalDetokenizer
    stream_delta: bool = False
    queue: RequestOutputCollector | None = None
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    num_logprobs: int = 0
    cumulative_logprob: float | None = None
    num_cached_tokens: int = 0
    sent_tokens: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    last_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    scheduled_time: float | None = None  # arrival + the core's queue time: when it was first scheduled
    max_tokens_param: int | None = None
    n_param: int = 1
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_prompt_logprobs: int = 0
    prompt_logprobs_sent: bool = False
    stream_interval: int = 1


@dataclass
class OutputProcessorOutput:
    request_outputs: list[RequestOutput]
    reqs_to_abort: list[str]


class OutputProcessor:
    """Tracks every live request of the frontend and turns core outputs into user outputs."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}

    def add_request(self, request: EngineCoreRequest, prompt: str | None, stream_delta: bool = False,
                    queue: RequestOutputCollector | None = None) -> None:
        if request.request_id in self.request_states:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        params = request.sampling_params
        self.request_states[request.request_id] = RequestState(
            request.request_id, prompt, request.prompt_token_ids,
            IncrementalDetokenizer(self.tokenizer, params, request.prompt_token_ids), stream_delta, queue,
            logprobs=[] if params.logprobs is not None else None, num_logprobs=params.logprobs or 0,
            cumulative_logprob=0.0 if params.logprobs is not None else None,
            arrival_time=request.arrival_time, max_tokens_param=params.max_tokens, n_param=params.n,
            num_prompt_logprobs=params.prompt_logprobs or 0, stream_interval=params.stream_interval or 1)

    def _append_logprobs(self, state: RequestState, out: EngineCoreOutput) -> None:
        """Each new position's {token: Logprob}: the sampled token first (its rank from the sampler), then the
        top-n ranked 1..n, each with its text decoded on its own (vLLM: LogprobsProcessor)."""
        ranks = out.new_logprob_ranks
        for i, (tok, lps) in enumerate(zip(out.new_token_ids, out.new_logprobs, strict=False)):
            entry_rank = (entry_ranks(state.num_logprobs, len(lps), ranks[i]) if ranks is not None
                          else [None] * len(lps))
            texts = decoded_tokens(self.tokenizer, list(lps), context_ids(state.logprobs))
            state.logprobs.append({t: Logprob(lp, rank, text)
                                   for (t, lp), rank, text in zip(lps.items(), entry_rank, texts, strict=True)})
            state.cumulative_logprob += lps[tok]

    def abort_requests(self, request_ids) -> list[str]:
        """Forget requests; a stream still being read gets a final output with finish_reason "abort"."""
        aborted = []
        for request_id in request_ids:
            state = self.request_states.pop(request_id, None)
            if state is None:
                continue
            aborted.append(request_id)
            if state.queue is not None:
                state.queue.put(self._make_request_output(state, FinishReason.ABORT, None))
        return aborted

    def propagate_error(self, error: BaseException) -> None:
        """The engine died: every waiting stream raises error; nothing is left tracked."""
        for state in self.request_states.values():
            if state.queue is not None:
                state.queue.put(error)
        self.request_states.clear()

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def process_outputs(self, outputs: list[EngineCoreOutput], now: float | None = None,
                        iteration_stats: IterationStats | None = None) -> OutputProcessorOutput:
        """now: time.time() (the clock of arrival_time) when the outputs arrived; enables the timings."""
        request_outputs: list[RequestOutput] = []
        reqs_to_abort: list[str] = []
        for out in outputs:
            state = self.request_states.get(out.request_id)
            if state is None:
                continue  # aborted in the frontend already
            if now is not None and out.new_token_ids:
                if iteration_stats is not None:
                    iteration_stats.num_generation_tokens += len(out.new_token_ids)
                    if state.first_token_time is None:
                        iteration_stats.num_prompt_tokens += len(state.prompt_token_ids)
                        iteration_stats.num_cached_prompt_tokens += max(out.num_cached_tokens, 0)
                        iteration_stats.time_to_first_tokens.append(now - state.arrival_time)
                    else:
                        iteration_stats.inter_token_latencies.append(now - state.last_token_time)
                if state.first_token_time is None:
                    state.first_token_time = now
                state.last_token_time = now
                state.token_times.append(now)
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            if out.queue_time is not None:
                state.scheduled_time = state.arrival_time + out.queue_time
                if iteration_stats is not None:
                    iteration_stats.queue_times.append(out.queue_time)
            state.output_token_ids.extend(out.new_token_ids)
            state.num_cached_tokens = out.num_cached_tokens
            if out.new_logprobs is not None and state.logprobs is not None:
                self._append_logprobs(state, out)
            if out.new_prompt_logprobs is not None:
                k = state.num_prompt_logprobs
                state.prompt_logprobs = [None]
                for lps, rank in zip(out.new_prompt_logprobs, out.new_prompt_logprob_ranks, strict=True):
                    texts = decoded_tokens(self.tokenizer, list(lps), context_ids(state.prompt_logprobs))
                    state.prompt_logprobs.append({t: Logprob(lp, r, text) for (t, lp), r, text in
                                                  zip(lps.items(), entry_ranks(k, len(lps), rank), texts, strict=True)})
            # A stop string wins over the core's reason, even "length" from the same (last) token, as in vLLM.
            stop_str = state.detokenizer.update(out.new_token_ids, finish_reason == FinishReason.STOP)
            if stop_str is not None:
                if finish_reason is None:
                    reqs_to_abort.append(out.request_id)
                finish_reason, stop_reason = FinishReason.STOP, stop_str
            if finish_reason == FinishReason.ERROR:
                # The core failed this request's step (stop_reason holds why): its stream raises; the
                # synchronous LLMEngine returns it with finish_reason "error".
                del self.request_states[out.request_id]
                if iteration_stats is not None and now is not None:
                    self._record_finished(state, finish_reason, now, iteration_stats)
                if state.queue is not None:
                    state.queue.put(EngineGenerateError(f"request {out.request_id!r} failed in the engine: "
                                                        f"{stop_reason}"))
                    continue
            if (finish_reason is None and state.stream_delta and state.stream_interval > 1 and state.sent_tokens
                    and len(state.output_token_ids) - state.sent_tokens < state.stream_interval):
                continue  # vLLM's stream_interval (v1/engine/output_processor.py:292-309): wait for more tokens
            ro = self._make_request_output(state, finish_reason, stop_reason)
            if finish_reason is not None:
                self.request_states.pop(out.request_id, None)
                if iteration_stats is not None and now is not None:
                    self._record_finished(state, finish_reason, now, iteration_stats)
            if state.queue is not None:
                state.queue.put(ro)
            else:
                request_outputs.append(ro)
        return OutputProcessorOutput(request_outputs, reqs_to_abort)

    @staticmethod
    def _record_finished(state: RequestState, finish_reason, now: float, stats: IterationStats) -> None:
        n = len(state.output_token_ids)
        stats.e2e_latencies.append(now - state.arrival_time)
        stats.finished_reasons.append(str(finish_reason))
        stats.request_prompt_tokens.append(len(state.prompt_token_ids))
        stats.request_generation_tokens.append(n)
        if n > 1 and state.first_token_time is not None:
            stats.time_per_output_tokens.append((state.last_token_time - state.first_token_time) / (n - 1))
        # vLLM's phase times (RequestStateStats), on the frontend's clock: first/last token are arrivals here.
        if state.first_token_time is not None:
            stats.decode_times.append(state.last_token_time - state.first_token_time)
            if state.scheduled_time is not None:
                stats.prefill_times.append(max(0.0, state.first_token_time - state.scheduled_time))
                stats.inference_times.append(max(0.0, state.last_token_time - state.scheduled_time))
        stats.request_prefill_kv_computed_tokens.append(len(state.prompt_token_ids) - max(state.num_cached_tokens, 0))
        if state.max_tokens_param:
            stats.request_max_tokens.append(state.max_tokens_param)
        stats.n_params.append(state.n_param)

    def _make_request_output(self, state: RequestState, finish_reason, stop_reason) -> RequestOutput:
        finished = finish_reason is not None
        delta = state.stream_delta
        text = state.detokenizer.get_next_output_text(finished, delta)
        token_ids = state.output_token_ids[state.sent_tokens:] if delta else list(state.output_token_ids)
        logprobs = None
        if state.logprobs is not None:
            logprobs = state.logprobs[state.sent_tokens:] if delta else list(state.logprobs)
        if delta:
            state.sent_tokens = len(state.output_token_ids)
        completion = CompletionOutput(0, text, token_ids, state.cumulative_logprob, logprobs,
                                      str(finish_reason) if finished else None, stop_reason)
        prompt_logprobs = None
        if state.prompt_logprobs is not None and not (delta and state.prompt_logprobs_sent):
            prompt_logprobs, state.prompt_logprobs_sent = state.prompt_logprobs, True  # once when streaming
        return RequestOutput(state.request_id, state.prompt, state.prompt_token_ids, [completion], finished,
                             state.num_cached_tokens, prompt_logprobs=prompt_logprobs)
