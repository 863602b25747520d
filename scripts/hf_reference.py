#!/usr/bin/env python3
"""Hugging Face model folders for checking mirrored's import (model.init_from) and export
(--names hf), with nothing downloaded: small GPT-2- and Llama-shaped folders with random weights,
and their logits by an independent PyTorch forward written from the architectures of Hugging
Face's GPT2LMHeadModel, LlamaForCausalLM and Qwen2ForCausalLM (their modules' names, GPT-2's
Conv1D layout [in, out], rotate-half rotary embeddings and their rope_scaling, repeat_kv, Qwen2's
biases on q, k and v).

    hf_reference.py make DIR --arch gpt2|llama|qwen2 [--dtype f32|bf16|f16] [--shards N] [--hub-names]
        [--vocab V --hidden C --layers L --heads H --kv-heads KV --intermediate I --positions P
         --tied --rope-scaling linear|llama3 --seed S]
        config.json and model.safetensors (or N shards and model.safetensors.index.json) with
        random weights stored in the dtype. --hub-names: GPT-2 as the hub's gpt2 is stored (GPT2Model's
        names without "transformer.", the attention-mask buffers).
    hf_reference.py logits DIR --tokens val.bin --context T --batch B [--compare ours.npy]
        [--logits-out ref.npy] [--out result.json]
        the loss of the folder's model on windows k*T .. k*T+T of the token file (k < B) and its
        logits, computed in float64 from the stored values; --compare: the largest difference of
        another [B, T*V] logits file relative to the largest logit, written to result.json.
    hf_reference.py generate DIR --prompt-ids "1 2 3" [--tokens 128 --threads 2 --out r.json]
        greedy generation as Hugging Face's loop with past_key_values does it, in float32, timed.
Needs only PyTorch and NumPy (Debian: python3-torch python3-numpy).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import load_tokens, make_batch, rotate_half  # noqa: E402


def fail(msg):
    print(f"hf_reference: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- safetensors in any float type

def tensor_bytes(a, dtype):
    """float array -> (safetensors dtype, little-endian bytes), rounded to nearest even for bf16."""
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
    if dtype == "bf16":
        return "BF16", t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    if dtype == "f16":
        return "F16", t.numpy().astype("<f2").tobytes()
    return "F32", t.numpy().astype("<f4").tobytes()


def write_file(path, tensors, dtype):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors.items():
        kind, b = tensor_bytes(a, dtype) if a.dtype != np.uint8 else ("U8", a.tobytes())
        header[name] = {"dtype": kind, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return off


def read_file(path):
    raw = open(path, "rb").read()
    n = struct.unpack_from("<Q", raw, 0)[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        if t["dtype"] == "BF16":
            bits = np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16
            a = bits.view(np.float32)
        elif t["dtype"] in ("F16", "F32"):
            a = np.frombuffer(data[b:e], dtype="<f2" if t["dtype"] == "F16" else "<f4")
        else:
            continue  # buffers such as GPT-2's masks
        out[name] = torch.tensor(a.astype(np.float64).reshape(t["shape"]))
    return out


def read_folder(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    p = {}
    for f in files:
        p.update(read_file(os.path.join(d, f)))
    return {(n if n.startswith(("transformer.", "model.", "lm_head")) else "transformer." + n): t for n, t in p.items()}


# ---------------------------------------------------------------- random folders

def gpt2_tensors(rng, a):
    V, C, L, P, inner = a.vocab, a.hidden, a.layers, a.positions, a.intermediate or 4 * a.hidden
    w = lambda *s: rng.normal(0, 0.02 if len(s) > 1 else 0.1, s)  # noqa: E731
    t = {"transformer.wte.weight": w(V, C), "transformer.wpe.weight": w(P, C)}
    for i in range(L):
        h = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            t[h + ln + ".weight"], t[h + ln + ".bias"] = 1 + w(C), w(C)
        for name, (i_, o) in {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, inner),
                              "mlp.c_proj": (inner, C)}.items():
            t[h + name + ".weight"], t[h + name + ".bias"] = w(i_, o), w(o)  # Conv1D: [in, out]
    t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = 1 + w(C), w(C)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": C, "n_head": a.heads,
              "n_layer": L, "n_positions": P, "n_ctx": P, "n_inner": a.intermediate or None, "vocab_size": V,
              "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new", "resid_pdrop": 0.1,
              "embd_pdrop": 0.1, "attn_pdrop": 0.1, "scale_attn_weights": True, "tie_word_embeddings": True}
    return t, config


def llama_tensors(rng, a):
    V, C, L, H, KV, I = a.vocab, a.hidden, a.layers, a.heads, a.kv_heads or a.heads, a.intermediate
    D = C // H
    w = lambda *s: rng.normal(0, 0.02 if len(s) > 1 else 0.1, s)  # noqa: E731
    t = {"model.embed_tokens.weight": w(V, C)}
    for i in range(L):
        h = f"model.layers.{i}."
        t[h + "input_layernorm.weight"] = 1 + w(C)
        t[h + "self_attn.q_proj.weight"] = w(H * D, C)
        t[h + "self_attn.k_proj.weight"] = w(KV * D, C)
        t[h + "self_attn.v_proj.weight"] = w(KV * D, C)
        t[h + "self_attn.o_proj.weight"] = w(C, H * D)
        if a.arch == "qwen2":  # Qwen2Attention: q, k and v with biases, o_proj without
            t[h + "self_attn.q_proj.bias"], t[h + "self_attn.k_proj.bias"] = w(H * D), w(KV * D)
            t[h + "self_attn.v_proj.bias"] = w(KV * D)
        t[h + "post_attention_layernorm.weight"] = 1 + w(C)
        t[h + "mlp.gate_proj.weight"] = w(I, C)
        t[h + "mlp.up_proj.weight"] = w(I, C)
        t[h + "mlp.down_proj.weight"] = w(C, I)
    t["model.norm.weight"] = 1 + w(C)
    if not a.tied:
        t["lm_head.weight"] = w(V, C)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
              "intermediate_size": I, "num_attention_heads": H, "num_key_value_heads": KV, "num_hidden_layers": L,
              "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "rope_scaling": None, "vocab_size": V,
              "max_position_embeddings": a.positions, "tie_word_embeddings": bool(a.tied),
              "attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    if a.arch == "qwen2":  # Qwen2Config: no attention_bias key (the biases are always there)
        del config["attention_bias"], config["mlp_bias"]
        config.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rope_theta": 1000000.0,
                       "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": L})
    if a.rope_scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": 4.0}
    elif a.rope_scaling == "llama3":  # Llama 3.1's, with an original context that puts pairs in every band
        config["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 512}
    return t, config


def make(a):
    rng = np.random.default_rng(a.seed)
    t, config = (gpt2_tensors if a.arch == "gpt2" else llama_tensors)(rng, a)
    if a.hub_names:
        t = {n[len("transformer."):]: v for n, v in t.items()}
        for i in range(a.layers):  # the causal mask GPT2Attention once saved as a buffer
            t[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, a.positions, a.positions), dtype=np.uint8))
    os.makedirs(a.dir, exist_ok=True)
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    names = list(t)
    if a.shards <= 1:
        write_file(os.path.join(a.dir, "model.safetensors"), t, a.dtype)
        return 0
    weight_map, total = {}, 0
    for k in range(a.shards):
        file = f"model-{k + 1:05d}-of-{a.shards:05d}.safetensors"
        part = {n: t[n] for n in names[k::a.shards]}
        total += write_file(os.path.join(a.dir, file), part, a.dtype)
        weight_map.update({n: file for n in part})
    with open(os.path.join(a.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return 0


# ---------------------------------------------------------------- the forward passes

def rope_inverse_frequencies(D, cfg):
    """LlamaRotaryEmbedding's inverse frequencies in float32, with config.json's rope_scaling:
    linear divides them all by the factor; llama3 divides those whose wavelength exceeds the
    original context / low_freq_factor, keeps those under the original context / high_freq_factor
    and interpolates the ones between."""
    inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    s = cfg.get("rope_scaling")
    if not s:
        return inv
    kind = s.get("rope_type", s.get("type"))
    if kind == "linear":
        return inv / s["factor"]
    assert kind == "llama3", kind
    factor, lo, hi = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    n = s["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv
    slowed = torch.where(wavelength > n / lo, inv / factor, inv)
    t = (n / wavelength - lo) / (hi - lo)
    between = (wavelength >= n / hi) & (wavelength <= n / lo)
    return torch.where(between, (1 - t) * slowed / factor + t * slowed, slowed)


def rope_tables(T, D, cfg, dtype):
    """cos and sin of [T, D] (each frequency twice: the halves of rotate_half), cast to dtype."""
    freqs = torch.arange(T).float()[:, None] * rope_inverse_frequencies(D, cfg)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def adapted(lora, name, z, out):
    """PEFT's LoRA on module `name`: out + scale * (z A^T) B^T, where lora = (scale, {name: (A, B)})."""
    if lora and name in lora[1]:
        a, b = lora[1][name]
        return out + lora[0] * ((z @ a.T) @ b.T)
    return out


