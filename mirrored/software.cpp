#include "mirrored/software.h"

#include <nlohmann/json.hpp>

#include <sstream>

#include "kernels/blas.h"
#include "kernels/device.h"
#include "mirrored/nodes.h"

#ifndef MIRRORED_VERSION
#define MIRRORED_VERSION "unknown"
#endif

namespace mirrored {

namespace {

std::string triple(int v) {  // major x 10000 + minor x 100 + patch
    return v > 0 ? std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100)
                 : "none";
}

std::string compiler() {
#if defined(__clang__)
    return std::string("clang++ ") + __clang_version__;
#elif defined(__GNUC__)
    return std::string("g++ ") + __VERSION__;
#else
    return "unknown";
#endif
}

}  // namespace

std::string mirrored_version() { return MIRRORED_VERSION; }

std::vector<SoftwareEntry> software() {
    const CudaVersions cuda = cuda_versions();
    const bool with_cuda = cuda_compiled();
    return {
        {"mirrored", mirrored_version(), true},
        {"compiler", compiler(), false},
        {"CUDA runtime", with_cuda ? cuda_version_text(cuda.runtime) : "none (CPU-only build)", true},
        {"CUDA driver", cuda_version_text(cuda.driver), false},
        {"cuBLAS", triple(cuda.cublas), false},
        {"NCCL", nccl_version_text(cuda.nccl), true},  // ranks of one communicator must run one NCCL
        {"BLAS", blas_library() + ", kernel " + blas_kernel(), false},
        {"MPI", Nodes::library(), true},
    };
}

std::string version_text() {
    std::string s = "mirrored " + mirrored_version();
    for (const SoftwareEntry& e : software())
        if (e.name != "mirrored") s += "\n  " + e.name + ": " + e.value;
    return s;
}

std::string software_line() {
    std::string s;
    for (const SoftwareEntry& e : software()) {
        if (e.name == "mirrored") s = "mirrored " + e.value;
        else if (e.name == "compiler") s += " (" + e.value + ")";
        else s += ", " + e.name + " " + e.value;
    }
    return s;
}

std::string software_json() {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    for (const SoftwareEntry& e : software()) j[e.name] = e.value;
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string software_fingerprint() {
    std::string s;
    for (const SoftwareEntry& e : software())
        s += e.name + "\t" + e.value + "\t" + (e.nodes_must_match ? "1" : "0") + "\n";
    return s;
}

SoftwareComparison compare_software(const std::vector<std::string>& fingerprints) {
    auto parse = [](const std::string& text) {
        std::vector<SoftwareEntry> entries;
        std::istringstream in(text);
        std::string line;
        while (std::getline(in, line)) {
            const size_t a = line.find('\t'), b = line.rfind('\t');
            if (a == std::string::npos || b == a) continue;
            entries.push_back({line.substr(0, a), line.substr(a + 1, b - a - 1), line.substr(b + 1) == "1"});
        }
        return entries;
    };
    SoftwareComparison c;
    if (fingerprints.empty()) return c;
    const std::vector<SoftwareEntry> first = parse(fingerprints[0]);
    std::vector<std::string> differences;
    for (size_t k = 1; k < fingerprints.size(); ++k) {
        const std::vector<SoftwareEntry> other = parse(fingerprints[k]);
        const std::string node = "node " + std::to_string(k);
        for (const SoftwareEntry& e : first) {
            const SoftwareEntry* o = nullptr;
            for (const SoftwareEntry& x : other)
                if (x.name == e.name) o = &x;
            if (o && o->value == e.value) continue;
            const std::string what =
                node + " runs " + e.name + " " + (o ? o->value : "(not reported)") + " where node 0 runs " + e.value;
            if (e.nodes_must_match) differences.push_back(what);
            else c.notes.push_back(what);
        }
    }
    for (size_t i = 0; i < differences.size(); ++i) c.refusal += (i ? "; " : "") + differences[i];
    if (!c.refusal.empty())
        c.refusal +=
            ": every node must run the same mirrored build, CUDA runtime, NCCL and MPI (mirrored --version "
            "on each shows them)";
    return c;
}

}  // namespace mirrored
