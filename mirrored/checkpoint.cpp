#include "mirrored/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "kernels/error.h"
#include "mirrored/util.h"

namespace mirrored {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "mirrored-checkpoint";
constexpr const char* kVersion = "1";

std::string exact(double v) {
    char b[40];
    std::snprintf(b, sizeof b, "%.17g", v);
    return b;
}

// CRC-32 of the tensor bytes followed by the metadata (sorted, without the checksum itself).
uint32_t content_crc(const unsigned char* data, size_t n, const std::map<std::string, std::string>& meta) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (size_t done = 0; done < n;) {
        const uInt chunk = uInt(std::min<size_t>(n - done, 1u << 30));
        crc = crc32(crc, data + done, chunk);
        done += chunk;
    }
    for (const auto& [k, v] : meta) {
        if (k == "checksum") continue;
        const std::string line = k + "=" + v + "\n";
        crc = crc32(crc, reinterpret_cast<const Bytef*>(line.data()), uInt(line.size()));
    }
    return uint32_t(crc);
}

void fsync_dir(const fs::path& dir) {
    const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

// Test hook: kill this process half-way through writing the checkpoint of this step, to prove
// that a crash during a write never costs a good checkpoint.
bool kill_requested(int64_t step) {
    const char* s = std::getenv("MIRRORED_TEST_KILL_DURING_CHECKPOINT");
    return s && *s && std::strtoll(s, nullptr, 10) == step;
}

void write_all(int fd, const std::string& tmp, const char* p, size_t n) {
    while (n > 0) {
        const ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            const std::string err = std::strerror(errno);
            ::close(fd);
            ::unlink(tmp.c_str());
            throw CheckpointError(tmp + ": write failed: " + err);
        }
        p += w;
        n -= size_t(w);
    }
}

void write_atomic(const std::string& path, const std::string& header, const std::vector<unsigned char>& data,
                  int64_t kill_step) {
    const fs::path p(path);
    const std::string tmp = (p.parent_path() / ("." + p.filename().string() + ".tmp")).string();
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw CheckpointError(tmp + ": cannot create: " + std::strerror(errno));
    write_all(fd, tmp, header.data(), header.size());
    if (kill_requested(kill_step)) {
        write_all(fd, tmp, reinterpret_cast<const char*>(data.data()), data.size() / 2);
        ::fsync(fd);
        std::raise(SIGKILL);
    }
    write_all(fd, tmp, reinterpret_cast<const char*>(data.data()), data.size());
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        ::unlink(tmp.c_str());
        throw CheckpointError(tmp + ": fsync failed: " + std::strerror(errno));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string err = std::strerror(errno);
        ::unlink(tmp.c_str());
        throw CheckpointError(path + ": rename failed: " + err);
    }
    fsync_dir(p.parent_path());
}

// Builds a safetensors file: 8-byte little-endian header length, JSON header padded with
// spaces to 8 bytes, then the tensors back to back.
struct Builder {
    json header = json::object();
    std::vector<unsigned char> data;
    void add(const std::string& name, const std::vector<int>& shape, const float* values, size_t count) {
        const size_t begin = data.size();
        data.resize(begin + count * sizeof(float));
        std::memcpy(data.data() + begin, values, count * sizeof(float));
        header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
    }
    std::string serialize(std::map<std::string, std::string> meta, bool checksum) {
        if (checksum) {
            char b[16];
            std::snprintf(b, sizeof b, "%08x", content_crc(data.data(), data.size(), meta));
            meta["checksum"] = b;
        }
        header["__metadata__"] = meta;
        std::string h = header.dump();
        while ((h.size() + 8) % 8 != 0) h.push_back(' ');
        std::string out(8, '\0');
        const uint64_t n = h.size();
        for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
        return out + h;
    }
};

struct Parsed {
    json header;
    std::vector<unsigned char> bytes;
    size_t data_start = 0;
    std::map<std::string, std::string> meta;
};

