#!/usr/bin/env python3
"""Independent reference of GPT-2's byte-level BPE, written from the algorithm of OpenAI's
encoder.py (bytes_to_unicode, the pre-tokenizer regex over Unicode letters and numbers, bpe()'s
lowest-rank-first merges), to check mirrored's C++ tokenizer (data/tokenizer.cpp) id for id.

    train:  python3 scripts/bpe_reference.py train TEXT --merges 200 --out DIR
            writes DIR/vocab.json, DIR/merges.txt and the same tokenizer as DIR/tokenizer.json
            (Hugging Face's layout: model BPE, a ByteLevel pre-tokenizer, <|endoftext|> added)
    encode: python3 scripts/bpe_reference.py encode TEXT --tokenizer DIR --out IDS
            writes the ids, one per line (<|endoftext|> in the text is its own id)

The text is read as UTF-8. Needs the `regex` module (Debian: python3-regex)."""
import argparse
import collections
import json
import os
import sys

import regex

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def words(text):
    b2u = bytes_to_unicode()
    for part in text.split(EOT):
        for w in regex.findall(PATTERN, part):
            yield "".join(b2u[b] for b in w.encode("utf-8"))


def merge(symbols, pair):
    """The symbols with every occurrence of `pair` joined, left to right (encoder.py's bpe() loop)."""
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and symbols[i] == pair[0] and symbols[i + 1] == pair[1]:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return out


def train(text, n_merges):
    """Naive BPE training: the most frequent adjacent pair (ties: the smallest pair) merged, n times."""
    counts = collections.Counter(words(text))
    split = {w: list(w) for w in counts}
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in counts.items():
            s = split[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]  # ties: the largest pair
        merges.append(best)
        for w in counts:
            split[w] = merge(split[w], best)
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    vocab[EOT] = len(vocab)
    return vocab, merges


class Encoder:
    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.cache = {}

    def bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        w = list(word)
        while len(w) > 1:
            pairs = set(zip(w, w[1:]))
            bigram = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if bigram not in self.ranks:
                break
            w = merge(w, bigram)
        self.cache[word] = [self.vocab[t] for t in w]
        return self.cache[word]

    def encode(self, text):
        ids = []
        parts = text.split(EOT)
        for k, part in enumerate(parts):
            for w in words(part):
                ids.extend(self.bpe(w))
            if k + 1 < len(parts):
                ids.append(self.vocab[EOT])
        return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("train", "encode"))
    ap.add_argument("text")
    ap.add_argument("--merges", type=int, default=200)
    ap.add_argument("--tokenizer")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    text = open(a.text, encoding="utf-8").read()
    if a.what == "train":
        vocab, merges = train(text, a.merges)
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
        with open(os.path.join(a.out, "merges.txt"), "w", encoding="utf-8") as f:
            f.write("#version: 0.2\n" + "".join(f"{x} {y}\n" for x, y in merges))
        tok = {"version": "1.0",
               "added_tokens": [{"id": vocab[EOT], "content": EOT, "special": True}],
               "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
               "model": {"type": "BPE", "vocab": vocab, "merges": [f"{x} {y}" for x, y in merges]}}
        with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False)
        print(f"{len(merges)} merges, {len(vocab)} tokens")
    else:
        vocab = json.load(open(os.path.join(a.tokenizer, "vocab.json"), encoding="utf-8"))
        lines = open(os.path.join(a.tokenizer, "merges.txt"), encoding="utf-8").read().split("\n")
        merges = [tuple(l.split(" ")) for l in lines[1:] if l]
        ids = Encoder(vocab, merges).encode(text)
        with open(a.out, "w") as f:
            f.write("\n".join(map(str, ids)) + "\n")
        print(f"{len(ids)} ids")
    return 0


if __name__ == "__main__":
    sys.exit(main())
