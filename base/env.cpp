#include "base/env.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "base/error.h"

namespace mirrored {

namespace {

// A whole decimal integer in [lo, hi], nothing before or after it.
bool integer_in(const std::string& text, int64_t lo, int64_t hi, int64_t* out) {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || errno || *end || n < lo || n > hi) return false;
    *out = n;
    return true;
}

}  // namespace

int64_t env_integer(const char* name, int64_t def, int64_t lo, int64_t hi) {
    const char* v = std::getenv(name);
    if (!v || !*v) return def;
    int64_t n = 0;
    if (!integer_in(v, lo, hi, &n))
        throw ConfigError(std::string(name) + "=" + v + ": expected an integer from " + std::to_string(lo) + " to " +
                          std::to_string(hi));
    return n;
}

std::vector<std::string> env_fields(const char* name, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                    const std::string& form, const std::vector<std::pair<size_t, std::string>>& words) {
    const char* v = std::getenv(name);
    if (!v || !*v) return {};
    std::vector<std::string> fields(1);
    for (const char* c = v; *c; ++c) {
        if (*c == ':') fields.emplace_back();
        else fields.back() += *c;
    }
    const auto refuse = [&] { throw ConfigError(std::string(name) + "=" + v + ": expected " + form); };
    if (fields.size() != ranges.size()) refuse();
    for (size_t i = 0; i < fields.size(); ++i) {
        const std::string& f = fields[i];
        bool word = false;
        for (const auto& [at, choices] : words)
            if (at == i) {
                word = true;
                if (f.empty() || f.find('|') != std::string::npos ||
                    ("|" + choices + "|").find("|" + f + "|") == std::string::npos)
                    refuse();
            }
        int64_t n = 0;
        if (!word && !integer_in(f, ranges[i].first, ranges[i].second, &n)) refuse();
    }
    return fields;
}

}  // namespace mirrored
