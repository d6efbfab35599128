"""Seeded random workloads, the same for the pinned vLLM and minivllm. Pure Python: imported under either venv.

A workload is plain JSON: the engine's limits, the requests (prompt token ids, sampling fields, the step they
arrive at, the step they are aborted at) and the "model": the token a request samples at each position. The
token depends on (request, position) alone, so a request recomputed after preemption samples what it sampled
before, and both engines see the same model whatever they schedule.
"""
from __future__ import annotations

import random

from autograder.vllm_oracle.scheduler_harness import request, workload

EOS = 1
STOP_ID = 2
VOCAB = 200


def scheduler_workload(seed: int) -> dict:
    """One scheduler scenario: limits, requests with shared prefixes, EOS and stop ids, aborts, a small KV pool."""
    r = random.Random(seed)
    block_size = r.choice([4, 8, 16])
    max_model_len = r.choice([48, 64, 96, 128])
    chunked = r.random() < 0.8
    budget = r.choice([8, 16, 24, 32, 64, 128]) if chunked else r.choice([max_model_len, 2 * max_model_len])
    blocks_per_seq = -(-max_model_len // block_size)
    config = {
        "block_size": block_size,
        "max_model_len": max_model_len,
        "max_num_batched_tokens": budget,
        "max_num_seqs": min(budget, r.choice([1, 2, 3, 4, 8, 16])),  # vLLM: at most max_num_batched_tokens
        "long_prefill_token_threshold": r.choice([0, 0, 0, 4, 8, 20]) if chunked else 0,
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": r.random() < 0.6,
        "async_scheduling": r.random() < 0.35,
        # The null block, room for one whole request, and a little more: small pools preempt.
        "num_blocks": 1 + blocks_per_seq + r.choice([0, 1, 2, 4, 8, 32, 200]),
    }
    prefixes = [[r.randrange(3, VOCAB) for _ in range(r.randint(1, 3) * block_size)] for _ in range(2)]
    requests = []
    for i in range(r.randint(1, 10)):
        tail = [r.randrange(3, VOCAB) for _ in range(r.randint(1, max_model_len // 2))]
        prompt = (r.choice(prefixes) + tail) if r.random() < 0.5 else tail
        prompt = prompt[:max_model_len - 1]
        max_tokens = r.randint(1, 40)
        min_tokens = r.choice([0, 0, 0, r.randint(0, max_tokens)])
        # The InputProcessor's rule in both engines: a prompt plus min_tokens fits the context.
        min_tokens = max(0, min(min_tokens, max_model_len - len(prompt)))
        n_out = max_tokens + max_model_len
        p_eos = r.choice([0.0, 0.02, 0.1])
        model = [EOS if r.random() < p_eos else STOP_ID if r.random() < 0.02 else r.randrange(3, VOCAB)
                 for _ in range(n_out)]
        requests.append(request(
            f"r{i}", prompt, max_tokens, model, min_tokens=min_tokens, ignore_eos=r.random() < 0.15,
            stop_token_ids=[STOP_ID] if r.random() < 0.5 else [],
            arrival_step=0 if r.random() < 0.6 else r.randint(1, 30),
            abort_step=r.randint(1, 40) if r.random() < 0.12 else None))
    return workload(requests, 2000, seed=seed, **config)


def sampler_case(seed: int) -> dict:
    """One batch of logits (drawn from the seed by torch under either venv) and per-row sampling parameters.

    Every random row is seeded: vLLM's CPU sampler draws a batch with any unseeded row from the global RNG
    (TopKTopPSampler.forward_cpu), and only a seeded row's draw is defined by its own generator."""
    r = random.Random(seed)
    rows = []
    batch = r.randint(1, 8)
    mode = r.choice(["greedy", "random", "mixed"])
    for _ in range(batch):
        greedy = mode == "greedy" or (mode == "mixed" and r.random() < 0.5)
        row = {"temperature": 0.0 if greedy else r.choice([0.3, 0.7, 1.0, 1.5]),
               "top_k": r.choice([0, 0, 1, 5, 50]), "top_p": r.choice([1.0, 1.0, 0.5, 0.9]),
               "min_p": r.choice([0.0, 0.0, 0.05, 0.3]), "seed": r.randrange(2**31),
               "logprobs": r.choice([None, None, 0, 1, 5]), "min_tokens": r.choice([0, 0, 3]),
               "num_output_tokens": r.choice([0, 1, 5]), "ignore_eos": r.random() < 0.3,
               "stop_token_ids": [STOP_ID] if r.random() < 0.5 else []}
        rows.append(row)
    if mode == "mixed" and all(row["temperature"] == 0.0 for row in rows):
        rows[0]["temperature"] = 1.0
    # Rows whose EOS (or stop id) logit leads by far: what min_tokens must hold back.
    boost = [[i, r.choice([EOS, STOP_ID])] for i in range(batch) if r.random() < 0.3]
    return {"seed": seed, "vocab": r.choice([64, 257, 1000]), "scale": r.choice([1.0, 3.0, 60.0]), "rows": rows,
            "eos": EOS, "boost": boost}


def first_sampler_divergence(a: dict, b: dict) -> str | None:
    """Sampled tokens equal; per row the logprob entries (sampled token first, then the top-n) name the same
    tokens in the same order, with logprobs within 1e-5 and the same ranks."""
    if a["sampled"] != b["sampled"]:
        return f"sampler seed {a['seed']} ({a['path']}): sampled vLLM {a['sampled']} != minivllm {b['sampled']}"
    la, lb = a["logprobs"], b["logprobs"]
    if (la is None) != (lb is None):
        return f"sampler seed {a['seed']}: logprobs vLLM {la} != minivllm {lb}"
    for i, (ra, rb) in enumerate(zip(la or [], lb or [], strict=True)):
        if (ra is None) != (rb is None) or (ra is not None and (
                [e[0] for e in ra] != [e[0] for e in rb]
                or any(abs(x[1] - y[1]) > 1e-5 or x[2] != y[2] for x, y in zip(ra, rb, strict=False)))):
            return f"sampler seed {a['seed']}, row {i}: logprobs vLLM {ra} != minivllm {rb}"
    return None


ENGINE_MODELS = ("shakespeare-llama", "tiny-llama", "tiny-qwen2", "tiny-qwen3")


def engine_case(model: str, seed: int) -> dict:
    """One LLM.generate call: greedy prompts (token ids, some sharing a prefix), engine limits that chunk the
    prefills, a KV pool small enough to preempt or not, prefix caching on or off, async scheduling on or off."""
    r = random.Random(f"{model}-{seed}")
    prefix = [r.randrange(4, 4000) for _ in range(r.choice([16, 32]))]
    prompts = []
    for _ in range(r.randint(2, 6)):
        tail = [r.randrange(4, 4000) for _ in range(r.randint(1, 60))]
        prompts.append((prefix + tail) if r.random() < 0.5 else tail)
    return {
        "model": model, "seed": seed, "prompts": prompts,
        "max_tokens": [r.randint(4, 24) for _ in prompts], "ignore_eos": [r.random() < 0.5 for _ in prompts],
        "engine": {"max_model_len": 128, "block_size": 16, "max_num_seqs": r.choice([2, 4, 8]),
                   "max_num_batched_tokens": r.choice([32, 64, 256]),
                   "enable_prefix_caching": r.random() < 0.7,
                   "num_gpu_blocks_override": r.choice([10, 16, 64]),
                   "async_scheduling": r.random() < 0.5},
    }


def engine_cases() -> list[dict]:
    return [engine_case(m, s) for m in ENGINE_MODELS for s in range(3)]


def error_divergence(label: str, a: dict, b: dict) -> tuple[bool, str | None]:
    """(either side failed, how they differ): engines that both refuse a case the same way agree."""
    if not (a.get("error") or b.get("error")):
        return False, None
    if a.get("error") == b.get("error"):
        return True, None
    return True, f"{label}: vLLM {a.get('error') or 'ran'} != minivllm {b.get('error') or 'ran'}"


def generate_case(make_llm, sampling_params_cls, case: dict) -> dict:
    """One engine case through an LLM (vLLM's or minivllm's, from make_llm(model, engine args)): greedy token
    ids and finish reason per prompt, or the error type of a refused configuration."""
    from autograder.vllm_oracle.models import model_path

    try:
        llm = make_llm(str(model_path(case["model"])), case["engine"])
    except Exception as e:  # noqa: BLE001 - a refused configuration is an answer too
        return {"model": case["model"], "seed": case["seed"], "error": type(e).__name__}
    params = [sampling_params_cls(temperature=0.0, max_tokens=m, ignore_eos=ie)
              for m, ie in zip(case["max_tokens"], case["ignore_eos"], strict=True)]
    outs = llm.generate([{"prompt_token_ids": p} for p in case["prompts"]], params, use_tqdm=False)
    return {"model": case["model"], "seed": case["seed"],
            "outputs": [[list(o.outputs[0].token_ids), o.outputs[0].finish_reason] for o in outs]}


def first_engine_divergence(a: dict, b: dict) -> str | None:
    failed, diff = error_divergence(f"engine {a['model']} seed {a['seed']}", a, b)
    if failed:
        return diff
    for i, (x, y) in enumerate(zip(a["outputs"], b["outputs"], strict=True)):
        if x != y:
            return f"engine {a['model']} seed {a['seed']}, prompt {i}: vLLM {x} != minivllm {y}"
    return None


DETOK_TEXTS = ("ROMEO: But soft, what light through yonder window breaks?",
               "JULIET: 你好，世界！O Romeo, Romeo, wherefore art thou 🙂 Romeo?",
               "KING: Now is the winter of our discontent — «made» glorious summer 🌞🌞 by this sun.",
               "First Citizen: We are accounted poor citizens, the patricians good. ñandú ça 日本語")


def detokenizer_case(seed: int, tokenizer, tokenizer_name: str = "shipped") -> dict:
    """A prompt and an output (token ids of the shipped byte-level BPE tokenizer, or of the Metaspace one with
    byte fallback), cut into steps of 1-3 tokens;
    stop strings that occur, span tokens or never occur; include_stop_str_in_output, skip_special_tokens,
    min_tokens; sometimes a stop token ends the output. Prompts may end inside a multi-byte character."""
    r = random.Random(seed)
    prompt_text, out_text = r.sample(DETOK_TEXTS, 2)
    prompt = tokenizer.encode(prompt_text, add_special_tokens=False).ids
    prompt = prompt[:r.randint(1, len(prompt))]
    output = tokenizer.encode(out_text, add_special_tokens=False).ids
    if r.random() < 0.3:
        output.insert(r.randrange(len(output)), 2)  # </s> inside the text: skip_special_tokens matters
    stop = []
    for _ in range(r.choice([0, 1, 2])):
        start = r.randrange(len(out_text) - 2)
        stop.append(out_text[start:start + r.randint(1, 6)])
    if r.random() < 0.2:
        stop.append("never there")
    stop_terminated = r.random() < 0.3
    if stop_terminated:
        output.append(1)
    steps, i = [], 0
    while i < len(output):
        n = r.randint(1, 3)
        steps.append(output[i:i + n])
        i += n
    return {"seed": seed, "tokenizer": tokenizer_name, "prompt": prompt, "steps": steps,
            "stop_terminated": stop_terminated,
            "params": {"stop": stop or None, "include_stop_str_in_output": r.random() < 0.3,
                       "skip_special_tokens": r.random() < 0.7, "min_tokens": r.choice([0, 0, 2, 5])}}


def detokenize(make_detokenizer, case: dict) -> dict:
    """Drive one IncrementalDetokenizer as the OutputProcessor does: update per step (the last step with
    stop_terminated when a stop token ended it), then the streamed delta; the final whole text."""
    detok = make_detokenizer(case)
    events = []
    for k, ids in enumerate(case["steps"]):
        last = k == len(case["steps"]) - 1
        stop_string = detok.update(list(ids), case["stop_terminated"] and last)
        finished = last or stop_string is not None
        events.append([stop_string, detok.get_next_output_text(finished, True)])
        if stop_string is not None:
            break
    return {"seed": case["seed"], "events": events, "text": detok.get_next_output_text(True, False)}


def first_detokenizer_divergence(a: dict, b: dict) -> str | None:
    for k, (x, y) in enumerate(zip(a["events"], b["events"], strict=False)):
        if x != y:
            return f"detokenizer seed {a['seed']}, step {k}: [stop string, streamed delta] vLLM {x} != minivllm {y}"
    if len(a["events"]) != len(b["events"]) or a["text"] != b["text"]:
        return (f"detokenizer seed {a['seed']}: vLLM {len(a['events'])} steps, text {a['text']!r} != minivllm "
                f"{len(b['events'])} steps, text {b['text']!r}")
    return None


SO_CONSTRAINTS = (
    {"choice": ["merry", "sad", "sadder", "mad"]},
    {"choice": ["non", "nonce", "on"]},
    {"regex": r"[a-c]{2,5}(x|yz)"},
    {"regex": r"(ROMEO|JULIET): [a-z ]{3,12}\."},
    {"json": {"type": "object", "properties": {"mood": {"enum": ["merry", "sad"]}, "n": {"type": "integer"}},
              "required": ["mood", "n"]}},
    {"json": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
    {"grammar": 'root ::= "yes" | "no" | "maybe " root'},
    {"json_object": True},
)


def structured_output_case(seed: int) -> dict:
    """A constraint and a seed for a walk: at each step the bitmask row, then (sometimes) the rows with the
    next token scheduled as a draft, then a token the row allows, until the grammar terminates."""
    r = random.Random(seed)
    return {"seed": seed, "constraint": SO_CONSTRAINTS[seed % len(SO_CONSTRAINTS)], "max_steps": 24,
            "draft_steps": sorted(r.sample(range(24), 6))}


def structured_output_walk(make, case: dict) -> dict:
    """Drive one request's grammar through a StructuredOutputManager as the scheduler does. `make(case)` gives
    (manager, requests dict, request id, grammar). Rows are the int32 words of the packed bitmask. An engine
    that raises answers with the exception's type."""
    try:
        return _walk(make, case)
    except Exception as e:  # noqa: BLE001 - an engine's failure is an answer to compare
        return {"seed": case["seed"], "steps": [], "terminated": None, "error": type(e).__name__}


def _walk(make, case: dict) -> dict:
    manager, requests, req_id, grammar = make(case)
    r = random.Random(case["seed"])
    steps = []
    for k in range(case["max_steps"]):
        if grammar.is_terminated():
            break
        row = [int(x) for x in manager.grammar_bitmask(requests, [req_id], {})[0]]
        allowed = [t for t in range(len(row) * 32) if (row[t // 32] >> (t % 32)) & 1]
        step = {"row": row}
        if not allowed:
            steps.append(step)
            break
        token = allowed[r.randrange(len(allowed))]
        if k in case["draft_steps"]:
            rows = manager.grammar_bitmask(requests, [req_id], {req_id: [token, -1]})
            step["draft_rows"] = [[int(x) for x in w] for w in rows]
        step["token"] = token
        step["accepted"] = bool(grammar.accept_tokens(req_id, [token]))
        steps.append(step)
    return {"seed": case["seed"], "steps": steps, "terminated": bool(grammar.is_terminated())}


def first_structured_output_divergence(a: dict, b: dict) -> str | None:
    failed, diff = error_divergence(f"structured output seed {a['seed']}", a, b)
    if failed:
        return diff
    for k, (x, y) in enumerate(zip(a["steps"], b["steps"], strict=False)):
        for key in ("row", "draft_rows", "token", "accepted"):
            if x.get(key) != y.get(key):
                if key == "row":
                    xs = {t for t in range(len(x["row"]) * 32) if (x["row"][t // 32] >> (t % 32)) & 1}
                    ys = {t for t in range(len(y["row"]) * 32) if (y["row"][t // 32] >> (t % 32)) & 1}
                    return (f"structured output seed {a['seed']}, step {k}: tokens only vLLM allows "
                            f"{sorted(xs - ys)[:10]}, only minivllm {sorted(ys - xs)[:10]}")
                return f"structured output seed {a['seed']}, step {k}, {key}: vLLM {x.get(key)} != minivllm {y.get(key)}"
    if len(a["steps"]) != len(b["steps"]) or a["terminated"] != b["terminated"]:
        return (f"structured output seed {a['seed']}: vLLM {len(a['steps'])} steps (terminated {a['terminated']}) "
                f"!= minivllm {len(b['steps'])} (terminated {b['terminated']})")
    return None


GENERATE_MODELS = ("shakespeare-llama", "tiny-llama", "tiny-qwen3")
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
GENERATE_PROMPTS = ("ROMEO: O Romeo, Romeo, wherefore art thou Romeo? ROMEO: O Romeo, Romeo,",
                    "JULIET: the the the and the and the and the",
                    "KING: Now is the winter of our discontent; now is the winter — «made» 🌞 glorious",
                    "First Citizen: We are accounted poor citizens, the patricians good. ñandú ça 日本語 ça")
# Token ids of the shipped tokenizer that its model (and the tiny ones) often sample: stop ids, allowed subsets.
_COMMON_IDS = (202, 15, 17, 29, 262, 271, 295, 297, 313, 327, 353, 396, 450)


def sampling_case(model: str, spec: bool) -> dict:
    """One LLM (n-gram speculation or not) and its LLM.generate calls: every sampling parameter of the pinned vLLM
    on greedy and seeded rows (penalties, allowed_token_ids, bad_words, min_tokens, stop rules, logprobs 0-20,
    prompt_logprobs 0-5, n > 1, a regex), the prompt-logprob rows again (prefix caching across calls and the
    requests that skip the lookup), then logit_bias past 100 (a rare token biased 150 beats three of 100:
    unclamped offline) and min_p, each alone (speculation refuses them). Prefills fit one step (512 tokens), so every
    admission step has outputs and vLLM's offline counters miss no prefix-cache query."""
    r = random.Random(f"sampling-{model}")  # the same rows with and without speculation
    allowed = sorted(set(_COMMON_IDS[:6]) | set(r.sample(range(4, 4096), 40)))
    rows = [
        {"temperature": 0.0, "repetition_penalty": 1.3},
        {"temperature": 0.0, "presence_penalty": 1.0, "frequency_penalty": 0.7},
        {"temperature": 0.0, "allowed_token_ids": allowed},
        {"temperature": 0.0, "bad_words": ["the", "thou", " and", "Romeo", "O Romeo"]},
        {"temperature": 0.0, "min_tokens": 20, "stop_token_ids": list(_COMMON_IDS[:3])},
        {"temperature": 0.0, "stop": ["the", "\n\n"], "include_stop_str_in_output": r.random() < 0.5},
        {"temperature": 0.8, "seed": 11, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.2},
        {"temperature": 1.0, "seed": 12, "allowed_token_ids": allowed, "bad_words": ["the", " and"],
         "presence_penalty": 0.5},
        {"temperature": 0.0, "logprobs": 20, "prompt_logprobs": 5},
        {"temperature": 0.7, "seed": 13, "logprobs": 3, "prompt_logprobs": 0, "min_tokens": 10},
        {"temperature": 0.9, "seed": 14, "n": 2, "frequency_penalty": 0.4, "logprobs": 0},
        {"temperature": 0.0, "structured_outputs": {"regex": "(ROMEO|JULIET): [a-z ]{3,20}\\."}},
    ]
    main = [{"prompt": GENERATE_PROMPTS[i % len(GENERATE_PROMPTS)], "params": {"max_tokens": 32, **row}}
            for i, row in enumerate(rows)]
    again = [{"prompt": GENERATE_PROMPTS[i], "params": {"max_tokens": 8, "temperature": 0.0,
                                                        "logprobs": 2, "prompt_logprobs": i % 3 or None}}
             for i in range(len(GENERATE_PROMPTS))]
    biased = [{"prompt": GENERATE_PROMPTS[0], "params": {
        "max_tokens": 4, "temperature": 0.0, "logit_bias": {"3000": 150.0, "15": 100.0, "17": 100.0, "202": 100.0}}}]
    min_p = [{"prompt": GENERATE_PROMPTS[1], "params": {"max_tokens": 8, "temperature": 1.0, "seed": 3,
                                                        "min_p": 0.2}}]
    engine = {"max_model_len": 256, "block_size": 16, "max_num_seqs": 8, "max_num_batched_tokens": 512,
              "enable_prefix_caching": True, "disable_log_stats": False}
    if spec:
        engine["speculative_config"] = dict(NGRAM)
    return {"model": model, "spec": spec, "engine": engine, "calls": [main, again, biased, min_p]}


def sampling_cases() -> list[dict]:
    return [sampling_case(m, spec) for m in GENERATE_MODELS for spec in (False, True)]


_COUNTERS = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
             "spec_decode_num_accepted_tokens_per_pos", "prefix_cache_queries", "prefix_cache_hits")


def _entries(d: dict | None) -> list | None:
    return None if d is None else [[t, lp.logprob, lp.rank, lp.decoded_token] for t, lp in d.items()]


def sample_run(make_llm, sampling_params_cls, structured_outputs_cls, case: dict) -> dict:
    """One sampling case through an LLM (vLLM's or minivllm's): per call, per request and completion the token
    ids, text, finish and stop reasons, cumulative logprob and logprob entries [token, logprob, rank, decoded
    text], prompt logprobs and num_cached_tokens, or the error a refused call raised (type and message); at
    the end the draft and prefix-cache counters of LLM.get_metrics()."""
    from autograder.vllm_oracle.models import model_path

    llm = make_llm(str(model_path(case["model"])), case["engine"])
    calls = []
    for call in case["calls"]:
        try:
            params = []
            for req in call:
                p = dict(req["params"])
                if "structured_outputs" in p:
                    p["structured_outputs"] = structured_outputs_cls(**p["structured_outputs"])
                if "logit_bias" in p:
                    p["logit_bias"] = {int(k): v for k, v in p["logit_bias"].items()}
                params.append(sampling_params_cls(**p))
            outs = llm.generate([req["prompt"] for req in call], params, use_tqdm=False)
        except Exception as e:  # noqa: BLE001 - a refused request is an answer too
            calls.append({"error": [type(e).__name__, str(e)]})
            continue
        calls.append({"outputs": [{
            "prompt_token_ids": list(o.prompt_token_ids), "num_cached_tokens": o.num_cached_tokens,
            "prompt_logprobs": None if o.prompt_logprobs is None else [_entries(d) for d in o.prompt_logprobs],
            "completions": [{"token_ids": list(c.token_ids), "text": c.text, "finish_reason": c.finish_reason,
                             "stop_reason": c.stop_reason, "cumulative_logprob": c.cumulative_logprob,
                             "logprobs": None if c.logprobs is None else [_entries(d) for d in c.logprobs]}
                            for c in o.outputs]} for o in outs]})
    counters = {}
    for m in llm.get_metrics():
        name = m.name.split(":", 1)[1]
        if name in _COUNTERS and (case["spec"] or not name.startswith("spec_decode")):
            counters[name] = list(m.values) if hasattr(m, "values") else m.value
    return {"model": case["model"], "spec": case["spec"], "calls": calls, "counters": counters}


def _same_rank(a: int, b: int) -> bool:
    """Equal ranks; past rank 100 (a sampled token deep in the tail, among thousands of near-equal logprobs)
    the engines' last-bit fp32 differences may reorder a neighbour or two, so there within 2."""
    return a == b or (min(a, b) > 100 and abs(a - b) <= 2)


def _entries_divergence(x: list | None, y: list | None) -> str | None:
    """Logprob entries name the same tokens in the same order, with the same ranks (_same_rank) and decoded
    texts and logprobs within 1e-4 (the engines' fp32 kernels differ in the last bits)."""
    if (x is None) != (y is None):
        return f"vLLM {x} != minivllm {y}"
    for a, b in zip(x or [], y or [], strict=True):
        if a[0] != b[0] or not _same_rank(a[2], b[2]) or a[3] != b[3] or abs(a[1] - b[1]) > 1e-4:
            return f"vLLM {a} != minivllm {b}"
    return None


def first_sampling_divergence(a: dict, b: dict) -> str | None:
    label = f"sampling {a['model']} spec={a['spec']}"
    for k, (ca, cb) in enumerate(zip(a["calls"], b["calls"], strict=True)):
        if "error" in ca or "error" in cb:
            if ca.get("error") != cb.get("error"):
                return f"{label}, call {k}: vLLM {ca.get('error') or 'ran'} != minivllm {cb.get('error') or 'ran'}"
            continue
        for i, (oa, ob) in enumerate(zip(ca["outputs"], cb["outputs"], strict=True)):
            where = f"{label}, call {k}, request {i}"
            for key in ("prompt_token_ids", "num_cached_tokens"):
                if oa[key] != ob[key]:
                    return f"{where}, {key}: vLLM {oa[key]} != minivllm {ob[key]}"
            if (oa["prompt_logprobs"] is None) != (ob["prompt_logprobs"] is None):
                return f"{where}, prompt_logprobs: vLLM {oa['prompt_logprobs']} != minivllm {ob['prompt_logprobs']}"
            for p, (x, y) in enumerate(zip(oa["prompt_logprobs"] or [], ob["prompt_logprobs"] or [], strict=True)):
                if d := _entries_divergence(x, y):
                    return f"{where}, prompt position {p}: {d}"
            for j, (x, y) in enumerate(zip(oa["completions"], ob["completions"], strict=True)):
                for key in ("token_ids", "text", "finish_reason", "stop_reason"):
                    if x[key] != y[key]:
                        return f"{where}, completion {j}, {key}: vLLM {x[key]!r} != minivllm {y[key]!r}"
                if (x["cumulative_logprob"] is None) != (y["cumulative_logprob"] is None) or (
                        x["cumulative_logprob"] is not None
                        and abs(x["cumulative_logprob"] - y["cumulative_logprob"]) > 1e-3):
                    return f"{where}, completion {j}: cumulative_logprob vLLM {x['cumulative_logprob']} != " \
                           f"minivllm {y['cumulative_logprob']}"
                if (x["logprobs"] is None) != (y["logprobs"] is None):
                    return f"{where}, completion {j}, logprobs: vLLM {x['logprobs']} != minivllm {y['logprobs']}"
                for p, (ex, ey) in enumerate(zip(x["logprobs"] or [], y["logprobs"] or [], strict=True)):
                    if d := _entries_divergence(ex, ey):
                        return f"{where}, completion {j}, position {p}: {d}"
    if a["counters"] != b["counters"]:
        return f"{label}: counters vLLM {a['counters']} != minivllm {b['counters']}"
    return None
