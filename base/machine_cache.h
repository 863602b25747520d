// Choices measured on this machine (the BLAS kernel, the cross-device ops for a device list),
// kept so that later starts reuse them instead of measuring again. One file per kind of choice in
// ~/.cache/mirrored/ (MIRRORED_CACHE_DIR, else XDG_CACHE_HOME/mirrored), one "key<TAB>value" line
// per entry. A cache that cannot be read or written only costs a measurement.
#pragma once

#include <optional>
#include <string>

namespace mirrored {

// The value stored under key in `file` ("blas-kernel.txt"), if any.
std::optional<std::string> cache_lookup(const std::string& file, const std::string& key);
// Stores (or replaces) key's value; other keys are kept. Atomic: written aside, then renamed.
void cache_store(const std::string& file, const std::string& key, const std::string& value);
// Removes key's entry (one found wrong), so that the next start measures again.
void cache_erase(const std::string& file, const std::string& key);

}  // namespace mirrored
