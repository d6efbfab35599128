"""Find a checkpoint, build the model for its config and stream its safetensors in
(vLLM: model_executor/model_loader/).

A local folder loads directly; anything else is a Hugging Face hub id, tried in the local HF cache first
and downloaded only when the hub is reachable, so an offline machine fails fast with a clear message.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, PretrainedConfig

from minivllm.attention.backend import AttentionBackend
from minivllm.model_executor.layers.utils import process_weights_after_loading
from minivllm.model_executor.models import get_model_architecture

_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model"]


def _hub_offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return True
    try:
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
        return False
    except OSError:
        return True


def resolve_model_path(model: str) -> str:
    """A local folder holding config.json, or the snapshot folder of a hub id (cache first, then download)."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model folder {model!r} has no config.json")
        return str(path)
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(model, allow_patterns=_HUB_PATTERNS, local_files_only=True)
    except Exception:  # not in the cache, or not a valid repo id
        pass
    if _hub_offline():
        raise ValueError(f"model {model!r}: no such local folder, and it is not in the Hugging Face cache "
                         "while the hub is unreachable (offline or HF_HUB_OFFLINE=1); pass a local folder "
                         "such as data/models/shakespeare-llama")
    try:
        return snapshot_download(model, allow_patterns=_HUB_PATTERNS)
    except Exception as e:
        raise ValueError(f"model {model!r}: no such local folder and the hub download failed: {e}") from e


def load_hf_config(path: str) -> PretrainedConfig:
    return AutoConfig.from_pretrained(path)


def safetensors_files(path: str) -> list[Path]:
    """The checkpoint's shard files: from model.safetensors.index.json when sharded."""
    folder = Path(path)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return [folder / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors weights in {path!r}")
    return files


def safetensors_weights_iterator(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) one at a time, memory-mapped from each shard: never a whole state dict."""
    for file in safetensors_files(path):
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def get_model(model: str, dtype: torch.dtype, device: torch.device | str,
              attn_backend: type[AttentionBackend]) -> nn.Module:
    """Build the architecture named in config.json directly on `device` in `dtype`, then load its weights."""
    path = resolve_model_path(model)
    config = load_hf_config(path)
    model_cls = get_model_architecture(config)
    with _default_dtype(dtype), torch.device(device):
        net = model_cls(config, attn_backend)
    net.load_weights(safetensors_weights_iterator(path))
    process_weights_after_loading(net)
    return net.eval()
