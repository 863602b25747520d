// The one place every configuration key is read: its type, range and default.
#include "mirrored/config.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>

#include "base/io.h"
#include "base/error.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/hf_models.h"
#include "mirrored/optimizer.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

std::vector<std::string> split_path(const std::string& path) {
    std::vector<std::string> parts;
    std::stringstream ss(path);
    std::string p;
    while (std::getline(ss, p, '.')) parts.push_back(p);
    return parts;
}

bool is_index(const std::string& s) {
    return !s.empty() && s.size() < 7 && s.find_first_not_of("0123456789") == std::string::npos;
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

constexpr uint64_t kMaxConfigBytes = uint64_t(4) << 20;  // a configuration is text, never this large
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
std::string printable(const std::string& s) {
    std::string out;
    const bool utf8 = valid_utf8(s);
    for (unsigned char ch : s.substr(0, 120)) {
        if (ch < 0x20 || ch == 0x7f || (!utf8 && ch >= 0x80)) {
            char e[8];
            std::snprintf(e, sizeof e, "\\x%02x", ch);
            out += e;
        } else {
            out += char(ch);
        }
    }
    return s.size() > 120 ? out + "..." : out;
}

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

std::string describe(const YAML::Node& n) {
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    return "nothing";
}

// Reads typed values by key path, remembering every path it was asked for, so that any key
// left over afterwards is unknown.
class Reader final : public SpecReader {
public:
    Reader(YAML::Node root, std::string file, std::map<std::string, std::string> set_origin)
        : root_(std::move(root)), file_(std::move(file)), set_origin_(std::move(set_origin)) {}

    std::map<std::string, std::string> where;

    YAML::Node at(const std::string& path) {
        const auto parts = split_path(path);
        std::string prefix;
        for (const auto& p : parts) {
            prefix += (prefix.empty() ? "" : ".") + p;
            visited_.insert(prefix);
        }
        YAML::Node n = lookup(root_, parts, 0);
        where[path] = location(path, n);
        return n;
    }

    std::string location(const std::string& path, const YAML::Node& n) const {
        for (const auto& [p, origin] : set_origin_)
            if (path == p || path.rfind(p + ".", 0) == 0) return origin;
        if (n.IsDefined() && n.Mark().line >= 0) return file_ + ":" + std::to_string(n.Mark().line + 1);
        // a missing key: point at the nearest enclosing node that exists
        auto parts = split_path(path);
        while (!parts.empty()) {
            parts.pop_back();
            YAML::Node p = lookup(root_, parts, 0);
            if (p.IsDefined() && p.Mark().line >= 0) return file_ + ":" + std::to_string(p.Mark().line + 1);
        }
        return file_;
    }

    [[noreturn]] void fail(const std::string& path, const std::string& what) override {
        throw ConfigError(location(path, lookup(root_, split_path(path), 0)) + ": " + path + ": " + what);
    }

    // A value the file does not hold, as if it did; messages about it name `origin`.
    void define(const std::string& path, const YAML::Node& value, const std::string& origin) {
        const auto parts = split_path(path);
        YAML::Node n = root_;
        for (size_t i = 0; i + 1 < parts.size(); ++i) {
            if (!n[parts[i]].IsDefined() || n[parts[i]].IsNull()) n[parts[i]] = YAML::Node(YAML::NodeType::Map);
            n.reset(n[parts[i]]);
        }
        n[parts.back()] = value;
        set_origin_[path] = origin;
    }

    bool has(const std::string& path) override {
        YAML::Node n = at(path);
        return n.IsDefined() && !n.IsNull();
    }

    // A key that is present must have a value: `steps:` with nothing after it is an error, not
    // the default (a forgotten value should not silently mean something else).
    bool absent(const std::string& path, const YAML::Node& n) {
        if (!n.IsDefined()) return true;
        if (n.IsNull()) fail(path, "expected a value, got nothing (remove the key to use the default)");
        return false;
    }

    std::string text(const std::string& path, const std::string& def) override { return str(path, def); }
    std::string nonempty_text(const std::string& path, const std::string& def) override {
        return nonempty_str(path, def);
    }
    std::vector<std::string> text_list(const std::string& path) override { return str_list(path); }
    std::vector<int> integer_list(const std::string& path, const std::vector<int>& def, int lo, int hi) override {
        return int_list(path, def, lo, hi);
    }
    std::vector<double> number_list(const std::string& path) override { return numbers_as<double>(path); }

    std::string str(const std::string& path, const std::string& def) {
        YAML::Node n = at(path);
        if (absent(path, n)) return def;
        if (!n.IsScalar()) fail(path, "expected a string, got " + describe(n));
        return n.Scalar();
    }

    std::string nonempty_str(const std::string& path, const std::string& def) {
        const std::string v = str(path, def);
        if (v.empty()) fail(path, "expected a non-empty string");
        return v;
    }

    std::string choice(const std::string& path, const std::string& def,
                       const std::vector<std::string>& allowed) override {
        const std::string v = str(path, def);
        for (const auto& a : allowed)
            if (v == a) return v;
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        fail(path, "expected one of " + list + ", got '" + v + "'");
    }

    int64_t integer(const std::string& path, int64_t def, int64_t lo, int64_t hi) override {
        YAML::Node n = at(path);
        if (absent(path, n)) return def;
        int64_t v = 0;
        if (!n.IsScalar() || !parse_int(n.Scalar(), v))
            fail(path, "expected an integer" + range(lo, hi) + ", got " + describe(n));
        if (v < lo || v > hi) fail(path, "expected an integer" + range(lo, hi) + ", got " + std::to_string(v));
        return v;
    }

    double number(const std::string& path, double def, double lo, double hi) override {
        return number(path, def, lo, hi, false);
    }
    double number_above(const std::string& path, double def, double lo, double hi) override {
        return number(path, def, lo, hi, true);
    }
    double number(const std::string& path, double def, double lo, double hi, bool lo_open) {
        YAML::Node n = at(path);
        if (absent(path, n)) return def;
        double v = 0;
        if (!n.IsScalar() || !parse_double(n.Scalar(), v))
            fail(path, "expected a number" + nrange(lo, hi, lo_open) + ", got " + describe(n));
        if (!(lo_open ? v > lo : v >= lo) || v > hi)
            fail(path, "expected a number" + nrange(lo, hi, lo_open) + ", got " + n.Scalar());
        return v;
    }

    bool boolean(const std::string& path, bool def) override {
        YAML::Node n = at(path);
        if (absent(path, n)) return def;
        const std::string s = n.IsScalar() ? n.Scalar() : "";
        if (s == "true" || s == "True" || s == "yes") return true;
        if (s == "false" || s == "False" || s == "no") return false;
        fail(path, "expected true or false, got " + describe(n));
    }

    std::vector<int> int_list(const std::string& path, const std::vector<int>& def, int lo, int hi) {
        YAML::Node n = at(path);
        if (absent(path, n)) return def;
        if (!n.IsSequence() || n.size() == 0) fail(path, "expected a non-empty list of integers, got " + describe(n));
        std::vector<int> out;
        for (size_t i = 0; i < n.size(); ++i) out.push_back(int(integer(path + "." + std::to_string(i), 0, lo, hi)));
        return out;
    }

    // Numbers read as T (float: what the data pipeline computes in; double: the optimizer's
    // hyperparameters, which stay what the user wrote).
    template <class T>
    std::vector<T> numbers_as(const std::string& path) {
        YAML::Node n = at(path);
        if (absent(path, n)) return {};
        if (!n.IsSequence() || n.size() == 0) fail(path, "expected a non-empty list of numbers, got " + describe(n));
        std::vector<T> out;
        for (size_t i = 0; i < n.size(); ++i) out.push_back(T(number(path + "." + std::to_string(i), 0, -1e30, 1e30)));
        return out;
    }

    std::vector<std::string> str_list(const std::string& path) {
        YAML::Node n = at(path);
        if (absent(path, n)) return {};
        if (n.IsScalar()) return {n.Scalar()};
        if (!n.IsSequence()) fail(path, "expected a file name or a list of them, got " + describe(n));
        std::vector<std::string> out;
        for (size_t i = 0; i < n.size(); ++i) out.push_back(nonempty_str(path + "." + std::to_string(i), ""));
        return out;
    }

    size_t list_size(const std::string& path) override {
        YAML::Node n = at(path);
        if (absent(path, n)) return 0;
        if (!n.IsSequence()) fail(path, "expected a list, got " + describe(n));
        return n.size();
    }

    void expect_map(const std::string& path) override {
        YAML::Node n = at(path);
        if (n.IsDefined() && !n.IsNull() && !n.IsMap()) fail(path, "expected a mapping of keys, got " + describe(n));
    }

    // Every key of the document must have been read.
    void reject_unknown() { walk(root_, ""); }

private:
    static bool parse_int(const std::string& s, int64_t& v) {
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || errno) return false;
        v = x;
        return true;
    }
    static bool parse_double(const std::string& s, double& v) {
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(x)) return false;
        v = x;
        return true;
    }
    static std::string range(int64_t lo, int64_t hi) {
        if (hi == std::numeric_limits<int64_t>::max()) return " >= " + std::to_string(lo);
        return " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    }
    static std::string nrange(double lo, double hi, bool lo_open) {
        std::ostringstream s;
        if (hi >= 1e30) s << (lo_open ? " > " : " >= ") << lo;
        else s << " in " << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
        return s.str();
    }
    void walk(const YAML::Node& n, const std::string& path) {
        if (n.IsMap()) {
            for (auto it = n.begin(); it != n.end(); ++it) {
                const std::string key = it->first.Scalar();
                const std::string child = path.empty() ? key : path + "." + key;
                if (!visited_.count(child)) {
                    std::string known;
                    for (const auto& v : visited_) {
                        const std::string pre = path.empty() ? "" : path + ".";
                        if (v.rfind(pre, 0) == 0 && v.size() > pre.size() &&
                            v.find('.', pre.size()) == std::string::npos)
                            known += (known.empty() ? "" : ", ") + v.substr(pre.size());
                    }
                    throw ConfigError(location(child, it->first) + ": " + child + ": unknown key" +
                                      (known.empty() ? "" : " (known here: " + known + ")"));
                }
                walk(it->second, child);
            }
        } else if (n.IsSequence()) {
            for (size_t i = 0; i < n.size(); ++i) walk(n[i], path + "." + std::to_string(i));
        }
    }

    YAML::Node root_;
    std::string file_;
    std::map<std::string, std::string> set_origin_;
    std::set<std::string> visited_;
};

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

}  // namespace

