#!/usr/bin/env python3
"""Text files -> byte-level token files for `dataset: tokens` (vocabulary 256).

Writes DIR/train.bin and DIR/val.bin as nanoGPT writes them (raw little-endian uint16 ids, one per
byte of text) and DIR/meta.json (vocabulary, files, sizes, the source, SHA-256 of both files).
The validation split is by file: every Nth file of the sorted list is held out, so no file is
split between training and validation.

    scripts/prepare_text.py --python-stdlib --out data/python-stdlib
    scripts/prepare_text.py --out data/mine --val-every 10 notes/ book.txt

--python-stdlib takes the source of the standard library of the Python that runs this script
(/usr/lib/python3.X, tests and third-party packages left out): a corpus every Debian and Ubuntu
machine has. Existing output is replaced only when DIR/meta.json says this script wrote it.
Exit codes: 0 done, 2 bad arguments or input, 4 output refused.
"""
import argparse
import hashlib
import json
import os
import sys
import sysconfig
import tempfile

EXCLUDED_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3"}
WRITER = "mirrored scripts/prepare_text.py"


def fail(code, message):
    print(f"prepare_text: {message}", file=sys.stderr)
    sys.exit(code)


def stdlib_files():
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in EXCLUDED_DIRS)
        files += [os.path.join(d, n) for n in names if n.endswith(".py")]
    if not files:
        fail(2, f"no .py files under {root}")
    return root, sorted(files)


def listed_files(paths, suffixes):
    files = []
    for p in paths:
        if os.path.isdir(p):
            for d, dirs, names in os.walk(p):
                dirs.sort()
                files += [os.path.join(d, n) for n in names if not suffixes or n.endswith(tuple(suffixes))]
        elif os.path.isfile(p):
            files.append(p)
        else:
            fail(2, f"{p}: no such file or folder")
    if not files:
        fail(2, "no input files")
    return sorted(files)


def write_atomic(path, data):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="*", help="text files or folders (read recursively)")
    ap.add_argument("--python-stdlib", action="store_true", help="the running Python's standard library source")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--val-every", type=int, default=10, help="hold out every Nth file for validation (default 10)")
    ap.add_argument("--suffix", action="append", default=[], help="only files ending so, in folders (repeatable)")
    ap.add_argument("--max-bytes", type=int, default=0, help="stop adding training files past this many bytes")
    a = ap.parse_args()
    if a.python_stdlib == bool(a.inputs):
        fail(2, "give either --python-stdlib or input files, not both or neither")
    if a.val_every < 2:
        fail(2, "--val-every must be at least 2")
    if a.python_stdlib:
        source, files = stdlib_files()
        source = f"Python {sys.version_info.major}.{sys.version_info.minor} standard library, {source}"
    else:
        files, source = listed_files(a.inputs, a.suffix), "listed files"

    os.makedirs(a.out, exist_ok=True)
    meta_path = os.path.join(a.out, "meta.json")
    for name in ("train.bin", "val.bin", "meta.json"):
        path = os.path.join(a.out, name)
        if os.path.exists(path):
            try:
                ours = json.load(open(meta_path)).get("writer") == WRITER
            except (OSError, ValueError):
                ours = False
            if not ours:
                fail(4, f"{path} exists and was not written by this script; choose another --out")

    train, val = bytearray(), bytearray()
    counts = {"train": 0, "val": 0}
    for i, f in enumerate(files):
        try:
            data = open(f, "rb").read()
        except OSError as e:
            fail(2, f"{f}: {e.strerror}")
        held_out = i % a.val_every == a.val_every - 1
        if not held_out and a.max_bytes and len(train) >= a.max_bytes:
            continue
        (val if held_out else train).extend(data)
        counts["val" if held_out else "train"] += 1
    if not train or not val:
        fail(2, f"{len(files)} files leave an empty split; give more files or a larger --val-every")

    def tokens(b):  # one uint16 id per byte, little-endian
        out = bytearray(2 * len(b))
        out[0::2] = b
        return bytes(out)

    meta = {"writer": WRITER, "vocab": 256, "tokenizer": "bytes", "dtype": "uint16", "source": source,
            "files": {"train": counts["train"], "val": counts["val"]},
            "tokens": {"train": len(train), "val": len(val)}}
    for name, b in (("train.bin", train), ("val.bin", val)):
        data = tokens(b)
        write_atomic(os.path.join(a.out, name), data)
        meta.setdefault("sha256", {})[name] = hashlib.sha256(data).hexdigest()
    write_atomic(meta_path, (json.dumps(meta, indent=1) + "\n").encode())
    print(f"prepare_text: {a.out}: {len(train)} training tokens from {counts['train']} files, "
          f"{len(val)} validation tokens from {counts['val']} files ({source})")


if __name__ == "__main__":
    main()
