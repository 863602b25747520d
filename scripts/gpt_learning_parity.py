#!/usr/bin/env python3
"""Learning parity of the shipped language model: mirrored against an independent PyTorch
implementation of the same model, initialisation, data order and recipe, over several seeds.

For each seed S, `mirrored train CONFIG --set run.seed=S` trains as shipped; the PyTorch run
draws its own initial weights from the same distributions with torch's generator seeded S (the
embeddings and attention weights N(0, 0.02), c_fc he_uniform, the MLP's c_proj glorot_uniform,
layernorms 1 and 0, biases 0), takes the same windows in the same order (the loader's Philox
shuffle of the tiled windows, reimplemented here and pinned to the C++ by a known permutation
in tests/test_transformer.cpp), and follows the same schedule (linear warmup, cosine to the floor),
AdamW, clipping and weight decay. Both are then evaluated on every tiled window of the
validation file. Within a seed the two runs share the data order but not the initial weights
(each draws its own), so the spread over seeds is the noise the two means are compared against.

    /usr/bin/python3 scripts/gpt_learning_parity.py --seeds 1,2,3 --out runs/parity
    /usr/bin/python3 scripts/gpt_learning_parity.py --report --out runs/parity
    /usr/bin/python3 scripts/gpt_learning_parity.py --self-test

Results go to OUT/<side>-seed<S>.json; a run whose file exists is not run again. Needs PyTorch,
NumPy and PyYAML (Debian: python3-torch python3-numpy python3-yaml).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MASK = 0xFFFFFFFF
STREAM_SHUFFLE = 3  # base/philox.h kStreamShuffle


def fail(msg):
    print(f"gpt_learning_parity: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------- the loader's data order

def philox(seed, counters, stream_a, stream_b):
    """Philox4x32-10 over a vector of 64-bit counters (base/philox.h's philox())."""
    c = np.asarray(counters, dtype=np.uint64)
    c0, c1 = c & MASK, c >> np.uint64(32)
    c2 = np.full_like(c0, stream_a)
    c3 = np.full_like(c0, stream_b)
    k0, k1 = seed & MASK, (seed >> 32) & MASK
    for rnd in range(10):
        if rnd > 0:
            k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & np.uint64(MASK),
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & np.uint64(MASK))
    return c0, c1, c2, c3


def permutation(n, seed, epoch):
    """data/loader.cpp's Loader::permutation: Fisher-Yates, position i swapped with a Philox draw."""
    p = list(range(n))
    if n < 2:
        return p
    v0, v1, _, _ = philox(seed, np.arange(n, dtype=np.uint64), STREAM_SHUFFLE, epoch & MASK)
    for i in range(n - 1, 0, -1):
        x = (int(v0[i]) << 32) | int(v1[i])
        j = (x * (i + 1)) >> 64
        p[i], p[j] = p[j], p[i]
    return p


def batch_windows(n_windows, batch, step):
    """The windows of global batch `step` (drop_last: every epoch holds n // batch batches)."""
    per_epoch = n_windows // batch
    epoch, b = divmod(step, per_epoch)
    return epoch, b * batch


# ---------------------------------------------------------------- the recipe

def learning_rate(opt, step, total):
    """mirrored/optimizer.cpp's learning_rate for warmup + cosine (or constant)."""
    base = opt["lr"]
    sched = opt.get("schedule", {}) or {}
    warmup = int(sched.get("warmup_steps", 0))
    if warmup > 0 and step < warmup:
        return base * (step + 1) / warmup
    if sched.get("type", "constant") != "cosine":
        return base
    span = max(total - warmup, 1)
    t = min(max((step - warmup) / span, 0.0), 1.0)
    floor = base * float(sched.get("min_lr_ratio", 0.0))
    return floor + (base - floor) * 0.5 * (1.0 + math.cos(math.pi * t))


