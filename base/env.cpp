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

}  // namespace mirrored
