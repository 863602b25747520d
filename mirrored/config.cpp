// The one place every configuration key is read: its type, range and default.
#include "mirrored/config.h"

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
#include "mirrored/config_document.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/hf_models.h"
#include "mirrored/optimizer.h"
#include "mirrored/util.h"

namespace mirrored {

using namespace config_document;

namespace {

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
        m.lora.dropout = r.number("model.lora.dropout", 0.0, 0.0, 0.999);
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

}  // namespace mirrored