Parsed parse(const std::string& path) {
    Parsed p;
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw CheckpointError(path + ": cannot open: " + std::strerror(errno));
    std::fseek(f, 0, SEEK_END);
    const long size = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    p.bytes.resize(size > 0 ? size_t(size) : 0);
    const size_t got = std::fread(p.bytes.data(), 1, p.bytes.size(), f);
    std::fclose(f);
    if (got != p.bytes.size()) throw CheckpointError(path + ": read failed");
    if (p.bytes.size() < 8) throw CheckpointError(path + ": truncated (" + std::to_string(p.bytes.size()) + " bytes)");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(p.bytes[i]) << (8 * i);
    if (n > p.bytes.size() - 8) throw CheckpointError(path + ": truncated: the header claims " + std::to_string(n) + " bytes");
    try {
        p.header = json::parse(p.bytes.begin() + 8, p.bytes.begin() + 8 + long(n));
    } catch (const json::exception& e) {
        throw CheckpointError(path + ": corrupt header: " + e.what());
    }
    if (!p.header.is_object()) throw CheckpointError(path + ": corrupt header: not a JSON object");
    p.data_start = 8 + n;
    size_t end = 0;
    for (auto it = p.header.begin(); it != p.header.end(); ++it) {
        if (it.key() == "__metadata__") {
            if (!it->is_object()) throw CheckpointError(path + ": corrupt header: __metadata__ is not an object");
            for (auto m = it->begin(); m != it->end(); ++m) {
                if (!m->is_string()) throw CheckpointError(path + ": corrupt header: metadata " + m.key() + " is not a string");
                p.meta[m.key()] = m->get<std::string>();
            }
            continue;
        }
        const json& t = *it;
        if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets") ||
            !t["data_offsets"].is_array() || t["data_offsets"].size() != 2)
            throw CheckpointError(path + ": corrupt header entry " + it.key());
        if (t["dtype"] != "F32") throw CheckpointError(path + ": tensor " + it.key() + " is " + t["dtype"].dump() + ", expected F32");
        const size_t b = t["data_offsets"][0].get<size_t>(), e = t["data_offsets"][1].get<size_t>();
        size_t count = 1;
        for (const auto& d : t["shape"]) count *= d.get<size_t>();
        if (e < b || e - b != count * 4) throw CheckpointError(path + ": tensor " + it.key() + ": offsets do not match its shape");
        end = std::max(end, e);
    }
    const size_t have = p.bytes.size() - p.data_start;
    if (have < end) throw CheckpointError(path + ": truncated: " + std::to_string(have) + " of " + std::to_string(end) + " data bytes");
    if (have > end) throw CheckpointError(path + ": " + std::to_string(have - end) + " unexpected bytes after the tensors");
    return p;
}

std::vector<float> tensor_values(const Parsed& p, const std::string& name) {
    const json& t = p.header[name];
    const size_t b = t["data_offsets"][0].get<size_t>(), e = t["data_offsets"][1].get<size_t>();
    std::vector<float> v((e - b) / 4);
    std::memcpy(v.data(), p.bytes.data() + p.data_start + b, e - b);
    return v;
}

const std::string& meta_of(const Parsed& p, const std::string& path, const std::string& key) {
    auto it = p.meta.find(key);
    if (it == p.meta.end()) throw CheckpointError(path + ": metadata '" + key + "' is missing");
    return it->second;
}

void verify(const Parsed& p, const std::string& path) {
    if (meta_of(p, path, "format") != kFormat) throw CheckpointError(path + ": not a mirrored checkpoint");
    if (meta_of(p, path, "format_version") != kVersion)
        throw CheckpointError(path + ": checkpoint format version " + meta_of(p, path, "format_version") +
                              ", this build reads " + kVersion);
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x",
                  content_crc(p.bytes.data() + p.data_start, p.bytes.size() - p.data_start, p.meta));
    if (meta_of(p, path, "checksum") != crc)
        throw CheckpointError(path + ": checksum mismatch (stored " + meta_of(p, path, "checksum") + ", computed " +
                              crc + "): the file is corrupt");
}

int64_t meta_int(const Parsed& p, const std::string& path, const std::string& key) {
    const std::string& s = meta_of(p, path, key);
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end) throw CheckpointError(path + ": metadata '" + key + "' is not an integer");
    return v;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
    char name[64];
    std::snprintf(name, sizeof name, "step-%010lld.safetensors", static_cast<long long>(step));
    return (fs::path(dir) / name).string();
}

void write_checkpoint(const std::string& path, const Model& model, const CheckpointData& d) {
    Builder b;
    for (const auto& t : model.tensors()) b.add(t.name, t.shape, d.params.data() + t.offset, t.count);
    for (const auto& [state, flat] : d.optimizer)
        for (const auto& t : model.tensors()) b.add("optimizer." + state + "." + t.name, t.shape, flat.data() + t.offset, t.count);
    std::map<std::string, std::string> meta{
        {"format", kFormat},
        {"format_version", kVersion},
        {"step", std::to_string(d.step)},
        {"loader_epoch", std::to_string(d.loader.epoch)},
        {"loader_batch", std::to_string(d.loader.batch)},
        {"seed", std::to_string(d.seed)},
        {"model_hash", hex64(d.model_hash)},
        {"model", d.model_summary},
        {"config", d.config_yaml},
        {"replicas", std::to_string(d.replicas)},
        {"devices", d.devices},
    };
    json metrics = json::array();
    for (const auto& m : d.train_metrics) metrics.push_back({exact(m[0]), exact(m[1]), exact(m[2])});
    meta["train_metrics"] = metrics.dump();
    std::string states;
    for (const auto& [state, flat] : d.optimizer) states += (states.empty() ? "" : ",") + state;
    meta["optimizer_state"] = states;
    const std::string header = b.serialize(meta, true);
    write_atomic(path, header, b.data, d.step);
}

