#!/usr/bin/env python3
"""mirrored's CPU replicas against PyTorch over a grid of MLPs nobody tuned for, side by side.

Each row is an MLP on 784 synthetic features and 10 classes: its width (256-4096), depth (hidden
layers, 2-4), global batch (32-1024), activation (ReLU or exact GELU) and optimizer (SGD with
momentum 0.9, or AdamW with weight decay 0.01), at a constant learning rate. Timed: training steps
after a warm-up, on data already in memory, about --seconds per measurement.

  mirrored   build/mirrored bench-step on cpu:2 (one replica per core), once with each product's
             GEMM kernel measured (MIRRORED_JIT_GEMM=measure, the default) and once by the static
             rules (=rules)
  PyTorch    one process with 2 threads (OMP_WAIT_POLICY=passive) and DistributedDataParallel
             with gloo, 2 processes x 1 thread; the faster is PyTorch's best; glibc's malloc
             keeps freed memory (bench_cpu_vs_pytorch.TORCH_MALLOC; BENCH_TORCH_MALLOC=default
             for glibc's own)

PyTorch runs on the BLAS kernel mirrored chose (OPENBLAS_CORETYPE, from `mirrored devices`).
Prints each row's samples/s, the ratio to PyTorch's best, mirrored's GFLOP/s per core against the
core's FMA peak, what 1.5x PyTorch's best would need of each core's products (the rest of the step
counted free) against that peak and OpenBLAS's large sgemm, and the median over the rows.

    /usr/bin/python3 scripts/bench_mlp_grid.py [--rounds 1] [--seconds 5] [--rows 1,3,5] [--json out.json]

Needs python3-torch (Debian/Ubuntu package)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cpu_vs_pytorch as pair  # noqa: E402  (free_port, mirrored_blas)

FEATURES, CLASSES, SAMPLES = 784, 10, 16384
TARGET = 1.5  # the wide rows' target over PyTorch's best, whose ceiling each row prints
# width, hidden layers, global batch, activation, optimizer
GRID = [
    (256, 2, 32, "relu", "sgd"),
    (256, 3, 256, "gelu", "adamw"),
    (512, 2, 128, "relu", "sgd"),
    (512, 4, 1024, "gelu", "adamw"),
    (1024, 2, 64, "gelu", "adamw"),
    (1024, 3, 256, "relu", "sgd"),
    (1024, 4, 512, "gelu", "sgd"),
    (2048, 2, 128, "relu", "adamw"),
    (2048, 3, 512, "gelu", "adamw"),
    (4096, 2, 32, "relu", "sgd"),
    (4096, 2, 256, "gelu", "adamw"),
    (4096, 3, 1024, "relu", "sgd"),
]


def parameters(width, depth):
    return FEATURES * width + width + (depth - 1) * (width * width + width) + width * CLASSES + CLASSES


def step_flop(row):
    """Forward and backward GEMMs of one step: 6 x batch x weights (the first layer's input
    gradient, never needed, counted too: both sides skip it or not alike)."""
    width, depth, batch = row[:3]
    weights = FEATURES * width + (depth - 1) * width * width + width * CLASSES
    return 6.0 * batch * weights


def steps_for(row, seconds, rate=6e10):
    return int(min(3000, max(20, seconds * rate / step_flop(row))))


def mirrored_config(row, folder):
    width, depth, batch, act, opt = row
    layers = "".join("    - {type: dense, units: %d, activation: %s}\n" % (width, act) for _ in range(depth))
    optimizer = ("{type: sgd, lr: 0.01, momentum: 0.9}" if opt == "sgd"
                 else "{type: adamw, lr: 0.001, weight_decay: 0.01}")
    text = ("run: {name: grid, seed: 1, output_dir: %s}\n"
            "strategy: {devices: \"cpu:2\", shared_parameters: true}\n"
            "data: {dataset: synthetic, input_shape: [%d], classes: %d, train_samples: %d, test_samples: 256}\n"
            "model:\n  layers:\n%s    - {type: dense, units: %d}\n"
            "optimizer: %s\n"
            "train: {epochs: 1000, global_batch_size: %d, log_every_steps: 1000000}\n") % (
                os.path.join(folder, "run"), FEATURES, CLASSES, SAMPLES, layers, CLASSES, optimizer, batch)
    path = os.path.join(folder, "grid.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def run_mirrored(row, steps, warmup, choice):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "step.json")
        env = dict(os.environ, MIRRORED_JIT_GEMM=choice)
        subprocess.run([os.path.join(ROOT, "build", "mirrored"), "bench-step", mirrored_config(row, d), "--devices",
                        "cpu:2", "--steps", str(steps), "--warmup", str(warmup), "--json", out],
                       check=True, stdout=subprocess.DEVNULL, env=env)
        with open(out) as f:
            return json.load(f)["results"][0]["samples_per_sec"]


def torch_worker(rank, world, threads, row, steps, warmup, out_path, port):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if world > 1:
        import torch.distributed as dist

        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    width, depth, batch, act, opt = row
    nn = torch.nn
    layers, inputs = [], FEATURES
    for _ in range(depth):
        layers += [nn.Linear(inputs, width), nn.ReLU() if act == "relu" else nn.GELU()]
        inputs = width
    model = nn.Sequential(*layers, nn.Linear(inputs, CLASSES))
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if opt == "sgd"
                 else torch.optim.AdamW(model.parameters(), lr=0.001, weight_decay=0.01))
    X = torch.randn(SAMPLES, FEATURES)
    Y = torch.randint(0, CLASSES, (SAMPLES,))
    loss_fn = nn.CrossEntropyLoss()
    per = batch // world
    batches = SAMPLES // batch

    def step(i):
        lo = (i % batches) * batch + rank * per
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(X[lo:lo + per]), Y[lo:lo + per]).backward()
        optimizer.step()

    pair.time_steps(step, warmup, steps, batch, rank, out_path)


def run_torch(row, steps, warmup, world, threads, env):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        code = ("import sys; sys.path.insert(0, %r); import bench_mlp_grid as g; import torch.multiprocessing as mp\n"
                "if %d > 1: mp.spawn(g.torch_worker, args=(%d, %d, %r, %d, %d, %r, %d), nprocs=%d)\n"
                "else: g.torch_worker(0, 1, %d, %r, %d, %d, %r, 0)\n") % (
                    os.path.dirname(os.path.abspath(__file__)), world, world, threads, tuple(row), steps, warmup, out,
                    pair.free_port(), world, threads, tuple(row), steps, warmup, out)
        e = dict(env, OMP_WAIT_POLICY="passive", OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                 MKL_NUM_THREADS=str(threads), **pair.torch_malloc(env))
        subprocess.run([sys.executable, "-c", code], env=e, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)["samples_per_sec"]


def fma_peak():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "sweep.json")
        subprocess.run([os.path.join(ROOT, "build", "mirrored"), "bench-gemm", "--sweep", "--shapes", "64x64x64:nn",
                        "--seconds", "0.01", "--json", out], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        with open(out) as f:
            j = json.load(f)
        return j["fma_peak_gflops"], j["large_sgemm_gflops"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=5.0, help="about this long per measurement")
    ap.add_argument("--rows", help="only these rows of the grid (1-based, comma-separated)")
    ap.add_argument("--json", help="write the medians here")
    args = ap.parse_args()
    rows = GRID if not args.rows else [GRID[int(i) - 1] for i in args.rows.split(",")]
    blas, kernel = pair.mirrored_blas()
    env = dict(os.environ)
    if kernel:
        env["OPENBLAS_CORETYPE"] = kernel
    peak, large = fma_peak()
    print("mirrored: %s\nthe core's FMA peak %.1f GFLOP/s, OpenBLAS's large sgemm %.1f (one thread)" % (blas, peak, large))
    started = time.time()
    results = []
    for n, row in enumerate(rows):
        steps = steps_for(row, args.seconds)
        warmup = max(5, steps // 10)
        got = {"measure": [], "rules": [], "torch-2-threads": [], "torch-ddp": []}
        for _ in range(args.rounds):
            got["measure"].append(run_mirrored(row, steps, warmup, "measure"))
            got["rules"].append(run_mirrored(row, steps, warmup, "rules"))
            got["torch-2-threads"].append(run_torch(row, steps, warmup, 1, 2, env))
            got["torch-ddp"].append(run_torch(row, steps, warmup, 2, 1, env))
        med = {k: statistics.median(v) for k, v in got.items()}
        best_torch = max(med["torch-2-threads"], med["torch-ddp"])
        per_core = med["measure"] * step_flop(row) / row[2] / 2 / 1e9
        # the ceiling: what a step 1.5x PyTorch's best would ask of each core's products alone,
        # against the FMA peak and OpenBLAS's own large sgemm (the rest of the step counted free)
        needed = TARGET * best_torch * step_flop(row) / row[2] / 2 / 1e9
        r = dict(width=row[0], depth=row[1], batch=row[2], activation=row[3], optimizer=row[4],
                 parameters=parameters(row[0], row[1]), steps=steps, samples_per_sec=med,
                 vs_torch=med["measure"] / best_torch, measure_vs_rules=med["measure"] / med["rules"],
                 gflops_per_core=per_core, of_peak=per_core / peak, target_needs_gflops_per_core=needed,
                 target_needs_of_peak=needed / peak, target_needs_of_large_sgemm=needed / large)
        results.append(r)
        print("%4d x %d  batch %4d  %-4s %-5s  mirrored %8.0f (rules %8.0f)  PyTorch %8.0f / ddp %8.0f  "
              "%.2fx PyTorch's best, measure/rules %.2fx, %5.1f GFLOP/s per core (%2.0f%% of peak)" % (
                  row[0], row[1], row[2], row[3], row[4], med["measure"], med["rules"], med["torch-2-threads"],
                  med["torch-ddp"], r["vs_torch"], r["measure_vs_rules"], per_core, 100 * r["of_peak"]), flush=True)
        print("    %.1fx PyTorch's best needs %.1f GFLOP/s per core: %.0f%% of the FMA peak, %.0f%% of OpenBLAS's "
              "large sgemm" % (TARGET, needed, 100 * needed / peak, 100 * needed / large), flush=True)
        left = (time.time() - started) / (n + 1) * (len(rows) - n - 1)
        if left > 0:
            print("  (%d of %d rows, about %.0f s left)" % (n + 1, len(rows), left), file=sys.stderr, flush=True)
    ratios = sorted(r["vs_torch"] for r in results)
    gains = sorted(r["measure_vs_rules"] for r in results)
    print("\nmedian over %d rows: %.2fx PyTorch's best (lowest %.2fx, highest %.2fx); measured kernels over the "
          "rules %.2fx (lowest %.2fx)" % (len(results), statistics.median(ratios), ratios[0], ratios[-1],
                                          statistics.median(gains), gains[0]))
    past_peak = [r for r in results if r["target_needs_of_peak"] > 1]
    past_blas = [r for r in results if r["target_needs_of_large_sgemm"] > 1 and r["target_needs_of_peak"] <= 1]

    def describe(rs):
        return ", ".join("%d x %d batch %d" % (r["width"], r["depth"], r["batch"]) for r in rs) or "none"
    print("%.1fx PyTorch's best would need GEMMs past the core's FMA peak on: %s; past OpenBLAS's large sgemm on: %s"
          % (TARGET, describe(past_peak), describe(past_blas)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"blas": blas, "fma_peak_gflops": peak, "large_sgemm_gflops": large, "rounds": args.rounds,
                       "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
