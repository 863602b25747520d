// Numbers from environment variables, read as carefully as a config key: a value out of range or
// not a number is a ConfigError (exit 2) naming the variable, never a silent wrap or a hang.
#pragma once

#include <cstdint>

namespace mirrored {

// def when `name` is unset or empty; otherwise an integer in [lo, hi].
int64_t env_integer(const char* name, int64_t def, int64_t lo, int64_t hi);

}  // namespace mirrored
