#!/usr/bin/env python3
"""mirrored's CPU replicas against PyTorch on the same work, side by side, in alternating rounds.

The work: the default run's MLP 784-512-256-10 (configs/fashion_mnist_mlp.yaml), global batch
128, SGD with momentum 0.9 and its learning-rate schedule, on Fashion-MNIST (or the IDX stand-in of
scripts/make_idx_dataset.py when the package is absent). Timed: training steps on pre-loaded data, after a warm-up.
--model cnn: configs/fashion_mnist_cnn.yaml's CNN instead (two 3x3 convolutions with batchnorm,
ReLU and max pooling, dense 256 with dropout, dense 10; SGD with momentum 0.9 and weight decay
5e-4; batch 128; mirrored's own horizontal flips are left on, PyTorch gets none: the comparison
favours PyTorch slightly).
--model resnet20: configs/cifar10_resnet20.yaml's ResNet-20 (SGD with momentum 0.9, weight decay
1e-4, batch 128) on synthetic CIFAR-shaped data for both sides (CIFAR-10 is not a package).
For both convolutional models PyTorch runs every configuration in its default NCHW layout and in
channels_last, oneDNN's preferred layout on CPUs; the fastest row of any kind is the peer.
--model gpt: configs/python_gpt.yaml's byte-level GPT (4 pre-LN blocks of width 128, 4 heads, exact
GELU, context 128, LM head tied to the embedding, no dropout; AdamW lr 0.002, betas (0.9, 0.99),
weight decay 0.1, gradient clipping at 1.0, its warm-up and cosine schedule; global batch 32) on
the token files of scripts/prepare_text.py --python-stdlib (runs/data/python-stdlib, written
first when missing). PyTorch trains the model as nanoGPT writes it (masked softmax attention on a
torch without scaled_dot_product_attention, as 1.13), on random windows of 129 tokens of train.bin
drawn before the clock starts; mirrored's loader draws its own windows while it trains.
torch.compile is used where the torch has it (1.13 has not). Rows are in tokens/s (steps x 32 x
128 / seconds).
--model llama: configs/python_llama.yaml's Llama-style model on the same windows (4 blocks of width
128: RMSNorm, rotary embeddings, 4 query heads sharing 2 key/value heads, SwiGLU MLP of 352, no
biases, untied head; AdamW betas (0.9, 0.95), weight decay 0.1 on matrices only). PyTorch trains it
as Hugging Face's LlamaForCausalLM computes it (rotate_half, repeat_kv; q/k/v and gate/up as one
product each, as mirrored does: the faster form for both).
--model llama_bpe: configs/python_llama_bpe.yaml's, the same model with a vocabulary of 2,048 (its
embedding and head 8x wider) on the BPE token files `make train-llm` writes
(runs/data/python-stdlib-bpe, written first when missing).

  mirrored   build/mirrored bench-step on cpu:1 and cpu:2 (one replica per core)
  PyTorch    one process with 1 and with 2 threads (OpenMP threads sleep when idle:
             OMP_WAIT_POLICY=passive, as a careful user sets it), and DistributedDataParallel
             with gloo, 2 processes x 1 thread (64 rows each); glibc's malloc told to keep
             freed memory (TORCH_MALLOC below; BENCH_TORCH_MALLOC=default for glibc's own), as
             PyTorch's CPU tuning guide advises an allocator that reuses it: each step's fresh
             tensors otherwise fault their pages in

PyTorch runs on the BLAS kernel mirrored chose (OPENBLAS_CORETYPE, read from `mirrored
devices`), so the comparison is kernel for kernel; --also-env-kernel adds PyTorch on whatever
kernel the environment gives it. Prints medians over the rounds and the ratios.

    /usr/bin/python3 scripts/bench_cpu_vs_pytorch.py [--model mlp|cnn|resnet20|gpt|llama|llama_bpe] [--rounds 3] [--steps 1500] [--json out.json]

--steps and --warmup default to 1500 and 100, for gpt, llama and llama_bpe to 120 and 20 (on a 2-core machine
about a minute per row).

Needs python3-torch and python3-numpy (Debian/Ubuntu packages)."""
import argparse
import gzip
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION = "/usr/share/datasets/fashion-mnist"
TOKENS = os.path.join(ROOT, "runs", "data", "python-stdlib")  # configs/python_gpt.yaml's data.root
GPT = {"vocab": 256, "dim": 128, "context": 128, "layers": 4, "heads": 4, "batch": 32}  # configs/python_gpt.yaml
TOKENS_BPE = os.path.join(ROOT, "runs", "data", "python-stdlib-bpe")  # configs/python_llama_bpe.yaml's
LANGUAGE_MODELS = ("gpt", "llama", "llama_bpe")
LLAMA = {"kv_heads": 2, "intermediate": 352, "theta": 10000.0, "eps": 1e-6}  # configs/python_llama.yaml, else as GPT


