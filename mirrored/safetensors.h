// The safetensors format (Hugging Face's): an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the tensors back to back. mirrored's
// checkpoints are such files (mirrored/checkpoint.h); Hugging Face's model folders hold them too,
// in bf16 or f16 as often as f32 (mirrored/hf_models.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/io.h"

namespace mirrored {

// A tensor's entry in a header, validated.
struct SafetensorsEntry {
    std::string dtype;  // "F32", "I64", and where asked any of the format's ("BF16", "F16", "U8", ...)
    std::vector<int> shape;
    uint64_t begin = 0, end = 0;                     // byte offsets into the data section
    uint64_t count() const;                          // elements
    static bool is_float(const std::string& dtype);  // F32, BF16, F16, F64: what read_rows converts
};

struct SafetensorsHeader {
    std::map<std::string, SafetensorsEntry> tensors;
    std::map<std::string, std::string> metadata;  // __metadata__: strings only
    uint64_t data_bytes = 0;                      // the data section the entries tile
    uint64_t data_at = 0;                         // where it starts in the file
};

// Reads and validates the header length and the header from the start of `in`: types, shapes,
// offsets that tile the data section exactly (the format's rules), string metadata; nothing read
// before its size is known to fit the file. all_dtypes: any of the format's types (Hugging Face's
// files: BF16, F16, masks in U8 or BOOL ...), else only F32 and I64 (mirrored's). CheckpointError
// naming the file and what is wrong.
SafetensorsHeader read_safetensors_header(InputFile& in, bool all_dtypes = false);

// Builds a file: add() tensors, then header() - the length, the JSON header padded with spaces to
// 8 bytes - followed by data.
struct SafetensorsBuilder {
    template <typename T>
    void add(const std::string& name, const std::vector<int>& shape, const T* values, size_t count) {
        add_bytes(name, sizeof(T) == 8 ? "I64" : "F32", shape, values, count * sizeof(T));
    }
    void add_bytes(const std::string& name, const std::string& dtype, const std::vector<int>& shape, const void* bytes,
                   size_t size);
    std::string header(const std::map<std::string, std::string>& metadata) const;
    std::vector<unsigned char> data;

private:
    std::map<std::string, SafetensorsEntry> entries_;
};

// A safetensors file mapped read-only, its header validated (any type): each float tensor is
// read where it lies, converted to f32 once, so that a model file is never held twice. A file
// shorter than its header says is a CheckpointError naming it (a truncated download).
class MappedSafetensors {
public:
    explicit MappedSafetensors(const std::string& path);
    const std::string& path() const { return file_.path(); }
    const std::map<std::string, SafetensorsEntry>& tensors() const { return header_.tensors; }
    const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
    // Rows [row, row + rows) of a floating-point tensor (its first dimension; all of a
    // one-dimensional one when rows is its length) as f32 into out.
    void read_rows(const std::string& name, uint64_t row, uint64_t rows, float* out) const;

private:
    MappedFile file_;
    SafetensorsHeader header_;
};

}  // namespace mirrored
