#include "base/spec_reader.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace mirrored {

namespace {

std::string trimmed(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool plain(const std::string& s) {
    if (s.empty()) return false;
    for (char c : s)
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.' || c == '/' || c == '+'))
            return false;
    return true;
}

// An item of a flow list as yaml_list writes it: quotes removed, \" and \\ unescaped.
std::string unquoted(const std::string& s) {
    if (s.size() < 2 || s.front() != '"' || s.back() != '"') return s;
    std::string out;
    for (size_t i = 1; i + 1 < s.size(); ++i) {
        if (s[i] == '\\' && i + 2 < s.size()) ++i;
        out += s[i];
    }
    return out;
}

}  // namespace

std::string yaml_list(const std::vector<std::string>& items) {
    std::string s = "[";
    for (const std::string& item : items) {
        if (s.size() > 1) s += ", ";
        if (plain(item)) {
            s += item;
            continue;
        }
        s += '"';
        for (char c : item) {
            if (c == '"' || c == '\\') s += '\\';
            s += c;
        }
        s += '"';
    }
    return s + "]";
}

const std::string* FieldsReader::value(const std::string& path) {
    const std::string key = path.rfind(prefix_ + ".", 0) == 0 ? path.substr(prefix_.size() + 1) : path;
    for (const auto& [k, v] : fields_)
        if (k == key) {
            read_.insert(k);
            return &v;
        }
    return nullptr;
}

int64_t FieldsReader::integer(const std::string& path, int64_t def, int64_t lo, int64_t hi) {
    const std::string* v = value(path);
    if (!v) return def;
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end != '\0' || errno || x < lo || x > hi)
        fail(path, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + *v + "'");
    return x;
}

double FieldsReader::number(const std::string& path, double def, double lo, double hi) {
    const std::string* v = value(path);
    if (!v) return def;
    char* end = nullptr;
    const double x = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0' || !std::isfinite(x) || x < lo || x > hi)
        fail(path, "expected a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + *v + "'");
    return x;
}

double FieldsReader::number_above(const std::string& path, double def, double lo, double hi) {
    const double x = number(path, def, lo, hi);
    if (has(path) && !(x > lo)) fail(path, "expected a number above " + std::to_string(lo));
    return x;
}

bool FieldsReader::boolean(const std::string& path, bool def) {
    const std::string* v = value(path);
    if (!v) return def;
    if (*v == "true") return true;
    if (*v == "false") return false;
    fail(path, "expected true or false, got '" + *v + "'");
}

std::string FieldsReader::choice(const std::string& path, const std::string& def,
                                 const std::vector<std::string>& allowed) {
    const std::string v = text(path, def);
    std::string list;
    for (const auto& a : allowed) {
        if (v == a) return v;
        list += (list.empty() ? "" : ", ") + a;
    }
    fail(path, "expected one of " + list + ", got '" + v + "'");
}

std::string FieldsReader::text(const std::string& path, const std::string& def) {
    const std::string* v = value(path);
    return v ? *v : def;
}

std::string FieldsReader::nonempty_text(const std::string& path, const std::string& def) {
    const std::string v = text(path, def);
    if (v.empty()) fail(path, "expected a non-empty string");
    return v;
}

std::vector<std::string> FieldsReader::items(const std::string& path) {
    const std::string* v = value(path);
    if (!v) return {};
    std::string s = trimmed(*v);
    if (s.size() < 2 || s.front() != '[' || s.back() != ']') return {s};
    s = s.substr(1, s.size() - 2);
    std::vector<std::string> out;
    std::string item;
    bool quoted = false;
    for (size_t i = 0; i <= s.size(); ++i) {  // commas inside quotes belong to the item
        if (i == s.size() || (s[i] == ',' && !quoted)) {
            const std::string t = trimmed(item);
            if (t.empty()) fail(path, "expected a list like [a, b], got '" + *v + "'");
            out.push_back(unquoted(t));
            item.clear();
            continue;
        }
        if (s[i] == '\\' && quoted && i + 1 < s.size()) item += s[i++];
        else if (s[i] == '"') quoted = !quoted;
        item += s[i];
    }
    return out;
}

std::vector<std::string> FieldsReader::text_list(const std::string& path) { return items(path); }

std::vector<int> FieldsReader::integer_list(const std::string& path, const std::vector<int>& def, int lo, int hi) {
    if (!has(path)) return def;
    std::vector<int> out;
    for (const std::string& item : items(path)) {
        FieldsReader one("", {{"x", item}});
        out.push_back(int(one.integer("x", 0, lo, hi)));
    }
    return out;
}

std::vector<double> FieldsReader::number_list(const std::string& path) {
    std::vector<double> out;
    for (const std::string& item : items(path)) {
        FieldsReader one("", {{"x", item}});
        out.push_back(one.number("x", 0, -1e30, 1e30));
    }
    return out;
}

size_t FieldsReader::list_size(const std::string& path) { return items(path).size(); }

void FieldsReader::finish() const {
    for (const auto& [k, v] : fields_)
        if (!read_.count(k)) throw ConfigError(prefix_.empty() ? k : prefix_ + "." + k, "unknown key");
}

}  // namespace mirrored
