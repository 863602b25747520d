// Numbers from environment variables, read as carefully as a config key: a value out of range or
// not a number is a ConfigError (exit 2) naming the variable, never a silent wrap or a hang.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mirrored {

// def when `name` is unset or empty; otherwise an integer in [lo, hi].
int64_t env_integer(const char* name, int64_t def, int64_t lo, int64_t hi);

// A knob of colon-separated fields ("0:120", "1:40:kill"): empty when `name` is unset or empty;
// otherwise exactly one field per entry of `ranges`, each an integer in its [lo, hi] - or, where
// `words` names a field's choices ({field, "kill|hang"}), one of them. Anything else is a
// ConfigError showing `form`, never a knob silently ignored.
std::vector<std::string> env_fields(const char* name, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                                    const std::string& form,
                                    const std::vector<std::pair<size_t, std::string>>& words = {});

}  // namespace mirrored
