// A configuration written back as YAML (--print-config, the run folder's config.yaml, the text a
// checkpoint embeds), and the model section's summary and hash that checkpoints are checked by.
#include <yaml-cpp/yaml.h>

#include "mirrored/config.h"
#include "mirrored/optimizer.h"
#include "mirrored/util.h"

namespace mirrored {

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
            .put("dropout", m.lora.dropout)
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
