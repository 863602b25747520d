#include "mirrored/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "base/env.h"
#include "base/io.h"
#include "base/error.h"
#include "base/output.h"
#include "mirrored/safetensors.h"
#include "mirrored/util.h"

namespace mirrored {

namespace fs = std::filesystem;
using json = nlohmann::json;

int64_t checkpoint_kill_hook() {
    static const int64_t step = env_integer("MIRRORED_TEST_KILL_DURING_CHECKPOINT", -1, 0, int64_t(1) << 62);
    return step;
}

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

// Test hook: kill this process half-way through writing the checkpoint of this step, to prove
// that a crash during a write never costs a good checkpoint.
bool kill_requested(int64_t step) { return step >= 0 && checkpoint_kill_hook() == step; }

// The header and data of a safetensors file into `path` atomically; kill_step: the test hook's
// step (a kill half-way through the data), -1 for none.
void write_atomic(const std::string& path, const std::string& header, const std::vector<unsigned char>& data,
                  int64_t kill_step) {
    write_file_atomic(path, [&](int fd, const std::string& tmp) {
        write_all(fd, path, tmp, header.data(), header.size());
        const char* bytes = reinterpret_cast<const char*>(data.data());
        if (kill_requested(kill_step)) {
            write_all(fd, path, tmp, bytes, data.size() / 2);
            ::fsync(fd);
            std::raise(SIGKILL);
        }
        write_all(fd, path, tmp, bytes, data.size());
    });
}

// A safetensors file read whole: its header and data section.
struct Parsed {
    std::map<std::string, SafetensorsEntry> tensors;
    std::map<std::string, std::string> meta;
    std::vector<unsigned char> data;  // the data section
};

InputFile open_input(const std::string& path) {
    try {
        return InputFile(path, /*inflate=*/false);
    } catch (const InputError& e) {
        throw CheckpointError(e.what());
    }
}

// A checkpoint's header with its checksum over the data and the metadata.
std::string checksummed_header(const SafetensorsBuilder& b, std::map<std::string, std::string> meta) {
    char crc[16];
    std::snprintf(crc, sizeof crc, "%08x", content_crc(b.data.data(), b.data.size(), meta));
    meta["checksum"] = crc;
    return b.header(meta);
}

// Reads a safetensors file: the header, then exactly the data it describes; nothing is read
// before its size is known to fit the file and the memory available.
Parsed parse(InputFile& in) {
    Parsed p;
    const std::string& path = in.path();
    try {
        SafetensorsHeader h = read_safetensors_header(in);
        const uint64_t have = in.file_size() - h.data_at, data = h.data_bytes;
        p.tensors = std::move(h.tensors);
        p.meta = std::move(h.metadata);
        if (have < data)
            throw CheckpointError(path + ": truncated: " + std::to_string(have) + " of " + std::to_string(data) +
                                  " data bytes");
        if (have > data)
            throw CheckpointError(path + ": " + std::to_string(have - data) + " unexpected bytes after the tensors");
        const uint64_t avail = available_host_memory();
        if (avail && data > avail)
            throw CheckpointError(path + ": " + format_bytes(data) + " of tensors do not fit the " +
                                  format_bytes(avail) + " of memory available");
        in.read_exact(p.data, size_t(data), "the tensors");
    } catch (const InputError& e) {
        throw CheckpointError(e.what());
    }
    return p;
}

std::vector<float> tensor_values(const Parsed& p, const std::string& path, const std::string& name) {
    const SafetensorsEntry& t = p.tensors.at(name);
    if (t.dtype != "F32") throw CheckpointError(path + ": tensor " + name + " is " + t.dtype + ", expected F32");
    std::vector<float> v((t.end - t.begin) / 4);
    if (!v.empty()) std::memcpy(v.data(), p.data.data() + t.begin, t.end - t.begin);
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
    std::snprintf(crc, sizeof crc, "%08x", content_crc(p.data.data(), p.data.size(), p.meta));
    if (meta_of(p, path, "checksum") != crc)
        throw CheckpointError(path + ": checksum mismatch (stored " + meta_of(p, path, "checksum") + ", computed " +
                              crc + "): the file is corrupt");
}

// A non-negative integer of metadata, at most `max` (absurd values are corruption).
int64_t meta_int(const Parsed& p, const std::string& path, const std::string& key, int64_t max = int64_t(1) << 50) {
    const std::string& s = meta_of(p, path, key);
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    // digits only: strtoll would skip any leading white space, "\n-1" included
    if (s.empty() || *end || errno || !std::isdigit(static_cast<unsigned char>(s.front())))
        throw CheckpointError(path + ": metadata '" + key + "' is not a non-negative integer");
    if (v > max)
        throw CheckpointError(path + ": metadata '" + key + "' is " + s + ", more than " + std::to_string(max));
    return v;
}

uint64_t meta_u64(const Parsed& p, const std::string& path, const std::string& key, int base) {
    const std::string& s = meta_of(p, path, key);
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(s.c_str(), &end, base);
    if (s.empty() || *end || errno || !std::isxdigit(static_cast<unsigned char>(s.front())))
        throw CheckpointError(path + ": metadata '" + key + "' is not a non-negative integer");
    return v;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
    char name[64];
    std::snprintf(name, sizeof name, "step-%010lld.safetensors", static_cast<long long>(step));
    return (fs::path(dir) / name).string();
}

namespace {

struct CheckpointBytes {
    std::string header;
    std::vector<unsigned char> data;
};

CheckpointBytes build_checkpoint(const Model& model, const CheckpointData& d) {
    SafetensorsBuilder b;
    for (const auto& t : model.tensors()) b.add(t.name, t.shape, d.params.data() + t.offset, t.count);
    for (const auto& [state, flat] : d.optimizer)
        for (const auto& t : model.tensors())
            if (t.trainable) b.add("optimizer." + state + "." + t.name, t.shape, flat.data() + t.offset, t.count);
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
        {"blas_kernel", d.blas_kernel},
        {"cross_device_ops", d.cross_device_ops},
        {"global_batch", std::to_string(d.global_batch)},
        {"train_samples", std::to_string(d.train_samples)},
        {"train_data_fingerprint", hex64(d.train_data)},
        {"loss_scale", exact(d.loss_scale[0]) + "," + exact(d.loss_scale[1])},
        {"software", d.software},
    };
    json metrics = json::array();
    for (const auto& m : d.train_metrics) metrics.push_back({exact(m[0]), exact(m[1]), exact(m[2])});
    meta["train_metrics"] = metrics.dump();
    if (!d.gemm_choices.empty()) meta["gemm_choices"] = d.gemm_choices;
    if (d.device_hours > 0) meta["device_hours"] = exact(d.device_hours);
    std::string states;
    for (const auto& [state, flat] : d.optimizer) states += (states.empty() ? "" : ",") + state;
    meta["optimizer_state"] = states;
    std::string header = checksummed_header(b, meta);
    return {std::move(header), std::move(b.data)};
}

}  // namespace