def read_recipe(config_path):
    import yaml
    with open(config_path) as f:
        cfg = yaml.safe_load(f)
    layers = cfg["model"]["layers"]
    blocks = [l for l in layers if l["type"] == "transformer_block"]
    if [l["type"] for l in layers] != (["embedding", "position_embedding"] + ["transformer_block"] * len(blocks) +
                                       ["layernorm", "lm_head"]):
        fail(f"{config_path}: model.layers: expected embedding, position_embedding, transformer blocks, "
             "layernorm, lm_head (the shipped GPT's layout)")
    modelled = {"embedding": {"type", "vocab", "dim"}, "position_embedding": {"type", "max_len"},
                "transformer_block": {"type", "heads"}, "layernorm": {"type"}, "lm_head": {"type"}}
    for i, l in enumerate(layers):  # every other key (epsilon, dropout, an untied head ...) is not modelled here
        extra = sorted(set(l) - modelled[l["type"]])
        if extra:
            fail(f"{config_path}: model.layers.{i}: {', '.join(extra)}: this reference models the defaults only")
    opt = cfg["optimizer"]
    if opt.get("type") != "adamw" or opt.get("weight_decay_on", "all") != "all" or opt.get("scale_lr_with_replicas"):
        fail(f"{config_path}: optimizer: expected adamw with weight_decay_on: all, the rate not scaled")
    if (opt.get("schedule", {}) or {}).get("type", "constant") not in ("constant", "cosine"):
        fail(f"{config_path}: optimizer.schedule.type: this reference models constant and cosine")
    data = cfg["data"]
    if data.get("windows", "tiled") != "tiled" or not data.get("drop_last", True) or data.get("shuffle", True) is False:
        fail(f"{config_path}: data: expected tiled windows, shuffled, drop_last")
    if data.get("dtype", "uint16") != "uint16":
        fail(f"{config_path}: data.dtype: this reference reads uint16 token ids")
    train = cfg["train"]
    if train.get("precision", "fp32") != "fp32" or cfg["model"].get("loss") not in (None, "softmax_cross_entropy"):
        fail(f"{config_path}: expected train.precision fp32 and the default loss")
    if int(train.get("steps", 0)) <= 0:
        fail(f"{config_path}: train.steps: expected a number of steps (epochs are not modelled)")
    root = data["root"]
    root = os.environ.get("MIRRORED_DATA_DIR", root if os.path.isabs(root) else
                          os.path.normpath(os.path.join(os.path.dirname(config_path), root)))
    return {
        "V": int(layers[0]["vocab"]), "C": int(layers[0]["dim"]), "L": len(blocks),
        "heads": int(blocks[0]["heads"]), "max_len": int(layers[1]["max_len"]),
        "context": int(data["context"]), "train": os.path.join(root, data.get("train", "train.bin")),
        "val": os.path.join(root, data.get("test", "val.bin")), "batch": int(train["global_batch_size"]),
        "steps": int(train["steps"]), "opt": opt,
    }


# ---------------------------------------------------------------- PyTorch side

def init_weights(torch, shapes, gen):
    """mirrored's initialisers for the GPT's tensors, drawn from torch's generator."""
    p = {}
    for name, shp in shapes.items():
        if len(shp) == 1:
            t = torch.ones(shp) if name.endswith(".weight") else torch.zeros(shp)
        elif name.endswith("mlp.c_fc.weight"):  # dense + GELU: he_uniform
            bound = math.sqrt(6.0 / shp[1])
            t = (torch.rand(shp, generator=gen) * 2 - 1) * bound
        elif name.endswith("mlp.c_proj.weight"):  # dense without activation: glorot_uniform
            bound = math.sqrt(6.0 / (shp[0] + shp[1]))
            t = (torch.rand(shp, generator=gen) * 2 - 1) * bound
        else:  # embeddings, c_attn, attn.c_proj: GPT-2's N(0, 0.02)
            t = torch.randn(shp, generator=gen) * 0.02
        p[name] = t.requires_grad_(True)
    return p


def load_ids(ref, path):
    """uint16 ids, raw (nanoGPT) or after llm.c's header, as data/formats/tokens.cpp reads them."""
    head = np.fromfile(path, dtype="<i4", count=1)
    return ref.load_tokens(path, "llmc" if head.size and head[0] == ref.LLMC_MAGIC else "raw", "uint16")


def tiled(tok, context):
    n = (tok.size - 1) // context
    idx = np.arange(n)[:, None] * context + np.arange(context + 1)[None, :]
    return tok[idx]  # [n, context + 1]


