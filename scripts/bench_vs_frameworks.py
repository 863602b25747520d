#!/usr/bin/env python3
"""mirrored against PyTorch (eager, and the whole step as a CUDA graph) and JAX (jit) on one GPU,
side by side in one run, with the physical bound of each row.

The work: the MLP 784-1024-1024-10 of configs/synthetic_mlp.yaml, SGD with momentum 0.9, random
data of Fashion-MNIST shape already on the GPU, at batch 256 and 2048, in fp32, tf32 and bf16
(PyTorch: autocast; JAX: bf16 parameters and inputs). mirrored: `build/mirrored bench-step` on
cuda:0 with the same batch and precision, and 4 replicas sharing GPU 0 at a quarter of the largest
batch each. Each framework runs in its own process, one after the other, in alternating rounds;
medians. The peers are information: one that is missing or fails leaves its column empty with
the reason below the row, and the exit status is 1 only when mirrored's own runs fail.

Bound per row: the larger of the step's GEMM FLOPs (forward and backward: 6 x batch x weights)
over `mirrored bench-gemm`'s rate at 4096 in that precision, and the optimizer's bytes (read
parameters, gradients, momentum; write parameters, momentum: 20 bytes per parameter) over the
device-to-device copy bandwidth measured here.

    python3 scripts/bench_vs_frameworks.py [--rounds 3] [--steps 300] [--json out.json]
        [--mirrored build/mirrored] [--batches 256,2048] [--precisions fp32,tf32,bf16] [--warmup 20]
        [--gemm-size 4096]

Without a GPU (no CUDA for PyTorch) it runs the CPU comparison instead,
scripts/bench_cpu_vs_pytorch.py, with the same arguments it understands."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIRRORED = os.path.join(ROOT, "build", "mirrored")  # --mirrored: scripts/gpu_check.sh passes the binary it uses
SIZES = [784, 1024, 1024, 10]
WEIGHTS = sum(a * b for a, b in zip(SIZES[:-1], SIZES[1:]))
PARAMS = WEIGHTS + sum(SIZES[1:])
BATCHES = (256, 2048)
GEMM_SIZE = 4096
PRECISIONS = ("fp32", "tf32", "bf16")

# One framework's timing, run as `python3 THIS --peer NAME --batch B --precision P --steps N`:
# prints microseconds per step. Separate processes, so that one framework's allocator, threads
# and compilation caches never slow another's.
def peer_torch(batch, precision, steps, graph):
    import time
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    layers = []
    for a, b in zip(SIZES[:-1], SIZES[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    torch.manual_seed(0)
    model = nn.Sequential(*layers[:-1]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, SIZES[0], device="cuda")
    y = torch.randint(0, SIZES[-1], (batch,), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    if graph:  # warm up on a side stream (as CUDA graphs require), then capture one whole step
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            step()
        run = g.replay
    else:
        def run():
            opt.zero_grad(set_to_none=True)
            step()
    for _ in range(10):
        run()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / steps * 1e6


def peer_jax(batch, precision, steps):
    import time
    import jax
    import jax.numpy as jnp
    dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32
    matmul = {"fp32": "highest", "tf32": "tensorfloat32", "bf16": "bfloat16"}[precision]

    def init(key):
        ps = []
        for a, b in zip(SIZES[:-1], SIZES[1:]):
            key, k = jax.random.split(key)
            ps.append(((jax.random.normal(k, (a, b)) * (2 / a) ** 0.5).astype(jnp.float32), jnp.zeros(b)))
        return ps

    def forward(ps, x):
        for w, b in ps[:-1]:
            x = jax.nn.relu(x @ w.astype(dtype) + b.astype(dtype))
        w, b = ps[-1]
        return (x @ w.astype(dtype) + b.astype(dtype)).astype(jnp.float32)

    def loss(ps, x, y):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(forward(ps, x)), y[:, None], 1))

    @jax.jit
    def step(ps, vs, x, y):
        g = jax.grad(loss)(ps, x, y)
        vs = jax.tree_util.tree_map(lambda v, g: 0.9 * v + g, vs, g)
        return jax.tree_util.tree_map(lambda p, v: p - 0.01 * v, ps, vs), vs

    with jax.default_matmul_precision(matmul):
        ps = init(jax.random.PRNGKey(0))
        vs = jax.tree_util.tree_map(jnp.zeros_like, ps)
        x = jax.random.normal(jax.random.PRNGKey(1), (batch, SIZES[0])).astype(dtype)
        y = jax.random.randint(jax.random.PRNGKey(2), (batch,), 0, SIZES[-1])
        for _ in range(5):
            ps, vs = step(ps, vs, x, y)
        jax.block_until_ready(ps)
        t = time.perf_counter()
        for _ in range(steps):
            ps, vs = step(ps, vs, x, y)
        jax.block_until_ready(ps)
    return (time.perf_counter() - t) / steps * 1e6


def copy_bandwidth():
    import torch
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        b.copy_(a)
    end.record()
    end.synchronize()
    return 2 * a.numel() * 4 * 10 / (start.elapsed_time(end) / 1e3)  # bytes read + written per second


def run_peer(name, batch, precision, steps):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--peer", name, "--batch", str(batch),
                          "--precision", precision, "--steps", str(steps)], capture_output=True, text=True)
    try:
        if out.returncode == 0:
            return float(out.stdout.strip().splitlines()[-1]), None
    except (IndexError, ValueError):
        return None, ["printed no time: " + (out.stdout.strip()[-200:] or "nothing")]
    return None, out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]


WARMUP = 20


def run_mirrored(devices, batch, precision, steps, graph=False, fused=False):
    """us per step of bench-step; graph: strategy.cuda_graph (and the direct op for shared GPUs);
    fused: strategy.fused_epilogues."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "step.json")
        cmd = [MIRRORED, "bench-step", os.path.join(ROOT, "configs", "synthetic_mlp.yaml"), "--devices", devices,
               "--per-replica-batch", str(batch), "--steps", str(steps), "--warmup", str(WARMUP),
               "--set", "train.precision=" + precision, "--set", "strategy.cuda_graph=" + str(graph).lower(),
               "--set", "strategy.cross_device_ops=" + ("direct" if graph else "ring"),
               "--set", "strategy.fused_epilogues=" + str(fused).lower(), "--json", path]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            return None, (out.stderr.strip().splitlines() or ["failed"])[-1:]
        return json.load(open(path))["results"][0]["step_ms"] * 1e3, None


