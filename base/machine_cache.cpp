#include "base/machine_cache.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

namespace mirrored {

namespace fs = std::filesystem;

namespace {

fs::path cache_path(const std::string& file) {
    if (const char* d = std::getenv("MIRRORED_CACHE_DIR"); d && *d) return fs::path(d) / file;
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "mirrored" / file;
    if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "mirrored" / file;
    return {};
}

// Keys and values are single lines without tabs: anything else would corrupt the file.
bool storable(const std::string& s) { return s.find_first_of("\t\n\r") == std::string::npos; }

}  // namespace

std::optional<std::string> cache_lookup(const std::string& file, const std::string& key) {
    const fs::path f = cache_path(file);
    if (f.empty() || !storable(key)) return std::nullopt;
    std::ifstream in(f);
    std::string line;
    while (std::getline(in, line)) {
        const size_t tab = line.find('\t');
        if (tab != std::string::npos && line.compare(0, tab, key) == 0 && tab == key.size())
            return line.substr(tab + 1);
    }
    return std::nullopt;
}

namespace {

// Writes the file again without key's line, and with `value` under key when given. Atomic:
// written aside, then renamed.
void rewrite(const std::string& file, const std::string& key, const std::optional<std::string>& value) {
    const fs::path f = cache_path(file);
    if (f.empty() || !storable(key) || (value && !storable(*value))) return;
    std::vector<std::string> keep;
    bool found = false;
    {
        std::ifstream in(f);
        std::string line;
        while (std::getline(in, line) && keep.size() < 1000) {
            const size_t tab = line.find('\t');
            if (tab == std::string::npos) continue;
            if (tab == key.size() && line.compare(0, tab, key) == 0) found = true;
            else keep.push_back(line);
        }
    }
    if (!value && !found) return;
    std::error_code ec;
    fs::create_directories(f.parent_path(), ec);
    const fs::path tmp = f.string() + ".tmp" + std::to_string(::getpid());
    {
        std::ofstream out(tmp);
        for (const auto& line : keep) out << line << '\n';
        if (value) out << key << '\t' << *value << '\n';
        if (!out) {
            fs::remove(tmp, ec);
            return;
        }
    }
    fs::rename(tmp, f, ec);
    if (ec) fs::remove(tmp, ec);
}

}  // namespace

void cache_store(const std::string& file, const std::string& key, const std::string& value) {
    rewrite(file, key, value);
}

void cache_erase(const std::string& file, const std::string& key) { rewrite(file, key, std::nullopt); }

}  // namespace mirrored