def gpt2_logits(p, cfg, x, lora=None):
    """GPT2LMHeadModel: wte + wpe; per block ln_1, c_attn (Conv1D: x @ W + b), causal attention
    scaled by 1/sqrt(head_dim), c_proj, ln_2, c_fc, gelu_new, c_proj; ln_f; the head tied to wte."""
    B, T = x.shape
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg.get("layer_norm_epsilon", 1e-5)
    D = C // H
    conv1d = lambda z, n: adapted(lora, n, z, z @ p[n + ".weight"] + p[n + ".bias"])  # noqa: E731
    ln = lambda z, n: F.layer_norm(z, (C,), p[n + ".weight"], p[n + ".bias"], eps)  # noqa: E731
    act = cfg.get("activation_function", "gelu_new")
    gelu = (lambda z: F.gelu(z)) if act == "gelu" else (
        lambda z: 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z.pow(3)))))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    h = p["transformer.wte.weight"][x] + p["transformer.wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        b = f"transformer.h.{i}."
        q, k, v = conv1d(ln(h, b + "ln_1"), b + "attn.c_attn").split(C, dim=-1)
        q, k, v = (z.view(B, T, H, D).transpose(1, 2) for z in (q, k, v))
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(D)).masked_fill(~causal, float("-inf")).softmax(-1)
        h = h + conv1d((att @ v).transpose(1, 2).reshape(B, T, C), b + "attn.c_proj")
        h = h + conv1d(gelu(conv1d(ln(h, b + "ln_2"), b + "mlp.c_fc")), b + "mlp.c_proj")
    return ln(h, "transformer.ln_f") @ p["transformer.wte.weight"].T