void write_checkpoint(const std::string& path, const Model& model, const CheckpointData& d) {
    const CheckpointBytes c = build_checkpoint(model, d);
    write_atomic(path, c.header, c.data, d.step);
}

std::string checkpoint_bytes(const Model& model, const CheckpointData& d) {
    CheckpointBytes c = build_checkpoint(model, d);
    c.header.append(reinterpret_cast<const char*>(c.data.data()), c.data.size());
    return std::move(c.header);
}

CheckpointData read_checkpoint(const std::string& path, const Model& model, uint64_t expected_hash,
                               const std::string& expected_summary) {
    return read_checkpoint(open_input(path), model, expected_hash, expected_summary);
}

namespace {

// Training never saves a NaN or an infinity (a diverged run stops before its checkpoint): one in a
// checkpoint with a valid checksum was put there by hand, and resuming it would diverge at once.
void check_finite(const CheckpointData& d, const Model& model, const std::string& path) {
    auto first_bad = [](const std::vector<float>& v) {
        for (size_t i = 0; i < v.size(); ++i)
            if (!std::isfinite(v[i])) return i;
        return v.size();
    };
    auto name_at = [&](size_t i, const std::string& prefix) {
        for (const auto& t : model.tensors())
            if (i >= t.offset && i < t.offset + t.count)
                return prefix + t.name + " element " + std::to_string(i - t.offset);
        return prefix + "element " + std::to_string(i);
    };
    auto refuse = [&](const std::string& where) {
        throw CheckpointError(path + ": " + where +
                              " is not finite (NaN or infinite): training cannot continue "
                              "from it; resume from an earlier checkpoint");
    };
    if (const size_t i = first_bad(d.params); i < d.params.size()) refuse(name_at(i, ""));
    for (const auto& [state, values] : d.optimizer) {
        if (const size_t i = first_bad(values); i < values.size()) refuse(name_at(i, "optimizer." + state + "."));
        if (state != "exp_avg_sq") continue;
        // a mean of squares is never negative: AdamW would take the square root of one
        for (size_t i = 0; i < values.size(); ++i)
            if (values[i] < 0)
                throw CheckpointError(path + ": " + name_at(i, "optimizer." + state + ".") +
                                      " is negative, which a mean of squared gradients never is: training cannot "
                                      "continue from it; resume from an earlier checkpoint");
    }
}

}  // namespace

