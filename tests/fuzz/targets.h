// Fuzz targets: every parser of untrusted input, each as a function of raw bytes. libFuzzer drives
// them (tests/fuzz/fuzz_main.cpp, `make fuzz`, scripts/fuzz.sh); the test suite replays every
// corpus and regression input through them (tests/test_fuzz_corpus.cpp), so a crash once found
// stays fixed. A target may throw mirrored::Error (a clean rejection); anything else - a crash,
// a sanitizer report, another exception, a leak, a timeout - is a finding.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mirrored::fuzz {

using Target = void (*)(const uint8_t* data, size_t size);

// IDX images + labels: a 2-byte little-endian split point, then the two files (raw or gzip).
void idx(const uint8_t* data, size_t size);
// One CIFAR-10 batch file (raw or gzip).
void cifar10(const uint8_t* data, size_t size);
// NumPy .npy features + labels: a 2-byte little-endian split point (its top bit: float targets),
// then the two files (raw or gzip).
void npy(const uint8_t* data, size_t size);
// An .npz archive (a zip of .npy members) whose arrays "x" and "y" are read as features and labels.
void npz(const uint8_t* data, size_t size);
// A language model's token file; the first byte picks the context (1-32), the second the
// vocabulary, the third's low bit 4-byte ids.
void tokens(const uint8_t* data, size_t size);
// A tokenizer's files after one byte that picks the kind (its value mod 3): a Hugging Face
// tokenizer.json; GPT-2's vocab.json and merges.txt after a 2-byte little-endian split point; a
// tiktoken rank file after a byte that picks the encoding's name. A tokenizer that loads encodes a
// fixed text (specials, Unicode, bytes that are not UTF-8) to ids it can decode.
void tokenizer(const uint8_t* data, size_t size);
// A JPEG or PNG file after one byte: its low bit asks for grey (else RGB), bits 1-2 the JPEG
// shrink (1, 2, 4, 8), bit 3 a flip; decoded under a 4-megapixel limit, then resampled.
void image(const uint8_t* data, size_t size);
// A CSV file; the first byte picks header mode, label column and delimiter.
void csv(const uint8_t* data, size_t size);
// A YAML configuration, then after a NUL byte '--set' overrides, one per line; a config that
// loads also builds its model's layout.
void config(const uint8_t* data, size_t size);
// A safetensors file read as an export (any tensors) and as a checkpoint of a small fixed model.
void safetensors(const uint8_t* data, size_t size);
// A valid checkpoint of a small model edited by the input (values, shapes, dtypes, missing
// tensors, metadata) with its checksum made right again: the loader's own checks must refuse what
// a resume cannot continue from (non-finite values, impossible steps and epochs).
void checkpoint(const uint8_t* data, size_t size);
// A device spec such as cuda:0,0 or sim:1, under each CUDA availability.
void devices(const uint8_t* data, size_t size);
// A profile for `plan --profile` (scaling.json or bench-step --json).
void profile(const uint8_t* data, size_t size);

struct Named {
    const char* name;
    Target fn;
};
// Every target, by the name its corpus folder and `make fuzz` binary carry.
// (The Makefile and scripts/fuzz.sh read the names from this list.)
inline constexpr Named kTargets[] = {{"idx", idx},
                                     {"cifar10", cifar10},
                                     {"csv", csv},
                                     {"npy", npy},
                                     {"npz", npz},
                                     {"tokens", tokens},
                                     {"tokenizer", tokenizer},
                                     {"image", image},
                                     {"config", config},
                                     {"safetensors", safetensors},
                                     {"checkpoint", checkpoint},
                                     {"devices", devices},
                                     {"profile", profile}};

}  // namespace mirrored::fuzz
