// Small helpers the host code shares: a monotonic clock and fixed-width hex.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mirrored {

inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline std::string hex64(uint64_t v) {
    char b[20];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return b;
}

}  // namespace mirrored