def llama_logits(p, cfg, x, lora=None):
    """LlamaForCausalLM: embed_tokens; per layer input_layernorm (RMSNorm), q/k/v_proj, rotary
    embeddings (rotate_half), repeat_kv, causal attention, o_proj, post_attention_layernorm,
    down_proj(silu(gate_proj) * up_proj); norm; lm_head (or embed_tokens when tied)."""
    B, T = x.shape
    C, L, H = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    KV, eps = cfg.get("num_key_value_heads") or H, cfg["rms_norm_eps"]
    D = C // H
    norm = lambda z, n: p[n] * (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps))  # noqa: E731
    proj = lambda z, n: adapted(lora, n, z, F.linear(z, p[n + ".weight"], p.get(n + ".bias")))  # noqa: E731
    cos, sin = rope_tables(T, D, cfg, torch.float64)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    h = p["model.embed_tokens.weight"][x]
    for i in range(L):
        a = f"model.layers.{i}."
        r = norm(h, a + "input_layernorm.weight")
        q = proj(r, a + "self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
        k = proj(r, a + "self_attn.k_proj").view(B, T, KV, D).transpose(1, 2)
        v = proj(r, a + "self_attn.v_proj").view(B, T, KV, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(D)).masked_fill(~causal, float("-inf")).softmax(-1)
        h = h + proj((att @ v).transpose(1, 2).reshape(B, T, H * D), a + "self_attn.o_proj")
        r = norm(h, a + "post_attention_layernorm.weight")
        h = h + proj(F.silu(proj(r, a + "mlp.gate_proj")) * proj(r, a + "mlp.up_proj"), a + "mlp.down_proj")
    head = p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]
    return norm(h, "model.norm.weight") @ head.T


