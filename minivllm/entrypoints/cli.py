"""The `minivllm` command: generate (offline), serve (OpenAI server), bench (serving benchmark)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from minivllm.config import CLI_HELP, EngineArgs
from minivllm.exceptions import StartupError


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The EngineArgs keywords the parsed flags give (EngineArgs.add_cli_args made them)."""
    kw = {k: getattr(args, k) for k in CLI_HELP}
    if getattr(args, "model", None):
        kw["model"] = args.model
    return kw


def cmd_generate(args: argparse.Namespace) -> int:
    from minivllm.entrypoints.llm import LLM
    from minivllm.sampling_params import SamplingParams
    # Sampling arguments first: a bad one is reported before the model loads.
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.sample_seed)
    llm = LLM(**engine_kwargs(args))
    prompts = args.prompt or ["ROMEO:"]
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outputs)
    for o in outputs:
        print(f"--- prompt: {o.prompt!r}\n{o.prompt}{o.outputs[0].text}\n")
    print(f"[{len(outputs)} request(s), {n} tokens in {dt:.2f} s: {n / dt:.1f} tok/s]", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from minivllm.entrypoints.openai.api_server import run_server
    kw = engine_kwargs(args)
    if args.model_tag:
        kw["model"] = args.model_tag
    return run_server(args, EngineArgs.from_kwargs(**kw))


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from minivllm.benchmarks.serve import main as bench_main
    return bench_main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minivllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text offline with the LLM API")
    g.add_argument("--model", default=None, help="HF model folder (default: the model in data/)")
    g.add_argument("--prompt", action="append", help="a prompt (repeat for a batch)")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--sample-seed", type=int, default=0, help="per-request sampling seed")
    EngineArgs.add_cli_args(g)
    g.set_defaults(func=cmd_generate)

    s = sub.add_parser("serve", help="run the OpenAI-compatible server (EngineCore in its own process)")
    s.add_argument("model_tag", nargs="?", default=None, help="HF model folder (default: the model in data/)")
    s.add_argument("--model", default=None, help="same as the positional MODEL")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1/* (as vLLM does)")
    s.add_argument("--max-request-body-bytes", type=int, default=8 << 20, help="larger bodies get a 413")
    s.add_argument("--shutdown-grace-period", type=float, default=5.0,
                   help="seconds in-flight requests may finish after SIGTERM before they end with an error")
    s.add_argument("--served-model-name", default=None, help="the model id clients send (default: folder name)")
    s.add_argument("--enable-server-load-tracking", action="store_true",
                   help="count in-flight completions and chat requests; GET /load reports them")
    s.add_argument("--uvicorn-log-level", default="warning")
    s.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let the model choose to call tools (tool_choice "auto"); needs --tool-call-parser')
    s.add_argument("--tool-call-parser", default=None,
                   help='how tool calls are read from the reply (minivllm: "pythonic"); also needed for a named '
                        'or "required" tool_choice')
    for flag, what in (("origins", "origins"), ("methods", "methods"), ("headers", "headers")):
        s.add_argument(f"--allowed-{flag}", type=json.loads, default=["*"],
                       help=f'CORS: allowed {what}, a JSON list (default ["*"], as vLLM)')
    s.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    s.add_argument("--structured-outputs-config", type=json.loads, default=None,
                   help='JSON, as vLLM\'s: {"disable_any_whitespace": true} keeps JSON output compact')
    EngineArgs.add_cli_args(s)
    s.set_defaults(func=cmd_serve)

    b = sub.add_parser("bench", help="benchmarks")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    bs = bsub.add_parser("serve", help="load-test a running server (vLLM: vllm bench serve)")
    from minivllm.benchmarks.serve import add_cli_args
    add_cli_args(bs)
    bs.set_defaults(func=cmd_bench_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:  # a bad setting: one line naming it, no traceback
        print(f"minivllm: error: {e}", file=sys.stderr)
        return 2
    except StartupError as e:
        print(f"minivllm: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