def evaluate(torch, F, ref, p, r, windows):
    total, count = 0.0, 0
    with torch.no_grad():
        for b in range(0, windows.shape[0], 64):
            w = torch.from_numpy(windows[b:b + 64])
            logits = ref.forward(p, r, w[:, :-1], r["heads"], "exact")
            total += F.cross_entropy(logits.reshape(-1, r["V"]), w[:, 1:].reshape(-1), reduction="sum").item()
            count += w[:, 1:].numel()
    return total / count


def train_pytorch(r, seed, steps, threads, log):
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, HERE)
    import gpt_reference as ref
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed)
    shapes = ref.expected_shapes(r["L"], r["C"], r["V"], r["max_len"], tied=True)
    cfg = {"L": r["L"], "C": r["C"], "tied": True}
    r = dict(r, **cfg)
    p = init_weights(torch, shapes, gen)
    opt = r["opt"]
    betas = opt.get("betas", [0.9, 0.999])
    adamw = torch.optim.AdamW(list(p.values()), lr=opt["lr"], betas=(betas[0], betas[1]),
                              eps=float(opt.get("eps", 1e-8)), weight_decay=float(opt.get("weight_decay", 0.0)))
    clip = float(opt.get("grad_clip_norm", 0.0))
    train = tiled(load_ids(ref, r["train"]), r["context"])
    val = tiled(load_ids(ref, r["val"]), r["context"])
    B, n = r["batch"], train.shape[0]
    orders, t0, loss_sum, loss_count = {}, time.time(), 0.0, 0
    for step in range(steps):
        epoch, first = batch_windows(n, B, step)
        if epoch not in orders:
            orders = {epoch: np.asarray(permutation(n, seed, epoch))}
        w = torch.from_numpy(train[orders[epoch][first:first + B]])
        for g in adamw.param_groups:
            g["lr"] = learning_rate(opt, step, steps)
        adamw.zero_grad(set_to_none=True)
        logits = ref.forward(p, cfg, w[:, :-1], r["heads"], "exact")
        loss = F.cross_entropy(logits.reshape(-1, r["V"]), w[:, 1:].reshape(-1))
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(list(p.values()), clip)
        adamw.step()
        loss_sum, loss_count = loss_sum + loss.item(), loss_count + 1
        if (step + 1) % 100 == 0 or step + 1 == steps:
            log(f"pytorch seed {seed} step {step + 1} train loss {loss_sum / loss_count:.4f} "
                f"({(step + 1) * B / (time.time() - t0):.1f} samples/s)")
            last_train, loss_sum, loss_count = loss_sum / loss_count, 0.0, 0
    train_s = time.time() - t0
    val_loss = evaluate(torch, F, ref, p, r, val)
    return {"side": "pytorch", "seed": seed, "steps": steps, "test_loss": val_loss,
            "test_bits_per_token": val_loss / math.log(2), "train_loss": last_train,
            "train_seconds": train_s, "samples_per_s": steps * B / train_s, "threads": threads,
            "torch": torch.__version__}


# ---------------------------------------------------------------- mirrored side

def train_mirrored(config, binary, seed, steps, out, log):
    run_dir = os.path.join(out, f"mirrored-seed{seed}-run")
    cmd = [binary, "train", config, "--set", f"run.seed={seed}", "--set", f"run.output_dir={run_dir}",
           "--set", "checkpoint.resume=never", "--set", f"train.steps={steps}"]
    log(" ".join(cmd))
    t0 = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        fail(f"mirrored exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    return {"side": "mirrored", "seed": seed, "steps": s["steps"], "test_loss": s["test_loss"],
            "test_bits_per_token": s["test_loss"] / math.log(2), "train_loss": s["train_loss"],
            "wall_seconds": time.time() - t0, "devices": s["devices"], "blas": s["blas"]}


# ---------------------------------------------------------------- report

