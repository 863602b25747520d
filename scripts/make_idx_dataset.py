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

# A pixel is int(255 * (0.35 t + 0.65 u)), t the template's 0 or 1 and u = b / 256 for a random
# byte b: two byte tables, one per t, picked per pixel by a mask. The pick is done on whole images
# as big integers (a ^ ((a ^ b) & mask)), so that 20,000 images take a fraction of a second in
# pure Python instead of 784 interpreted steps each.
DARK = bytes(int(255 * 0.65 * b / 256) for b in range(256))
LIT = bytes(int(255 * (0.35 + 0.65 * b / 256)) for b in range(256))

def shifted_mask(t, dy, dx):
    m = bytearray(784)
    for y in range(28):
        for x in range(28):
            sy, sx = y - dy, x - dx
            if 0 <= sy < 28 and 0 <= sx < 28 and t[sy * 28 + sx]:
                m[y * 28 + x] = 0xFF
    return int.from_bytes(m, "big")

def write(dir_, prefix, n, seed, temps):
    rnd = random.Random(seed)
    labels = bytes(i % 10 for i in range(n))
    masks = {}
    pixels = bytearray()
    for i in range(n):
        dy, dx = rnd.randint(-2, 2), rnd.randint(-2, 2)
        key = (labels[i], dy, dx)
        if key not in masks:
            masks[key] = shifted_mask(temps[labels[i]], dy, dx)
        noise = rnd.randbytes(784)
        dark = int.from_bytes(noise.translate(DARK), "big")
        lit = int.from_bytes(noise.translate(LIT), "big")
        pixels += (dark ^ ((dark ^ lit) & masks[key])).to_bytes(784, "big")
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
