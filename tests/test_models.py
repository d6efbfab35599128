"""minivllm's Llama / Qwen2 / Qwen3 against transformers on tiny random checkpoints (fp32, atol 1e-4).

Each model runs over the paged KV cache as the runner drives it: one full prefill, a prefill split into
two chunks (the second reads the first's cached K/V), then single-token decodes.
"""
from __future__ import annotations

import json
import time

import pytest
import torch
from tiny_models import DEFAULT_MODEL, TINY_VARIANTS
from transformers import AutoModelForCausalLM, AutoTokenizer

from minivllm.attention.backend import AttentionMetadata
from minivllm.attention.backends.torch_attn import TorchAttentionBackend
from minivllm.model_executor import get_model, load_hf_config
from minivllm.model_executor.models import get_model_architecture

BLOCK_SIZE = 16
PROMPT = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet"
ATOL = 1e-4


def one_request_metadata(start: int, end: int, num_blocks: int) -> AttentionMetadata:
    """Tokens [start, end) of one request whose blocks are 1..num_blocks (block 0 left unused)."""
    block_table = torch.arange(1, num_blocks + 1, dtype=torch.int32)[None]
    pos = torch.arange(start, end)
    slot_mapping = block_table[0, pos // BLOCK_SIZE].long() * BLOCK_SIZE + pos % BLOCK_SIZE
    is_decode = end - start == 1 and start > 0
    qsl = torch.tensor([0, end - start], dtype=torch.int32)
    seq_lens = torch.tensor([end], dtype=torch.int32)
    return AttentionMetadata(
        num_actual_tokens=end - start, max_query_len=end - start, query_start_loc=qsl, max_seq_len=end,
        seq_lens=seq_lens, block_table=block_table, slot_mapping=slot_mapping, num_decodes=int(is_decode),
        num_decode_tokens=int(is_decode), num_prefills=int(not is_decode), query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens)


class PagedRunner:
    """Drives a minivllm model over one request's token chunks with its own KV cache."""

    def __init__(self, model, num_blocks: int) -> None:
        cfg = model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        shape = TorchAttentionBackend.get_kv_cache_shape(num_blocks + 1, BLOCK_SIZE, cfg.num_key_value_heads,
                                                         head_dim)
        self.model, self.num_blocks = model, num_blocks
        self.kv_caches = [torch.zeros(shape) for _ in range(cfg.num_hidden_layers)]

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        end = start + len(ids)
        md = one_request_metadata(start, end, self.num_blocks)
        hidden = self.model(ids, torch.arange(start, end), self.kv_caches, md)
        return self.model.compute_logits(hidden)


@pytest.fixture(scope="module")
def model_dirs(tiny_model):
    dirs = {v: tiny_model(v) for v in TINY_VARIANTS}
    return dirs | {"default": str(DEFAULT_MODEL)}


@pytest.mark.parametrize("variant", [*TINY_VARIANTS, "default"])
def test_matches_hf(model_dirs, variant):
    path = model_dirs[variant]
    ids = AutoTokenizer.from_pretrained(path)(PROMPT, return_tensors="pt").input_ids[0]
    assert 15 <= len(ids) <= 30
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = get_model(path, torch.float32, "cpu", TorchAttentionBackend)
    num_decode, n = 4, len(ids)
    num_blocks = -(-(n + num_decode) // BLOCK_SIZE)
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]

    full = PagedRunner(model, num_blocks)(ids, 0)
    torch.testing.assert_close(full, expected, atol=ATOL, rtol=0)

    chunked = PagedRunner(model, num_blocks)
    logits = torch.cat([chunked(ids[:13], 0), chunked(ids[13:], 13)])
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)

    seq = ids
    for _ in range(num_decode):
        nxt = logits[-1].argmax()[None]
        logits = chunked(nxt, len(seq))
        seq = torch.cat([seq, nxt])
        with torch.no_grad():
            expected = hf(seq[None]).logits[0, -1:]
        torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


@pytest.mark.timeout(120)  # a hang guard only
def test_missing_folder_fails_fast_offline(monkeypatch):
    """Offline, a missing model fails at once: no connection is tried and nothing sleeps (a retry or a network
    timeout is what would make it slow), counted instead of timed."""
    import socket
    import threading

    tried = []

    def refuse(kind, real):
        def record(*args, **kwargs):
            if threading.current_thread() is not me:  # another thread of this process: not the load's doing
                return real(*args, **kwargs)
            tried.append((kind, args[:2]))
            raise OSError(f"{kind} refused by the test")
        return record

    me = threading.current_thread()

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", refuse("create_connection", socket.create_connection))
    monkeypatch.setattr(socket.socket, "connect", refuse("connect", socket.socket.connect))
    monkeypatch.setattr(time, "sleep", refuse("sleep", time.sleep))
    for name in ["/no/such/model/folder", "no-such-org/no-such-model"]:
        with pytest.raises(ValueError, match="unreachable"):
            get_model(name, torch.float32, "cpu", TorchAttentionBackend)
    assert tried == []


def test_unsupported_architecture(model_dirs, tmp_path):
    cfg = json.loads((DEFAULT_MODEL / "config.json").read_text()) | {"architectures": ["GPT2LMHeadModel"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        get_model_architecture(load_hf_config(str(tmp_path)))
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        get_model(str(tmp_path), torch.float32, "cpu", TorchAttentionBackend)


def test_bfloat16_load(model_dirs):
    model = get_model(model_dirs["qwen3"], torch.bfloat16, "cpu", TorchAttentionBackend)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.get_default_dtype() == torch.float32
    runner = PagedRunner(model, num_blocks=2)
    runner.kv_caches = [c.bfloat16() for c in runner.kv_caches]
    logits = runner(torch.arange(4, 24), 0)
    assert logits.dtype == torch.float32 and logits.isfinite().all()


def test_cpu_linears_run_onednn_on_prepacked_weights(model_dirs):
    """After loading, every linear and the LM head run vLLM's CPU GEMM path (oneDNN, prepacked weights):
    within float32 rounding of F.linear on the same weights, at decode and prefill row counts."""
    from minivllm.model_executor.layers.linear import LinearBase
    from minivllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    net = get_model(str(model_dirs["default"]), torch.float32, "cpu", TorchAttentionBackend)
    layers = [m for m in net.modules() if isinstance(m, (LinearBase, ParallelLMHead))]
    assert layers and all(m.cpu_linear is not torch.nn.functional.linear for m in layers)
    gen = torch.Generator().manual_seed(0)
    for m in layers:
        for rows in (1, 7, 64):
            x = torch.randn(rows, m.weight.shape[1], generator=gen)
            bias = getattr(m, "bias", None)
            got, want = m.cpu_linear(x, m.weight, bias), torch.nn.functional.linear(x, m.weight, bias)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    m = layers[0]
    x = torch.randn(4, m.weight.shape[1], generator=gen)
    before = m.cpu_linear(x, m.weight, None)
    m.weight.data.mul_(2)  # the packed copy was taken at load time: re-dispatching picks up new weights
    m.process_weights_after_loading()
    torch.testing.assert_close(m.cpu_linear(x, m.weight, None), 2 * before, rtol=1e-5, atol=1e-5)