CheckpointData read_checkpoint(InputFile&& in, const Model& model, uint64_t expected_hash,
                               const std::string& expected_summary) {
    const std::string path = in.path();
    const Parsed p = parse(in);
    verify(p, path);
    CheckpointData d;
    d.model_hash = meta_u64(p, path, "model_hash", 16);
    d.model_summary = meta_of(p, path, "model");
    if (d.model_hash != expected_hash)
        throw ForeignCheckpointError(
            path + ": written for a different model or optimizer and cannot be resumed here.\n  checkpoint: " +
            d.model_summary + "\n  this run:   " + expected_summary);
    d.step = meta_int(p, path, "step");
    d.loader = {meta_int(p, path, "loader_epoch"), meta_int(p, path, "loader_batch")};
    d.seed = meta_u64(p, path, "seed", 10);
    d.replicas = int(meta_int(p, path, "replicas", 1024));
    if (d.replicas < 1) throw CheckpointError(path + ": metadata 'replicas' is 0");
    if (p.meta.count("global_batch")) d.global_batch = meta_int(p, path, "global_batch", int64_t(1) << 31);
    if (p.meta.count("train_samples")) d.train_samples = meta_int(p, path, "train_samples");
    if (p.meta.count("train_data_fingerprint")) d.train_data = meta_u64(p, path, "train_data_fingerprint", 16);
    d.devices = meta_of(p, path, "devices");
    if (p.meta.count("blas_kernel")) d.blas_kernel = meta_of(p, path, "blas_kernel");
    if (p.meta.count("gemm_choices")) d.gemm_choices = meta_of(p, path, "gemm_choices");
    if (p.meta.count("cross_device_ops")) d.cross_device_ops = meta_of(p, path, "cross_device_ops");
    if (p.meta.count("software")) d.software = meta_of(p, path, "software");
    d.config_yaml = meta_of(p, path, "config");
    try {
        const json m = json::parse(meta_of(p, path, "train_metrics"));
        if (!m.is_array() || m.size() > 1024) throw std::runtime_error("not a list of replicas");
        for (const json& r : m) {
            if (!r.is_array() || r.size() != 3) throw std::runtime_error("not three sums");
            std::array<double, 3> v{};
            for (int k = 0; k < 3; ++k) {
                v[size_t(k)] = std::stod(r[size_t(k)].get<std::string>());
                if (!std::isfinite(v[size_t(k)]) || (k > 0 && v[size_t(k)] < 0)) throw std::runtime_error("not finite");
            }
            d.train_metrics.push_back(v);
        }
    } catch (const std::exception&) {
        throw CheckpointError(path + ": metadata 'train_metrics' is malformed");
    }
    auto gather = [&](const std::string& prefix, bool trainable_only) {
        std::vector<float> flat(trainable_only ? model.trainable_size() : model.flat_size(), 0.0f);
        for (const auto& t : model.tensors()) {
            if (trainable_only && !t.trainable) continue;
            const std::string name = prefix + t.name;
            auto it = p.tensors.find(name);
            if (it == p.tensors.end()) throw CheckpointError(path + ": tensor " + name + " is missing");
            if (it->second.shape != t.shape)
                throw CheckpointError(path + ": tensor " + name + " has another shape than the model's");
            const auto v = tensor_values(p, path, name);
            std::copy(v.begin(), v.end(), flat.begin() + long(t.offset));
        }
        return flat;
    };
    d.params = gather("", false);
    if (p.meta.count("loss_scale")) {
        const std::string& ls = meta_of(p, path, "loss_scale");
        char* end = nullptr;
        d.loss_scale[0] = std::strtof(ls.c_str(), &end);
        if (*end != ',') throw CheckpointError(path + ": metadata 'loss_scale' is malformed");
        d.loss_scale[1] = std::strtof(end + 1, &end);
        if (*end || !(d.loss_scale[0] > 0) || !std::isfinite(d.loss_scale[0]) || !(d.loss_scale[1] >= 0))
            throw CheckpointError(path + ": metadata 'loss_scale' is malformed");
    }
    if (p.meta.count("device_hours")) {
        const std::string& h = meta_of(p, path, "device_hours");
        char* end = nullptr;
        d.device_hours = std::strtod(h.c_str(), &end);
        if (h.empty() || *end || !std::isfinite(d.device_hours) || d.device_hours < 0 || d.device_hours > 1e9)
            throw CheckpointError(path + ": metadata 'device_hours' is malformed (expected hours, 0 to 1e9)");
    }
    const std::string states = meta_of(p, path, "optimizer_state");
    size_t start = 0;
    while (start < states.size()) {
        size_t comma = states.find(',', start);
        if (comma == std::string::npos) comma = states.size();
        const std::string state = states.substr(start, comma - start);
        if (state != "momentum_buffer" && state != "exp_avg" && state != "exp_avg_sq")
            throw CheckpointError(path + ": metadata 'optimizer_state' names an unknown state '" + state + "'");
        d.optimizer.emplace_back(state, gather("optimizer." + state + ".", true));
        start = comma + 1;
    }
    check_finite(d, model, path);
    // an epoch is at least one step: a loader further on than the steps taken is not a checkpoint
    // this program wrote
    if (d.loader.epoch > d.step)
        throw CheckpointError(path + ": its loader is at epoch " + std::to_string(d.loader.epoch) + " after " +
                              std::to_string(d.step) + " steps, which no run reaches");
    return d;
}

