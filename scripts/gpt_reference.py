#!/usr/bin/env python3
"""Independent PyTorch reference of a GPT-2 style language model (nanoGPT's model.py, pre-LN,
bias=True, no dropout) and of a Llama-style one (Hugging Face's LlamaForCausalLM as its
architecture describes it: RMSNorm, rotary embeddings with rotate_half, grouped-query attention by
repeating key/value heads, SwiGLU MLP, no biases), used to check mirrored's transformers step for
step: the same weights, the same batch and AdamW must give the same losses, step-1 logits and
step-1 gradients.

Tensor names are mirrored's (L blocks, C channels, V tokens). GPT:
  layers.0.weight [V, C] token embedding     layers.1.weight [max_len, C] position embedding
  layers.k.{ln_1,attn.c_attn,attn.c_proj,ln_2,mlp.c_fc,mlp.c_proj}.{weight,bias}  k = 2..L+1
  layers.{L+2}.weight/.bias final layernorm   layers.{L+3}.weight [V, C] head (absent: tied to wte)
Llama (H query heads, KV key/value heads of width D = C / H, MLP width I):
  layers.0.weight [V, C] token embedding
  layers.k.input_layernorm.weight [C]        layers.k.self_attn.qkv_proj.weight [(H + 2 KV) D, C]
  layers.k.self_attn.o_proj.weight [C, C]    layers.k.post_attention_layernorm.weight [C]
  layers.k.mlp.gate_up_proj.weight [2 I, C]  layers.k.mlp.down_proj.weight [C, I]     k = 1..L
  layers.{L+1}.weight final RMSNorm          layers.{L+2}.weight [V, C] head (absent: tied)
  (qkv_proj is q_proj, k_proj, v_proj stacked by rows; gate_up_proj is gate_proj, up_proj.)
A checkpoint's `optimizer.*` tensors are ignored (AdamW here always starts from zero moments).
Needs only PyTorch and NumPy (Debian: python3-torch python3-numpy).

    /usr/bin/python3 scripts/gpt_reference.py --weights model.safetensors --tokens train.bin \
        --context 64 --batch 4 --heads 4 --steps 10 --out result.json --grads-out g.safetensors
    /usr/bin/python3 scripts/gpt_reference.py --weights llama.safetensors ... --heads 4 --kv-heads 2
    /usr/bin/python3 scripts/gpt_reference.py --self-test
"""
import argparse
import contextlib
import io
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

ST_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2"}
LLMC_MAGIC = 20240520