# PyTorch's processes: glibc's malloc keeps what PyTorch frees (no mmap, however large the block;
# no trimming; a 256 MiB top pad) instead of returning it to the system each step. Where page
# faults are dear (the 2-vCPU VMs: torch.sqrt into a fresh 16 MiB tensor 13.7 ms, into a reused
# one 0.9) this makes PyTorch's AdamW steps up to 4x faster. mirrored allocates nothing in a step
# and is unaffected. A MALLOC_* variable already set wins; BENCH_TORCH_MALLOC=default sets none.
TORCH_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_MMAP_THRESHOLD_": "33554432",
                "MALLOC_TRIM_THRESHOLD_": "4294967296", "MALLOC_TOP_PAD_": "268435456"}


def torch_malloc(env):
    """The TORCH_MALLOC settings the environment does not already make."""
    if env.get("BENCH_TORCH_MALLOC") == "default":
        return {}
    return {k: v for k, v in TORCH_MALLOC.items() if k not in env}


def lr_at(step, total, base=0.05, warmup=200):
    """The config's schedule: linear warm-up, then cosine to zero."""
    if step < warmup:
        return base * (step + 1) / warmup
    t = min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0)
    return 0.5 * base * (1 + math.cos(math.pi * t))


def load_data(np):
    path = os.path.join(os.environ.get("MIRRORED_DATA_DIR", FASHION), "train-images-idx3-ubyte.gz")
    if os.path.exists(path):
        with gzip.open(path) as f:
            x = np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255.0
        with gzip.open(path.replace("images-idx3", "labels-idx1")) as f:
            y = np.frombuffer(f.read(), dtype=np.uint8, offset=8).astype(np.int64)
        x = (x - x.mean()) / x.std()
        return x, y, path
    rng = np.random.default_rng(0)
    raise SystemExit(f"no Fashion-MNIST at {path}")


SYNTHETIC_CIFAR = "data: {dataset: synthetic, input_shape: [32, 32, 3], classes: 10, train_samples: 6000, test_samples: 500}\n"


def synthetic_cifar(np):
    """Random CIFAR-shaped images and labels: only the step's speed is measured."""
    rng = np.random.default_rng(0)
    return rng.standard_normal((6000, 3, 32, 32), dtype=np.float32), rng.integers(0, 10, 6000).astype(np.int64)


