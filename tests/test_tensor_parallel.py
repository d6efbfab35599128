"""Tensor parallelism with two gloo ranks on CPU: the parallel layers against their unsharded selves,
TP=2 greedy generation against TP=1 and HF transformers, and the executor's fault handling.

Tolerances. A rank's column-parallel output must be bitwise the checkpoint's rows for that rank applied
to the input (the same matmul shape, so the same kernel); the embedding and the gathered LM-head logits
are bitwise too (a lookup plus zeros; whole rows), and so is the row-parallel output against the two
partial products summed. All of this holds at a fixed thread count: CPU BLAS rounding changes with it,
so the references run on one thread, like each rank. Against the *unsharded* matmul the CPU BLAS picks
other blockings for other shapes, and the row-parallel all-reduce adds two partial sums in another
order, so those compare within rtol=atol=1e-4 (float32, inputs ~N(0,1), sums over <= 64 terms).
"""
from __future__ import annotations

import io
import multiprocessing
import os
import random
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from minivllm.config import EngineArgs, ParallelConfig
from minivllm.engine.exceptions import EngineDeadError
from minivllm.entrypoints.llm import LLM
from minivllm.sampling_params import SamplingParams

TP = 2


# ---------------------------------------------------------------------------------------------- layers
def _full_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    return {"x": r(5, 48), "h": r(5, 64), "col_w": r(64, 48), "col_b": r(64), "gate": r(32, 48), "up": r(32, 48),
            "q": r(4 * 8, 48), "k2": r(2 * 8, 48), "v2": r(2 * 8, 48), "k1": r(8, 48), "v1": r(8, 48),
            "row_w": r(48, 64), "row_b": r(48), "emb": r(100, 16), "ids": torch.tensor([0, 5, 63, 64, 65, 99, 7]),
            "hid": r(3, 16), "mlp_gate_up": r(2 * 40, 48), "mlp_down": r(48, 40)}


def _layer_outputs(rank: int) -> dict[str, torch.Tensor]:
    """Runs on each rank: every parallel layer loaded from the full tensors, applied to the same input."""
    from minivllm.model_executor.layers.linear import (
        ColumnParallelLinear,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from minivllm.model_executor.layers.logits_processor import LogitsProcessor
    from minivllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from minivllm.model_executor.models.llama import LlamaMLP
    w, out = _full_weights(), {}
    col = ColumnParallelLinear(48, 64, bias=True)
    col.weight.weight_loader(col.weight, w["col_w"])
    col.bias.weight_loader(col.bias, w["col_b"])
    out["col"] = col(w["x"])
    col.gather_output = True
    out["col_gathered"] = col(w["x"])
    merged = MergedColumnParallelLinear(48, [32, 32])
    merged.weight_loader(merged.weight, w["gate"], 0)
    merged.weight_loader(merged.weight, w["up"], 1)
    out["merged"] = merged(w["x"])
    for kv in (2, 1):  # kv heads split (2 over 2 ranks), then replicated (1 head, 2 ranks)
        qkv = QKVParallelLinear(48, 8, 4, kv)
        for shard, name in (("q", "q"), ("k", f"k{kv}"), ("v", f"v{kv}")):
            qkv.weight_loader(qkv.weight, w[name], shard)
        out[f"qkv{kv}"] = qkv(w["x"])
    row = RowParallelLinear(64, 48, bias=True)
    row.weight.weight_loader(row.weight, w["row_w"])
    row.bias.weight_loader(row.bias, w["row_b"])
    out["row"] = row(w["h"].chunk(TP, dim=-1)[rank])
    emb = VocabParallelEmbedding(100, 16)
    emb.weight.weight_loader(emb.weight, w["emb"])
    out["emb"] = emb(w["ids"])
    head = ParallelLMHead(100, 16)
    head.weight.weight_loader(head.weight, w["emb"])
    out["logits"] = LogitsProcessor(100)(head, w["hid"])
    mlp = LlamaMLP(48, 40)
    mlp.gate_up_proj.weight_loader(mlp.gate_up_proj.weight, w["mlp_gate_up"][:40], 0)
    mlp.gate_up_proj.weight_loader(mlp.gate_up_proj.weight, w["mlp_gate_up"][40:], 1)
    mlp.down_proj.weight.weight_loader(mlp.down_proj.weight, w["mlp_down"])
    out["mlp"] = mlp(w["x"])
    return out


def _rank_main(rank: int, port: int, fn, queue) -> None:
    from minivllm.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    torch.set_num_threads(1)
    init_distributed_environment(TP, rank, f"tcp://127.0.0.1:{port}", "gloo")
    initialize_model_parallel(TP)
    with torch.inference_mode():
        buf = io.BytesIO()  # bytes, not torch's shared-memory tensor handles, which die with this process
        torch.save(fn(rank), buf)
        queue.put((rank, buf.getvalue()))


def run_on_ranks(fn) -> list:
    """fn(rank) on TP gloo ranks in spawned processes; their results in rank order."""
    from minivllm.distributed.parallel_state import get_open_port
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = get_open_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, fn, queue), daemon=True) for r in range(TP)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    return [torch.load(io.BytesIO(results[r])) for r in range(TP)]