def fail(msg):
    print(f"gpt_reference: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- files

def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        fail(f"{path}: too short for a safetensors file")
    n = struct.unpack_from("<Q", raw, 0)[0]
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        fail(f"{path}: bad safetensors header: {e}")
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or name.startswith("optimizer."):
            continue
        if t.get("dtype") not in ST_DTYPES:
            fail(f"{path}: {name} has dtype {t.get('dtype')}, expected F32")
        b, e = t["data_offsets"]
        a = np.frombuffer(data[b:e], dtype=ST_DTYPES[t["dtype"]])
        if a.size != math.prod(t["shape"]) or e > len(data):
            fail(f"{path}: {name}: data size does not match shape {t['shape']}")
        out[name] = a.reshape(t["shape"]).astype(np.float64)
    return out


def write_safetensors(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)  # data starts 8-byte aligned, as the format recommends
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_tokens(path, fmt, dtype):
    dt = np.dtype("<u2" if dtype == "uint16" else "<u4")
    raw = np.fromfile(path, dtype=np.uint8)
    if fmt == "llmc":
        if raw.size < 1024:
            fail(f"{path}: shorter than the 1024-byte llm.c header")
        hdr = raw[:1024].view("<i4")
        # llm.c: version 1 holds uint16 tokens, version 2 (llama 3) uint32.
        versions = (1,) if dtype == "uint16" else (1, 2)
        if hdr[0] != LLMC_MAGIC or hdr[1] not in versions:
            fail(f"{path}: llm.c header has magic {hdr[0]} version {hdr[1]}, "
                 f"expected {LLMC_MAGIC} and one of {versions} for {dtype}")
        n = int(hdr[2])
        if raw.size - 1024 < n * dt.itemsize:
            fail(f"{path}: header says {n} tokens but the file holds fewer")
        return raw[1024:1024 + n * dt.itemsize].view(dt).astype(np.int64)
    if raw.size % dt.itemsize:
        fail(f"{path}: size {raw.size} is not a multiple of {dt.itemsize} ({dtype} tokens)")
    return raw.view(dt).astype(np.int64)


def make_batch(tok, B, T):
    """Window k starts at token k*T; targets are the inputs shifted by one."""
    if tok.size < B * T + 1:
        fail(f"token file holds {tok.size} tokens; batch {B} x context {T} needs {B * T + 1}")
    x = np.stack([tok[k * T:k * T + T] for k in range(B)])
    y = np.stack([tok[k * T + 1:k * T + T + 1] for k in range(B)])
    return x, y


# ---------------------------------------------------------------- model layout

def block_shapes(C):
    return {"ln_1.weight": (C,), "ln_1.bias": (C,),
            "attn.c_attn.weight": (3 * C, C), "attn.c_attn.bias": (3 * C,),
            "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,),
            "ln_2.weight": (C,), "ln_2.bias": (C,),
            "mlp.c_fc.weight": (4 * C, C), "mlp.c_fc.bias": (4 * C,),
            "mlp.c_proj.weight": (C, 4 * C), "mlp.c_proj.bias": (C,)}


def expected_shapes(L, C, V, max_len, tied):
    s = {"layers.0.weight": (V, C), "layers.1.weight": (max_len, C)}
    for k in range(2, L + 2):
        s.update({f"layers.{k}.{n}": shp for n, shp in block_shapes(C).items()})
    s[f"layers.{L + 2}.weight"] = (C,)
    s[f"layers.{L + 2}.bias"] = (C,)
    if not tied:
        s[f"layers.{L + 3}.weight"] = (V, C)
    return s


def llama_shapes(L, C, V, I, qkv_rows, tied):
    s = {"layers.0.weight": (V, C)}
    for k in range(1, L + 1):
        b = f"layers.{k}."
        s.update({b + "input_layernorm.weight": (C,), b + "self_attn.qkv_proj.weight": (qkv_rows, C),
                  b + "self_attn.o_proj.weight": (C, C), b + "post_attention_layernorm.weight": (C,),
                  b + "mlp.gate_up_proj.weight": (2 * I, C), b + "mlp.down_proj.weight": (C, I)})
    s[f"layers.{L + 1}.weight"] = (C,)
    if not tied:
        s[f"layers.{L + 2}.weight"] = (V, C)
    return s


def check_llama_weights(w):
    V, C = w["layers.0.weight"].shape
    ks = sorted(int(m.group(1)) for n in w if (m := re.fullmatch(r"layers\.(\d+)\.input_layernorm\.weight", n)))
    L = len(ks)
    if ks != list(range(1, L + 1)):
        fail(f"weights: Llama blocks (by their input_layernorm.weight) are layers {ks}, expected 1..{L}")
    if "layers.1.mlp.down_proj.weight" not in w or "layers.1.self_attn.qkv_proj.weight" not in w:
        fail("weights: layers.1 has no mlp.down_proj.weight or self_attn.qkv_proj.weight")
    I = w["layers.1.mlp.down_proj.weight"].shape[1]
    qkv_rows = w["layers.1.self_attn.qkv_proj.weight"].shape[0]
    tied = f"layers.{L + 2}.weight" not in w
    exp = llama_shapes(L, C, V, I, qkv_rows, tied)
    missing, extra = sorted(set(exp) - set(w)), sorted(set(w) - set(exp))
    if missing or extra:
        fail(f"weights: missing {missing}, unexpected {extra} (for {L} Llama blocks)")
    bad = [f"{n} {list(w[n].shape)} (expected {list(s)})" for n, s in exp.items() if w[n].shape != s]
    if bad:
        fail("weights: wrong shapes: " + ", ".join(bad))
    return {"arch": "llama", "L": L, "C": C, "V": V, "I": I, "qkv_rows": qkv_rows, "max_len": None,
            "tied": tied, "names": list(exp)}


def check_weights(w):
    """Infers the architecture, L, C, V, max_len and tying, and rejects anything but exactly the
    expected tensors."""
    if "layers.1.input_layernorm.weight" in w:
        return check_llama_weights(w)
    for n in ("layers.0.weight", "layers.1.weight"):
        if n not in w or w[n].ndim != 2:
            fail(f"weights: {n} is missing or not 2-D")
    V, C = w["layers.0.weight"].shape
    max_len = w["layers.1.weight"].shape[0]
    ks = sorted(int(m.group(1)) for n in w if (m := re.fullmatch(r"layers\.(\d+)\.ln_1\.weight", n)))
    L = len(ks)
    if ks != list(range(2, L + 2)):
        fail(f"weights: blocks (by their ln_1.weight) are layers {ks}, expected 2..{L + 1}")
    tied = f"layers.{L + 3}.weight" not in w
    exp = expected_shapes(L, C, V, max_len, tied)
    missing, extra = sorted(set(exp) - set(w)), sorted(set(w) - set(exp))
    if missing or extra:
        fail(f"weights: missing {missing}, unexpected {extra} (for {L} blocks)")
    bad = [f"{n} {list(w[n].shape)} (expected {list(s)})" for n, s in exp.items() if w[n].shape != s]
    if bad:
        fail("weights: wrong shapes: " + ", ".join(bad))
    return {"arch": "gpt", "L": L, "C": C, "V": V, "max_len": max_len, "tied": tied, "names": list(exp)}


# ---------------------------------------------------------------- torch model

def forward(p, cfg, x, heads, gelu):
    B, T = x.shape
    L, C = cfg["L"], cfg["C"]
    hd = C // heads

    def ln(z, k):
        return F.layer_norm(z, (C,), p[k + ".weight"], p[k + ".bias"], eps=1e-5)

    def lin(z, k):
        return F.linear(z, p[k + ".weight"], p[k + ".bias"])

    h = p["layers.0.weight"][x] + p["layers.1.weight"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for k in range(2, L + 2):
        b = f"layers.{k}."
        q, kk, v = lin(ln(h, b + "ln_1"), b + "attn.c_attn").split(C, dim=-1)
        q, kk, v = (t.view(B, T, heads, hd).transpose(1, 2) for t in (q, kk, v))  # [B, H, T, hd]
        att = (q @ kk.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + lin(y, b + "attn.c_proj")
        m = F.gelu(lin(ln(h, b + "ln_2"), b + "mlp.c_fc"), approximate="tanh" if gelu == "tanh" else "none")
        h = h + lin(m, b + "mlp.c_proj")
    h = ln(h, f"layers.{L + 2}")
    head = p["layers.0.weight"] if cfg["tied"] else p[f"layers.{L + 3}.weight"]
    return h @ head.T


def rope_tables(T, hd, theta, dtype):
    """Hugging Face's LlamaRotaryEmbedding: inverse frequencies and angles in float32, cos and sin
    of [T, hd] (each frequency twice: the halves of rotate_half), cast to the model's type."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = torch.arange(T).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def llama_forward(p, cfg, x, heads, kv_heads, theta, eps):
    B, T = x.shape
    L, C, I = cfg["L"], cfg["C"], cfg["I"]
    hd = C // heads

    def rms(z, k):
        return p[k] * (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps))

    cos, sin = rope_tables(T, hd, theta, p["layers.0.weight"].dtype)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    h = p["layers.0.weight"][x]
    for k in range(1, L + 1):
        b = f"layers.{k}."
        qkv = F.linear(rms(h, b + "input_layernorm.weight"), p[b + "self_attn.qkv_proj.weight"])
        q, kk, v = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
        q = q.view(B, T, heads, hd).transpose(1, 2)  # [B, H, T, hd]
        kk = kk.view(B, T, kv_heads, hd).transpose(1, 2)
        v = v.view(B, T, kv_heads, hd).transpose(1, 2)
        q, kk = q * cos + rotate_half(q) * sin, kk * cos + rotate_half(kk) * sin
        kk = kk.repeat_interleave(heads // kv_heads, dim=1)  # Hugging Face's repeat_kv
        v = v.repeat_interleave(heads // kv_heads, dim=1)
        att = (q @ kk.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + F.linear(y, p[b + "self_attn.o_proj.weight"])
        gate, up = F.linear(rms(h, b + "post_attention_layernorm.weight"), p[b + "mlp.gate_up_proj.weight"]).split(I, -1)
        h = h + F.linear(F.silu(gate) * up, p[b + "mlp.down_proj.weight"])
    h = rms(h, f"layers.{L + 1}.weight")
    head = p["layers.0.weight"] if cfg["tied"] else p[f"layers.{L + 2}.weight"]
    return h @ head.T


def run(args, log=print):
    """Trains args.steps AdamW steps on one fixed batch; writes the requested outputs and returns
    (result dict, step-1 gradients as float64 numpy, step-1 logits)."""
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    dtype = torch.float64 if args.double else torch.float32
    w = read_safetensors(args.weights)
    cfg = check_weights(w)
    V, C, T, B = cfg["V"], cfg["C"], args.context, args.batch
    if args.heads < 1 or C % args.heads:
        fail(f"--heads {args.heads} does not divide the {C} channels")
    kv_heads = args.kv_heads or args.heads
    if cfg["arch"] == "llama":
        if args.heads % kv_heads or cfg["qkv_rows"] != (args.heads + 2 * kv_heads) * (C // args.heads):
            fail(f"--heads {args.heads} --kv-heads {kv_heads} do not match qkv_proj's {cfg['qkv_rows']} rows")
    elif T > cfg["max_len"]:
        fail(f"--context {T} exceeds the position embedding's {cfg['max_len']} rows")
    if args.steps < 1:
        fail("--steps must be at least 1")
    x, y = make_batch(load_tokens(args.tokens, args.format, args.dtype), B, T)
    if max(x.max(), y.max()) >= V:
        fail(f"token id {max(x.max(), y.max())} is outside the vocabulary of {V}")
    x, y = torch.from_numpy(x), torch.from_numpy(y)

    # Parameters are plain leaf tensors so a tied head is just a second use of the embedding.
    p = {n: torch.tensor(w[n], dtype=dtype, requires_grad=True) for n in cfg["names"]}
    if args.decay_matrices_only:  # GPT-2 recipe: decay 2-D tensors, not biases or norms
        groups = [{"params": [t for t in p.values() if t.dim() == 2], "weight_decay": args.weight_decay},
                  {"params": [t for t in p.values() if t.dim() != 2], "weight_decay": 0.0}]
    else:
        groups = [{"params": list(p.values()), "weight_decay": args.weight_decay}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)

    losses, grads, logits1 = [], None, None
    for i in range(1, args.steps + 1):
        opt.zero_grad(set_to_none=True)
        if cfg["arch"] == "llama":
            logits = llama_forward(p, cfg, x, args.heads, kv_heads, args.rope_theta, args.rms_eps)
        else:
            logits = forward(p, cfg, x, args.heads, args.gelu)
        loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))  # mean over B*T
        loss.backward()
        losses.append(loss.item())
        log(f"step {i} loss {loss.item():.10g}")
        if i == 1:  # before clipping: the raw gradient is what the trainer's should match
            grads = {n: t.grad.detach().double().numpy().copy() for n, t in p.items()}
            logits1 = logits.detach().double().numpy().copy()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(list(p.values()), args.clip)
        opt.step()

    result = {
        "losses": losses, "tokens_per_step": B * T,
        "params": sum(t.numel() for t in p.values()),
        "logits_step1": {"shape": list(logits1.shape), "sum": float(logits1.sum()),
                         "abs_sum": float(np.abs(logits1).sum())},
        "grad_norms_step1": {n: float(np.linalg.norm(g.ravel())) for n, g in grads.items()},
        "config": {k: cfg[k] for k in ("arch", "L", "C", "V", "max_len", "tied")} | {
            "heads": args.heads, "kv_heads": kv_heads, "context": T, "batch": B, "gelu": args.gelu,
            "dtype": "float64" if args.double else "float32", "torch": torch.__version__},
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.grads_out:
        write_safetensors(args.grads_out, grads, {"format": "pt", "what": "gradients at step 1"})
    if args.logits_out:
        np.save(args.logits_out, logits1.astype(np.float32))
    return result, grads, logits1


# ---------------------------------------------------------------- self-test

def numpy_loss(w, L, H, x, y, gelu, tied):
    """Float64 forward written separately from the torch one (explicit per-head loop, hand-written
    layernorm, GELU and log-softmax), the yardstick for the torch path."""
    B, T = x.shape
    C = w["layers.0.weight"].shape[1]
    hd = C // H
    erf = np.vectorize(math.erf)

    def ln(z, k):
        mu = z.mean(-1, keepdims=True)
        var = ((z - mu) ** 2).mean(-1, keepdims=True)
        return (z - mu) / np.sqrt(var + 1e-5) * w[k + ".weight"] + w[k + ".bias"]

    def act(z):
        if gelu == "erf":
            return 0.5 * z * (1 + erf(z / math.sqrt(2)))
        return 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))

    h = w["layers.0.weight"][x] + w["layers.1.weight"][:T]
    future = np.triu(np.ones((T, T), dtype=bool), 1)
    for k in range(2, L + 2):
        P = lambda n: w[f"layers.{k}.{n}"]
        qkv = ln(h, f"layers.{k}.ln_1") @ P("attn.c_attn.weight").T + P("attn.c_attn.bias")
        y_att = np.zeros_like(h)
        for j in range(H):
            c = slice(j * hd, (j + 1) * hd)
            q, kk, v = qkv[..., 0:C][..., c], qkv[..., C:2 * C][..., c], qkv[..., 2 * C:][..., c]
            s = np.einsum("btd,bsd->bts", q, kk) / math.sqrt(hd)
            s[:, future] = -np.inf
            s = np.exp(s - s.max(-1, keepdims=True))
            y_att[..., c] = (s / s.sum(-1, keepdims=True)) @ v
        h = h + y_att @ P("attn.c_proj.weight").T + P("attn.c_proj.bias")
        m = act(ln(h, f"layers.{k}.ln_2") @ P("mlp.c_fc.weight").T + P("mlp.c_fc.bias"))
        h = h + m @ P("mlp.c_proj.weight").T + P("mlp.c_proj.bias")
    h = ln(h, f"layers.{L + 2}")
    logits = h @ (w["layers.0.weight"] if tied else w[f"layers.{L + 3}.weight"]).T
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -logp[np.arange(B)[:, None], np.arange(T)[None, :], y].mean()


def numpy_llama_loss(w, L, H, KV, theta, eps, x, y, tied):
    """Float64 Llama forward written separately from the torch one: explicit per-head loop, each
    rotation pair (e, e + D/2) turned by its angle, key/value head j // (H / KV) for query head j."""
    B, T = x.shape
    C = w["layers.0.weight"].shape[1]
    D, I = C // H, w["layers.1.mlp.down_proj.weight"].shape[1]
    f = (1.0 / np.power(np.float32(theta), np.arange(0, D, 2, dtype=np.float32) / np.float32(D))).astype(np.float32)
    ang = (np.arange(T, dtype=np.float32)[:, None] * f[None, :]).astype(np.float64)  # [T, D/2], f32 angles
    cs, sn = np.cos(ang), np.sin(ang)

    def rms(z, k):
        return w[k] * z / np.sqrt((z * z).mean(-1, keepdims=True) + eps)

    def rot(z):  # z [B, T, D]
        a, b = z[..., : D // 2], z[..., D // 2:]
        return np.concatenate([a * cs - b * sn, b * cs + a * sn], -1)

    h = w["layers.0.weight"][x]
    future = np.triu(np.ones((T, T), dtype=bool), 1)
    for k in range(1, L + 1):
        P = lambda n: w[f"layers.{k}.{n}"]
        qkv = rms(h, f"layers.{k}.input_layernorm.weight") @ P("self_attn.qkv_proj.weight").T
        y_att = np.zeros_like(h)
        for j in range(H):
            g = j // (H // KV)
            q = rot(qkv[..., j * D:(j + 1) * D])
            kk = rot(qkv[..., H * D + g * D:H * D + (g + 1) * D])
            v = qkv[..., (H + KV) * D + g * D:(H + KV) * D + (g + 1) * D]
            s = np.einsum("btd,bsd->bts", q, kk) / math.sqrt(D)
            s[:, future] = -np.inf
            s = np.exp(s - s.max(-1, keepdims=True))
            y_att[..., j * D:(j + 1) * D] = (s / s.sum(-1, keepdims=True)) @ v
        h = h + y_att @ P("self_attn.o_proj.weight").T
        gu = rms(h, f"layers.{k}.post_attention_layernorm.weight") @ P("mlp.gate_up_proj.weight").T
        gate, up = gu[..., :I], gu[..., I:]
        h = h + (gate / (1 + np.exp(-gate)) * up) @ P("mlp.down_proj.weight").T
    h = rms(h, f"layers.{L + 1}.weight")
    logits = h @ (w["layers.0.weight"] if tied else w[f"layers.{L + 2}.weight"]).T
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -logp[np.arange(B)[:, None], np.arange(T)[None, :], y].mean()


def llama_self_test(rng, d, check, go):
    V, C, L, H, KV, I, T, B, theta = 40, 16, 2, 4, 2, 24, 9, 3, 50.0
    tok = rng.integers(0, V, size=B * T + 3).astype("<u2")
    tok.tofile(f"{d}/llama.bin")
    x, y = make_batch(tok.astype(np.int64), B, T)
    for tied in (False, True):
        tag = "llama " + ("tied" if tied else "untied")
        w = {}
        for n, shp in llama_shapes(L, C, V, I, (H + 2 * KV) * (C // H), tied).items():
            norm = "layernorm" in n or n == f"layers.{L + 1}.weight"
            w[n] = ((1 + 0.2 * rng.standard_normal(shp)) if norm else 0.3 * rng.standard_normal(shp)).astype(np.float32)
        path = f"{d}/llama_{tag[6:]}.safetensors"
        write_safetensors(path, w, {"format": "pt"})
        w64 = {n: a.astype(np.float64) for n, a in w.items()}
        base = ["--weights", path, "--tokens", f"{d}/llama.bin", "--context", str(T), "--batch", str(B),
                "--heads", str(H), "--kv-heads", str(KV), "--rope-theta", str(theta), "--rms-eps", "1e-6"]
        res, grads, _ = go(base + ["--double", "--steps", "1"])
        ref = numpy_llama_loss(w64, L, H, KV, theta, 1e-6, x, y, tied)
        rel = abs(res["losses"][0] - ref) / abs(ref)
        check(f"{tag} loss vs numpy", rel < 1e-6, f"torch {res['losses'][0]:.12f} numpy {ref:.12f} rel {rel:.1e}")
        f = lambda ww: numpy_llama_loss(ww, L, H, KV, theta, 1e-6, x, y, tied)
        for name in ("layers.1.self_attn.qkv_proj.weight", "layers.2.mlp.gate_up_proj.weight"):
            dvec = rng.standard_normal(grads[name].shape)
            plus, minus = dict(w64), dict(w64)
            plus[name] = w64[name] + 1e-5 * dvec
            minus[name] = w64[name] - 1e-5 * dvec
            fd = (f(plus) - f(minus)) / 2e-5
            ad = float((grads[name] * dvec).sum())
            rel = abs(fd - ad) / max(abs(fd), 1e-12)
            check(f"{tag} grad {name} random direction", rel < 1e-5,
                  f"autograd {ad:.9e} finite-diff {fd:.9e} rel {rel:.1e}")


def random_weights(rng, V, C, L, max_len, tied):
    # Large enough weights that attention is far from uniform and every term matters.
    w = {}
    for n, shp in expected_shapes(L, C, V, max_len, tied).items():
        if re.search(r"ln_\d\.weight$", n) or n == f"layers.{L + 2}.weight":
            a = 1 + 0.2 * rng.standard_normal(shp)
        else:
            a = 0.3 * rng.standard_normal(shp)
        w[n] = a.astype(np.float32)
    return w


def self_test():
    rng = np.random.default_rng(1234)
    V, C, L, H, T, B = 50, 16, 2, 4, 8, 3
    failures = []

    def check(what, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {detail}")
        if not ok:
            failures.append(what)

    def go(argv):
        return run(parse_args(argv), log=lambda *_: None)

    with tempfile.TemporaryDirectory() as d:
        tok = rng.integers(0, V, size=B * T + 7).astype("<u2")
        tok.tofile(f"{d}/train.bin")
        hdr = np.zeros(256, "<i4")
        hdr[:3] = [LLMC_MAGIC, 1, tok.size]
        with open(f"{d}/train.llmc", "wb") as f:
            f.write(hdr.tobytes() + tok.tobytes())
        x, y = make_batch(tok.astype(np.int64), B, T)

        for tied in (True, False):
            tag = "tied" if tied else "untied"
            w = random_weights(rng, V, C, L, T + 4, tied)
            path = f"{d}/w_{tag}.safetensors"
            write_safetensors(path, w, {"format": "pt"})
            w64 = {n: a.astype(np.float64) for n, a in w.items()}
            base = ["--weights", path, "--tokens", f"{d}/train.bin", "--context", str(T),
                    "--batch", str(B), "--heads", str(H)]

            # (1) step-1 loss against the numpy float64 forward, both GELU forms.
            for gelu in ("erf", "tanh"):
                res, _, _ = go(base + ["--double", "--steps", "1", "--gelu", gelu])
                ref = numpy_loss(w64, L, H, x, y, gelu, tied)
                rel = abs(res["losses"][0] - ref) / abs(ref)
                check(f"{tag} gelu={gelu} loss vs numpy", rel < 1e-6,
                      f"torch {res['losses'][0]:.12f} numpy {ref:.12f} rel {rel:.1e}")

            # (2) autograd against central differences of the numpy forward, along a random
            # direction over the whole tensor and for the tensor's largest single entries.
            gpath = f"{d}/g_{tag}.safetensors"
            res, grads, logits = go(base + ["--double", "--steps", "1", "--grads-out", gpath,
                                            "--logits-out", f"{d}/l.npy", "--out", f"{d}/r.json"])
            f = lambda ww: numpy_loss(ww, L, H, x, y, "erf", tied)
            eps = 1e-5
            for name in ("layers.2.attn.c_attn.weight", "layers.0.weight", "layers.3.ln_1.bias"):
                g = grads[name]
                probes = [("random direction", rng.standard_normal(g.shape))]
                for idx in np.argsort(-np.abs(g).ravel())[:2]:
                    e = np.zeros(g.size)
                    e[idx] = 1
                    probes.append((f"entry {np.unravel_index(idx, g.shape)}", e.reshape(g.shape)))
                for label, dvec in probes:
                    plus, minus = dict(w64), dict(w64)
                    plus[name] = w64[name] + eps * dvec
                    minus[name] = w64[name] - eps * dvec
                    fd = (f(plus) - f(minus)) / (2 * eps)
                    ad = float((g * dvec).sum())
                    rel = abs(fd - ad) / max(abs(fd), 1e-12)
                    check(f"{tag} grad {name} {label}", rel < 1e-5,
                          f"autograd {ad:.9e} finite-diff {fd:.9e} rel {rel:.1e}")

            # The written files hold what the run computed.
            g_file = read_safetensors(gpath)
            worst = max(np.abs(g_file[n] - grads[n]).max() / (np.abs(grads[n]).max() + 1e-30) for n in grads)
            check(f"{tag} --grads-out / --logits-out / --out", set(g_file) == set(w) and worst < 1e-6
                  and np.load(f"{d}/l.npy").shape == (B, T, V)
                  and json.load(open(f"{d}/r.json"))["losses"] == res["losses"],
                  f"{len(g_file)} gradients (worst F32 rounding {worst:.1e}), logits {list(logits.shape)}")

            # (3) float32 (the default) training lowers the loss over 10 steps at lr 1e-2,
            # run through the command line as a user would.
            out = subprocess.run([sys.executable, os.path.abspath(__file__)] + base +
                                 ["--steps", "10", "--lr", "1e-2", "--out", f"{d}/r10.json"],
                                 capture_output=True, text=True)
            losses = json.load(open(f"{d}/r10.json"))["losses"] if out.returncode == 0 else [0]
            lines = out.stdout.strip().splitlines()
            check(f"{tag} 10 float32 steps at lr 1e-2 (CLI)", out.returncode == 0 and len(lines) == 10
                  and losses[-1] < losses[0] - 0.1,
                  " ".join(f"{v:.4f}" for v in losses))

        # llm.c token files give the same batch.
        a = go(base + ["--double", "--steps", "1"])[0]["losses"][0]
        b = go(base[:2] + ["--tokens", f"{d}/train.llmc", "--format", "llmc"] + base[4:]
               + ["--double", "--steps", "1"])[0]["losses"][0]
        check("llmc token file equals raw file", a == b, f"{a:.12f} {b:.12f}")

        llama_self_test(rng, d, check, go)

        # Malformed weight files are refused with exit code 2.
        bad = {"missing name": {k: v for k, v in w.items() if k != "layers.2.ln_2.bias"},
               "extra name": w | {"layers.2.extra": np.zeros(3, np.float32)},
               "wrong shape": w | {"layers.3.mlp.c_fc.bias": np.zeros(C, np.float32)}}
        for what, ww in bad.items():
            write_safetensors(f"{d}/bad.safetensors", ww)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                try:
                    go(["--weights", f"{d}/bad.safetensors"] + base[2:])
                    code = 0
                except SystemExit as e:
                    code = e.code
            check(f"rejects {what}", code == 2, err.getvalue().strip()[:110])

    print(f"self-test: {'all passed' if not failures else f'{len(failures)} FAILED'} (torch {torch.__version__})")
    return 0 if not failures else 1


# ---------------------------------------------------------------- command line

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--self-test", action="store_true", help="check this script against numpy and exit")
    ap.add_argument("--weights", help="safetensors file with mirrored's tensor names")
    ap.add_argument("--tokens", help="token file (nanoGPT train.bin, or llm.c with --format llmc)")
    ap.add_argument("--format", choices=("raw", "llmc"), default="raw")
    ap.add_argument("--dtype", choices=("uint16", "uint32"), default="uint16")
    ap.add_argument("--context", type=int, help="T")
    ap.add_argument("--batch", type=int, help="B: windows at token offsets 0, T, ..., (B-1)T")
    ap.add_argument("--heads", type=int, help="attention heads")
    ap.add_argument("--kv-heads", type=int, default=0, help="Llama: key/value heads (default: --heads)")
    ap.add_argument("--rope-theta", type=float, default=10000.0, help="Llama: the rotary base")
    ap.add_argument("--rms-eps", type=float, default=1e-6, help="Llama: RMSNorm's epsilon")
    ap.add_argument("--gelu", choices=("erf", "tanh"), default="erf", help="exact erf form, or the tanh approximation")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--decay-matrices-only", action="store_true", help="weight decay on 2-D tensors only")
    ap.add_argument("--clip", type=float, default=0.0, help="> 0: clip the global gradient norm")
    ap.add_argument("--double", action="store_true", help="compute in float64")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="result JSON")
    ap.add_argument("--grads-out", help="step-1 gradients, safetensors F32")
    ap.add_argument("--logits-out", help="step-1 logits [B, T, V], .npy float32")
    args = ap.parse_args(argv)
    if not args.self_test:
        missing = [o for o in ("weights", "tokens", "context", "batch", "heads") if getattr(args, o) is None]
        if missing:
            ap.error("required: " + ", ".join("--" + o for o in missing))
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.self_test:
        return self_test()
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