std::string safetensors_bytes(const SafetensorsFile& file, bool with_checksum) {
    SafetensorsBuilder b;
    for (const auto& [name, t] : file.tensors) b.add(name, t.first, t.second.data(), t.second.size());
    for (const auto& [name, t] : file.int_tensors) b.add(name, t.first, t.second.data(), t.second.size());
    std::string out = with_checksum ? checksummed_header(b, file.metadata) : b.header(file.metadata);
    out.append(reinterpret_cast<const char*>(b.data.data()), b.data.size());
    return out;
}

void write_safetensors(const std::string& path, const SafetensorsFile& file, bool with_checksum) {
    write_file_atomic(path, safetensors_bytes(file, with_checksum));
}

SafetensorsFile read_safetensors(const std::string& path, bool verify_checksum) {
    return read_safetensors(open_input(path), verify_checksum);
}

SafetensorsFile read_safetensors(InputFile&& in, bool verify_checksum) {
    const std::string path = in.path();
    const Parsed p = parse(in);
    if (verify_checksum) verify(p, path);
    SafetensorsFile f;
    f.metadata = p.meta;
    for (const auto& [name, t] : p.tensors) {
        if (t.dtype == "I64") {
            std::vector<int64_t> v((t.end - t.begin) / 8);
            if (!v.empty()) std::memcpy(v.data(), p.data.data() + t.begin, t.end - t.begin);
            f.int_tensors[name] = {t.shape, std::move(v)};
        } else {
            f.tensors[name] = {t.shape, tensor_values(p, path, name)};
        }
    }
    return f;
}

std::vector<std::string> list_checkpoints(const std::string& dir, std::vector<std::string>* ignored,
                                          bool remove_stale) {
    std::vector<std::string> out;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return out;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.size() > 4 && name.front() == '.' && name.substr(name.size() - 4) == ".tmp") {
            if (remove_stale) fs::remove(e.path(), ec);  // a write that never finished
            continue;
        }
        if (checkpoint_step(name) < 0) continue;
        if (e.symlink_status(ec).type() == fs::file_type::regular) out.push_back(e.path().string());
        else if (ignored) ignored->push_back(e.path().string());
    }
    // newest first, by the number (past 10 digits the names no longer sort as text)
    std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
        const int64_t sa = checkpoint_step(a), sb = checkpoint_step(b);
        return sa != sb ? sa > sb : a > b;
    });
    return out;
}

std::map<std::string, std::string> peek_checkpoint_metadata(const std::string& path) {
    try {
        return peek_checkpoint_metadata(open_input(path));
    } catch (const std::exception&) {
        return {};
    }
}

std::map<std::string, std::string> read_checkpoint_metadata(const std::string& path) {
    InputFile in = open_input(path);
    return read_safetensors_header(in).metadata;
}

std::map<std::string, std::string> peek_checkpoint_metadata(InputFile&& in) {
    try {
        return read_safetensors_header(in).metadata;
    } catch (const std::exception&) {  // unreadable: no hint; resuming reads it properly and says why
        return {};
    }
}

int64_t checkpoint_step(const std::string& path) {
    const std::string name = fs::path(path).filename().string();
    const std::string prefix = "step-", suffix = ".safetensors";
    if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        return -1;
    const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    if (digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoll(digits);
}

void prune_checkpoints(const std::string& dir, int keep, int64_t upto) {
    std::error_code ec;
    int kept = 0;
    for (const std::string& path : list_checkpoints(dir)) {
        if (checkpoint_step(path) > upto) continue;  // not this run's past: never removed here
        if (++kept > std::max(keep, 1)) fs::remove(path, ec);
    }
}

}  // namespace mirrored
