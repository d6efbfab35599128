"""The checkpoints the engine comparison loads: the shipped model, and tiny random Llama / Qwen2 / Qwen3 ones
made offline with transformers (head_dim 32: vLLM's CPU attention refuses 16). Both engines read the same
safetensors files; they are built once under build/ by the caller's venv, before vLLM is asked anything."""
from __future__ import annotations

import shutil
from pathlib import Path

from autograder.pin import REPO

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


def save_tiny(path: Path, arch: str, model_type: str, config: dict, *, seed: int = 0, own_init: bool = True,
              **save_kwargs) -> Path:
    """The one tiny-checkpoint factory (the oracle's and tests/tiny_models.py's): a random float32 `arch` with the
    shipped tokenizer. own_init draws every weight from our own seeded generator, parameter by parameter in name
    order (norms 1), so they do not depend on how a transformers release initialises its layers (the recorded
    vLLM answers are tied to them); otherwise transformers' own init under torch.manual_seed(seed)."""
    import torch
    import transformers

    hf_config = transformers.AutoConfig.for_model(model_type, **config)
    hf_config.architectures = [arch]
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(hf_config).to(torch.float32).eval()
    if own_init:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in sorted(model.named_parameters()):
                if name.endswith("norm.weight") or ".norm" in name or "layernorm" in name:
                    param.fill_(1.0)
                else:
                    param.copy_(torch.randn(param.shape, generator=g) * 0.1)
    path = Path(path)
    model.save_pretrained(path, safe_serialization=True, **save_kwargs)
    for f in TOKENIZER_FILES:
        if (SHIPPED / f).exists():
            shutil.copy(SHIPPED / f, path / f)
    return path


def ensure(name: str) -> Path:
    """The checkpoint's folder, building a tiny one (seed 0, own init) if it is not there yet."""
    path = model_path(name)
    if (path / "config.json").exists():
        return path
    arch, model_type, overrides = TINY[name]
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_tiny(tmp, arch, model_type, _COMMON | overrides).rename(path)
    return path


METASPACE = MODELS_DIR / "metaspace-tokenizer"


def ensure_metaspace_tokenizer() -> Path:
    """A SentencePiece-style tokenizer (Metaspace pre-tokenizer, byte fallback, Llama 2's
    decoder), trained offline on
    the shipped Shakespeare text: the other family of detokenization (leading "▁" instead of byte-level "Ġ")."""
    if (METASPACE / "tokenizer.json").exists():
        return METASPACE
    import json
    import lzma

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = lzma.open(REPO / "data" / "shakespeare.txt.xz", "rt", encoding="utf-8").read()[:400_000]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    # Llama 2's decoder: "▁" back to a space, byte pieces to bytes, one string, the first space dropped.
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                  show_progress=False)
    tok.train_from_iterator(text.splitlines(), trainer)
    # The 256 byte pieces byte fallback needs, as ordinary vocabulary (as in Llama 2's tokenizer).
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(256):
        vocab.setdefault(f"<0x{i:02X}>", len(vocab))
    tok = Tokenizer.from_str(json.dumps(spec))
    tmp = METASPACE.with_name(METASPACE.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    tok.save(str(tmp / "tokenizer.json"))
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 1024}))
    # minivllm loads tokenizers from model folders, which have a config.json: a tiny Llama's, naming the vocab.
    (tmp / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                                 "vocab_size": tok.get_vocab_size()}))
    tmp.rename(METASPACE)
    return METASPACE
