"""Llama from an HF checkpoint, over minivllm's paged attention (vLLM: model_executor/models/llama.py).

The model runs on one flat batch of tokens [T] (no batch dim): every request's new tokens back to back,
with `positions` giving each token's place in its sequence and `attn_metadata` saying which tokens
belong to which request and where their KV lives. Qwen2 and Qwen3 subclass this file's classes.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from transformers import PretrainedConfig

from minivllm.attention.backend import AttentionBackend, AttentionMetadata
from minivllm.attention.layer import Attention
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    default_weight_loader,
)
from minivllm.model_executor.layers.logits_processor import LogitsProcessor
from minivllm.model_executor.layers.rotary_embedding import get_rope
from minivllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding


def get_head_dim(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def get_rope_config(config: PretrainedConfig) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from a transformers 5 `rope_parameters` or an older `rope_theta`/`rope_scaling`."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    theta = params.pop("rope_theta", None) or getattr(config, "rope_theta", None) or 10000.0
    return float(theta), params or getattr(config, "rope_scaling", None)


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)), with gate and up as one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    """GQA self-attention: fused qkv, optional per-head q/k norm (Qwen3), RoPE, paged attention, o_proj.

    Under tensor parallelism each rank runs its own heads end to end (qkv_proj gives it num_heads/tp q
    heads and their kv heads, its KV cache holds just those) until o_proj's all-reduce.
    """

    def __init__(self, config: PretrainedConfig, attn_backend: type[AttentionBackend], qkv_bias: bool,
                 o_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        total_num_heads = config.num_attention_heads
        total_num_kv_heads = getattr(config, "num_key_value_heads", None) or total_num_heads
        self.head_dim = get_head_dim(config)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, total_num_heads, total_num_kv_heads,
                                          bias=qkv_bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(total_num_heads * self.head_dim, config.hidden_size, bias=o_bias)
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.qk_norm = qk_norm
        theta, rope_scaling = get_rope_config(config)
        self.rotary_emb = get_rope(self.head_dim, config.max_position_embeddings, theta, rope_scaling)
        self.attn = Attention(self.num_heads, self.head_dim, self.head_dim ** -0.5, self.num_kv_heads,
                              attn_backend)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v.contiguous(), kv_cache, attn_metadata))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(.)), with the residual add fused into the norms."""

    def __init__(self, config: PretrainedConfig, attn_backend: type[AttentionBackend], qkv_bias: bool,
                 o_bias: bool, qk_norm: bool) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, attn_backend, qkv_bias, o_bias, qk_norm)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size, bias=getattr(config, "mlp_bias", False))
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, residual: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden_states = hidden_states, self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, kv_cache, attn_metadata)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    """Embedding, the decoder stack (one KV cache tensor per layer) and the final norm."""

    def __init__(self, config: PretrainedConfig, attn_backend: type[AttentionBackend], qkv_bias: bool = False,
                 o_bias: bool = False, qk_norm: bool = False) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, attn_backend, qkv_bias, o_bias, qk_norm)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        hidden_states, residual = self.embed_tokens(input_ids), None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden_states, residual = layer(positions, hidden_states, kv_cache, attn_metadata, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    """Llama for generation: forward gives hidden states, compute_logits the float32 vocab scores."""

    # checkpoint name -> (fused parameter, shard) as in vLLM's load_weights
    stacked_params_mapping = [
        (".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
        (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1),
    ]
    qk_norm = False

    def __init__(self, config: PretrainedConfig, attn_backend: type[AttentionBackend]) -> None:
        super().__init__()
        self.config = config
        qkv_bias, o_bias = self.attention_biases(config)
        self.model = LlamaModel(config, attn_backend, qkv_bias, o_bias, self.qk_norm)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    @staticmethod
    def attention_biases(config: PretrainedConfig) -> tuple[bool, bool]:
        """(bias on q/k/v, bias on o_proj): Llama's attention_bias covers all four."""
        bias = getattr(config, "attention_bias", False)
        return bias, bias

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                attn_metadata: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy HF checkpoint tensors into the (partly fused) parameters; raise if any is left unset.

        Each parameter's weight_loader takes the full checkpoint tensor and keeps this rank's shard."""
        params = dict(self.named_parameters())
        tied = getattr(self.config, "tie_word_embeddings", False)
        loaded: set[str] = set()
        for name, loaded_weight in weights:
            if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight"):
                continue
            for param_name, weight_name, shard_id in self.stacked_params_mapping:
                if weight_name in name:
                    name = name.replace(weight_name, param_name)
                    params[name].weight_loader(params[name], loaded_weight, shard_id)
                    break
            else:
                if name not in params:
                    raise ValueError(f"checkpoint tensor {name!r} has no parameter in {type(self).__name__}")
                getattr(params[name], "weight_loader", default_weight_loader)(params[name], loaded_weight)
            loaded.add(name)
        if missing := set(params) - loaded:
            raise ValueError(f"checkpoint is missing weights for {sorted(missing)}")
        return loaded
