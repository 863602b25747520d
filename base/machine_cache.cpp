#include "base/machine_cache.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "base/error.h"
#include "base/io.h"
#include "base/output.h"

namespace mirrored {

namespace fs = std::filesystem;

namespace {

// Where the cache lives, and the folder that must already exist before the cache's folders are
// made below it: a MIRRORED_CACHE_DIR names one folder to make, never the path above it (a typo
// must not build a tree in /); the defaults are made below the cache home's parent, or HOME.
struct CacheHome {
    fs::path dir, anchor;
};
CacheHome cache_home() {
    const auto parent = [](const fs::path& dir) {
        fs::path p = dir.lexically_normal();
        if (!p.has_filename()) p = p.parent_path();  // "a/b/": the folder b
        p = p.parent_path();
        return p.empty() ? fs::path(".") : p;
    };
    if (const char* d = std::getenv("MIRRORED_CACHE_DIR"); d && *d) return {d, parent(d)};
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return {fs::path(x) / "mirrored", parent(x)};
    if (const char* h = std::getenv("HOME"); h && *h) return {fs::path(h) / ".cache" / "mirrored", h};
    return {};
}

fs::path cache_path(const std::string& file) {
    const CacheHome home = cache_home();
    return home.dir.empty() ? fs::path() : home.dir / file;
}

// Keys and values are single lines without tabs: anything else would corrupt the file.
bool storable(const std::string& s) { return s.find_first_of("\t\n\r") == std::string::npos; }

// The cache file's lines: only a regular file is read (a FIFO or a device planted at its path
// would block or never end), at most 1 MiB; none when there is no such file.
std::vector<std::string> cache_lines(const fs::path& f) {
    std::string text;
    try {
        text = read_regular_file(f.string(), uint64_t(1) << 20);
    } catch (const InputError&) {
        return {};
    }
    std::vector<std::string> lines;
    size_t start = 0;
    while (start < text.size()) {
        const size_t end = std::min(text.find('\n', start), text.size());
        lines.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return lines;
}

}  // namespace

std::optional<std::string> cache_lookup(const std::string& file, const std::string& key) {
    const fs::path f = cache_path(file);
    if (f.empty() || !storable(key)) return std::nullopt;
    for (const std::string& line : cache_lines(f)) {
        const size_t tab = line.find('\t');
        if (tab != std::string::npos && line.compare(0, tab, key) == 0 && tab == key.size())
            return line.substr(tab + 1);
    }
    return std::nullopt;
}

namespace {

// Writes the file again without key's line, and with `value` under key when given, atomically
// (base/output.h: a new temporary, never through a planted link). A cache that cannot be written
// only costs a measurement: failures are dropped.
void rewrite(const std::string& file, const std::string& key, const std::optional<std::string>& value) {
    const fs::path f = cache_path(file);
    if (f.empty() || !storable(key) || (value && !storable(*value))) return;
    std::vector<std::string> keep;
    bool found = false;
    for (const std::string& line : cache_lines(f)) {
        const size_t tab = line.find('\t');
        if (tab == std::string::npos) continue;
        if (tab == key.size() && line.compare(0, tab, key) == 0) found = true;
        else keep.push_back(line);
    }
    // at most 1000 entries: the oldest (first) go, never the one being stored
    constexpr size_t kEntries = 1000;
    const size_t room = kEntries - (value ? 1 : 0);
    if (keep.size() > room) keep.erase(keep.begin(), keep.end() - std::ptrdiff_t(room));
    if (!value && !found) return;
    std::error_code ec;
    if (!fs::is_directory(cache_home().anchor, ec)) return;
    fs::create_directories(f.parent_path(), ec);
    std::string text;
    for (const auto& line : keep) text += line + '\n';
    if (value) text += key + '\t' + *value + '\n';
    try {
        if (fs::symlink_status(f, ec).type() == fs::file_type::regular || !fs::exists(fs::symlink_status(f, ec)))
            write_file_atomic(f.string(), text);  // never in place of a link, FIFO or device
    } catch (const Error&) {}
}

}  // namespace

void cache_store(const std::string& file, const std::string& key, const std::string& value) {
    rewrite(file, key, value);
}

void cache_erase(const std::string& file, const std::string& key) { rewrite(file, key, std::nullopt); }

}  // namespace mirrored
