"""The checkpoints the engine comparison loads: the shipped model, and tiny random Llama / Qwen2 / Qwen3 ones
made offline with transformers (head_dim 32: vLLM's CPU attention refuses 16). Both engines read the same
safetensors files; they are built once under build/ by the caller's venv, before vLLM is asked anything."""
from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "data" / "models" / "shakespeare-llama"
MODELS_DIR = REPO / "build" / "vllm_oracle" / "models"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
_COMMON = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.1,
               tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=3, vocab_size=4096)
# name -> (architecture, model_type, overrides)
TINY = {
    "tiny-llama": ("LlamaForCausalLM", "llama", {}),
    "tiny-qwen2": ("Qwen2ForCausalLM", "qwen2", {"num_key_value_heads": 4}),
    "tiny-qwen3": ("Qwen3ForCausalLM", "qwen3", {"hidden_size": 96, "head_dim": 32, "num_attention_heads": 4}),
}


def model_path(name: str) -> Path:
    return SHIPPED if name == "shakespeare-llama" else MODELS_DIR / name


def ensure(name: str) -> Path:
    """The checkpoint's folder, building a tiny one (seed 0, float32) if it is not there yet."""
    path = model_path(name)
    if (path / "config.json").exists():
        return path
    import torch
    import transformers

    arch, model_type, overrides = TINY[name]
    config = transformers.AutoConfig.for_model(model_type, **(_COMMON | overrides))
    config.architectures = [arch]
    torch.manual_seed(0)
    model = getattr(transformers, arch)(config).to(torch.float32).eval()
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in TOKENIZER_FILES:
        if (SHIPPED / f).exists():
            shutil.copy(SHIPPED / f, tmp / f)
    tmp.rename(path)
    return path
