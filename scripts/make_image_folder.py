#!/usr/bin/env python3
"""Writes an image folder as torchvision's ImageFolder reads it - OUT/train/<class>/<n>.jpg and
OUT/val/<class>/<n>.jpg - from the Fashion-MNIST files on this machine (Debian's
dataset-fashion-mnist), each 28 x 28 image upscaled (bicubic) to SIZE x SIZE and saved as an RGB
JPEG of the given quality (or PNG): photograph-sized files to decode, for dataset: image_folder,
its tests and the loader benchmarks. Deterministic: the same arguments write the same files.
Needs PIL (Debian and Ubuntu: python3-pil).
    scripts/make_image_folder.py --out DIR [--size 224] [--quality 90] [--classes 10]
                                 [--train-per-class 2000] [--val-per-class 200] [--png]
                                 [--source /usr/share/datasets/fashion-mnist]
Writes into a fresh folder beside OUT and renames it into place when complete; an OUT that exists
is left alone (exit 2) unless it holds this script's own meta.json (then it is replaced)."""
import argparse
import gzip
import json
import os
import shutil
import struct
import sys
import tempfile

CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle-boot"]


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = struct.unpack(">" + "I" * (magic & 0xFF), data[4:4 + 4 * (magic & 0xFF)])
    return dims, data[4 + 4 * len(dims):]


def load(source, split):
    prefix = "train" if split == "train" else "t10k"
    for ext in (".gz", ""):
        images = os.path.join(source, prefix + "-images-idx3-ubyte" + ext)
        labels = os.path.join(source, prefix + "-labels-idx1-ubyte" + ext)
        if os.path.exists(images) and os.path.exists(labels):
            (n, h, w), pixels = read_idx(images)
            _, marks = read_idx(labels)
            return [(pixels[i * h * w:(i + 1) * h * w], marks[i]) for i in range(n)], (h, w)
    sys.exit("make_image_folder.py: no Fashion-MNIST %s files under %s (scripts/install_deps.sh installs them)"
             % (split, source))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--source", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--train-per-class", type=int, default=2000)
    p.add_argument("--val-per-class", type=int, default=200)
    p.add_argument("--png", action="store_true", help="lossless PNG instead of JPEG")
    a = p.parse_args()
    if not 1 <= a.classes <= 10 or not 8 <= a.size <= 4096 or not 1 <= a.quality <= 100:
        sys.exit("make_image_folder.py: --classes 1-10, --size 8-4096, --quality 1-100")
    try:
        from PIL import Image
    except ImportError:
        sys.exit("make_image_folder.py: needs PIL (Debian and Ubuntu: python3-pil)")
    out = os.path.abspath(a.out)
    if os.path.exists(out) and not os.path.isfile(os.path.join(out, "meta.json")):
        print("make_image_folder.py: %s exists and was not written by this script: left alone" % out, file=sys.stderr)
        sys.exit(2)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=os.path.basename(out) + ".new.", dir=parent)
    try:
        ext = ".png" if a.png else ".jpg"
        counts = {}
        for split, per_class in (("train", a.train_per_class), ("val", a.val_per_class)):
            samples, (h, w) = load(a.source, split)
            taken = {c: 0 for c in range(a.classes)}
            for pixels, label in samples:
                if label >= a.classes or taken[label] >= per_class:
                    continue
                folder = os.path.join(stage, split, CLASSES[label])
                if taken[label] == 0:
                    os.makedirs(folder)
                image = Image.frombytes("L", (w, h), pixels).resize((a.size, a.size), Image.BICUBIC).convert("RGB")
                path = os.path.join(folder, "%05d%s" % (taken[label], ext))
                if a.png:
                    image.save(path, "PNG")
                else:
                    image.save(path, "JPEG", quality=a.quality)
                taken[label] += 1
                if all(n >= per_class for n in taken.values()):
                    break
            counts[split] = sum(taken.values())
        meta = {"source": a.source, "size": a.size, "quality": None if a.png else a.quality,
                "format": "png" if a.png else "jpeg", "classes": CLASSES[:a.classes], "images": counts}
        with open(os.path.join(stage, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    print("wrote %s: %d training and %d validation images, %d classes, %d x %d %s"
          % (out, counts["train"], counts["val"], a.classes, a.size, a.size, "PNG" if a.png else "JPEG q=%d" % a.quality))


if __name__ == "__main__":
    main()