@pytest.fixture(scope="module")
def layer_outputs():
    return run_on_ranks(_layer_outputs)


@pytest.fixture(autouse=True)
def one_thread():
    """The references use one torch thread, like each rank: BLAS blocking (so rounding) follows the thread count."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


TOL = dict(rtol=1e-4, atol=1e-4)


def rows(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t.chunk(TP, dim=0)[rank]


def test_column_parallel_holds_its_output_rows(layer_outputs):
    w = _full_weights()
    for rank, out in enumerate(layer_outputs):
        assert torch.equal(out["col"], F.linear(w["x"], rows(w["col_w"], rank), rows(w["col_b"], rank)))
        torch.testing.assert_close(out["col_gathered"], F.linear(w["x"], w["col_w"], w["col_b"]), **TOL)
    assert torch.equal(layer_outputs[0]["col_gathered"], layer_outputs[1]["col_gathered"])


def test_merged_column_splits_gate_and_up_each(layer_outputs):
    w = _full_weights()
    for rank, out in enumerate(layer_outputs):  # rank r: [gate_r; up_r], not rows r of [gate; up]
        expected = F.linear(w["x"], torch.cat([rows(w["gate"], rank), rows(w["up"], rank)]))
        assert torch.equal(out["merged"], expected)


@pytest.mark.parametrize("kv", [2, 1])
def test_qkv_splits_heads_or_replicates_kv(layer_outputs, kv):
    w = _full_weights()
    for rank, out in enumerate(layer_outputs):
        # two kv heads: one per rank; one kv head: both ranks hold all of it
        k, v = (rows(w[n], rank) if kv == TP else w[n] for n in (f"k{kv}", f"v{kv}"))
        assert torch.equal(out[f"qkv{kv}"], F.linear(w["x"], torch.cat([rows(w["q"], rank), k, v]))), rank


def test_row_parallel_all_reduces_and_adds_bias_once(layer_outputs):
    w = _full_weights()
    h = w["h"].chunk(TP, dim=-1)
    partial = [F.linear(h[r], w["row_w"].chunk(TP, dim=-1)[r], w["row_b"] if r == 0 else None) for r in range(TP)]
    for out in layer_outputs:
        assert torch.equal(out["row"], partial[0] + partial[1])  # the bias on rank 0 only, then the sum
        torch.testing.assert_close(out["row"], F.linear(w["h"], w["row_w"], w["row_b"]), **TOL)


def test_vocab_parallel_embedding_and_lm_head(layer_outputs):
    w = _full_weights()
    for out in layer_outputs:  # ids on either side of the split (64 = padded 128 / 2)
        assert torch.equal(out["emb"], F.embedding(w["ids"], w["emb"]))
        assert out["logits"].shape == (3, 100)
        assert torch.equal(out["logits"], F.linear(w["hid"], w["emb"]))


def test_mlp_column_then_row_equals_unsharded(layer_outputs):
    from minivllm.model_executor.models.llama import LlamaMLP
    w = _full_weights()
    mlp = LlamaMLP(48, 40)
    mlp.gate_up_proj.weight.data.copy_(w["mlp_gate_up"])
    mlp.down_proj.weight.data.copy_(w["mlp_down"])
    with torch.inference_mode():
        full = mlp(w["x"])
    for out in layer_outputs:
        torch.testing.assert_close(out["mlp"], full, **TOL)


# ---------------------------------------------------------------------------------------------- engine
def greedy(max_tokens: int = 10) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def hf_greedy(path: str, prompts: list[list[int]], max_tokens: int = 10) -> list[list[int]]:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = torch.tensor([p])
            gen = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, attention_mask=torch.ones_like(ids))
            outs.append(gen[0, len(p):].tolist())
    return outs


def shared_prefix_prompts(vocab: int, seed: int) -> list[list[int]]:
    """Eight prompts, 40 shared tokens then 10-30 own ones: longer than the token budget, sharing blocks."""
    rng = random.Random(seed)
    system = [rng.randrange(4, vocab) for _ in range(40)]
    return [system + [rng.randrange(4, vocab) for _ in range(rng.randint(10, 30))] for _ in range(8)]


# Chunked prefill (a 32-token budget), prefix caching, and a KV cache small enough to preempt.
ENGINE_KW = dict(device="cpu", attention_backend="torch", max_num_batched_tokens=32, max_num_seqs=8,
                 num_gpu_blocks=12, enable_prefix_caching=True, multiprocess=False)
CASES = {"llama": ("llama", {}),  # 6 heads, 2 kv heads: one kv head per rank
         "qwen3-kv1": ("qwen3", {"num_key_value_heads": 1})}  # 1 kv head < 2 ranks: replicated


@pytest.fixture(scope="module")
def tp_runs(tiny_model):
    """Per case: (path, prompts, TP=2 tokens, TP=1 tokens, TP=2 stats, KV cache shapes per rank per tp)."""
    runs = {}
    for case, (variant, overrides) in CASES.items():
        path = tiny_model(variant, **overrides)
        vocab = transformers.AutoConfig.from_pretrained(path).vocab_size
        prompts = shared_prefix_prompts(vocab, seed=len(case))
        tokens, specs = {}, {}
        for tp in (2, 1):
            llm = LLM(path, tensor_parallel_size=tp, **ENGINE_KW)
            tokens[tp] = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy(), use_tqdm=False)]
            specs[tp] = llm.llm_engine.engine_core.model_executor.collective_rpc("get_kv_cache_spec")
            if tp == 2:
                stats = llm.llm_engine.get_stats()
                assert type(llm.llm_engine.engine_core.model_executor).__name__ == "MultiprocExecutor"
            llm.llm_engine.shutdown()
        runs[case] = (path, prompts, tokens[2], tokens[1], stats, specs)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_tp2_greedy_equals_tp1_and_hf(tp_runs, case):
    path, prompts, tp2, tp1, stats, specs = tp_runs[case]
    assert tp2 == tp1
    assert tp2 == hf_greedy(path, prompts)
    assert stats.num_preemptions > 0, stats
    assert stats.prefix_cache_hits >= 32, stats
    assert min(len(p) for p in prompts) > ENGINE_KW["max_num_batched_tokens"]  # every prefill is chunked
    # (2, blocks, block_size, kv_heads, head_dim): each rank caches only its kv heads (2 -> 1 each; 1 -> 1 replicated)
    kv_heads = transformers.AutoConfig.from_pretrained(path).num_key_value_heads
    assert [s[3] for s in specs[1]] == [kv_heads]
    assert [s[3] for s in specs[2]] == [max(1, kv_heads // 2)] * 2
    assert all(s[:3] + s[4:] == specs[1][0][:3] + specs[1][0][4:] for s in specs[2])


def test_tp1_starts_no_process_and_no_group():
    from minivllm.distributed.parallel_state import model_parallel_is_initialized
    from minivllm.executor.uniproc_executor import UniProcExecutor
    before = set(multiprocessing.active_children())
    llm = LLM(device="cpu", multiprocess=False)
    assert type(llm.llm_engine.engine_core.model_executor) is UniProcExecutor
    assert not model_parallel_is_initialized() and set(multiprocessing.active_children()) == before


@pytest.mark.parametrize("tp, match", [(16, "num_attention_heads"), (3, "num_key_value_heads"),
                                       (0, "positive int")])
def test_unsupported_tp_size_raises_before_spawning(tp, match):
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=match):  # the default model: 8 heads, 2 kv heads
        LLM(device="cpu", tensor_parallel_size=tp, multiprocess=False)
    assert set(multiprocessing.active_children()) == before


def test_parallel_config_validates():
    with pytest.raises(ValueError, match="uni"):
        ParallelConfig(2, distributed_executor_backend="uni")
    with pytest.raises(ValueError, match="master_port"):
        ParallelConfig(2, master_port=70000)
    with pytest.raises(TypeError, match="unknown engine argument"):
        EngineArgs.from_kwargs(tensor_paralel_size=2)


def test_serve_and_generate_take_tensor_parallel_size():
    from minivllm.entrypoints.cli import build_parser, engine_kwargs
    for argv in (["serve", "-tp", "2", "--master-port", "29555"], ["generate", "--tensor-parallel-size", "2"]):
        args = EngineArgs.from_kwargs(**engine_kwargs(build_parser().parse_args(argv)))
        config = args.create_engine_config(1024).parallel_config
        assert (config.tensor_parallel_size, config.distributed_executor_backend) == (2, "mp")
    assert build_parser().parse_args(["serve", "-tp", "2", "--master-port", "29555"]).master_port == 29555


def test_busy_port_is_a_clear_startup_error(monkeypatch):
    """The port is checked before any worker starts (not found busy by a rendezvous that times out): starting a
    process here fails the test."""
    def no_start(self):
        raise AssertionError(f"{self.name} started before the port was checked")
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", no_start)
    before = set(multiprocessing.active_children())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port} is not free"):
            LLM(device="cpu", tensor_parallel_size=2, master_port=port, multiprocess=False)
    assert set(multiprocessing.active_children()) == before


# ---------------------------------------------------------------------------------------------- faults
def _children(pid: int) -> set[int]:
    kids = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        kids |= {int(c) for c in (task / "children").read_text().split()}
    return kids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_worker_raise_then_death_end_requests_with_engine_dead_error():
    """In-process core: a worker that raises fails the executor; a fresh engine's killed worker too."""
    llm = LLM(device="cpu", tensor_parallel_size=2, multiprocess=False, max_num_seqs=4)
    executor = llm.llm_engine.engine_core.model_executor
    pids = [w.proc.pid for w in executor.workers]
    with pytest.raises(EngineDeadError, match=r"rank \d raised in no_such_method"):
        executor.collective_rpc("no_such_method")  # AttributeError inside every worker
    assert _wait_gone(pids)
    with pytest.raises(EngineDeadError):
        llm.generate(["ROMEO:"], greedy(), use_tqdm=False)