void Config::fail(const std::string& key, const std::string& what) const {
    auto it = where.find(key);
    throw ConfigError((it != where.end() ? it->second : file) + ": " + key + ": " + what);
}

namespace {

// ---- the sections, one reader each ----------------------------------------------------------

void read_run(Reader& r, Config& c) {
    c.run.name = r.nonempty_str("run.name", "run");
    c.run.seed = uint64_t(r.integer("run.seed", 1, 0, std::numeric_limits<int64_t>::max()));
    c.run.output_dir = r.nonempty_str("run.output_dir", "runs/" + c.run.name);
}

void read_strategy(Reader& r, Config& c) {
    c.strategy.devices = r.nonempty_str("strategy.devices", "auto");
    std::vector<std::string> ops = cross_device_ops_kinds().names();
    ops.push_back("auto");  // measured at start-up among the ops these devices run
    c.strategy.cross_device_ops = r.choice("strategy.cross_device_ops", "ring", ops);
    c.strategy.bucket_mb = r.number("strategy.bucket_mb", 4.0, 0.0, 1e6);
    c.strategy.verify_every_steps = int(r.integer("strategy.verify_every_steps", 0, 0, 1 << 30));
    const std::string wire = r.choice("strategy.allreduce_dtype", "fp32", {"fp32", "bf16"});
    c.strategy.allreduce_dtype = wire == "bf16" ? DType::bf16 : DType::f32;
    c.strategy.collective_timeout_s = r.number("strategy.collective_timeout_s", 600.0, 1.0, 1e6);
    c.strategy.step_timeout_s = r.number("strategy.step_timeout_s", 1800.0, 0.0, 1e7);
    c.strategy.shared_parameters = r.boolean("strategy.shared_parameters", false);
    const std::string shard = r.choice("strategy.shard", "none", {"none", "optimizer", "gradients"});
    c.strategy.shard = shard == "optimizer"   ? StrategyConfig::Shard::optimizer
                       : shard == "gradients" ? StrategyConfig::Shard::gradients
                                              : StrategyConfig::Shard::none;
    if (c.strategy.shard != StrategyConfig::Shard::none) {
        if (const std::string why = shard_refusal(c.strategy.cross_device_ops); !why.empty())
            r.fail("strategy.shard", shard + " " + why);
        if (c.strategy.allreduce_dtype != DType::f32)
            r.fail("strategy.shard", shard + " exchanges fp32 gradients; set strategy.allreduce_dtype: fp32");
    }
    c.strategy.cuda_graph = r.boolean("strategy.cuda_graph", false);
    c.strategy.fused_epilogues = r.boolean("strategy.fused_epilogues", false);
    c.strategy.continue_on_failure =
        r.choice("strategy.on_replica_failure", "stop", {"stop", "continue"}) == "continue";
    c.strategy.min_replicas = int(r.integer("strategy.min_replicas", 1, 1, 1024));
    if (r.has("strategy.nodes"))
        r.fail("strategy.nodes",
               "the nodes are discovered from mpirun, never configured: remove the key and start "
               "the run with 'mpirun -np NODES -H host1,host2 mirrored train CONFIG'");
}

// data.normalize: auto, none, or the per-channel {mean, std}.
void read_normalize(Reader& r, DataConfig& d) {
    YAML::Node n = r.at("data.normalize");
    if (!n.IsDefined() || !n.IsMap()) {
        const std::string v = r.choice("data.normalize", "auto", {"auto", "none"});
        d.normalize = v == "none" ? DataConfig::Normalize::none : DataConfig::Normalize::auto_compute;
        return;
    }
    d.normalize = DataConfig::Normalize::given;
    d.normalization.mean = r.numbers_as<float>("data.normalize.mean");
    d.normalization.std = r.numbers_as<float>("data.normalize.std");
    if (d.normalization.mean.empty() || d.normalization.std.empty())
        r.fail("data.normalize", "expected auto, none, or {mean: [...], std: [...]} with one value per channel");
    for (size_t i = 0; i < d.normalization.std.size(); ++i)
        if (!(d.normalization.std[i] > 0))
            r.fail("data.normalize.std." + std::to_string(i), "expected a positive number");
}

// data.loader_threads: auto (0, settled by make_session from the replicas: CPU replicas take every
// core, so one) or a count.
int read_loader_threads(Reader& r) {
    if (!r.has("data.loader_threads")) return 0;
    const std::string v = r.str("data.loader_threads", "");
    if (v == "auto") return 0;
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
        r.fail("data.loader_threads", "expected auto or an integer in [1, 256], got '" + v + "'");
    return int(r.integer("data.loader_threads", 0, 1, 256));
}

// data: the format and its own keys (DataFormat::read), then what every format shares. targets:
// the loss reads float targets.
void read_data(Reader& r, DataConfig& d, bool targets) {
    d.dataset = r.choice("data.dataset", "idx", data_formats().names());
    const DataFormat& format = data_formats().get(d.dataset);
    d.root = r.nonempty_str("data.root", format.default_root);
    d.targets = targets;
    d.format = format.read(r, "data", targets);
    read_normalize(r, d);
    r.expect_map("data.augment");
    d.augment.crop_padding = int(r.integer("data.augment.random_crop_padding", 0, 0, 64));
    d.augment.horizontal_flip = r.boolean("data.augment.horizontal_flip", false);
    d.loader_threads = read_loader_threads(r);
    d.prefetch = int(r.integer("data.prefetch", 4, 1, 1024));
    d.drop_last = r.boolean("data.drop_last", true);
}

// model.loss: NAME, or {type: NAME, ...its own keys} for a kind that has keys.
void read_loss(Reader& r, LossConfig& l) {
    const YAML::Node n = r.at("model.loss");
    const bool keyed = n.IsDefined() && n.IsMap();
    l.type = r.choice(keyed ? "model.loss.type" : "model.loss", "softmax_cross_entropy", loss_kinds().names());
    l.options = loss_kinds().get(l.type).read(r, "model.loss");
}

// model.init_from: DIR (relative to the config's folder): without model.layers, the layers of the
// model DIR/config.json describes.
void read_model(Reader& r, ModelConfig& m, const std::string& base_dir) {
    m.input_shape = r.int_list("model.input_shape", {}, 1, 1 << 24);
    read_loss(r, m.loss);
    if (r.has("model.init_from")) {
        std::filesystem::path dir = r.nonempty_str("model.init_from", "");
        if (dir.is_relative() && !base_dir.empty()) dir = std::filesystem::path(base_dir) / dir;
        m.init_from = std::filesystem::absolute(dir).lexically_normal().string();
        if (!r.has("model.layers")) {
            std::string layers;
            try {
                layers = hf_model_config(m.init_from).layers;
            } catch (const ConfigError& e) {
                r.fail("model.init_from", e.what());
            }
            r.define("model.layers", YAML::Load(layers), m.init_from + "/config.json");
        }
    }
    m.layers = read_layer_list(r, "model.layers");
    r.expect_map("model.lora");
    if (r.has("model.lora")) {
        m.lora.rank = int(r.integer("model.lora.rank", 8, 1, 4096));
        m.lora.alpha = r.number_above("model.lora.alpha", 16.0, 0.0, 1e6);
        m.lora.targets = r.str_list("model.lora.targets");
        if (m.lora.targets.empty())
            r.fail("model.lora.targets", "required: the modules to adapt, e.g. [q_proj, v_proj] (GPT-2: [c_attn])");
    }
    m.freeze = r.str_list("model.freeze");
}

void read_optimizer(Reader& r, OptimizerConfig& o) {
    o.type = r.choice("optimizer.type", "sgd", optimizer_kinds().names());
    const OptimizerKind& kind = optimizer_kinds().get(o.type);
    o.lr = r.number("optimizer.lr", kind.default_lr, 0.0, 1e6, true);
    o.options = kind.read(r, "optimizer");
    o.weight_decay = r.number("optimizer.weight_decay", 0.0, 0.0, 10.0);
    o.weight_decay_on = r.choice("optimizer.weight_decay_on", "all", {"all", "matrices"}) == "matrices"
                            ? OptimizerConfig::DecayOn::matrices
                            : OptimizerConfig::DecayOn::all;
    o.grad_clip_norm = r.number("optimizer.grad_clip_norm", 0.0, 0.0, 1e9);
    o.scale_lr_with_replicas = r.boolean("optimizer.scale_lr_with_replicas", false);
    r.expect_map("optimizer.schedule");
    const std::string st = r.choice("optimizer.schedule.type", "constant", {"constant", "step", "multistep", "cosine"});
    o.schedule.type = st == "cosine"      ? ScheduleConfig::Type::cosine
                      : st == "step"      ? ScheduleConfig::Type::step
                      : st == "multistep" ? ScheduleConfig::Type::multistep
                                          : ScheduleConfig::Type::constant;
    o.schedule.warmup_steps = r.integer("optimizer.schedule.warmup_steps", 0, 0, int64_t(1) << 40);
    if (o.schedule.type == ScheduleConfig::Type::step) {
        o.schedule.step_size = r.integer("optimizer.schedule.step_size", 1000, 1, int64_t(1) << 40);
        o.schedule.gamma = r.number("optimizer.schedule.gamma", 0.1, 0.0, 1.0, true);
    }
    if (o.schedule.type == ScheduleConfig::Type::multistep) {
        for (int v : r.int_list("optimizer.schedule.milestones", {}, 1, INT32_MAX)) o.schedule.milestones.push_back(v);
        if (o.schedule.milestones.empty())
            r.fail("optimizer.schedule.milestones", "required for multistep: a list of steps");
        if (!std::is_sorted(o.schedule.milestones.begin(), o.schedule.milestones.end()))
            r.fail("optimizer.schedule.milestones", "expected increasing steps");
        o.schedule.gamma = r.number("optimizer.schedule.gamma", 0.1, 0.0, 1.0, true);
    }
    if (o.schedule.type == ScheduleConfig::Type::cosine)
        o.schedule.min_lr_ratio = r.number("optimizer.schedule.min_lr_ratio", 0.0, 0.0, 1.0);
}

void read_train(Reader& r, Config& c) {
    TrainConfig& t = c.train;
    t.epochs = r.integer("train.epochs", 10, 0, int64_t(1) << 30);
    t.steps = r.integer("train.steps", 0, 0, int64_t(1) << 40);
    if (t.epochs == 0 && t.steps == 0) r.fail("train.epochs", "set train.epochs or train.steps to a positive number");
    t.global_batch_size = int(r.integer("train.global_batch_size", 128, 1, 1 << 24));
    t.grad_accumulation_steps = int(r.integer("train.grad_accumulation_steps", 1, 1, 1 << 16));
    const std::string prec = r.choice("train.precision", "fp32", {"fp32", "tf32", "bf16", "fp16"});
    t.precision = prec == "tf32"   ? Precision::tf32
                  : prec == "bf16" ? Precision::bf16
                  : prec == "fp16" ? Precision::fp16
                                   : Precision::fp32;
    t.loss_scale_growth_interval = int(r.integer("train.loss_scale_growth_interval", 2000, 1, 1 << 24));
    t.eval_every_epochs = r.integer("train.eval_every_epochs", 1, 0, int64_t(1) << 30);
    t.eval_every_steps = r.integer("train.eval_every_steps", 0, 0, int64_t(1) << 30);
    t.log_every_steps = r.integer("train.log_every_steps", 100, 1, int64_t(1) << 30);
    t.recompute_blocks = r.choice("train.recompute", "none", {"none", "blocks"}) == "blocks";
    c.strategy.precision = t.precision;
    c.strategy.loss_scale_growth_interval = t.loss_scale_growth_interval;
}

void read_checkpoint(Reader& r, CheckpointConfig& k) {
    k.every_steps = r.integer("checkpoint.every_steps", 1000, 0, int64_t(1) << 40);
    k.every_epochs = r.integer("checkpoint.every_epochs", 0, 0, int64_t(1) << 30);
    k.every_minutes = r.number("checkpoint.every_minutes", 30.0, 0.0, 1e6);
    k.keep = int(r.integer("checkpoint.keep", 3, 1, 1000));
    k.resume = r.nonempty_str("checkpoint.resume", "auto");
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

}  // namespace

Config load_config_text(const std::string& text, const std::string& path, const std::vector<std::string>& sets) {
    YAML::Node root = parse_document(text, path);
    if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
    if (!root.IsMap()) throw ConfigError(path + ":1: expected a mapping of sections (run, strategy, data, model, ...)");
    std::map<std::string, std::string> set_origin;
    for (const auto& s : sets) {
        apply_set(root, s);
        set_origin[s.substr(0, s.find('='))] = "--set " + s;
    }
    Reader r(root, path, set_origin);
    Config c;
    c.file = path;
    c.base_dir = std::filesystem::path(path).parent_path().string();
    for (const char* section : {"run", "strategy", "data", "model", "optimizer", "train", "checkpoint"})
        r.expect_map(section);
    read_run(r, c);
    read_strategy(r, c);
    read_model(r, c.model, c.base_dir);  // before the data: the loss says what its label columns hold
    read_data(r, c.data, loss_kind(c.model.loss).labels == LabelKind::targets);
    read_optimizer(r, c.optimizer);
    read_train(r, c);
    read_checkpoint(r, c.checkpoint);
    r.reject_unknown();
    c.where = std::move(r.where);
    return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& sets) {
    std::string text;
    try {
        text = read_regular_file(path, kMaxConfigBytes);
    } catch (const InputError& e) {
        throw ConfigError(e.what());
    }
    return load_config_text(text, path, sets);
}

namespace {

// yaml-cpp's emitter with the config's conventions: numbers as decimal_text (what a person would
// write: 0.1, not 0.10000000000000001), lists in flow style, one map per section.
class ConfigEmitter {
public:
    template <class T>
    ConfigEmitter& put(const char* key, const T& value) {
        e_ << YAML::Key << key << YAML::Value;
        emit(value);
        return *this;
    }
    ConfigEmitter& begin(const char* key, bool flow = false) {
        e_ << YAML::Key << key << YAML::Value;
        if (flow) e_ << YAML::Flow;
        e_ << YAML::BeginMap;
        return *this;
    }
    ConfigEmitter& end() {
        e_ << YAML::EndMap;
        return *this;
    }
    // An entry's own keys (Options::fields): a list's flow text as a list, other values as text
    // (plain where YAML allows), consecutive "map.key"s as a block mapping `map`.
    ConfigEmitter& fields(const Fields& fs) {
        std::string open;  // the mapping being written
        for (const auto& [key, v] : fs) {
            const size_t dot = key.find('.');
            const std::string map = dot == std::string::npos ? "" : key.substr(0, dot);
            if (map != open) {
                if (!open.empty()) e_ << YAML::EndMap;
                if (!map.empty()) e_ << YAML::Key << map << YAML::Value << YAML::BeginMap;
                open = map;
            }
            e_ << YAML::Key << key.substr(dot == std::string::npos ? 0 : dot + 1) << YAML::Value;
            if (!v.empty() && v.front() == '[') {
                YAML::Node list = YAML::Load(v);
                list.SetStyle(YAML::EmitterStyle::Flow);
                e_ << list;
            } else {
                e_ << v;
            }
        }
        if (!open.empty()) e_ << YAML::EndMap;
        return *this;
    }
    YAML::Emitter& raw() { return e_; }

private:
    void emit(double v) { e_ << decimal_text(v); }
    void emit(float v) { e_ << decimal_text(v); }
    void emit(const char* v) { e_ << v; }
    void emit(const std::string& v) { e_ << v; }
    void emit(bool v) { e_ << v; }
    template <class T>
    requires std::is_integral_v<T>
    void emit(T v) { e_ << v; }
    template <class T>
    void emit(const std::vector<T>& v) {
        e_ << YAML::Flow << YAML::BeginSeq;
        for (const T& x : v) emit(x);
        e_ << YAML::EndSeq;
    }

