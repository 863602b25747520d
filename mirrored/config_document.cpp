#include "mirrored/config_document.h"

#include <yaml-cpp/depthguard.h>

#include <cstddef>

#include "base/error.h"
#include "base/io.h"

namespace mirrored::config_document {

namespace {

bool is_index(const std::string& s) {
    return !s.empty() && s.size() < 7 && s.find_first_not_of("0123456789") == std::string::npos;
}

constexpr int kMaxDepth = 32;
// Values a document may hold, counted as its readers see them: an alias is its anchor's values
// once more, so nine lists of nine aliases nested twelve deep would be 9^12 values to walk.
constexpr size_t kMaxValues = 100000;

bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        if (len == 0 || i + size_t(len) > s.size()) return false;
        uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
        for (int k = 1; k < len; ++k) {
            const unsigned char cc = static_cast<unsigned char>(s[i + size_t(k)]);
            if ((cc >> 6) != 0x2) return false;
            cp = (cp << 6) | (cc & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;  // overlong forms, surrogates, beyond Unicode
        i += size_t(len);
    }
    return true;
}

// For messages: control bytes and invalid UTF-8 shown escaped, long strings cut.
std::string printable(const std::string& s) { return shown_text(s, 120, !valid_utf8(s)); }

bool valid_key_path(const std::string& key) {
    if (key.empty() || key.front() == '.' || key.back() == '.' || key.find("..") != std::string::npos) return false;
    for (char ch : key)
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.')) return false;
    return true;
}

// Every string of the document is valid UTF-8 without control characters (they would be mangled
// in file names, logs and checkpoint metadata), no mapping repeats a key, nesting and size (with
// aliases expanded) are bounded.
void check_node(const YAML::Node& n, const std::string& name, const std::string& path, int depth, size_t& values) {
    auto where = [&](const YAML::Node& at) {  // a --set value has no line of its own
        return at.Mark().line >= 0 && name.rfind("--set ", 0) != 0 ? name + ":" + std::to_string(at.Mark().line + 1)
                                                                   : name;
    };
    if (depth > kMaxDepth)
        throw ConfigError(where(n) + ": " + path + ": nested more than " + std::to_string(kMaxDepth) + " levels deep");
    if (++values > kMaxValues)
        throw ConfigError(where(n) + ": " + (path.empty() ? "(document)" : path) + ": the document holds more than " +
                          std::to_string(kMaxValues) +
                          " values with its aliases expanded (a configuration has hundreds)");
    auto check_text = [&](const YAML::Node& at, const std::string& s, const std::string& key) {
        if (!valid_utf8(s)) throw ConfigError(where(at) + ": " + key + ": '" + printable(s) + "' is not valid UTF-8");
        for (unsigned char ch : s)
            if (ch < 0x20 || ch == 0x7f)
                throw ConfigError(where(at) + ": " + key + ": '" + printable(s) + "' contains a control character");
    };
    if (n.IsScalar()) {
        check_text(n, n.Scalar(), path.empty() ? "(document)" : path);
    } else if (n.IsSequence()) {
        for (size_t i = 0; i < n.size(); ++i) check_node(n[i], name, path + "." + std::to_string(i), depth + 1, values);
    } else if (n.IsMap()) {
        std::map<std::string, int> seen;
        for (auto it = n.begin(); it != n.end(); ++it) {
            if (!it->first.IsScalar()) throw ConfigError(where(it->first) + ": " + path + ": a key must be a name");
            const std::string key = it->first.Scalar();
            const std::string child = path.empty() ? key : path + "." + key;
            check_text(it->first, key, child);
            const int line = it->first.Mark().line + 1;
            auto [prev, inserted] = seen.emplace(key, line);
            if (!inserted)
                throw ConfigError(where(it->first) + ": " + printable(child) + ": the key appears twice (lines " +
                                  std::to_string(prev->second) + " and " + std::to_string(line) + ")");
            check_node(it->second, name, child, depth + 1, values);
        }
    }
}

void check_document(const YAML::Node& n, const std::string& name, const std::string& path) {
    size_t values = 0;
    check_node(n, name, path, 0, values);
}

}  // namespace

std::vector<std::string> split_path(const std::string& path) {
    std::vector<std::string> parts;
    std::stringstream ss(path);
    std::string p;
    while (std::getline(ss, p, '.')) parts.push_back(p);
    return parts;
}

YAML::Node lookup(const YAML::Node& node, const std::vector<std::string>& parts, size_t i) {
    if (i == parts.size()) return node;
    if (!node.IsDefined() || node.IsNull()) return YAML::Node(YAML::NodeType::Undefined);
    if (node.IsMap()) {
        const YAML::Node& cn = node;
        return lookup(cn[parts[i]], parts, i + 1);
    }
    if (node.IsSequence() && is_index(parts[i])) {
        const size_t idx = std::stoul(parts[i]);
        if (idx >= node.size()) return YAML::Node(YAML::NodeType::Undefined);
        const YAML::Node& cn = node;
        return lookup(cn[idx], parts, i + 1);
    }
    return YAML::Node(YAML::NodeType::Undefined);
}

std::string describe(const YAML::Node& n) {
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    return "nothing";
}

// Parses YAML text; every scalar must be valid UTF-8 without control characters, and no mapping
// may repeat a key (yaml-cpp would silently keep the first).
YAML::Node parse_document(const std::string& text, const std::string& name) {
    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::DeepRecursion& e) {
        throw ConfigError(name + ":" + std::to_string(e.mark.line + 1) + ": nested more than " +
                          std::to_string(e.depth()) + " levels deep: a configuration nests a few levels");
    } catch (const YAML::ParserException& e) {
        throw ConfigError(name + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
    } catch (const YAML::Exception& e) {
        throw ConfigError(name + ": invalid YAML: " + e.msg);
    }
    check_document(root, name, "");
    return root;
}

// Applies "a.b.c=value" to the document, creating mappings on the way.
void apply_set(YAML::Node root, const std::string& assignment) {
    const size_t eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0)
        throw ConfigError("--set " + printable(assignment) + ": expected key.path=value");
    const std::string key = assignment.substr(0, eq);
    if (!valid_key_path(key))
        throw ConfigError("--set " + printable(assignment) + ": '" + printable(key) +
                          "' is not a key path (names of a-z, 0-9 and _ joined by single dots, e.g. train.steps)");
    if (eq + 1 == assignment.size())
        throw ConfigError("--set " + printable(assignment) + ": expected a value after '='");
    YAML::Node value;
    try {
        value = YAML::Load(assignment.substr(eq + 1));
    } catch (const YAML::Exception& e) {
        throw ConfigError("--set " + printable(assignment) + ": the value is not valid YAML: " + e.msg);
    }
    check_document(value, "--set " + printable(assignment), key);
    if (value.IsNull()) throw ConfigError("--set " + printable(assignment) + ": expected a value, got nothing");
    const auto parts = split_path(key);
    YAML::Node cur(root);
    for (size_t i = 0; i < parts.size(); ++i) {
        const bool last = i + 1 == parts.size();
        if (cur.IsSequence()) {
            if (!is_index(parts[i]) || std::stoul(parts[i]) >= cur.size())
                throw ConfigError("--set " + assignment + ": " + key + ": '" + parts[i] + "' is not an index of the " +
                                  std::to_string(cur.size()) + "-element list");
            YAML::Node next = cur[std::stoul(parts[i])];
            if (last) next = value;
            cur.reset(next);
        } else {
            if (cur.IsDefined() && !cur.IsNull() && !cur.IsMap())
                throw ConfigError("--set " + assignment + ": " + key + ": '" + parts[i] +
                                  "' is inside a value that is not a mapping");
            YAML::Node next = cur[parts[i]];
            if (last) next = value;
            cur.reset(next);
        }
    }
}

}  // namespace mirrored::config_document
