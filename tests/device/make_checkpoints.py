#!/usr/bin/env python3
"""Two random-weight Llama checkpoints for the device tests, laid out as hub_server.py repositories.

    make_checkpoints.py OUT [--size-gb N] [--shard-size 1GB] [--names switch-a,switch-b]

writes OUT/device/switch-a/ and OUT/device/switch-b/ (repositories "device/switch-a" and
"device/switch-b" of `hub_server.py --repos OUT`), each a `LlamaForCausalLM(LlamaConfig(...))`
with random weights (created on the GPU, in bfloat16) of about N GB (10^9 bytes), saved with
`save_pretrained(..., max_shard_size=...)` as several safetensors shards plus
model.safetensors.index.json, config.json and generation_config.json, and a small word-level
tokenizer (tokenizer.json, tokenizer_config.json) built here with the `tokenizers` library, so
nothing is downloaded. A and B differ in their seed and rope_theta, so their commits and bytes
differ. Prints one JSON line per checkpoint: {"repo", "bytes", "shards", "layers", "seconds"}.

The shape is Llama-3-8B's (hidden 4096, MLP 14336, 32 heads, 8 KV heads) with as many layers as
make the size: each layer is about 436 MB, embeddings and head about 262 MB each. Needs torch
with CUDA, transformers and tokenizers (the H200 machine has them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ORG = "device"
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, VOCAB = 4096, 14336, 32, 8, 32000
BYTES_PER_PARAM = 2  # bfloat16
WORDS = ("the a an of to in and is was it for on with as at by from this that be are or not "
         "model server weights page cache load warm cold switch deploy gpu memory token hello world").split()
SPECIALS = ["<unk>", "<s>", "</s>"]


def layer_params() -> int:
    head_dim = HIDDEN // HEADS
    attention = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * head_dim
    return attention + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN  # + the two RMSNorm weights


def layers_for(size_bytes: float) -> int:
    """How many decoder layers make a checkpoint of about `size_bytes` (at least 1)."""
    fixed = (2 * VOCAB * HIDDEN + HIDDEN) * BYTES_PER_PARAM  # embeddings, untied head, final norm
    return max(1, round((size_bytes - fixed) / (layer_params() * BYTES_PER_PARAM)))


def save_tokenizer(folder: Path) -> None:
    """A word-level tokenizer over VOCAB entries (specials, some words, filler), whitespace split."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    for i in range(len(vocab), VOCAB):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(folder))


def make_one(folder: Path, layers: int, seed: int, rope_theta: float, shard_size: str) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    t0 = time.monotonic()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         max_position_embeddings=4096, rope_theta=rope_theta, tie_word_embeddings=False,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(str(folder), max_shard_size=shard_size)
    del model
    torch.cuda.empty_cache()
    save_tokenizer(folder)
    shards = sorted(folder.glob("*.safetensors"))
    size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return {"repo": f"{ORG}/{folder.name}", "bytes": size, "shards": len(shards), "layers": layers,
            "seconds": round(time.monotonic() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", metavar="OUT", help="the hub fixture's --repos folder")
    ap.add_argument("--size-gb", type=float, default=11.0, help="size of each checkpoint in GB (default 11)")
    ap.add_argument("--shard-size", default="1GB", help="save_pretrained's max_shard_size (default 1GB)")
    ap.add_argument("--names", default="switch-a,switch-b", help="repository names under device/, comma-separated")
    args = ap.parse_args(argv)
    layers = layers_for(args.size_gb * 1e9)
    for i, name in enumerate(args.names.split(",")):
        made = make_one(Path(args.out) / ORG / name, layers, seed=1000 + i, rope_theta=500000.0 + i,
                        shard_size=args.shard_size)
        print(json.dumps(made), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