def logits(a):
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    p = read_folder(a.dir)
    x, y = make_batch(load_tokens(a.tokens, "raw", "uint16"), a.batch, a.context)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    z = (gpt2_logits if cfg["model_type"] == "gpt2" else llama_logits)(p, cfg, x)
    V = z.shape[-1]
    result = {"loss": F.cross_entropy(z.reshape(-1, V), y.reshape(-1)).item()}
    if a.compare:
        ours = np.load(a.compare).astype(np.float64).reshape(-1)
        ref = z.numpy().reshape(-1)[:ours.size]
        if ours.size == 0 or ours.size % (a.context * V):
            fail(f"{a.compare}: {ours.size} values are not whole windows of {a.context} x {V} logits")
        result["max_rel_diff"] = float(np.abs(ours - ref).max() / np.abs(ref).max())
        result["compared"] = int(ours.size)
    if a.logits_out:
        np.save(a.logits_out, z.numpy().astype(np.float32))
    print(json.dumps(result))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def lora_train(a):
    """LoRA fine-tuning as PEFT does it: the base frozen, A and B of each target trained by AdamW
    (weight decay 0) on the same batch every step (windows k*T, k < B); the loss before each step."""
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    p = read_folder(a.dir)
    init = read_file(a.adapters)  # mirrored's names: layers.<k>.<...>.<module>.lora_A.weight
    gpt2 = cfg["model_type"] == "gpt2"
    first = 2 if gpt2 else 1  # mirrored's index of the first block
    adapters = {}
    for name, t in init.items():
        parts = name.split(".")
        k, module = int(parts[1]), ".".join(parts[2:-2])
        hf = (f"transformer.h.{k - first}." if gpt2 else f"model.layers.{k - first}.") + module
        adapters.setdefault(hf, [None, None])[0 if parts[-2] == "lora_A" else 1] = t.clone().requires_grad_(True)
    lora = (a.alpha / a.rank, {n: tuple(ab) for n, ab in adapters.items()})
    x, y = make_batch(load_tokens(a.tokens, "raw", "uint16"), a.batch, a.context)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    params = [t for ab in adapters.values() for t in ab]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    forward = gpt2_logits if gpt2 else llama_logits
    losses = []
    for _ in range(a.steps):
        z = forward(p, cfg, x, lora)
        loss = F.cross_entropy(z.reshape(-1, z.shape[-1]), y.reshape(-1))
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    # the merged weight in PyTorch's [out, in] (GPT-2's Conv1D stores the transpose)
    merged = {n: ((p[n + ".weight"].T if gpt2 else p[n + ".weight"]) + lora[0] * (b @ a_)).detach()
              for n, (a_, b) in lora[1].items()}
    result = {"losses": losses, "adapters": len(adapters)}
    print(json.dumps(result))
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    if a.merged_out:  # base + scale B A, in the folder's layout (GPT-2's Conv1D: transposed)
        write_file(a.merged_out, {n + ".weight": (m.T if gpt2 else m).numpy() for n, m in merged.items()}, "f32")
    return 0


def conv1d(z, w, b):
    """GPT-2's Conv1D as transformers computes it: addmm(bias, x, weight [in, out])."""
    return torch.addmm(b, z.reshape(-1, z.shape[-1]), w).view(*z.shape[:-1], w.shape[-1])