def report(out, seeds):
    rows = {}
    for side in ("mirrored", "pytorch"):
        for s in seeds:
            path = os.path.join(out, f"{side}-seed{s}.json")
            if os.path.exists(path):
                with open(path) as f:
                    rows.setdefault(side, []).append(json.load(f))
    print("| seed | mirrored, bits per token | PyTorch, bits per token |")
    print("|---|---|---|")
    for s in seeds:
        cell = []
        for side in ("mirrored", "pytorch"):
            r = [x for x in rows.get(side, []) if x["seed"] == s]
            cell.append(f"{r[0]['test_bits_per_token']:.4f}" if r else "-")
        print(f"| {s} | {cell[0]} | {cell[1]} |")
    stats = {}
    for side, rs in rows.items():
        v = [x["test_bits_per_token"] for x in rs]
        stats[side] = (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else float("nan"), len(v))
        print(f"{side}: mean {stats[side][0]:.4f}, sample std {stats[side][1]:.4f} over {len(v)} seeds")
    if len(stats) == 2 and min(s[2] for s in stats.values()) > 1:
        (ma, sa, na), (mb, sb, nb) = stats["mirrored"], stats["pytorch"]
        se = math.sqrt(sa * sa / na + sb * sb / nb)
        diff = ma - mb
        print(f"difference of means {diff:+.4f} bits per token; standard error {se:.4f}; "
              f"{abs(diff) / se if se > 0 else float('inf'):.2f} standard errors")
    return stats


# ---------------------------------------------------------------- self-test

KNOWN_PERMUTATION = [4, 3, 7, 9, 1, 8, 6, 2, 5, 0]  # Loader::permutation(10, 1, 0), as tests/test_transformer.cpp pins it


def self_test():
    # Random123's known answers for Philox4x32-10.
    got = [int(x[0]) for x in philox(0, [0], 0, 0)]
    assert got == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8], [hex(x) for x in got]
    got = [int(x[0]) for x in philox(0xFFFFFFFFFFFFFFFF, [0xFFFFFFFFFFFFFFFF], MASK, MASK)]
    assert got == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD], [hex(x) for x in got]
    # The C++ loader's permutation of 10 with seed 1, epoch 0 (tests/test_transformer.cpp pins the same).
    assert permutation(10, 1, 0) == KNOWN_PERMUTATION, permutation(10, 1, 0)
    assert sorted(permutation(1000, 7, 3)) == list(range(1000))
    opt = {"lr": 1.0, "schedule": {"type": "cosine", "warmup_steps": 10}}
    assert learning_rate(opt, 0, 110) == 0.1 and learning_rate(opt, 10, 110) == 1.0
    assert abs(learning_rate(opt, 60, 110) - 0.5) < 1e-12 and learning_rate(opt, 110, 110) == 0.0
    assert batch_windows(100, 32, 3) == (1, 0) and batch_windows(100, 32, 2) == (0, 64)
    print("gpt_learning_parity: self-test passed")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "python_gpt.yaml"))
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "mirrored"))
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--sides", default="mirrored,pytorch")
    ap.add_argument("--steps", type=int, default=0, help="0: the config's train.steps")
    ap.add_argument("--threads", type=int, default=2, help="PyTorch's intra-op threads")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "parity"))
    ap.add_argument("--report", action="store_true", help="only print the table of finished runs")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test()
    try:
        seeds = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        fail(f"--seeds {a.seeds}: expected integers separated by commas, e.g. 1,2,3")
    sides = a.sides.split(",")
    if not set(sides) <= {"mirrored", "pytorch"}:
        fail(f"--sides {a.sides}: expected mirrored, pytorch or both")
    if a.report:
        report(a.out, seeds)
        return
    if a.steps < 0 or a.threads < 1:
        fail("--steps must be 0 (the config's) or more, --threads at least 1")
    r = read_recipe(a.config)
    steps = a.steps or r["steps"]
    os.makedirs(a.out, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    for seed in seeds:
        for side in sides:
            path = os.path.join(a.out, f"{side}-seed{seed}.json")
            if os.path.exists(path):
                continue
            res = (train_mirrored(a.config, a.binary, seed, steps, a.out, log) if side == "mirrored"
                   else train_pytorch(r, seed, steps, a.threads, log))
            log(json.dumps(res))
            with open(path + ".tmp", "w") as f:
                json.dump(res, f, indent=1)
            os.replace(path + ".tmp", path)
    report(a.out, seeds)


if __name__ == "__main__":
    main()
