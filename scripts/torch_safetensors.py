"""Reads a safetensors file (F32 and I64 tensors) into torch tensors, for the scripts that load an
export into PyTorch (check_export_pytorch.py, check_export_nanogpt.py)."""
import json
import struct
import sys

import numpy as np
import torch

DTYPES = {"F32": np.float32, "I64": np.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in DTYPES:
            sys.exit(f"{path}: tensor {name} is {t['dtype']}, expected F32 or I64")
        b, e = t["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[b:e], dtype=DTYPES[t["dtype"]]).reshape(t["shape"]).copy())
    return out
