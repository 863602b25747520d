#!/usr/bin/env python3
"""Images/s of torchvision's input pipeline on an image folder, tuned as its users tune it, to set
beside `mirrored bench-loader` on the same folder: ImageFolder + DataLoader with T worker
processes (persistent, shuffled, batches of B), transforms RandomResizedCrop(SIZE) +
RandomHorizontalFlip() + ToTensor() + Normalize(ImageNet's mean and std) - the same work as
dataset: image_folder's training split - and the decode rate of PIL alone (libjpeg-turbo under it)
as a ceiling. Needs python3-torch, python3-torchvision and python3-pil.
    scripts/bench_loader_torchvision.py FOLDER/train [--size 224] [--workers 1,2] [--batch 128]
                                        [--seconds 10] [--json out.json]"""
import argparse
import json
import os
import sys
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--workers", default="1,2")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--json")
    a = p.parse_args()
    try:
        import torch
        import torchvision
        from PIL import Image
        from torchvision import transforms
    except ImportError as e:
        sys.exit("bench_loader_torchvision.py: %s (Debian and Ubuntu: python3-torch python3-torchvision python3-pil)" % e)
    torch.set_num_threads(1)
    tf = transforms.Compose([transforms.RandomResizedCrop(a.size), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(),
                             transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = torchvision.datasets.ImageFolder(a.folder, transform=tf)
    print("torch %s, torchvision %s, PIL %s; %d images in %d classes; batch %d"
          % (torch.__version__, torchvision.__version__, Image.__version__, len(ds), len(ds.classes), a.batch))
    results = {"folder": os.path.abspath(a.folder), "size": a.size, "batch": a.batch, "torch": torch.__version__,
               "torchvision": torchvision.__version__, "pil": Image.__version__, "workers": {}}

    # the ceiling: decode alone (read + PIL's decode to RGB), one process
    paths = [s[0] for s in ds.samples]
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < a.seconds / 2:
        with open(paths[(n * 2654435761) % len(paths)], "rb") as f:
            Image.open(f).convert("RGB").load()
        n += 1
    decode = n / (time.perf_counter() - start)
    print("decode alone (PIL, one process): %.0f images/s" % decode)
    results["decode_images_per_sec"] = decode

    for workers in [int(w) for w in a.workers.split(",")]:
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=workers,
                                             persistent_workers=workers > 0, drop_last=True)
        it = iter(loader)
        for _ in range(2):  # warm-up: the workers started, their first batches in flight
            next(it)
        images, start = 0, time.perf_counter()
        while time.perf_counter() - start < a.seconds:
            try:
                x, _ = next(it)
            except StopIteration:
                it = iter(loader)
                continue
            images += x.shape[0]
        rate = images / (time.perf_counter() - start)
        print("workers %d: %.0f images/s" % (workers, rate))
        results["workers"][str(workers)] = rate
        del it, loader
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
