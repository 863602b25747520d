#include "mirrored/session.h"

#include "mirrored/adaptation.h"
#include "mirrored/hf_models.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/io.h"
#include "mirrored/loss.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

void check_model_against_data(Config& cfg, const Datasets& data) {
    const auto& shape = data.train.shape;
    if (cfg.model.input_shape.empty()) cfg.model.input_shape = shape;
    else if (cfg.model.input_shape != shape) {
        size_t a = 1, b = 1;
        for (int d : cfg.model.input_shape) a *= size_t(d);
        for (int d : shape) b *= size_t(d);
        cfg.fail("model.input_shape", shape_str(cfg.model.input_shape) + " does not match the dataset's samples " +
                                          shape_str(shape) + (a == b ? " (same size, other layout)" : ""));
    }
}

}  // namespace

Session::~Session() {
    if (!strategy || strategy->shutdown()) return;
    for (auto* loader : {&train_loader, &test_loader})
        if (*loader) {
            (*loader)->stop_workers();
            (void)loader->release();  // intentionally leaked: see the comment in session.h
        }
}

namespace {

// Host memory: CPU and simulated replicas keep their whole model state in it, and every run keeps
// the loaders' slots there. Checked before anything is allocated, so that a run that cannot fit
// ends with the numbers, not with the kernel's OOM killer: exit 2 when it needs more than the
// machine has at all, exit 5 when it needs more than its cgroup allows or than is free now.
void check_host_memory(const Config& cfg, const Model& model, const Dataset& train, const std::vector<int>& batches,
                       int nodes) {
    const DeviceList devices = parse_devices(cfg.strategy.devices);
    const int n = int(devices.ordinals.size()), acc = cfg.train.grad_accumulation_steps, all = n * nodes;
    const int shard = (cfg.train.global_batch_size + all - 1) / all;
    const int micro = (shard + acc - 1) / acc;
    const size_t labels = label_bytes(cfg.model.loss, model.output_classes(), model.output_positions());
    const std::vector<int> rows_met = batches.empty() ? std::vector<int>() : micro_batch_rows(batches, all, acc);
    const MemoryPlan plan = plan_memory(model, cfg.optimizer, cfg.strategy, *devices.backend, n, shard, micro,
                                        parameters_shared(cfg.strategy, devices), labels, nullptr, rows_met);
    const uint64_t replicas = devices.traits().gpu ? 0 : plan.total() * uint64_t(n);
    // Train and test loaders; CPU replicas gather their own rows (MirroredStrategy::gathers_input,
    // the same rule), so their slots hold only sample indices and labels.
    const uint64_t row_bytes =
        (devices.traits().asynchronous ? train.feature_size() * sizeof(float) : sizeof(uint32_t)) + labels;
    const uint64_t slots = 2 * uint64_t(cfg.data.prefetch) * uint64_t(cfg.train.global_batch_size) * row_bytes;
    const uint64_t need = replicas + slots;
    const uint64_t total = machine_memory(), avail = available_host_memory();
    const CgroupMemory cg = process_cgroup_memory();
    const std::string what =
        (replicas ? std::to_string(n) + " replica(s) x " + format_bytes(plan.total()) + " (" + plan.describe() + ") + "
                  : std::string()) +
        "loader slots " + format_bytes(slots) + " = " + format_bytes(need);
    // the sharding that would fit within `limit`, where one would
    const auto shard_fits = [&](uint64_t limit) {
        if (!replicas || limit <= slots) return std::string();
        const std::string s =
            fitting_shard(model, cfg.optimizer, cfg.strategy, *devices.backend, n, shard, micro,
                          parameters_shared(cfg.strategy, devices), labels, (limit - slots) / n, rows_met);
        return s.empty() ? s : "; " + s + " would fit";
    };
    if (total && need > total)
        cfg.fail(replicas ? "model.layers" : "data.prefetch",
                 "the run needs more host memory than this machine has: " + what + ", " + format_bytes(total) +
                     " in all" + shard_fits(total));
    if (cg.limit && need > cg.limit)
        throw DeviceError("the run needs more host memory than this process may use: " + what +
                          ", but its cgroup allows " + format_bytes(cg.limit) + " (" + cg.file +
                          "): raise the container's or the job's memory limit, or use a smaller model or batch" +
                          shard_fits(cg.limit));
    if (avail && need > avail)
        throw DeviceError("not enough free host memory: " + what + ", " + format_bytes(avail) +
                          " available: close other programs, or use a smaller model or batch" + shard_fits(avail));
}

// Layers that learn from batch statistics need at least two values per channel in every
// micro-batch a replica trains on: the full global batch and, without data.drop_last, an epoch's
// last partial one, split over all replicas and accumulation steps as the step splits them.
void check_batch_statistics(const Config& cfg, const Model& model, int all_replicas, size_t train_count) {
    const int global = cfg.train.global_batch_size, acc = cfg.train.grad_accumulation_steps;
    std::vector<int> batches{global};
    const int last = int(train_count % size_t(global));
    if (!cfg.data.drop_last && last > 0) batches.push_back(last);
    for (const int rows : batches) {
        for (int m = 0; m < acc; ++m) {
            int fewest = 0, in_job = 0;  // the smallest non-empty micro-batch of a replica; the job's
            for (int r = 0; r < all_replicas; ++r) {
                const int micro = shard_of(shard_of(rows, all_replicas, r).rows, acc, m).rows;
                in_job += micro;
                if (micro > 0 && (fewest == 0 || micro < fewest)) fewest = micro;
            }
            try {
                model.check_batch(fewest, in_job);
            } catch (const ConfigError& e) {
                if (rows == global) throw;
                throw ConfigError(e.key(), e.detail() + " (in the last batch of an epoch: " + std::to_string(rows) +
                                               " of " + std::to_string(train_count) +
                                               " samples; data.drop_last: true leaves it out)");
            }
        }
    }
}

// Float targets the loss can take, every one: finite, and for a loss of probabilities (binary
// cross-entropy) in [0, 1] - outside it the loss has no minimum and training runs off silently.
void check_targets(const LossKind& loss, const Dataset& d) {
    if (!d.has_targets()) return;
    for (size_t i = 0; i < d.targets.size(); ++i) {
        const float v = d.targets[i];
        if (std::isfinite(v) && (!loss.probability_targets || (v >= 0.0f && v <= 1.0f))) continue;
        char value[32];
        std::snprintf(value, sizeof value, "%.9g", double(v));
        throw DataError(d.labels_source + ": sample " + std::to_string(i / size_t(d.target_size)) + ", target " +
                        std::to_string(i % size_t(d.target_size)) + " is " + value + ": " +
                        (loss.probability_targets
                             ? std::string("model.loss ") + loss.name + " takes targets in [0, 1] (probabilities)"
                             : std::string("targets must be finite numbers")));
    }
}

// The labels the loss reads are the ones the data has: class indexes, or float targets as many as
// the model's outputs, each one the loss can take.
void check_labels_for_loss(const Config& cfg, const Model& model, const Datasets& data) {
    const Dataset& train = data.train;
    const LossKind& loss = loss_kind(cfg.model.loss);
    if (loss.labels == LabelKind::classes && train.has_targets())
        cfg.fail("model.loss", std::string(loss.name) + " takes a class index per sample, but " + train.labels_source +
                                   " has float targets");
    if (loss.labels == LabelKind::targets && !train.has_targets())
        cfg.fail("model.loss", std::string(loss.name) + " takes float targets per sample, but " + train.labels_source +
                                   " has class indexes (data.dataset csv reads targets from data.csv.label_column)");
    if (loss.labels == LabelKind::targets && model.output_features() != train.target_size) {
        const size_t last = cfg.model.layers.size() - 1;
        cfg.fail("model.layers." + std::to_string(last) + (cfg.model.layers[last].type == "dense" ? ".units" : ""),
                 "the model has " + std::to_string(model.output_features()) + " outputs, but " + train.labels_source +
                     " has " + std::to_string(train.target_size) + " target(s) per sample: they must match");
    }
    check_targets(loss, data.train);
    check_targets(loss, data.test);
}

std::unique_ptr<Session> build_session(const Config& config, std::shared_ptr<const Datasets> data,
                                       bool with_train_loader, Nodes* nodes) {
    auto s = std::make_unique<Session>();
    s->cfg = config;
    Config& cfg = s->cfg;
    s->data =
        data ? std::move(data) : std::make_shared<const Datasets>(load_datasets(cfg.data, cfg.base_dir, cfg.run.seed));
    check_model_against_data(cfg, *s->data);
    const DeviceList devices = parse_devices(cfg.strategy.devices);
    s->model = build_model(cfg, cfg.model.input_shape, cfg.train.recompute_blocks,
                           gradient_piece_floats(cfg.strategy, int(devices.ordinals.size()),
                                                 parameters_shared(cfg.strategy, devices, nodes != nullptr)));
    const Dataset& train = s->data->train;
    check_labels_for_loss(cfg, *s->model, *s->data);
    if (!train.has_targets() && s->model->output_classes() < train.classes) {
        size_t last = cfg.model.layers.size() - 1;
        while (last > 0 && cfg.model.layers[last].type != "dense") --last;
        const std::string key =
            "model.layers." + std::to_string(last) + (cfg.model.layers[last].type == "dense" ? ".units" : "");
        size_t record = 0;  // a data set read on demand was checked against its vocabulary when opened
        while (record < train.labels.size() && train.labels[record] < s->model->output_classes()) ++record;
        if (record == train.labels.size())  // a vocabulary larger than the model's outputs
            cfg.fail(key, "the model has " + std::to_string(s->model->output_classes()) +
                              " outputs, but the data has " + std::to_string(train.classes) +
                              " classes (data.vocab for token files)");
        cfg.fail(key, "the model has " + std::to_string(s->model->output_classes()) + " outputs, but " +
                          train.labels_source + " has label " + std::to_string(train.labels[record]) + " (record " +
                          std::to_string(record) + "), so " + std::to_string(train.classes) +
                          " classes: fix the model's last layer or the labels");
    }
    // a label per position (token windows: each position's next token) needs a score row per
    // position, as a language model's head gives; a classifier's one row per sample would learn
    // nothing (accuracy 0, exit 0)
    if (train.label_size > 1 && s->model->output_positions() != train.label_size)
        cfg.fail("model.layers", "the data has a label per position (" + std::to_string(train.label_size) +
                                     " per sample: " + train.labels_source + "), the model " +
                                     std::to_string(s->model->output_positions()) +
                                     " score row(s) per sample: a language model ends in lm_head");
    // every id the data holds has its row in the embedding (an untied head may be larger)
    if (const int rows = s->model->token_vocab(); rows > 0 && train.tokens && rows < train.classes)
        cfg.fail("model.layers.0.vocab", "the embedding has rows for ids 0 to " + std::to_string(rows - 1) +
                                             ", but the data's ids go up to " + std::to_string(train.classes - 1) +
                                             " (data.vocab " + std::to_string(train.classes) +
                                             "): an id past the table would read nothing");
    // The batches a training run computes: full ones, an epoch's last where data.drop_last keeps
    // it, and evaluation's last. Other sessions (evaluate, a prediction's chunks) may compute any
    // count up to the global batch: not known.
    std::vector<int> batches;
    if (with_train_loader) {
        const size_t global = size_t(cfg.train.global_batch_size);
        batches.push_back(cfg.train.global_batch_size);
        if (!cfg.data.drop_last && train.count() % global) batches.push_back(int(train.count() % global));
        if (s->data->test.count() % global) batches.push_back(int(s->data->test.count() % global));
    }
    check_host_memory(cfg, *s->model, train, batches, nodes ? nodes->count() : 1);
    s->strategy =
        std::make_unique<MirroredStrategy>(cfg.strategy, *s->model, cfg.optimizer, cfg.train.global_batch_size,
                                           cfg.train.grad_accumulation_steps, nodes, cfg.model.loss, batches);
    const int n = s->strategy->replicas();
    LoaderOptions lo;
    lo.global_batch = cfg.train.global_batch_size;
    lo.threads = cfg.data.loader_threads > 0 ? cfg.data.loader_threads : s->strategy->device_traits().loader_threads;
    lo.prefetch = cfg.data.prefetch;
    lo.seed = cfg.run.seed;
    lo.consumers = n;
    lo.gather_by_consumers = s->strategy->gathers_input();
    if (nodes) {  // this node's part of every global batch
        lo.all_replicas = s->strategy->all_replicas();
        lo.first_replica = s->strategy->first_replica();
    }
    if (with_train_loader) {
        check_batch_statistics(cfg, *s->model, s->strategy->all_replicas(), train.count());
        lo.drop_last = cfg.data.drop_last;
        lo.augment = cfg.data.augment;
        s->train_loader = std::make_unique<Loader>(s->data->train, lo, s->strategy->host_allocator());
    }
    lo.drop_last = false;
    lo.shuffle = false;
    lo.augment = {};
    s->test_loader = std::make_unique<Loader>(s->data->test, lo, s->strategy->host_allocator());
    return s;
}

}  // namespace

std::unique_ptr<Session> make_session(const Config& config, std::shared_ptr<const Datasets> data,
                                      bool with_train_loader, Nodes* nodes) {
    try {
        return build_session(config, std::move(data), with_train_loader, nodes);
    } catch (const ConfigError& e) {
        if (e.key().empty()) throw;
        config.fail(e.key(), e.detail());  // the same error, with the key's <file>:<line>
    }
}

void load_pretrained_weights(Session& session) {
    MirroredStrategy& st = *session.strategy;
    read_hf_weights(
        session.cfg.model.init_from, *session.model,
        [&](size_t offset, const float* v, size_t n) { st.upload_param_range(offset, v, n); },
        [&](size_t offset, float* v, size_t n) { st.download_param_range(offset, v, n); });
    st.refresh_weights();
}

}  // namespace mirrored
