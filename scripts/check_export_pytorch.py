#!/usr/bin/env python3
"""Loads a mirrored export into the equivalent torch.nn.Module and checks that it gives the
trainer's predictions. The module is built from the run's config: a ModuleList `layers` of plain
nn.Linear, nn.Conv2d, nn.BatchNorm2d/1d, nn.LayerNorm (over the channels), pooling and dropout
modules, each followed by its configured activation, and residual blocks with their own `layers`
and a `shortcut` nn.Sequential(Conv2d 1x1, BatchNorm2d) - so `load_state_dict(strict=True)` takes
the exported file as it is. It evaluates the samples `mirrored eval --dump-inputs` wrote (NHWC,
permuted to NCHW as PyTorch expects) and compares with the logits `--dump-logits` wrote.
Needs PyTorch, NumPy and PyYAML (Debian: python3-torch python3-yaml).

    build/mirrored eval CONFIG --checkpoint CK --dump-inputs x.npy --dump-logits y.npy --limit 1000
    build/mirrored export CK --out model.safetensors
    /usr/bin/python3 scripts/check_export_pytorch.py CONFIG model.safetensors x.npy y.npy
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from torch_safetensors import read_safetensors

ACT = {"none": lambda x: x, "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


def padding_of(spec, kernel):
    p = str(spec.get("padding", "valid"))
    return (kernel - 1) // 2 if p == "same" else 0 if p == "valid" else int(p)


def out_size(n, k, s, p):
    return (n + 2 * p - k) // s + 1


class Layers(nn.Module):
    """The layers of a model or of a residual block, each applied with its activation."""

    def __init__(self, specs, shape):
        super().__init__()
        self.layers = nn.ModuleList()
        self.apply_fns = []
        for s in specs:
            module, fn, shape = make_layer(s, shape)
            self.layers.append(module)
            self.apply_fns.append(fn)
        self.out_shape = shape

    def forward(self, x):
        for m, fn in zip(self.layers, self.apply_fns):
            x = fn(m, x)
        return x


class Residual(nn.Module):
    def __init__(self, s, shape):
        super().__init__()
        inner = Layers(s["layers"], shape)
        self.layers = inner.layers
        self.inner = [inner]  # not a registered child: its modules are registered as self.layers
        self.out_shape = inner.out_shape
        if s.get("shortcut", "identity") == "conv1x1":
            c = self.out_shape[0]
            self.shortcut = nn.Sequential(nn.Conv2d(shape[0], c, 1, shape[1] // self.out_shape[1], 0, bias=False),
                                          nn.BatchNorm2d(c))
        self.act = ACT[s.get("activation", "none")]

    def forward(self, x):
        s = self.shortcut(x) if hasattr(self, "shortcut") else x
        return self.act(self.inner[0](x) + s)


class RMSNorm(nn.Module):
    """torch.nn.RMSNorm (PyTorch 2.4 and later) written out for older versions."""

    def __init__(self, c, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def make_layer(s, shape):
    t, act = s["type"], ACT[s.get("activation", "none")]
    plain = lambda m, x: act(m(x))
    if t == "dense":
        return nn.Linear(shape[0], s["units"], bias=s.get("bias", True)), plain, (s["units"],)
    if t == "conv2d":
        k, st = s.get("kernel_size", 3), s.get("stride", 1)
        p = padding_of(s, k)
        conv = nn.Conv2d(shape[0], s["filters"], k, st, p, bias=s.get("bias", True))
        return conv, plain, (s["filters"], out_size(shape[1], k, st, p), out_size(shape[2], k, st, p))
    if t in ("maxpool2d", "avgpool2d"):
        k = s.get("kernel_size", 2)
        st = s.get("stride", k)
        p = padding_of(s, k)
        m = nn.MaxPool2d(k, st, p) if t == "maxpool2d" else nn.AvgPool2d(k, st, p)
        return m, plain, (shape[0], out_size(shape[1], k, st, p), out_size(shape[2], k, st, p))
    if t == "global_avgpool":
        return nn.AdaptiveAvgPool2d(1), lambda m, x: torch.flatten(m(x), 1), (shape[0],)
    if t == "flatten":
        return nn.Flatten(), plain, (int(np.prod(shape)),)
    if t == "dropout":
        return nn.Dropout(s.get("rate", 0.5)), plain, shape
    if t == "batchnorm":
        bn = nn.BatchNorm2d if len(shape) == 3 else nn.BatchNorm1d
        return bn(shape[0], eps=s.get("epsilon", 1e-5), momentum=s.get("momentum", 0.1)), plain, shape
    if t == "layernorm":  # over the channels of each position
        ln = nn.LayerNorm(shape[0], eps=s.get("epsilon", 1e-5))
        fn = (lambda m, x: m(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)) if len(shape) == 3 else plain
        return ln, fn, shape
    if t == "rmsnorm":  # over the channels of each position, as layernorm
        rms = RMSNorm(shape[0], s.get("epsilon", 1e-6))
        fn = (lambda m, x: m(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)) if len(shape) == 3 else plain
        return rms, fn, shape
    if t == "residual":
        block = Residual(s, shape)
        return block, lambda m, x: m(x), block.out_shape
    raise SystemExit(f"no PyTorch equivalent for layer type {t}")


def main():
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    cfg_path, export, xs, ys = sys.argv[1:]
    cfg = yaml.safe_load(open(cfg_path))
    x, want = np.load(xs), np.load(ys)
    shape = (x.shape[3], x.shape[1], x.shape[2]) if x.ndim == 4 else (x.shape[1],)
    model = Layers(cfg["model"]["layers"], shape)
    model.load_state_dict(read_safetensors(export), strict=True)
    model.eval()
    with torch.no_grad():
        t = torch.from_numpy(x)
        got = model(t.permute(0, 3, 1, 2).contiguous() if t.dim() == 4 else t).numpy()
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)
    agree = (got.argmax(1) == want.argmax(1)).mean()
    print(f"load_state_dict(strict=True) took {len(model.state_dict())} tensors; max relative logit difference "
          f"{err:.2e}; predictions agree on {agree:.4f} of {len(x)} samples")
    sys.exit(0 if err < 1e-4 and agree == 1.0 else 1)


if __name__ == "__main__":
    main()
