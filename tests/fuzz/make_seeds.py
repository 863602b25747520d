#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): small valid inputs
and a few near misses, so that fuzzing starts from every format's structure. Deterministic.
    tests/fuzz/make_seeds.py CHECKPOINT EXPORT
CHECKPOINT and EXPORT: a checkpoint of the fuzz target's model (one dense layer 4 -> 3, AdamW,
see tests/fuzz/targets.cpp) and its `mirrored export`, as the safetensors seeds."""
import gzip
import os
import struct
import sys
import zlib

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..", "..")

def put(target, name, data):
    d = os.path.join(here, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

def idx_images(n, h, w):
    return struct.pack(">IIII", 0x803, n, h, w) + bytes((i * 7) % 256 for i in range(n * h * w))

def idx_labels(n):
    return struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n))

def pair(images, labels):
    return struct.pack("<H", len(images)) + images + labels

# idx: raw, gzip, truncated, bad magic, wrong rank
img, lab = idx_images(3, 4, 5), idx_labels(3)
put("idx", "raw", pair(img, lab))
put("idx", "gzip", pair(gzip.compress(img, mtime=0), gzip.compress(lab, mtime=0)))
put("idx", "truncated", pair(img[:-7], lab))
put("idx", "bad_magic", pair(b"\x1f" + img[1:], lab))
put("idx", "rank2", pair(b"\x00\x00\x08\x02" + img[4:12], lab))

# cifar10: one and two records, gzip, a bad label
rec = bytes([3]) + bytes((i * 13) % 256 for i in range(3072))
put("cifar10", "one", rec)
put("cifar10", "two", rec + bytes([9]) + rec[1:])
put("cifar10", "gzip", gzip.compress(rec, mtime=0))
put("cifar10", "bad_label", bytes([11]) + rec[1:])

# csv: the first byte picks the options (tests/fuzz/targets.cpp)
put("csv", "header", b"\x00x1,x2,label\n0.5,1,2\n-1e-3,2.5,0\n")
put("csv", "noheader", b"\x02" + b"1,0.5,0\n0,1.5,2\n")
put("csv", "bom", b"\x03\xef\xbb\xbflabel,x1\n1,0.5\n")
put("csv", "semicolon", bytes([15]) + b"a;b;label\n1;2;0\n3;4;1\n")
with open(os.path.join(root, "configs", "data", "spirals_test.csv"), "rb") as f:
    put("csv", "spirals", b"\x03" + b"".join(f.readlines()[:40]))

# config: the shipped configs, and one with --set overrides after a NUL byte
for name in ("fashion_mnist_mlp", "synthetic_mlp", "csv_example"):
    with open(os.path.join(root, "configs", name + ".yaml"), "rb") as f:
        put("config", name, f.read())
small = (b"run: {name: t, seed: 2}\nstrategy: {devices: \"cpu:2\", bucket_mb: 1}\n"
         b"data: {dataset: synthetic, input_shape: [12], classes: 3, train_samples: 100, test_samples: 20}\n"
         b"model:\n  input_shape: [12]\n  layers:\n    - {type: dense, units: 8, activation: gelu}\n"
         b"    - {type: dropout, rate: 0.2}\n    - {type: dense, units: 3}\n"
         b"optimizer: {type: adamw, lr: 0.001, betas: [0.9, 0.99], schedule: {type: cosine, warmup_steps: 3}}\n"
         b"train: {epochs: 2, global_batch_size: 10}\n")
put("config", "small", small)
put("config", "sets", small + b"\x00model.layers.0.units=16\ntrain.steps=5\nstrategy.devices=sim:0,1\n")

# safetensors: a checkpoint of the fixed model and its export, plus a truncated one
ckpt, export = sys.argv[1], sys.argv[2]
with open(ckpt, "rb") as f:
    c = f.read()
with open(export, "rb") as f:
    e = f.read()
put("safetensors", "checkpoint", c)
put("safetensors", "export", e)
put("safetensors", "truncated", c[: len(c) // 2])

# devices: the first byte picks the CUDA availability
for i, spec in enumerate(["auto", "cpu", "cpu:4", "cuda", "cuda:all", "cuda:0,1,3", "cuda:0,0,0,0", "sim:0,1", "sim:0,0,0",
                          "cpu:0", "sim:,", "cuda:99"]):
    put("devices", "spec%02d" % i, bytes([i % 5]) + spec.encode())
# profile: plan --profile's JSON, a one-replica point, scale's shape, and wrong types
put("profile", "one_replica.json", '{"results": [{"replicas": 1, "global_batch": 256, "step_ms": 10.0}]}')
put("profile", "scaling.json", '{"benchmark": "scale", "results": [{"replicas": 2, "global_batch": 512, "step_ms": 5.5}, '
    '{"replicas": 1, "global_batch": 256, "step_ms": 3.25, "samples_per_sec": 78000}]}')
put("profile", "typed.json", '{"results": [{"replicas": "1", "step_ms": [1]}]}')
# npy: features + labels as numpy.save writes them (dtypes, versions, targets), and near misses
def npy(descr, shape, data, version=1, order="False"):
    d = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, order, shape)
    prefix = 10 if version == 1 else 12
    d += " " * ((64 - (prefix + len(d) + 1) % 64) % 64) + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(d))
    return b"\x93NUMPY" + bytes([version, 0]) + length + d.encode() + data
def npy_pair(x, y, targets=False):
    return struct.pack("<H", len(x) | (0x8000 if targets else 0)) + x + y
x = npy("<f4", "(3, 2)", struct.pack("<6f", 0.5, 1, 2, 3, 4, -5))
y = npy("<i8", "(3,)", struct.pack("<3q", 0, 2, 1))
put("npy", "f4_i8", npy_pair(x, y))
put("npy", "u1_images_v2", npy_pair(npy("|u1", "(2, 2, 2)", bytes(range(8)), 2), npy(">i4", "(2,)", struct.pack(">2i", 1, 0))))
put("npy", "targets", npy_pair(npy("<f2", "(2, 1)", struct.pack("<2H", 0x3c00, 0xc000)),
                               npy("<f8", "(2, 2)", struct.pack("<4d", 0.25, 1, -3, 4)), True))
put("npy", "gzip", npy_pair(gzip.compress(x, mtime=0), gzip.compress(y, mtime=0)))
put("npy", "object", npy_pair(npy("|O", "(3, 2)", bytes(48)), y))
put("npy", "fortran", npy_pair(npy("<f4", "(3, 2)", bytes(24), 1, "True"), y))
put("npy", "truncated", npy_pair(x[:-3], y))

# tokens: context, vocabulary, width, then a token file: raw uint16, llm.c's header (v1, v2), and
# near misses (an id beyond the vocabulary, a cut header, an odd length)
def tokens(context, vocab_byte, wide, body):
    return bytes([context - 1, vocab_byte, 1 if wide else 0]) + body
ids = list(range(1, 40))
raw16 = struct.pack("<%dH" % len(ids), *ids)
def llmc(ids, version=1):
    head = struct.pack("<3i", 20240520, version, len(ids)) + bytes(1012)
    return head + struct.pack(("<%dH" if version == 1 else "<%dI") % len(ids), *ids)
put("tokens", "raw16", tokens(8, 1, False, raw16))
put("tokens", "raw32", tokens(4, 1, True, struct.pack("<%dI" % len(ids), *ids)))
put("tokens", "llmc_v1", tokens(8, 1, False, llmc(ids)))
put("tokens", "llmc_v2", tokens(5, 1, False, llmc(ids, 2)))
put("tokens", "beyond_vocab", tokens(8, 0, False, raw16))
put("tokens", "cut_header", tokens(8, 1, False, llmc(ids)[:500]))
put("tokens", "odd", tokens(8, 1, False, raw16 + b"x"))

# checkpoint: 6-byte edits of a valid checkpoint (op, which, 32-bit value; tests/fuzz/targets.cpp)
def edit(op, which, value):
    return bytes([op, which]) + struct.pack("<I", value & 0xFFFFFFFF)
put("checkpoint", "unchanged", b"")
put("checkpoint", "nan", edit(0, 1, 0x7FC00000))
put("checkpoint", "inf_step", edit(0, 2, 0x7F800000) + edit(1, 0, 1000))
put("checkpoint", "epoch", edit(1, 1, 99999))
put("checkpoint", "negative_batch", edit(1, 2, -3))
put("checkpoint", "shape", edit(2, 3, 5))
put("checkpoint", "missing", edit(3, 0, 0))
put("checkpoint", "dtype", edit(4, 4, 0))
put("checkpoint", "text", edit(5, 7, 0x6E616E5B))
# npz: zip archives of .npy members x and y, stored and deflated, as numpy.savez writes them
import io
import zipfile
def npz(members, method):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as z:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # deterministic bytes
            info.compress_type = method
            z.writestr(info, data)
    return buf.getvalue()
npz_x = npy("<f4", "(3, 2)", struct.pack("<6f", 0.5, 1, 2, 3, 4, -5))
npz_y = npy("<i8", "(3,)", struct.pack("<3q", 0, 2, 1))
put("npz", "stored", npz([("x.npy", npz_x), ("y.npy", npz_y)], zipfile.ZIP_STORED))
put("npz", "deflated", npz([("x.npy", npz_x), ("y.npy", npz_y)], zipfile.ZIP_DEFLATED))
put("npz", "missing_y", npz([("x.npy", npz_x)], zipfile.ZIP_STORED))
put("npz", "cut", npz([("x.npy", npz_x), ("y.npy", npz_y)], zipfile.ZIP_DEFLATED)[:-30])

# image: one byte (low bit grey, bits 1-2 the JPEG shrink, bit 3 flip), then a PNG or JPEG file
def png(w, h, grey=False):
    rows = b"".join(b"\0" + bytes((x * 13 + y * 7) % 256 for x in range(w * (1 if grey else 3))) for y in range(h))
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    head = struct.pack(">IIBBBBB", w, h, 8, 0 if grey else 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
put("image", "png_rgb", b"\x00" + png(9, 7))
put("image", "png_grey", b"\x01" + png(5, 11, True))
put("image", "png_cut", b"\x08" + png(9, 7)[:60])
try:
    import io
    from PIL import Image
    for name, mode, flags, kw in (("jpeg_rgb", "RGB", 2, {}), ("jpeg_grey", "L", 1, {}),
                                  ("jpeg_progressive", "RGB", 4, {"progressive": True})):
        im = Image.new(mode, (33, 17))
        im.putdata([((x * 7) % 256, (y * 11) % 256, 90)[: len(mode)] if mode == "RGB" else (x * y) % 256
                    for y in range(17) for x in range(33)])
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90, **kw)
        put("image", name, bytes([flags]) + buf.getvalue())
        put("image", name + "_cut", bytes([flags]) + buf.getvalue()[: len(buf.getvalue()) // 2])
except ImportError:
    print("PIL is not installed (python3-pil): no JPEG seeds for the image target")
# tokenizer: the kind byte (0 tokenizer.json, 1 vocab.json + merges.txt, 2 a tiktoken rank file),
# then a small byte-level BPE (the 256 bytes as GPT-2's printable characters, a few merges,
# <|endoftext|>), and near misses (a merge of unknown tokens, an id far past the others, cut JSON)
import json
import base64
def byte_chars():  # GPT-2's bytes_to_unicode
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars
chars = byte_chars()
def printable(bs):
    return "".join(chars[b] for b in bs)
bpe_merges = [(b" ", b"t"), (b"h", b"e"), (b" t", b"he"), (b"r", b"e"), (b" ", b"f"), (b"e", b"t")]
bpe_vocab = {printable([b]): b for b in range(256)}
for a, c in bpe_merges:
    bpe_vocab[printable(a + c)] = len(bpe_vocab)
eot = len(bpe_vocab)
merge_lines = [printable(a) + " " + printable(c) for a, c in bpe_merges]
def tokenizer_json(vocab=bpe_vocab, merges=merge_lines, extra=None):
    j = {"model": {"type": "BPE", "vocab": vocab, "merges": merges},
         "added_tokens": [{"id": eot, "content": "<|endoftext|>", "special": True}],
         "pre_tokenizer": {"type": "ByteLevel"}}
    j.update(extra or {})
    return json.dumps(j, ensure_ascii=False)
put("tokenizer", "json", b"\x00" + tokenizer_json().encode())
put("tokenizer", "json_split", b"\x00" + tokenizer_json(extra={"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": r"\s+|\p{L}+|\p{N}{1,3}|[^\s\p{L}\p{N}]+"}}, {"type": "ByteLevel"}]}}).encode())
put("tokenizer", "json_pairs", b"\x00" + tokenizer_json(merges=[[printable(a), printable(c)] for a, c in bpe_merges]).encode())
put("tokenizer", "json_unknown_merge", b"\x00" + tokenizer_json(merges=merge_lines + ["zz qq"]).encode())
put("tokenizer", "json_far_id", b"\x00" + tokenizer_json(vocab=dict(bpe_vocab, far=1 << 29)).encode())
put("tokenizer", "json_cut", b"\x00" + tokenizer_json().encode()[:700])
vocab_json = json.dumps(dict(bpe_vocab, **{"<|endoftext|>": eot}), ensure_ascii=False).encode()
merges_txt = ("#version: 0.2\n" + "\n".join(merge_lines) + "\n").encode()
put("tokenizer", "vocab_merges", b"\x01" + struct.pack("<H", len(vocab_json)) + vocab_json + merges_txt)
put("tokenizer", "vocab_merges_crlf", b"\x01" + struct.pack("<H", len(vocab_json)) + vocab_json +
    merges_txt.replace(b"\n", b"\r\n"))
ranks = [bytes([b]) for b in range(256)] + [a + c for a, c in bpe_merges]
rank_file = "".join("%s %d\n" % (base64.b64encode(t).decode(), r) for r, t in enumerate(ranks)).encode()
put("tokenizer", "tiktoken_gpt2", b"\x02\x00" + rank_file)
put("tokenizer", "tiktoken_cl100k", b"\x02\x03" + rank_file)
put("tokenizer", "tiktoken_not_merge", b"\x02\x00" + rank_file + base64.b64encode(b"xyz") + b" 262\n")
print("seeds written under", os.path.join(here, "corpus"))
