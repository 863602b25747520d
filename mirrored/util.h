// Small helpers the host code shares: a monotonic clock and the wall clock, fixed-width hex and
// numbers as text.
#pragma once

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace mirrored {

inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The wall clock (seconds since 1970): what a record's time means across a crash and a resume.
inline double unix_time_s() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

inline std::string hex64(uint64_t v) {
    char b[20];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return b;
}

// A duration for a person to read: "42s", "3m07s", "2h05m" ("?" when not finite or negative).
inline std::string duration_str(double s) {
    if (!std::isfinite(s) || s < 0) return "?";
    char b[32];
    if (s >= 3.6e9) {  // a million hours and more: no whole seconds to count (nor a long to hold them)
        std::snprintf(b, sizeof b, "%.3gh", s / 3600);
        return b;
    }
    const long t = long(s + 0.5);
    if (t >= 3600) std::snprintf(b, sizeof b, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) std::snprintf(b, sizeof b, "%ldm%02lds", t / 60, t % 60);
    else std::snprintf(b, sizeof b, "%lds", t);
    return b;
}

// A number for a person to read (six significant digits: %g).
inline std::string number_str(double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return b;
}

// A tensor's shape as "[2, 3]".
inline std::string shape_str(const std::vector<int>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// A float or double as the text a config would hold: printf's %g where that reads back as the
// same value (0.1, 1e-05, 0.0001), else the shortest decimal that does (0.1234567, not %g's
// 0.123457 or a 17-digit 0.10000000000000001).
template <class T>
std::string decimal_text(T v) {
    char b[64];
    std::snprintf(b, sizeof b, "%g", static_cast<double>(v));
    T back{};
    const char* end = b + std::char_traits<char>::length(b);
    if (std::from_chars(b, end, back).ptr == end && back == v) return b;
    return std::string(b, std::to_chars(b, b + sizeof b, v).ptr);
}

}  // namespace mirrored