def make_resnet20(nn):
    """He et al.'s ResNet-20, as configs/cifar10_resnet20.yaml builds it."""
    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                      nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
            self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                             if stride != 1 else nn.Identity())
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.body(x) + self.shortcut(x))

    layers = [nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(Block(cin, cout, stride if i == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def make_torch_model(nn, kind):
    if kind.startswith("resnet20"):
        return make_resnet20(nn)
    if kind.startswith("cnn"):
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(7 * 7 * 64, 256), nn.ReLU(), nn.Dropout(0.4), nn.Linear(256, 10))
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


def make_gpt(torch):
    """configs/python_gpt.yaml's GPT as nanoGPT writes it (model.py): pre-LN blocks, fused qkv,
    causal attention (masked softmax where the torch has no scaled_dot_product_attention, as 1.13
    has not), exact GELU, tied LM head, no dropout."""
    nn, F = torch.nn, torch.nn.functional
    V, C, T, L, H = GPT["vocab"], GPT["dim"], GPT["context"], GPT["layers"], GPT["heads"]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

        def forward(self, x):
            B, t, _ = x.size()
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (z.view(B, t, H, C // H).transpose(1, 2) for z in (q, k, v))
            if hasattr(F, "scaled_dot_product_attention"):  # torch 2: nanoGPT's flash path
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                y = F.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, t, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(C), Attention(), nn.LayerNorm(C)
            self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(), nn.Linear(4 * C, C))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, V, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as GPT-2's
            for name, p in self.named_parameters():  # GPT-2's initialisation
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            t = idx.size(1)
            x = self.wte(idx) + self.wpe(torch.arange(t, dtype=torch.long))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, V), targets.reshape(-1))

    return Model()


def token_files(kind):
    return TOKENS_BPE if kind == "llama_bpe" else TOKENS


def make_llama(torch, vocab):
    """configs/python_llama.yaml's model as Hugging Face's Llama computes it: RMSNorm (f32), rotary
    embeddings (rotate_half), grouped-query attention (repeat_kv), SwiGLU, no biases, untied head."""
    nn, F = torch.nn, torch.nn.functional
    V, C, T, L, H = vocab, GPT["dim"], GPT["context"], GPT["layers"], GPT["heads"]
    KV, I, D = LLAMA["kv_heads"], LLAMA["intermediate"], GPT["dim"] // GPT["heads"]
    inv = 1.0 / (LLAMA["theta"] ** (torch.arange(0, D, 2).float() / D))
    emb = torch.arange(T).float()[:, None] * inv[None, :]
    cos, sin = torch.cat((emb, emb), -1).cos(), torch.cat((emb, emb), -1).sin()

    def rotate_half(x):
        return torch.cat((-x[..., D // 2:], x[..., :D // 2]), -1)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(C))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + LLAMA["eps"]))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
            self.qkv_proj = nn.Linear(C, (H + 2 * KV) * D, bias=False)
            self.o_proj = nn.Linear(C, C, bias=False)
            self.gate_up_proj = nn.Linear(C, 2 * I, bias=False)
            self.down_proj = nn.Linear(I, C, bias=False)
            self.mask = torch.tril(torch.ones(T, T, dtype=torch.bool))  # not a buffer: gloo broadcasts no bools

        def forward(self, x):
            B, t, _ = x.size()
            q, k, v = self.qkv_proj(self.input_layernorm(x)).split([H * D, KV * D, KV * D], -1)
            q, k, v = q.view(B, t, H, D).transpose(1, 2), k.view(B, t, KV, D).transpose(1, 2), v.view(B, t, KV, D).transpose(1, 2)
            q, k = q * cos[:t] + rotate_half(q) * sin[:t], k * cos[:t] + rotate_half(k) * sin[:t]
            k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
                y = F.softmax(att.masked_fill(~self.mask[:t, :t], float("-inf")), dim=-1) @ v
            x = x + self.o_proj(y.transpose(1, 2).contiguous().view(B, t, C))
            gate, up = self.gate_up_proj(self.post_attention_layernorm(x)).split(I, -1)
            return x + self.down_proj(F.silu(gate) * up)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, C)
            self.layers = nn.ModuleList(Block() for _ in range(L))
            self.norm = RMSNorm()
            self.lm_head = nn.Linear(C, V, bias=False)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx, targets):
            x = self.embed_tokens(idx)
            for block in self.layers:
                x = block(x)
            return F.cross_entropy(self.lm_head(self.norm(x)).view(-1, V), targets.reshape(-1))

    return Model()


def time_steps(step, warmup, steps, batch, rank, out_path):
    """Runs step(i) for the warm-up, then times `steps` more; rank 0 writes samples/s to out_path."""
    for i in range(warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    elapsed = time.perf_counter() - t0
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"samples_per_sec": steps * batch / elapsed}, f)


def gpt_worker(rank, world, threads, steps, warmup, out_path, kind="gpt"):
    """torch_worker's GPT or Llama: every step's windows are drawn from train.bin before the clock starts."""
    import torch
    import numpy as np

    tokens = np.fromfile(os.path.join(token_files(kind), "train.bin"), dtype="<u2")
    total, batch, T = warmup + steps, GPT["batch"], GPT["context"]
    per = batch // world
    starts = np.random.default_rng(0).integers(0, len(tokens) - T - 1, size=(total, batch))  # the same on every rank
    windows = torch.from_numpy(tokens[starts[:, rank * per:(rank + 1) * per, None] + np.arange(T + 1)].astype(np.int64))
    model = make_gpt(torch) if kind == "gpt" else make_llama(torch, 2048 if kind == "llama_bpe" else 256)
    if kind == "gpt":
        groups, betas = model.parameters(), (0.9, 0.99)
    else:  # weight_decay_on: matrices
        groups = [{"params": [p for p in model.parameters() if p.dim() == 2], "weight_decay": 0.1},
                  {"params": [p for p in model.parameters() if p.dim() != 2], "weight_decay": 0.0}]
        betas = (0.9, 0.95)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    if hasattr(torch, "compile"):  # torch 2: what its users would turn on
        model = torch.compile(model)
    # foreach: the documented faster form of the same update (1.13's default is the per-tensor loop)
    opt = torch.optim.AdamW(groups, lr=0.002, betas=betas, weight_decay=0.1, foreach=True)

    def step(i):
        for g in opt.param_groups:
            g["lr"] = lr_at(i, 2000, base=0.002, warmup=100)  # the config's schedule over its 2000 steps
        opt.zero_grad(set_to_none=True)
        w = windows[i]
        model(w[:, :-1], w[:, 1:]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    time_steps(step, warmup, steps, batch, rank, out_path)


def torch_worker(rank, world, threads, steps, warmup, out_path, port, kind="mlp"):
    """One PyTorch process: `world` > 1 is DDP over gloo; writes samples/s to out_path (rank 0)."""
    import torch  # before numpy: the BLAS torch loads first is the one its GEMMs bind to
    import numpy as np

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if world > 1:
        import torch.distributed as dist

        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    if kind in LANGUAGE_MODELS:
        return gpt_worker(rank, world, threads, steps, warmup, out_path, kind)
    x, y = synthetic_cifar(np) if kind.startswith("resnet20") else load_data(np)[:2]
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    X, Y = torch.from_numpy(x)[perm].contiguous(), torch.from_numpy(y)[perm].contiguous()  # shuffled once
    if kind.startswith("cnn"):
        X = X.reshape(-1, 1, 28, 28)
    nn = torch.nn
    model = make_torch_model(nn, kind)
    if kind.endswith("-channels-last"):  # oneDNN's preferred layout on CPUs
        model, X = model.to(memory_format=torch.channels_last), X.contiguous(memory_format=torch.channels_last)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    decay = {"cnn": 5e-4, "resnet20": 1e-4}.get(kind.removesuffix("-channels-last"), 0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=decay)
    loss_fn = nn.CrossEntropyLoss()
    batch, per = 128, 128 // world
    batches = len(Y) // batch
    total = warmup + steps

    def step(i):
        lo = (i % batches) * batch + rank * per
        for g in opt.param_groups:
            g["lr"] = lr_at(i, total)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(X[lo:lo + per]), Y[lo:lo + per]).backward()
        opt.step()

    time_steps(step, warmup, steps, batch, rank, out_path)


def free_port():
    """A port no one listens on now: each DDP run gets its own, since a port the previous run
    used may linger and make the next rendezvous wait for minutes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(kind, steps, warmup, env, peer_script=None, model="mlp"):
    """A fresh interpreter per measurement, so that thread settings and OpenBLAS's kernel apply.
    peer_script: an external peer with the same command line (the reference measurements'
    pytorch_cpu_peer.py), run instead of the one here."""
    if peer_script:
        world, threads = (2, 1) if kind == "ddp" else (1, int(kind))
        args = [sys.executable, peer_script, "--threads", str(threads), "--steps", str(steps), "--warmup", str(warmup)]
        if world > 1:
            args += ["--ddp", str(world)]
        e = dict(env, OMP_WAIT_POLICY="passive", OPENBLAS_NUM_THREADS=str(threads), **torch_malloc(env))
        out = subprocess.run(args, env=e, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])["samples_per_sec"]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        world, threads = (2, 1) if kind == "ddp" else (1, int(kind))
        code = ("import sys; sys.path.insert(0, %r); import bench_cpu_vs_pytorch as b; import torch.multiprocessing as mp\n"
                "if %d > 1: mp.spawn(b.torch_worker, args=(%d, %d, %d, %d, %r, %d, %r), nprocs=%d)\n"
                "else: b.torch_worker(0, 1, %d, %d, %d, %r, 0, %r)\n") % (
                    os.path.dirname(os.path.abspath(__file__)), world, world, threads, steps, warmup, out, free_port(),
                    model, world, threads, steps, warmup, out, model)
        e = dict(env, OMP_WAIT_POLICY="passive", OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                 MKL_NUM_THREADS=str(threads), **torch_malloc(env))
        subprocess.run([sys.executable, "-c", code], env=e, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)["samples_per_sec"]


def resnet20_synthetic_config(folder):
    """configs/cifar10_resnet20.yaml with its data block replaced by synthetic CIFAR-shaped data."""
    lines = open(os.path.join(ROOT, "configs", "cifar10_resnet20.yaml")).read().splitlines(keepends=True)
    start = next(i for i, l in enumerate(lines) if l.startswith("data:"))
    end = next(i for i, l in enumerate(lines) if i > start and not l.startswith((" ", "#")))
    path = os.path.join(folder, "resnet20_synthetic.yaml")
    with open(path, "w") as f:
        f.writelines(lines[:start] + [SYNTHETIC_CIFAR] + lines[end:])
    return path


def run_mirrored(devices, steps, warmup, model="mlp"):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "step.json")
        env = dict(os.environ)
        if model in LANGUAGE_MODELS:
            config = os.path.join(ROOT, "configs", "python_%s.yaml" % model)
            env["MIRRORED_DATA_DIR"] = token_files(model)  # the files PyTorch reads, whatever the variable said
        else:
            config = (resnet20_synthetic_config(d) if model == "resnet20"
                      else os.path.join(ROOT, "configs", "fashion_mnist_%s.yaml" % model))
        subprocess.run([os.path.join(ROOT, "build", "mirrored"), "bench-step", config, "--devices", devices, "--steps", str(steps),
                        "--warmup", str(warmup), "--json", out], check=True, stdout=subprocess.DEVNULL, env=env)
        with open(out) as f:
            return json.load(f)["results"][0]["samples_per_sec"]


def mirrored_blas():
    text = subprocess.run([os.path.join(ROOT, "build", "mirrored"), "devices"], capture_output=True, text=True).stdout
    line = next((l for l in text.splitlines() if l.startswith("BLAS: ")), "BLAS: unknown")
    m = re.search(r"kernel (\w+)", line)
    return line[len("BLAS: "):], (m.group(1) if m else None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["mlp", "cnn", "resnet20", "gpt", "llama", "llama_bpe"], default="mlp",
                    help="the default run's MLP, configs/fashion_mnist_cnn.yaml's CNN, "
                    "configs/cifar10_resnet20.yaml's ResNet-20 on synthetic data, configs/python_gpt.yaml's GPT, "
                    "configs/python_llama.yaml's Llama-style model or configs/python_llama_bpe.yaml's")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, help="timed steps per row (default 1500; gpt 120)")
    ap.add_argument("--warmup", type=int, help="untimed steps first (default 100; gpt 20)")
    ap.add_argument("--also-env-kernel", action="store_true", help="also PyTorch on the environment's BLAS kernel")
    ap.add_argument("--json", help="write the medians here")
    ap.add_argument("--peer-script", help="an external PyTorch peer with the same flags, e.g. "
                    "../shared/reference/pytorch_cpu_peer.py")
    a = ap.parse_args()
    if a.peer_script and a.model != "mlp":
        ap.error("--peer-script measures the MLP only")
    gpt = a.model in LANGUAGE_MODELS
    a.steps = a.steps if a.steps is not None else (120 if gpt else 1500)
    a.warmup = a.warmup if a.warmup is not None else (20 if gpt else 100)
    # rows in tokens/s for the language model: samples (sequences of 128 tokens) x 128
    scale, unit = (GPT["context"], "tokens/s") if gpt else (1, "samples/s")
    scratch = tempfile.TemporaryDirectory()
    if a.model == "llama_bpe":
        if not os.path.exists(os.path.join(TOKENS_BPE, "train.bin")):  # as `make train-llm` writes them
            files = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_text.py"), "--python-stdlib",
                                    "--list"], check=True, capture_output=True, text=True).stdout.split()
            subprocess.run([os.path.join(ROOT, "build", "mirrored"), "tokenize", *files, "--train-bpe", "2048",
                            "--val-every", "10", "--out", TOKENS_BPE], check=True, stdout=subprocess.DEVNULL)
    elif gpt:
        if not os.path.exists(os.path.join(TOKENS, "train.bin")):  # as `make train-gpt` writes them
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_text.py"), "--python-stdlib",
                            "--out", TOKENS], check=True, stdout=subprocess.DEVNULL)
    elif not os.path.exists(os.path.join(os.environ.get("MIRRORED_DATA_DIR", FASHION), "train-images-idx3-ubyte.gz")):
        # no Fashion-MNIST package: the same stand-in scripts/gpu_check.sh trains on, for both sides
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_idx_dataset.py"), scratch.name], check=True,
                       stdout=subprocess.DEVNULL)
        os.environ["MIRRORED_DATA_DIR"] = scratch.name
    blas, kernel = mirrored_blas()
    same = dict(os.environ)
    if kernel:
        same["OPENBLAS_CORETYPE"] = kernel
    m = a.model
    rows = [("mirrored cpu:1", lambda: run_mirrored("cpu:1", a.steps, a.warmup, m)),
            ("mirrored cpu:2", lambda: run_mirrored("cpu:2", a.steps, a.warmup, m)),
            ("PyTorch 1 thread", lambda: run_torch("1", a.steps, a.warmup, same, a.peer_script, m)),
            ("PyTorch 2 threads", lambda: run_torch("2", a.steps, a.warmup, same, a.peer_script, m)),
            ("PyTorch DDP gloo 2x1", lambda: run_torch("ddp", a.steps, a.warmup, same, a.peer_script, m))]
    if m in ("cnn", "resnet20"):  # convolutions: PyTorch in channels_last too
        rows += [("PyTorch 1 thread, channels_last", lambda: run_torch("1", a.steps, a.warmup, same, None, m + "-channels-last")),
                 ("PyTorch 2 threads, channels_last", lambda: run_torch("2", a.steps, a.warmup, same, None, m + "-channels-last")),
                 ("PyTorch DDP gloo 2x1, channels_last",
                  lambda: run_torch("ddp", a.steps, a.warmup, same, None, m + "-channels-last"))]
    if a.also_env_kernel:
        env = dict(os.environ)
        rows += [("PyTorch 1 thread, environment's kernel", lambda: run_torch("1", a.steps, a.warmup, env, a.peer_script, m)),
                 ("PyTorch 2 threads, environment's kernel", lambda: run_torch("2", a.steps, a.warmup, env, a.peer_script, m))]
    samples = {name: [] for name, _ in rows}
    for r in range(a.rounds):  # alternating rounds: drift on a shared machine hits every row alike
        for name, fn in rows:
            samples[name].append(fn() * scale)
        print(f"round {r + 1}/{a.rounds} ({unit}): " + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in samples.items()),
              file=sys.stderr)
    med = {n: statistics.median(v) for n, v in samples.items()}
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
    print(f"machine: {cpu}, {os.cpu_count()} cores; BLAS: {blas}")
    print(f"model: {a.model}; PyTorch ({a.peer_script or 'the peer in this script'}) on OPENBLAS_CORETYPE={kernel}; "
          f"medians of {a.rounds} alternating rounds, {a.steps} steps each\n")
    print(f"{'':42} {unit:>12} {'min':>10} {'max':>10}")
    for n, v in samples.items():
        print(f"{n:42} {med[n]:12,.0f} {min(v):10,.0f} {max(v):10,.0f}")
    # PyTorch's best on the same kernel: any thread count, layout or DDP (the environment's
    # kernel rows are extra information, not the peer)
    one = [n for n in samples if n.startswith("PyTorch 1 thread") and "environment" not in n]
    threads = one + [n for n in samples if n.startswith("PyTorch 2 threads") and "environment" not in n]
    ddp = [n for n in samples if n.startswith("PyTorch DDP")]
    print()
    print(f"mirrored cpu:1 / PyTorch 1 thread:          {med['mirrored cpu:1'] / max(med[n] for n in one):.2f}x")
    print(f"mirrored cpu:2 / best of PyTorch 1, 2 thr.: {med['mirrored cpu:2'] / max(med[n] for n in threads):.2f}x")
    print(f"mirrored cpu:2 / PyTorch DDP gloo 2x1:      {med['mirrored cpu:2'] / max(med[n] for n in ddp):.2f}x")
    print(f"mirrored cpu:2 / PyTorch's best row:        {med['mirrored cpu:2'] / max(med[n] for n in threads + ddp):.2f}x")
    # Paired by round against the fastest PyTorch row of that round: a round's rows ran minutes
    # apart at most, so slow phases of a shared machine cancel more than in the ratio of medians.
    paired = [mine / max(theirs) for mine, *theirs in
              zip(samples["mirrored cpu:2"], *(samples[n] for n in threads + ddp))]
    print(f"cpu:2 / PyTorch's fastest, paired by round: {statistics.median(paired):.2f}x median "
          f"({min(paired):.2f}x - {max(paired):.2f}x)")
    # A shared VM changes speed for minutes at a time; say so when a row's rounds disagree, since
    # then the medians mix two machines and the paired ratio is the steadier number.
    unsteady = [n for n, v in samples.items() if len(v) > 1 and max(v) > 1.15 * min(v)]
    if unsteady:
        print("note: rounds of " + ", ".join(unsteady) + " differ by more than 15% (max/min): the machine's "
              "speed changed during the run; compare the paired ratio, or rerun")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": cpu, "blas": blas, "pytorch_kernel": kernel, "model": a.model, "unit": unit,
                       "steps": a.steps, "warmup": a.warmup, "rounds": a.rounds, "medians": med, "samples": samples,
                       "cpu2_over_best_torch_by_round": paired}, f, indent=2)


if __name__ == "__main__":
    main()
