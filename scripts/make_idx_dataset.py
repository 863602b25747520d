#!/usr/bin/env python3
"""Writes a small Fashion-MNIST-shaped dataset in the IDX format (gzip-compressed) for machines
without the dataset-fashion-mnist package: 28x28 images of 10 classes, each class a fixed random
stroke pattern plus noise, learnable but not trivial. Standard library only, deterministic.
    scripts/make_idx_dataset.py DIR [--train N] [--test N]
DIR then serves as MIRRORED_DATA_DIR (or data.root) for configs/fashion_mnist_mlp.yaml."""
import argparse
import gzip
import os
import random
import struct

def templates(rnd):
    out = []
    for _ in range(10):
        img = [0.0] * 784
        for _ in range(6):  # strokes: short random walks
            y, x = rnd.randrange(4, 24), rnd.randrange(4, 24)
            for _ in range(12):
                img[y * 28 + x] = 1.0
                y = min(27, max(0, y + rnd.choice((-1, 0, 1))))
                x = min(27, max(0, x + rnd.choice((-1, 0, 1))))
        out.append(img)
    return out

def write(dir_, prefix, n, seed, temps):
    rnd = random.Random(seed)
    labels = bytes(i % 10 for i in range(n))
    pixels = bytearray()
    for i in range(n):
        t = temps[labels[i]]
        dy, dx = rnd.randint(-2, 2), rnd.randint(-2, 2)
        for y in range(28):
            for x in range(28):
                sy, sx = y - dy, x - dx
                v = t[sy * 28 + sx] if 0 <= sy < 28 and 0 <= sx < 28 else 0.0
                v = 0.35 * v + 0.65 * rnd.random()
                pixels.append(int(255 * v))
    with gzip.open(os.path.join(dir_, f"{prefix}-images-idx3-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">IIII", 0x00000803, n, 28, 28) + bytes(pixels))
    with gzip.open(os.path.join(dir_, f"{prefix}-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(struct.pack(">II", 0x00000801, n) + labels)

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--train", type=int, default=12000)
    p.add_argument("--test", type=int, default=2000)
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    temps = templates(random.Random(7))
    write(a.dir, "train", a.train, 1, temps)
    write(a.dir, "t10k", a.test, 2, temps)
    print(f"wrote {a.train} train and {a.test} test images to {a.dir}")

if __name__ == "__main__":
    main()
