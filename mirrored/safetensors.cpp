#include "mirrored/safetensors.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/output.h"
#include "kernels/op_math.h"

namespace mirrored {

using json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;  // as the safetensors format bounds it

size_t dtype_size(const std::string& d, bool all_dtypes) {
    if (d == "F32") return 4;
    if (d == "I64") return 8;
    if (!all_dtypes) return 0;
    static const std::map<std::string, size_t> kSizes = {{"F64", 8}, {"BF16", 2}, {"F16", 2}, {"U64", 8},
                                                         {"I32", 4}, {"U32", 4},  {"I16", 2}, {"U16", 2},
                                                         {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
    const auto it = kSizes.find(d);
    return it == kSizes.end() ? 0 : it->second;
}

// f16 (IEEE binary16) bits to f32, exactly: subnormals, infinities and NaN included.
float f16_value(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    if (exp == 0x1F) return bits_float(sign | 0x7F800000u | (mant << 13));
    if (exp != 0) return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
    const float v = float(mant) * 0x1p-24f;  // subnormal (or zero): mant x 2^-24
    return sign ? -v : v;
}

}  // namespace

bool SafetensorsEntry::is_float(const std::string& dtype) {
    return dtype == "F32" || dtype == "BF16" || dtype == "F16" || dtype == "F64";
}

uint64_t SafetensorsEntry::count() const {
    uint64_t n = 1;
    for (int d : shape) n *= uint64_t(d);  // validated not to overflow when read
    return n;
}

SafetensorsHeader read_safetensors_header(InputFile& in, bool all_dtypes) {
    const std::string& path = in.path();
    SafetensorsHeader h;
    std::vector<unsigned char> head(8);
    const size_t got = in.read(head.data(), 8);
    if (got < 8) throw CheckpointError(path + ": truncated (" + std::to_string(got) + " bytes)");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(head[size_t(i)]) << (8 * i);
    if (n > in.file_size() - 8)
        throw CheckpointError(path + ": truncated: the header claims " + std::to_string(n) + " bytes");
    if (n > kMaxHeaderBytes)
        throw CheckpointError(path + ": corrupt: a header of " + format_bytes(n) + " is larger than the format allows");
    head.clear();
    try {
        in.read_exact(head, size_t(n), "the header");
    } catch (const InputError& e) {
        throw CheckpointError(e.what());
    }
    json header;
    try {
        header = json::parse(head.begin(), head.end());
    } catch (const json::exception& e) {
        throw CheckpointError(path + ": corrupt header: " + e.what());
    }
    if (!header.is_object()) throw CheckpointError(path + ": corrupt header: not a JSON object");
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string& name = it.key();
        if (name == "__metadata__") {
            if (!it->is_object()) throw CheckpointError(path + ": corrupt header: __metadata__ is not an object");
            for (auto m = it->begin(); m != it->end(); ++m) {
                if (!m->is_string())
                    throw CheckpointError(path + ": corrupt header: metadata " + m.key() + " is not a string");
                h.metadata[m.key()] = m->get<std::string>();
            }
            continue;
        }
        const json& t = *it;
        const auto bad = [&](const std::string& what) {
            return CheckpointError(path + ": corrupt header entry " + name + ": " + what);
        };
        if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
            throw bad("expected dtype, shape and data_offsets");
        if (!t["dtype"].is_string()) throw bad("dtype is not a string");
        SafetensorsEntry e;
        e.dtype = t["dtype"].get<std::string>();
        if (dtype_size(e.dtype, all_dtypes) == 0)
            throw CheckpointError(path + ": tensor " + name + " is " + t["dtype"].dump() + ", expected " +
                                  (all_dtypes ? "one of the format's types" : "F32"));
        if (!t["shape"].is_array() || t["shape"].size() > 8) throw bad("shape is not a list of at most 8 dimensions");
        uint64_t count = 1;
        for (const json& d : t["shape"]) {
            if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT32_MAX))
                throw bad("a dimension is not an integer in [0, 2^31)");
            e.shape.push_back(int(d.get<uint64_t>()));
            if (!checked_mul(count, d.get<uint64_t>(), count)) throw bad("the shape's size overflows");
        }
        const json& off = t["data_offsets"];
        if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
            throw bad("data_offsets is not two non-negative integers");
        e.begin = off[0].get<uint64_t>();
        e.end = off[1].get<uint64_t>();
        uint64_t bytes = 0;
        if (!checked_mul(count, dtype_size(e.dtype, all_dtypes), bytes) || e.end < e.begin || e.end - e.begin != bytes)
            throw CheckpointError(path + ": tensor " + name + ": offsets do not match its shape");
        spans.emplace_back(e.begin, e.end);
        h.tensors[name] = std::move(e);
    }
    std::sort(spans.begin(), spans.end());
    uint64_t at = 0;
    for (const auto& [b, e] : spans) {
        if (b != at)
            throw CheckpointError(path + ": corrupt header: tensor data " + (b < at ? "overlaps" : "leaves a hole") +
                                  " at byte " + std::to_string(std::min(b, at)));
        at = e;
    }
    h.data_bytes = at;
    h.data_at = 8 + n;
    return h;
}

