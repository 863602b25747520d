#!/usr/bin/env python3
"""Text files -> token files for `dataset: tokens`: byte-level (vocabulary 256), or a BPE
vocabulary trained with sentencepiece (--bpe N; Debian and Ubuntu: python3-sentencepiece).

Writes DIR/train.bin and DIR/val.bin as nanoGPT writes them (raw little-endian uint16 ids: one per
byte of text, or one per BPE piece) and DIR/meta.json (vocabulary, files, sizes, the source,
SHA-256 of both files); with --bpe also DIR/tokenizer.model, trained on the training files only.
The validation split is by file: every Nth file of the sorted list is held out, so no file is
split between training and validation.

    scripts/prepare_text.py --python-stdlib --out data/python-stdlib
    scripts/prepare_text.py --out data/mine --val-every 10 notes/ book.txt
    scripts/prepare_text.py --out data/mine-bpe --bpe 4096 notes/ book.txt
    build/mirrored tokenize $(scripts/prepare_text.py --python-stdlib --list) --train-bpe 4096 --out DIR

A BPE model's prompts and samples go through the same tokenizer (`mirrored generate` prints ids
when the vocabulary is not bytes):

    ids=$(printf 'def ' | scripts/prepare_text.py --encode data/mine-bpe/tokenizer.model)
    build/mirrored generate CK --prompt-ids "$ids" --tokens 200 |
        scripts/prepare_text.py --decode data/mine-bpe/tokenizer.model

--python-stdlib takes the source of the standard library of the Python that runs this script
(/usr/lib/python3.X, tests and third-party packages left out): a corpus every Debian and Ubuntu
machine has. Existing output is replaced only when DIR/meta.json says this script wrote it.
Exit codes: 0 done, 2 bad arguments or input, 4 output refused.
"""
import argparse
import hashlib
import json
import os
import struct
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


def sentencepiece():
    try:
        import sentencepiece as spm
    except ImportError:
        fail(2, "--bpe, --encode and --decode need sentencepiece (Debian and Ubuntu: python3-sentencepiece)")
    return spm


def load_tokenizer(path):
    spm = sentencepiece()
    if not os.path.isfile(path):
        fail(2, f"{path}: no such file (a tokenizer.model that prepare_text.py --bpe wrote)")
    try:
        return spm.SentencePieceProcessor(model_file=path)
    except (OSError, RuntimeError) as e:
        fail(2, f"{path}: not a sentencepiece model ({e})")


def encode_decode(a):
    sp = load_tokenizer(a.encode or a.decode)
    text = sys.stdin.read()
    if a.encode:
        print(" ".join(str(i) for i in sp.encode(text)))
        return
    try:
        ids = [int(w) for w in text.split()]
    except ValueError:
        fail(2, "--decode reads token ids separated by spaces (what `mirrored generate` prints)")
    bad = [i for i in ids if not 0 <= i < sp.get_piece_size()]
    if bad:
        fail(2, f"--decode: id {bad[0]} is outside the tokenizer's vocabulary of {sp.get_piece_size()}")
    sys.stdout.write(sp.decode(ids) + "\n")


def train_bpe(train_files, vocab, out):
    """A BPE model over the training files (sentencepiece's defaults otherwise: every byte it has
    not seen falls back to byte pieces, so any text encodes). Returns the processor."""
    spm = sentencepiece()
    tmp = tempfile.mkdtemp(dir=out, prefix=".tmp-bpe-")
    try:
        spm.SentencePieceTrainer.train(input=train_files, model_prefix=os.path.join(tmp, "tokenizer"),
                                       model_type="bpe", vocab_size=vocab, byte_fallback=True,
                                       character_coverage=1.0, max_sentence_length=1 << 16,
                                       input_sentence_size=2_000_000, shuffle_input_sentence=True,
                                       num_threads=os.cpu_count() or 1, minloglevel=2)
        data = open(os.path.join(tmp, "tokenizer.model"), "rb").read()
    except (OSError, RuntimeError) as e:
        fail(2, f"--bpe {vocab}: sentencepiece could not train on the training files ({e})")
    finally:
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
    write_atomic(os.path.join(out, "tokenizer.model"), data)
    return spm.SentencePieceProcessor(model_proto=data)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="*", help="text files or folders (read recursively)")
    ap.add_argument("--python-stdlib", action="store_true", help="the running Python's standard library source")
    ap.add_argument("--out", help="output folder")
    ap.add_argument("--bpe", type=int, default=0, metavar="N",
                    help="a BPE vocabulary of N pieces (sentencepiece, trained on the training files), not bytes")
    ap.add_argument("--encode", metavar="MODEL", help="print the ids of the text on stdin (a --bpe tokenizer.model)")
    ap.add_argument("--decode", metavar="MODEL", help="print the text of the ids on stdin")
    ap.add_argument("--val-every", type=int, default=10, help="hold out every Nth file for validation (default 10)")
    ap.add_argument("--suffix", action="append", default=[], help="only files ending so, in folders (repeatable)")
    ap.add_argument("--max-bytes", type=int, default=0, help="stop adding training files past this many bytes")
    ap.add_argument("--list", action="store_true",
                    help="print the files, one a line, in the order the split counts them, and stop")
    a = ap.parse_args()
    if a.list:
        if a.python_stdlib == bool(a.inputs):
            fail(2, "give either --python-stdlib or input files, not both or neither")
        print("\n".join(stdlib_files()[1] if a.python_stdlib else listed_files(a.inputs, a.suffix)))
        return 0
    if a.encode or a.decode:
        if a.encode and a.decode:
            fail(2, "give --encode or --decode, not both")
        return encode_decode(a)
    if not a.out:
        fail(2, "--out is required (the output folder)")
    if a.bpe and not 257 <= a.bpe <= 65535:
        fail(2, f"--bpe {a.bpe}: expected 257 to 65535 pieces (uint16 ids; more than the 256 byte pieces)")
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
    for name in ("train.bin", "val.bin", "meta.json", "tokenizer.model"):
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
    train_files = []
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
        if not held_out:
            train_files.append(f)
    if not train or not val:
        fail(2, f"{len(files)} files leave an empty split; give more files or a larger --val-every")

    if a.bpe:
        sp = train_bpe(train_files, a.bpe, a.out)

        def tokens(b):  # one uint16 id per piece, little-endian
            ids = sp.encode(b.decode("utf-8", errors="replace"))
            return struct.pack(f"<{len(ids)}H", *ids)
    else:
        def tokens(b):  # one uint16 id per byte, little-endian
            out = bytearray(2 * len(b))
            out[0::2] = b
            return bytes(out)

    meta = {"writer": WRITER, "vocab": a.bpe or 256, "tokenizer": "sentencepiece bpe" if a.bpe else "bytes",
            "dtype": "uint16", "source": source, "files": {"train": counts["train"], "val": counts["val"]},
            "bytes": {"train": len(train), "val": len(val)}}
    for name, b in (("train.bin", train), ("val.bin", val)):
        data = tokens(b)
        write_atomic(os.path.join(a.out, name), data)
        meta.setdefault("sha256", {})[name] = hashlib.sha256(data).hexdigest()
        meta.setdefault("tokens", {})[name.split(".")[0]] = len(data) // 2
    write_atomic(meta_path, (json.dumps(meta, indent=1) + "\n").encode())
    print(f"prepare_text: {a.out}: {meta['tokens']['train']} training tokens from {counts['train']} files, "
          f"{meta['tokens']['val']} validation tokens from {counts['val']} files ({source}; "
          f"vocabulary {meta['vocab']}, {meta['tokenizer']})")


if __name__ == "__main__":
    main()
