#!/usr/bin/env bash
# Tokenizer throughput side by side on the same text, the source of Python's standard library
# (about 11 MB): GPT-2's byte-level BPE in mirrored (its ranks read as a tiktoken rank file) against
# js-tiktoken, and a SentencePiece BPE of 8,000 pieces in mirrored against python3-sentencepiece;
# mirrored on 1 thread and on every core. mirrored's seconds include reading the files and writing
# the token files (three runs each); the references' are the encode call alone, the median of 3.
#
#   scripts/bench_tokenizers.sh [BUILD_DIR]      (needs node + npm reaching the registry,
#                                                 python3-sentencepiece)
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mapfile -t files < <(/usr/bin/python3 "$here/prepare_text.py" --python-stdlib --list)
cat "${files[@]}" > "$work/text.txt"
echo "text: $(stat -c %s "$work/text.txt") bytes from ${#files[@]} files; $(nproc) cores"

# mirrored tokenize over the files with tokenizer $1, three times on 1 thread and on every core
mirrored_rounds() {
    for threads in 1 "$(nproc)"; do
        for round in 1 2 3; do
            rm -rf "$work/out"
            "$build/mirrored" tokenize "${files[@]}" --tokenizer "$1" --threads "$threads" --out "$work/out" |
                sed 's/.*; \([0-9.]* MB in .*\)/  mirrored: \1/'
        done
    done
}

npm install --prefix "$work/js" --no-audit --no-fund --silent js-tiktoken@1.0.21
node "$here/tiktoken_reference.js" "$work/js/node_modules" ranks gpt2 "$work/gpt2.tiktoken"
echo "GPT-2 BPE:"
node "$here/tiktoken_reference.js" "$work/js/node_modules" bench gpt2 "$work/text.txt" 3
mirrored_rounds "$work/gpt2.tiktoken"

echo "SentencePiece BPE, 8000 pieces (trained on the text's first 2 MB):"
head -c 2000000 "$work/text.txt" > "$work/spm_train.txt"
/usr/bin/python3 - "$work" "${files[@]}" <<'EOF'
import json, statistics, sys, time
import sentencepiece as spm
work, files = sys.argv[1], sys.argv[2:]
spm.SentencePieceTrainer.train(input=f"{work}/spm_train.txt", model_prefix=f"{work}/sp", vocab_size=8000,
                               model_type="bpe", byte_fallback=True, minloglevel=2)
sp = spm.SentencePieceProcessor(model_file=f"{work}/sp.model")
texts = [open(f, encoding="utf-8", errors="surrogateescape").read() for f in files]  # a file a text, as mirrored
times = []
for _ in range(3):
    t0 = time.perf_counter()
    ids = sum(len(sp.encode(t)) for t in texts)
    times.append(time.perf_counter() - t0)
size = sum(len(t.encode("utf-8", errors="surrogateescape")) for t in texts)
s = statistics.median(times)
print(json.dumps({"encoder": "python3-sentencepiece", "bytes": size, "ids": ids, "median_s": s,
                  "mb_per_s": size / 1e6 / s}))
EOF
mirrored_rounds "$work/sp.model"