def gemm_rate(precision):
    """FLOP/s of `mirrored bench-gemm` at GEMM_SIZE, or None with the reason."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "gemm.json")
        out = subprocess.run([MIRRORED, "bench-gemm", "--device", "cuda:0", "--precision", precision, "--sizes",
                              str(GEMM_SIZE), "--json", path], capture_output=True, text=True)
        if out.returncode != 0:
            return None, (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1:]
        return json.load(open(path))["results"][0]["gflops"] * 1e9, None


def positive_ints(text):
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, not '{text}'")
    return values


def main():
    global MIRRORED, GEMM_SIZE, WARMUP
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--json")
    ap.add_argument("--mirrored", default=MIRRORED, help="the mirrored binary (default: build/mirrored)")
    ap.add_argument("--batches", type=positive_ints, default=BATCHES, help="global batches, e.g. 256,2048")
    ap.add_argument("--precisions", type=lambda t: tuple(t.split(",")), default=PRECISIONS,
                    help="of fp32, tf32, bf16 (default all)")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="mirrored's untimed steps before the timed ones")
    ap.add_argument("--gemm-size", type=int, default=GEMM_SIZE, help="the GEMM rate's size (n = m = k)")
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    args, _ = ap.parse_known_args()

    if args.peer:
        if args.peer == "jax":
            us = peer_jax(args.batch, args.precision, args.steps)
        else:
            us = peer_torch(args.batch, args.precision, args.steps, graph=args.peer == "torch-graph")
        print(us)
        return

    MIRRORED, GEMM_SIZE, WARMUP = args.mirrored, args.gemm_size, args.warmup
    if not set(args.precisions) <= set(PRECISIONS):
        ap.error(f"--precisions: expected some of {','.join(PRECISIONS)}, not {','.join(args.precisions)}")
    try:
        import torch
        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu:
        print("no GPU for PyTorch here: running the CPU comparison (scripts/bench_cpu_vs_pytorch.py)", flush=True)
        passed = [f"--{k}={getattr(args, k)}" for k in ("rounds", "steps", "json") if getattr(args, k) is not None]
        os.execv(sys.executable, [sys.executable, os.path.join(ROOT, "scripts", "bench_cpu_vs_pytorch.py")] + passed)
    if not os.access(MIRRORED, os.X_OK):
        sys.exit(f"bench_vs_frameworks.py: no mirrored binary at {MIRRORED} (make all builds it; --mirrored names another)")

    try:  # PyTorch's own numbers are information: a failure leaves them out
        device = torch.cuda.get_device_name(0)
        bandwidth = copy_bandwidth()
    except Exception as e:  # noqa: BLE001 - whatever the peer raises, mirrored's rows still run
        reason = (str(e).splitlines() or [type(e).__name__])[0][:120]
        device, bandwidth = f"unknown (PyTorch: {reason})", None
        print(f"PyTorch could not measure the copy bandwidth: {device}; the optimizer-bytes bound is left out")
    rates, own_failures = {}, []
    for p in args.precisions:
        rates[p], err = gemm_rate(p)
        if err:
            own_failures.append(f"bench-gemm {p}: {' '.join(err)}")
    print(f"{device}; copy {bandwidth / 1e12 if bandwidth else float('nan'):.2f} TB/s; mirrored GEMM at {GEMM_SIZE}: " +
          ", ".join(f"{p} {rates[p] / 1e12 if rates[p] else float('nan'):.0f} TFLOP/s" for p in args.precisions), flush=True)
    peers = ["torch-eager", "torch-graph", "jax"]
    own = ["mirrored", "mirrored-graph", "mirrored-fused"]
    rows = []

    def cell(v):
        return f"{v:9.0f}" if v else "        -"

    def ratio(a, b):
        return f"{a / b:6.2f}x" if a and b else "      -"
    # each row is printed as soon as it is measured: a time-boxed run keeps the rows it finished
    print(f"\nus per step, medians of {args.rounds} rounds; ratio = mirrored / theirs (below 1: mirrored faster)")
    print("mirrored: uncaptured steps; m+graph: strategy.cuda_graph; m+fused: cuda_graph and fused_epilogues; "
          "the ratios use the fastest of the three")
    print(f"{'precision':9} {'batch':>5} {'mirrored':>9} {'m+graph':>9} {'m+fused':>9} {'eager':>9} {'graph':>9} {'jax':>9} "
          f"{'/eager':>7} {'/graph':>7} {'/jax':>7} {'bound':>9} {'/bound':>7}  bound by")
    for precision in args.precisions:
        for batch in args.batches:
            times = {k: [] for k in own + peers}
            notes = {}
            def record(name, result):
                us, err = result
                if us:
                    times[name].append(us)
                else:
                    notes.setdefault(name, err)
            for _ in range(args.rounds):
                record("mirrored", run_mirrored("cuda:0", batch, precision, args.steps))
                record("mirrored-graph", run_mirrored("cuda:0", batch, precision, args.steps, graph=True))
                record("mirrored-fused", run_mirrored("cuda:0", batch, precision, args.steps, graph=True, fused=True))
                for p in peers:
                    record(p, run_peer(p, batch, precision, args.steps))
            med = {k: statistics.median(v) if v else None for k, v in times.items()}
            flop_bound = 6.0 * batch * WEIGHTS / rates[precision] * 1e6 if rates[precision] else 0.0
            byte_bound = 20.0 * PARAMS / bandwidth * 1e6 if bandwidth else 0.0
            bound = max(flop_bound, byte_bound) or None
            rows.append({"precision": precision, "batch": batch, "us": med, "bound_us": bound,
                         "bound": "GEMM FLOPs" if flop_bound >= byte_bound else "optimizer bytes", "errors": notes})
            own_failures += [f"{k} {precision} batch {batch}: {' '.join(e)}" for k, e in notes.items() if k in own]
            r = rows[-1]
            u = r["us"]
            best = min((v for v in (u["mirrored"], u["mirrored-graph"], u["mirrored-fused"]) if v), default=None)
            print(f"{r['precision']:9} {r['batch']:5d} {cell(u['mirrored'])} {cell(u['mirrored-graph'])} "
                  f"{cell(u['mirrored-fused'])} "
                  f"{cell(u['torch-eager'])} {cell(u['torch-graph'])} {cell(u['jax'])} {ratio(best, u['torch-eager'])} "
                  f"{ratio(best, u['torch-graph'])} {ratio(best, u['jax'])} {cell(r['bound_us'])} "
                  f"{ratio(best, r['bound_us'])}  {r['bound'] if bound else '-'}")
            for k, e in r["errors"].items():
                print(f"    {k} failed: {' '.join(e)}")
            sys.stdout.flush()
    # 4 replicas sharing GPU 0 against one replica at the same global batch (the target: <= 1.1x)
    shared = {}
    whole = max(args.batches)
    quarter = max(1, whole // 4)
    for precision in args.precisions:
        one, four = [], []
        for _ in range(args.rounds):
            for devices, batch, into in (("cuda:0", 4 * quarter, one), ("cuda:0,0,0,0", quarter, four)):
                us, err = run_mirrored(devices, batch, precision, args.steps, graph=True)
                if us:
                    into.append(us)
                else:
                    own_failures.append(f"{devices} {precision} batch {batch}: {' '.join(err)}")
        shared[precision] = (statistics.median(one) if one else None, statistics.median(four) if four else None)

    print(f"\n4 replicas sharing GPU 0 ({quarter} each) against 1 replica at {4 * quarter}, both with cuda_graph and direct:")
    for p, (one, four) in shared.items():
        print(f"  {p}: {cell(one)} us vs {cell(four)} us: {ratio(four, one)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "copy_bytes_per_s": bandwidth, "gemm_flops": rates, "rows": rows,
                       "shared_gpu": {p: {"one_us": a, "four_us": b, "batch": 4 * quarter}
                                      for p, (a, b) in shared.items()},
                       "mirrored_failures": own_failures}, f, indent=2)
    if own_failures:  # the peers never fail this script; mirrored's own runs do
        print(f"\nmirrored's own runs failed {len(own_failures)} time(s):", *own_failures[:5], sep="\n  ")
        sys.exit(1)


if __name__ == "__main__":
    main()
