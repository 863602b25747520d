#include "base/env.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "base/error.h"

namespace mirrored {

int64_t env_integer(const char* name, int64_t def, int64_t lo, int64_t hi) {
    const char* v = std::getenv(name);
    if (!v || !*v) return def;
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v, &end, 10);
    if (errno || *end || n < lo || n > hi)
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
        if (word) continue;
        char* end = nullptr;
        errno = 0;
        const long long n = std::strtoll(f.c_str(), &end, 10);
        if (f.empty() || errno || *end || n < ranges[i].first || n > ranges[i].second) refuse();
    }
    return fields;
}

}  // namespace mirrored