CheckpointData read_checkpoint(const std::string& path, const Model& model, uint64_t expected_hash,
                               const std::string& expected_summary) {
    const Parsed p = parse(path);
    verify(p, path);
    CheckpointData d;
    d.model_hash = std::strtoull(meta_of(p, path, "model_hash").c_str(), nullptr, 16);
    d.model_summary = meta_of(p, path, "model");
    if (d.model_hash != expected_hash)
        throw ForeignCheckpointError(path + ": written for a different model or optimizer and cannot be resumed here.\n  checkpoint: " +
                              d.model_summary + "\n  this run:   " + expected_summary);
    d.step = meta_int(p, path, "step");
    d.loader = {meta_int(p, path, "loader_epoch"), meta_int(p, path, "loader_batch")};
    d.seed = uint64_t(meta_int(p, path, "seed"));
    d.replicas = int(meta_int(p, path, "replicas"));
    d.devices = meta_of(p, path, "devices");
    d.config_yaml = meta_of(p, path, "config");
    try {
        for (const auto& m : json::parse(meta_of(p, path, "train_metrics")))
            d.train_metrics.push_back({std::stod(m[0].get<std::string>()), std::stod(m[1].get<std::string>()),
                                       std::stod(m[2].get<std::string>())});
    } catch (const std::exception&) {
        throw CheckpointError(path + ": metadata 'train_metrics' is malformed");
    }
    auto gather = [&](const std::string& prefix) {
        std::vector<float> flat(model.flat_size(), 0.0f);
        for (const auto& t : model.tensors()) {
            const std::string name = prefix + t.name;
            if (!p.header.contains(name)) throw CheckpointError(path + ": tensor " + name + " is missing");
            std::vector<int> shape = p.header[name]["shape"].get<std::vector<int>>();
            if (shape != t.shape) throw CheckpointError(path + ": tensor " + name + " has another shape than the model's");
            const auto v = tensor_values(p, name);
            std::copy(v.begin(), v.end(), flat.begin() + long(t.offset));
        }
        return flat;
    };
    d.params = gather("");
    const std::string states = meta_of(p, path, "optimizer_state");
    size_t start = 0;
    while (start < states.size()) {
        size_t comma = states.find(',', start);
        if (comma == std::string::npos) comma = states.size();
        const std::string state = states.substr(start, comma - start);
        d.optimizer.emplace_back(state, gather("optimizer." + state + "."));
        start = comma + 1;
    }
    return d;
}

void write_safetensors(const std::string& path, const SafetensorsFile& file) {
    Builder b;
    for (const auto& [name, t] : file.tensors) b.add(name, t.first, t.second.data(), t.second.size());
    write_atomic(path, b.serialize(file.metadata, false), b.data, -1);
}

SafetensorsFile read_safetensors(const std::string& path, bool verify_checksum) {
    const Parsed p = parse(path);
    if (verify_checksum) verify(p, path);
    SafetensorsFile f;
    f.metadata = p.meta;
    for (auto it = p.header.begin(); it != p.header.end(); ++it) {
        if (it.key() == "__metadata__") continue;
        f.tensors[it.key()] = {(*it)["shape"].get<std::vector<int>>(), tensor_values(p, it.key())};
    }
    return f;
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return out;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.size() > 4 && name.front() == '.' && name.substr(name.size() - 4) == ".tmp") {
            fs::remove(e.path(), ec);  // a write that never finished
            continue;
        }
        if (name.rfind("step-", 0) == 0 && e.path().extension() == ".safetensors") out.push_back(e.path().string());
    }
    std::sort(out.rbegin(), out.rend());  // zero-padded step numbers: newest first
    return out;
}

void prune_checkpoints(const std::string& dir, int keep) {
    const auto all = list_checkpoints(dir);
    std::error_code ec;
    for (size_t i = size_t(std::max(keep, 1)); i < all.size(); ++i) fs::remove(all[i], ec);
}

void write_file_atomic(const std::string& path, const std::string& contents) {
    const std::vector<unsigned char> data(contents.begin(), contents.end());
    write_atomic(path, "", data, -1);
}

}  // namespace mirrored