def cached_logits(p, cfg, x, start, cache):
    """One call of a Hugging Face-style generation loop: the logits of new tokens x [1, n] at positions
    start.. with every layer's keys and values so far in cache (a list, extended here), as
    GPT2LMHeadModel and LlamaForCausalLM do with past_key_values."""
    gpt2 = cfg["model_type"] == "gpt2"
    n = x.shape[1]
    if gpt2:
        C, H, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
        KV, eps = H, cfg.get("layer_norm_epsilon", 1e-5)
    else:
        C, H, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
        KV, eps = cfg.get("num_key_value_heads") or H, cfg["rms_norm_eps"]
    D = C // H
    if gpt2:
        h = p["transformer.wte.weight"][x] + p["transformer.wpe.weight"][start:start + n]
    else:
        h = p["model.embed_tokens.weight"][x]
        cos, sin = rope_tables(start + n, D, cfg, h.dtype)
        cos, sin = cos[start:], sin[start:]
    mask = torch.ones(n, start + n, dtype=torch.bool).tril(diagonal=start)
    for i in range(L):
        if gpt2:
            b = f"transformer.h.{i}."
            r = F.layer_norm(h, (C,), p[b + "ln_1.weight"], p[b + "ln_1.bias"], eps)
            q, k, v = conv1d(r, p[b + "attn.c_attn.weight"], p[b + "attn.c_attn.bias"]).split(C, dim=-1)
        else:
            b = f"model.layers.{i}."
            r = p[b + "input_layernorm.weight"] * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))
            q, k, v = (F.linear(r, p[b + f"self_attn.{m}_proj.weight"]) for m in "qkv")
        q = q.view(1, n, H, D).transpose(1, 2)
        k = k.view(1, n, KV, D).transpose(1, 2)
        v = v.view(1, n, KV, D).transpose(1, 2)
        if not gpt2:
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if len(cache) > i:
            k, v = torch.cat((cache[i][0], k), 2), torch.cat((cache[i][1], v), 2)
            cache[i] = (k, v)
        else:
            cache.append((k, v))
        if KV != H:
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(D)).masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(1, n, C)
        if gpt2:
            h = h + conv1d(y, p[b + "attn.c_proj.weight"], p[b + "attn.c_proj.bias"])
            r = F.layer_norm(h, (C,), p[b + "ln_2.weight"], p[b + "ln_2.bias"], eps)
            z = conv1d(r, p[b + "mlp.c_fc.weight"], p[b + "mlp.c_fc.bias"])
            z = 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z.pow(3))))
            h = h + conv1d(z, p[b + "mlp.c_proj.weight"], p[b + "mlp.c_proj.bias"])
        else:
            h = h + F.linear(y, p[b + "self_attn.o_proj.weight"])
            r = p[b + "post_attention_layernorm.weight"] * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))
            h = h + F.linear(F.silu(F.linear(r, p[b + "mlp.gate_proj.weight"])) * F.linear(r, p[b + "mlp.up_proj.weight"]),
                             p[b + "mlp.down_proj.weight"])
    if gpt2:
        return F.layer_norm(h, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps) @ \
            p["transformer.wte.weight"].T
    h = p["model.norm.weight"] * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))
    return h @ (p["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else p["lm_head.weight"]).T


def generate(a):
    """Greedy generation with a key/value cache in float32, timed from the first new token."""
    import time
    torch.set_num_threads(a.threads)
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    p = {n: t.float() for n, t in read_folder(a.dir).items()}
    ids = [int(w) for w in a.prompt_ids.split()]
    out, cache = [], []
    with torch.no_grad():
        start = time.perf_counter()
        logits = cached_logits(p, cfg, torch.tensor([ids]), 0, cache)
        for _ in range(a.tokens):
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            logits = cached_logits(p, cfg, torch.tensor([[nxt]]), len(ids) + len(out) - 1, cache)
        seconds = time.perf_counter() - start
    result = {"tokens": a.tokens, "seconds": seconds, "tokens_per_s": a.tokens / seconds, "ids": out,
              "threads": a.threads}
    print(json.dumps({k: v for k, v in result.items() if k != "ids"}))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="a random Hugging Face folder")
    m.add_argument("dir")
    m.add_argument("--arch", choices=("gpt2", "llama", "qwen2"), required=True)
    m.add_argument("--rope-scaling", choices=("linear", "llama3"), help="Llama/Qwen2: config.json's rope_scaling")
    m.add_argument("--dtype", choices=("f32", "bf16", "f16"), default="f32")
    m.add_argument("--shards", type=int, default=1)
    m.add_argument("--hub-names", action="store_true")
    m.add_argument("--vocab", type=int, default=96)
    m.add_argument("--hidden", type=int, default=32)
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=0)
    m.add_argument("--intermediate", type=int, default=0, help="Llama: required; GPT-2: n_inner (default 4 C)")
    m.add_argument("--positions", type=int, default=64)
    m.add_argument("--tied", action="store_true", help="Llama: tie lm_head to embed_tokens")
    m.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("logits", help="the loss and logits of a folder's model on a token file")
    g.add_argument("dir")
    g.add_argument("--tokens", required=True)
    g.add_argument("--context", type=int, required=True)
    g.add_argument("--batch", type=int, required=True)
    g.add_argument("--compare")
    g.add_argument("--logits-out")
    g.add_argument("--out")
    t = sub.add_parser("lora", help="LoRA fine-tuning of a folder's model from given adapters")
    t.add_argument("dir")
    t.add_argument("--adapters", required=True, help="safetensors: the initial lora_A/lora_B under mirrored's names")
    t.add_argument("--tokens", required=True)
    t.add_argument("--context", type=int, required=True)
    t.add_argument("--batch", type=int, required=True)
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--rank", type=int, required=True)
    t.add_argument("--alpha", type=float, required=True)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--out", required=True)
    t.add_argument("--merged-out", help="the trained adapters merged into their weights (safetensors)")
    n = sub.add_parser("generate", help="greedy generation with a key/value cache, timed")
    n.add_argument("dir")
    n.add_argument("--prompt-ids", required=True)
    n.add_argument("--tokens", type=int, default=128)
    n.add_argument("--threads", type=int, default=2)
    n.add_argument("--out")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.cmd == "generate":
        return generate(a)
    if a.cmd == "lora":
        return lora_train(a)
    if a.cmd == "make":
        if a.arch != "gpt2" and a.intermediate <= 0:
            fail("--intermediate is required for a Llama")
        return make(a)
    return logits(a)


if __name__ == "__main__":
    sys.exit(main())