@pytest.mark.slow
@pytest.mark.timeout(300)  # a hang guard only
def test_killed_worker_fails_every_request_and_killed_core_leaves_no_orphans(monkeypatch):
    """The default process split: core process -> two workers. SIGKILL rank 1 mid-generation: every request
    fails with EngineDeadError and no worker survives. The RPC timeout is set far beyond the hang guard, so
    only the executor's watch on its workers can end the requests (not the timeout, and not a clock)."""
    monkeypatch.setenv("MINIVLLM_EXECUTE_MODEL_TIMEOUT_S", "100000")  # the core process and its workers inherit it
    llm = LLM(device="cpu", tensor_parallel_size=2, max_num_seqs=4)
    core_pid = llm.llm_engine.engine_core.engine_pid
    workers = sorted(_children(core_pid))
    assert len(workers) == TP
    assert llm.generate(["ROMEO:"], greedy(4), use_tqdm=False)[0].outputs[0].token_ids
    engine = llm.llm_engine
    ids = [engine.add_request(None, "ROMEO:", greedy(200)) for _ in range(3)]
    engine.step()
    os.kill(workers[1], signal.SIGKILL)
    with pytest.raises(EngineDeadError):
        while engine.has_unfinished_requests():
            engine.step()
    assert ids and _wait_gone(workers + [core_pid])
    llm.llm_engine.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_killed_core_process_takes_its_workers_down(monkeypatch, start_method):
    """A forked worker must also close the parent's pipe ends it inherited, or its death pipe never EOFs."""
    monkeypatch.setenv("MINIVLLM_WORKER_MULTIPROC_METHOD", start_method)  # the core process inherits it
    llm = LLM(device="cpu", tensor_parallel_size=2, max_num_seqs=4)
    core_pid = llm.llm_engine.engine_core.engine_pid
    workers = sorted(_children(core_pid))
    os.kill(core_pid, signal.SIGKILL)
    assert _wait_gone(workers), "workers outlived their EngineCore (parent-death watch)"
    llm.llm_engine.shutdown()
