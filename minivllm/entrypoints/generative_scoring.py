"""POST /generative_scoring (vLLM: entrypoints/generate/generative_scoring/): how likely each label token is to
come next after query + item, one score per item.

vLLM runs one request per item with max_tokens=1 and logprob_token_ids=label_token_ids (the labels' logprobs at
the next position). minivllm's sampler returns top-k logprobs only, so each label is appended to the prompt and
its prompt logprob read instead: the same number (log p(label | query + item)) from the same forward pass,
with one short request per label that the prefix cache makes cheap. The label takes one position, so a query + item
that fills the context (max_model_len - 1 tokens) is a 400 here, where vLLM still scores it.
"""
from __future__ import annotations

import math
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import Field, ValidationError

from minivllm.entrypoints.openai.protocol import OpenAIBaseModel, now
from minivllm.exceptions import VLLMValidationError
from minivllm.sampling_params import SamplingParams


class GenerativeScoringRequest(OpenAIBaseModel):
    model: str | None = None
    query: str | list[int]
    items: list[str] | list[list[int]]
    label_token_ids: list[int]
    apply_softmax: bool = True  # normalize over the labels only; False: the model's probability over the vocabulary
    item_first: bool = False
    add_special_tokens: bool = True
    priority: int = 0
    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:16])


def probabilities(label_logprobs: dict[int, float], apply_softmax: bool) -> dict[int, float]:
    """vLLM's _compute_probabilities: a softmax over the labels alone, or each label's own probability."""
    if not apply_softmax:
        return {t: math.exp(lp) for t, lp in label_logprobs.items()}
    top = max(label_logprobs.values())
    exp = {t: math.exp(lp - top) for t, lp in label_logprobs.items()}
    total = sum(exp.values())
    return {t: e / total for t, e in exp.items()}


async def create_generative_scoring(serving, raw: Request):
    """vLLM validates the body inside the handler (a 400 with param null), then checks labels and items."""
    from minivllm.entrypoints.openai.api_server import _usage, error_response, finals_of, start_children

    try:
        req = GenerativeScoringRequest.model_validate(await raw.json())
    except ValidationError as e:
        return error_response(400, str(e), "BadRequestError")
    serving.check_model(req.model)
    vocab = serving.engine.input_processor.vocab_size
    bad = [t for t in req.label_token_ids if not 0 <= t < vocab]
    if bad:
        raise VLLMValidationError(f"label_token_id {bad[0]} is out of vocabulary range [0, {vocab}). Please provide "
                                  "valid token IDs.")
    if not req.label_token_ids:
        raise VLLMValidationError("label_token_ids must contain at least one token ID.")
    if not req.items:
        raise VLLMValidationError("items must contain at least one item.")
    tok = serving.tokenizer
    query = tok.encode(req.query, add_special_tokens=req.add_special_tokens) if isinstance(req.query, str) \
        else list(req.query)
    rid = f"generative-scoring-{raw.headers.get('X-Request-Id') or req.request_id}"
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    prompts = []
    for item in req.items:
        item_ids = tok.encode(item, add_special_tokens=False) if isinstance(item, str) else list(item)
        prompts.append((item_ids + query if req.item_first else query + item_ids)[:serving.max_model_len - 1])
    # one engine request per (item, label), all in flight together: request k scores label k % L of item k // L
    labels = req.label_token_ids
    finals = await finals_of(await start_children(serving, rid, [p + [label] for p in prompts for label in labels],
                                                  params, False, 1))
    data = []
    for i in range(len(prompts)):
        label_lp = {label: float(out.prompt_logprobs[-1][label])
                    for label, out in zip(labels, finals[i * len(labels):(i + 1) * len(labels)], strict=True)}
        data.append({"index": i, "object": "score", "score": probabilities(label_lp, req.apply_softmax)[labels[0]]})
    n_prompt = sum(len(p) for p in prompts)
    return JSONResponse({"id": rid, "object": "list", "created": now(),
                         "model": serving.model_name, "data": data,
                         "usage": _usage(n_prompt, len(req.items))})