    YAML::Emitter e_;
};

// A list of layers, each a flow mapping of its type's keys; a container's layers nested.
void emit_layers(YAML::Emitter& e, const std::vector<LayerSpec>& layers) {
    e << YAML::BeginSeq;
    for (const LayerSpec& l : layers) {
        const bool nested = !l.layers.empty();
        if (!nested) e << YAML::Flow;
        e << YAML::BeginMap << YAML::Key << "type" << YAML::Value << l.type;
        for (const auto& [k, v] : l.fields()) e << YAML::Key << k << YAML::Value << v;
        if (nested) {
            e << YAML::Key << "layers" << YAML::Value;
            emit_layers(e, l.layers);
        }
        e << YAML::EndMap;
    }
    e << YAML::EndSeq;
}

void emit_run(ConfigEmitter& e, const RunConfig& r) {
    e.begin("run").put("name", r.name).put("seed", r.seed).put("output_dir", r.output_dir).end();
}

void emit_strategy(ConfigEmitter& e, const StrategyConfig& s) {
    e.begin("strategy")
        .put("devices", s.devices)
        .put("cross_device_ops", s.cross_device_ops)
        .put("bucket_mb", s.bucket_mb);
    e.put("allreduce_dtype", dtype_name(s.allreduce_dtype)).put("verify_every_steps", s.verify_every_steps);
    e.put("collective_timeout_s", s.collective_timeout_s).put("step_timeout_s", s.step_timeout_s);
    e.put("shared_parameters", s.shared_parameters).put("shard", shard_name(s.shard)).put("cuda_graph", s.cuda_graph);
    e.put("fused_epilogues", s.fused_epilogues)
        .put("on_replica_failure", s.continue_on_failure ? "continue" : "stop")
        .put("min_replicas", s.min_replicas)
        .end();
}

void emit_data(ConfigEmitter& e, const DataConfig& d) {
    e.begin("data").put("dataset", d.dataset).put("root", d.root).fields(data_format_options(d)->fields());
    if (d.normalize == DataConfig::Normalize::given)
        e.begin("normalize").put("mean", d.normalization.mean).put("std", d.normalization.std).end();
    else e.put("normalize", d.normalize == DataConfig::Normalize::none ? "none" : "auto");
    e.begin("augment", /*flow=*/true).put("random_crop_padding", d.augment.crop_padding);
    e.put("horizontal_flip", d.augment.horizontal_flip).end();
    if (d.loader_threads == 0) e.put("loader_threads", "auto");
    else e.put("loader_threads", d.loader_threads);
    e.put("prefetch", d.prefetch).put("drop_last", d.drop_last).end();
}

void emit_model(ConfigEmitter& e, const ModelConfig& m) {
    e.begin("model");
    if (!m.input_shape.empty()) e.put("input_shape", m.input_shape);
    if (!m.init_from.empty()) e.put("init_from", m.init_from);
    if (m.lora.rank)
        e.begin("lora", /*flow=*/true)
            .put("rank", m.lora.rank)
            .put("alpha", m.lora.alpha)
            .put("targets", m.lora.targets)
            .end();
    if (!m.freeze.empty()) e.put("freeze", m.freeze);
    e.raw() << YAML::Key << "layers" << YAML::Value;
    emit_layers(e.raw(), m.layers);
    const Fields keys = m.loss.options ? m.loss.options->fields() : Fields{};
    if (keys.empty()) e.put("loss", m.loss.type);
    else e.begin("loss", /*flow=*/true).put("type", m.loss.type).fields(keys).end();
    e.end();
}

const char* schedule_name(ScheduleConfig::Type t) {
    switch (t) {
        case ScheduleConfig::Type::cosine:
            return "cosine";
        case ScheduleConfig::Type::step:
            return "step";
        case ScheduleConfig::Type::multistep:
            return "multistep";
        case ScheduleConfig::Type::constant:
            break;
    }
    return "constant";
}

void emit_optimizer(ConfigEmitter& e, const OptimizerConfig& o) {
    e.begin("optimizer").put("type", o.type).put("lr", o.lr).fields(optimizer_options(o)->fields());
    e.put("weight_decay", o.weight_decay)
        .put("weight_decay_on", o.weight_decay_on == OptimizerConfig::DecayOn::matrices ? "matrices" : "all")
        .put("grad_clip_norm", o.grad_clip_norm);
    e.put("scale_lr_with_replicas", o.scale_lr_with_replicas);
    const ScheduleConfig& s = o.schedule;
    e.begin("schedule", /*flow=*/true).put("type", schedule_name(s.type)).put("warmup_steps", s.warmup_steps);
    if (s.type == ScheduleConfig::Type::step) e.put("step_size", s.step_size).put("gamma", s.gamma);
    if (s.type == ScheduleConfig::Type::multistep) e.put("milestones", s.milestones).put("gamma", s.gamma);
    if (s.type == ScheduleConfig::Type::cosine) e.put("min_lr_ratio", s.min_lr_ratio);
    e.end().end();
}

void emit_train(ConfigEmitter& e, const TrainConfig& t) {
    e.begin("train").put("epochs", t.epochs).put("steps", t.steps).put("global_batch_size", t.global_batch_size);
    e.put("grad_accumulation_steps", t.grad_accumulation_steps).put("precision", precision_name(t.precision));
    e.put("loss_scale_growth_interval", t.loss_scale_growth_interval).put("eval_every_epochs", t.eval_every_epochs);
    e.put("eval_every_steps", t.eval_every_steps);
    e.put("log_every_steps", t.log_every_steps).put("recompute", t.recompute_blocks ? "blocks" : "none").end();
}

void emit_checkpoint(ConfigEmitter& e, const CheckpointConfig& c) {
    e.begin("checkpoint").put("every_steps", c.every_steps).put("every_epochs", c.every_epochs);
    e.put("every_minutes", c.every_minutes).put("keep", c.keep).put("resume", c.resume).end();
}

}  // namespace

std::string config_to_yaml(const Config& c) {
    ConfigEmitter e;
    e.raw() << YAML::BeginMap;
    emit_run(e, c.run);
    emit_strategy(e, c.strategy);
    emit_data(e, c.data);
    emit_model(e, c.model);
    emit_optimizer(e, c.optimizer);
    emit_train(e, c.train);
    emit_checkpoint(e, c.checkpoint);
    e.raw() << YAML::EndMap;
    return std::string(e.raw().c_str()) + "\n";
}

std::string model_config_summary(const Config& c) {
    std::ostringstream s;
    s << "input";
    for (int d : c.model.input_shape) s << " " << d;
    for (const LayerSpec& l : c.model.layers) s << " | " << layer_spec_summary(l);
    if (c.model.lora.rank) {
        s << " | lora rank=" << c.model.lora.rank << " alpha=" << decimal_text(c.model.lora.alpha) << " targets=";
        for (const std::string& t : c.model.lora.targets) s << t << (&t == &c.model.lora.targets.back() ? "" : ",");
    }
    for (const std::string& f : c.model.freeze) s << " | freeze " << f;
    s << " | optimizer " << optimizer_description(c.optimizer);
    if (c.model.loss.type != "softmax_cross_entropy")
        s << " | loss " << c.model.loss.type;  // as before for classifiers
    return s.str();
}

uint64_t model_config_hash(const Config& c) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a 64
    for (unsigned char ch : model_config_summary(c)) {
        h ^= ch;
        h *= 1099511628211ull;
    }
    return h;
}

}  // namespace mirrored