void SafetensorsBuilder::add_bytes(const std::string& name, const std::string& dtype, const std::vector<int>& shape,
                                   const void* bytes, size_t size) {
    const size_t begin = data.size();
    data.resize(begin + size);
    if (size) std::memcpy(data.data() + begin, bytes, size);
    entries_[name] = {dtype, shape, begin, data.size()};
}

std::string SafetensorsBuilder::header(const std::map<std::string, std::string>& metadata) const {
    json header = json::object();
    for (const auto& [name, e] : entries_)
        header[name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
    header["__metadata__"] = metadata;
    std::string h = header.dump(-1, ' ', false, json::error_handler_t::replace);
    while ((h.size() + 8) % 8 != 0) h.push_back(' ');
    std::string out(8, '\0');
    const uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
    return out + h;
}

MappedSafetensors::MappedSafetensors(const std::string& path)
    : file_([&] {
          try {
              return MappedFile(path);
          } catch (const InputError& e) {
              throw CheckpointError(e.what());
          }
      }()) {
    InputFile in(path, file_.data(), file_.size(), /*inflate=*/false);
    header_ = read_safetensors_header(in, true);
    const uint64_t have = file_.size() - header_.data_at;
    if (have < header_.data_bytes)
        throw CheckpointError(path + ": truncated: " + std::to_string(have) + " of " +
                              std::to_string(header_.data_bytes) + " data bytes (an interrupted download?)");
    if (have > header_.data_bytes)
        throw CheckpointError(path + ": " + std::to_string(have - header_.data_bytes) +
                              " unexpected bytes after the tensors");
}

void MappedSafetensors::read_rows(const std::string& name, uint64_t row, uint64_t rows, float* out) const {
    const SafetensorsEntry& e = header_.tensors.at(name);
    const uint64_t first = e.shape.empty() ? 1 : uint64_t(e.shape[0]);
    if (!SafetensorsEntry::is_float(e.dtype) || row + rows > first || rows > first)
        throw std::logic_error("MappedSafetensors::read_rows: " + name + " has no such float rows");
    const uint64_t per_row = first ? e.count() / first : 0, n = rows * per_row;
    const unsigned char* at = file_.data() + header_.data_at + e.begin;
    if (e.dtype == "F32") {
        std::memcpy(out, at + row * per_row * 4, n * 4);
        return;
    }
    if (e.dtype == "F64") {
        for (uint64_t i = 0; i < n; ++i) {
            double v;
            std::memcpy(&v, at + (row * per_row + i) * 8, 8);
            out[i] = float(v);
        }
        return;
    }
    const unsigned char* src = at + row * per_row * 2;
    const bool bf16 = e.dtype == "BF16";
    for (uint64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        out[i] = bf16 ? bf16_value(b) : f16_value(b);
    }
}

}  // namespace mirrored
