#!/usr/bin/env python3
"""Loads `mirrored export --names nanogpt` into a GPT laid out module for module as nanoGPT's
model.py lays it out (GPT.transformer = ModuleDict(wte, wpe, drop, h = [Block(ln_1, attn(c_attn,
c_proj), ln_2, mlp(c_fc, gelu, c_proj))], ln_f), lm_head without a bias, tied to wte), with
load_state_dict(strict=True), and checks that it gives the trainer's logits for the samples
`mirrored eval --dump-inputs` wrote. The causal mask is a non-persistent buffer, as in nanoGPT's
flash-attention path, so the state dict holds parameters only.
Needs PyTorch and NumPy (Debian: python3-torch).

    build/mirrored eval CONFIG --checkpoint CK --dump-inputs x.npy --dump-logits y.npy --limit 64
    build/mirrored export CK --out gpt.safetensors --names nanogpt
    /usr/bin/python3 scripts/check_export_nanogpt.py gpt.safetensors x.npy y.npy --heads 4

Exit 0 when the logits agree within --tolerance (max |difference| / max |logit|), 1 otherwise.
"""
import argparse
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from torch_safetensors import read_safetensors


class CausalSelfAttention(nn.Module):
    def __init__(self, C, heads, block):
        super().__init__()
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.heads = heads
        self.register_buffer("mask", torch.tril(torch.ones(block, block, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, C, heads, block):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.attn = CausalSelfAttention(C, heads, block)
        self.ln_2 = nn.LayerNorm(C)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, C, layers, heads):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, C), wpe=nn.Embedding(block, C), drop=nn.Dropout(0.0),
            h=nn.ModuleList([Block(C, heads, block) for _ in range(layers)]), ln_f=nn.LayerNorm(C)))
        self.lm_head = nn.Linear(C, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as nanoGPT ties them

    def forward(self, idx):
        T = idx.shape[1]
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T)))
        for b in self.transformer.h:
            x = b(x)
        return self.lm_head(self.transformer.ln_f(x))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("weights")
    ap.add_argument("inputs", help="token ids [n, t] (.npy, from eval --dump-inputs)")
    ap.add_argument("logits", help="the trainer's logits [n, t * vocab] (.npy, from eval --dump-logits)")
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args(argv)
    sd = read_safetensors(args.weights)
    vocab, C = sd["transformer.wte.weight"].shape
    block = sd["transformer.wpe.weight"].shape[0]
    layers = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
    model = GPT(vocab, block, C, layers, args.heads)
    if not torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"]):
        sys.exit(f"{args.weights}: lm_head.weight differs from transformer.wte.weight; nanoGPT's GPT ties them")
    model.load_state_dict(sd, strict=True)
    model.eval()
    x = torch.from_numpy(np.load(args.inputs)).long()
    want = np.load(args.logits).reshape(x.shape[0], x.shape[1], vocab)
    with torch.no_grad():
        got = model(x).numpy()
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    ok = err <= args.tolerance
    print(f"nanoGPT layout: {layers} blocks, {args.heads} heads, width {C}, vocabulary {vocab}, context {block}, "
          f"tied head; {x.shape[0]} samples: max |logit difference| / max |logit| "
          f"= {err:.2e} ({'within' if ok else 'ABOVE'} {args.tolerance:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
