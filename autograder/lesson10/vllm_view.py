"""Lesson 10's vLLM side: the pinned vLLM's own tensor-parallel layers (vllm/model_executor/layers/linear.py,
vocab_parallel_embedding.py) load layer 0 and the embedding of the course model's checkpoint, once per rank of
TP=2 (and TP=1), each parameter through its own `weight_loader` (`weight_loader_v2` -> the parameter's
`load_qkv_weight` / `load_merged_column_weight` / `load_row_parallel_weight`, vllm/model_executor/parameter.py).
Runs under .venv-vllm only.

No process group: the rank and world size the layers and parameters read (`get_tensor_model_parallel_rank`,
`get_tensor_model_parallel_world_size`, imported into linear.py, vocab_parallel_embedding.py and parameter.py) are
patched to the rank being built; loading slices with them and never communicates. Each answer records a shard's
shape and which rows (dim 0) or columns (dim 1) of which checkpoint tensor it holds, found by matching values.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

MODEL = Path(__file__).resolve().parents[2] / "data" / "models" / "shakespeare-llama"
SCENARIOS = {"layer0_and_embedding": {"model": "shakespeare-llama", "tp_sizes": [1, 2], "layer": 0}}


def _ranges(idx: list[int]) -> list[list[int]]:
    """[start, end) runs of consecutive indices; -1 (no checkpoint row: padding) as its own runs."""
    out: list[list[int]] = []
    for i in idx:
        if out and out[-1][1] == i and i != -1:
            out[-1][1] = i + 1
        elif out and i == -1 and out[-1][0] == -1:
            out[-1][1] -= 1
        else:
            out.append([i, i + 1] if i != -1 else [-1, -1])
    return [[a, b] if a != -1 else ["pad", -b] for a, b in out]


def _source(shard, sources: dict, dim: int) -> list:
    """For each row (dim 0) or column (dim 1) of shard, the checkpoint tensor and index it equals."""
    import torch

    where = {}
    for name, t in sources.items():
        t = t if dim == 0 else t.t()
        for i, row in enumerate(t):
            where.setdefault(row.numpy().tobytes(), (name, i))
    rows = shard if dim == 0 else shard.t()
    seq = [where.get(r.contiguous().numpy().tobytes(), (None, -1)) for r in rows.to(torch.float32)]
    return [[name, _ranges([i for _, i in run])] for name, run in itertools.groupby(seq, key=lambda x: x[0])]


def vllm_answer(name: str, payload: dict) -> dict:
    import torch
    import vllm.model_executor.layers.linear as linear
    import vllm.model_executor.layers.vocab_parallel_embedding as vpe
    import vllm.model_executor.parameter as parameter
    from safetensors.torch import load_file
    from vllm.config import VllmConfig, set_current_vllm_config

    ckpt = load_file(str(MODEL / "model.safetensors"))
    cfg = json.loads((MODEL / "config.json").read_text())
    h, heads, kv, hd, inter = (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                               cfg["head_dim"], cfg["intermediate_size"])
    p = f"model.layers.{payload['layer']}."
    w = {k: ckpt[p + k + ".weight"].float() for k in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                       "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                       "mlp.down_proj")}
    embed = ckpt["model.embed_tokens.weight"].float()
    saved = {(m, f): getattr(m, f) for m in (linear, vpe, parameter) for f in
             ("get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size") if hasattr(m, f)}
    out = {}
    try:
        with set_current_vllm_config(VllmConfig()):
            for tp in payload["tp_sizes"]:
                for rank in range(tp):
                    for (m, f) in saved:
                        setattr(m, f, (lambda r=rank: r) if f.endswith("rank") else (lambda s=tp: s))
                    qkv = linear.QKVParallelLinear(h, hd, heads, kv, bias=False, params_dtype=torch.float32)
                    for sid, k in (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj")):
                        qkv.weight.weight_loader(qkv.weight, w[k], sid)
                    o = linear.RowParallelLinear(heads * hd, h, bias=False, params_dtype=torch.float32)
                    o.weight.weight_loader(o.weight, w["self_attn.o_proj"])
                    gu = linear.MergedColumnParallelLinear(h, [inter, inter], bias=False, params_dtype=torch.float32)
                    gu.weight.weight_loader(gu.weight, w["mlp.gate_proj"], 0)
                    gu.weight.weight_loader(gu.weight, w["mlp.up_proj"], 1)
                    down = linear.RowParallelLinear(inter, h, bias=False, params_dtype=torch.float32)
                    down.weight.weight_loader(down.weight, w["mlp.down_proj"])
                    emb = vpe.VocabParallelEmbedding(embed.shape[0], h, params_dtype=torch.float32)
                    emb.weight.weight_loader(emb.weight, embed)
                    src = {
                        "self_attn.qkv_proj": (qkv, {"q_proj": w["self_attn.q_proj"], "k_proj": w["self_attn.k_proj"],
                                                     "v_proj": w["self_attn.v_proj"]}, 0),
                        "self_attn.o_proj": (o, {"o_proj": w["self_attn.o_proj"]}, 1),
                        "mlp.gate_up_proj": (gu, {"gate_proj": w["mlp.gate_proj"], "up_proj": w["mlp.up_proj"]}, 0),
                        "mlp.down_proj": (down, {"down_proj": w["mlp.down_proj"]}, 1),
                        "embed_tokens": (emb, {"embed_tokens": embed}, 0),
                    }
                    out[f"tp{tp}_rank{rank}"] = {
                        k: {"class": type(layer).__name__, "param": type(layer.weight).__name__,
                            "shape": list(layer.weight.shape), "source_dim": dim,
                            "source": _source(layer.weight.data, s, dim)}
                        for k, (layer, s, dim) in src.items()}
    finally:
        for (m, f), fn in saved.items():
            setattr(m, f, fn)
    return out
