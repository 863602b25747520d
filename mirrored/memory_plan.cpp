#include "mirrored/memory_plan.h"

#include <algorithm>
#include <deque>
#include <limits>

#include "base/io.h"
#include "data/loader.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

size_t bucket_floats(double bucket_mb) { return std::max<size_t>(1, size_t(bucket_mb * 1048576.0 / sizeof(float))); }

}  // namespace

std::string MemoryPlan::describe() const {
    return "parameters " + format_bytes(params) + ", gradients " + format_bytes(grads) + ", optimizer state " +
           format_bytes(optimizer) + ", activations " + format_bytes(activations) + ", inputs " + format_bytes(inputs) +
           (weight_copy ? ", 16-bit weight copy " + format_bytes(weight_copy) : std::string()) +
           (wire ? ", bf16 gradient copy " + format_bytes(wire) : std::string()) + ", workspaces " +
           format_bytes(workspace) + "; total " + format_bytes(total());
}

std::vector<Bucket> make_buckets(const Model& model, double bucket_mb) {
    const std::vector<GradientPiece>& t = model.gradient_pieces();  // in offset order
    std::vector<Bucket> out;
    const size_t trainable = model.trainable_size();
    if (bucket_mb <= 0) {
        out.push_back(Bucket{0, trainable, t.front().unit});
    } else {
        const size_t limit = bucket_floats(bucket_mb);
        size_t end = trainable;
        for (int i = int(t.size()) - 1; i >= 0; --i)
            if (end - t[size_t(i)].begin >= limit || i == 0) {
                out.push_back(Bucket{t[size_t(i)].begin, end, t[size_t(i)].unit});
                end = t[size_t(i)].begin;
            }
        out.back().begin = 0;  // covers any alignment gap before the first tensor
    }
    if (model.has_state()) out.push_back(Bucket{trainable, model.grad_size(), -1});
    return out;
}

size_t gradient_piece_floats(const StrategyConfig& strategy, int replicas, bool shared) {
    if (strategy.shard != StrategyConfig::Shard::gradients || strategy.bucket_mb <= 0 || replicas < 2 || shared)
        return 0;
    return bucket_floats(strategy.bucket_mb);
}

const Model& model_for(const Model& model, const StrategyConfig& strategy, int replicas, bool shared,
                       std::unique_ptr<Model>& keep) {
    const size_t floats = gradient_piece_floats(strategy, replicas, shared);
    if (floats == model.gradient_piece_floats()) return model;
    keep = model.with_gradient_pieces(floats);
    return *keep;
}

GradientStaging plan_gradient_staging(const Model& model, const std::vector<Bucket>& buckets) {
    GradientStaging g;
    const size_t trainable = model.trainable_size(), nb = buckets.size();
    std::vector<int> first_writer(nb, -1);
    const int units = model.gradient_units();  // each reports, last first (Model::backward)
    for (const GradientPiece& t : model.gradient_pieces())
        for (size_t k = 0; k < nb; ++k)
            if (t.begin >= buckets[k].begin && t.begin < buckets[k].end)
                first_writer[k] = std::max(first_writer[k], t.written_from);
    // Backward's order: at unit U, buckets first written there take a slot, then those complete
    // after it free theirs (their reduce-scatter is issued then).
    g.slot_of.assign(nb, -1);
    const auto walk = [&](int slots, auto&& on_take) {
        std::deque<int> free;
        for (int s = 0; s < slots; ++s) free.push_back(s);
        int live = 0, most = 0;
        for (int unit = units - 1; unit >= 0; --unit) {
            for (size_t k = 0; k < nb; ++k)
                if (buckets[k].begin < trainable && first_writer[k] == unit) {
                    most = std::max(most, ++live);
                    if (slots > 0) {
                        if (free.empty()) throw std::logic_error("gradient staging: no free slot");
                        on_take(k, free.front());
                        free.pop_front();
                    }
                }
            for (size_t k = 0; k < nb; ++k)
                if (buckets[k].begin < trainable && buckets[k].ready_after_unit == unit) {
                    --live;
                    if (slots > 0) free.push_back(g.slot_of[k]);
                }
        }
        return most;
    };
    int trainable_buckets = 0;
    for (const Bucket& b : buckets) trainable_buckets += b.begin < trainable;
    g.slots = std::min(trainable_buckets, walk(0, [](size_t, int) {}) + 1);
    walk(g.slots, [&](size_t k, int s) { g.slot_of[k] = s; });
    std::vector<size_t> size(size_t(g.slots), 0), at(size_t(g.slots), 0), users(size_t(g.slots), 0);
    for (size_t k = 0; k < nb; ++k)
        if (g.slot_of[k] >= 0) {
            const size_t s = size_t(g.slot_of[k]);
            size[s] = std::max(size[s], buckets[k].end - buckets[k].begin);
            ++users[s];
        }
    for (int s = 0; s < g.slots; ++s) {
        at[size_t(s)] = g.buffer;
        g.buffer += (size[size_t(s)] + Model::kTensorAlign - 1) / Model::kTensorAlign * Model::kTensorAlign;
    }
    g.claim_after.assign(nb, -1);
    g.gaps.resize(nb);
    for (size_t k = 0; k < nb; ++k) {
        const Bucket& b = buckets[k];
        if (g.slot_of[k] < 0) {  // the state region, after the slots
            g.placement.pieces.push_back({b.begin, b.end, g.buffer});
            continue;
        }
        const size_t base = at[size_t(g.slot_of[k])];
        g.placement.pieces.push_back({b.begin, b.end, base});
        g.claim_after[k] = first_writer[k] + 1 < units ? first_writer[k] + 1 : -1;
        if (users[size_t(g.slot_of[k])] < 2) continue;
        std::vector<std::pair<size_t, size_t>> covered;
        for (const GradientPiece& t : model.gradient_pieces())
            if (t.begin >= b.begin && t.begin < b.end) covered.emplace_back(t.begin, t.end);
        std::sort(covered.begin(), covered.end());
        size_t from = b.begin;
        for (const auto& [tb, te] : covered) {
            if (tb > from) g.gaps[k].emplace_back(base + (from - b.begin), tb - from);
            from = std::max(from, te);
        }
        if (b.end > from) g.gaps[k].emplace_back(base + (from - b.begin), b.end - from);
    }
    if (model.has_state()) g.buffer += model.grad_size() - trainable;
    std::sort(g.placement.pieces.begin(), g.placement.pieces.end(),
              [](const auto& a, const auto& b) { return a.begin < b.begin; });
    return g;
}

std::vector<std::pair<size_t, size_t>> owned_ranges(const std::vector<Bucket>& buckets, size_t trainable, int replicas,
                                                    int r) {
    std::vector<std::pair<size_t, size_t>> out;
    for (const Bucket& b : buckets) {
        if (b.begin >= trainable) continue;  // the batch statistics: every replica keeps them whole
        const auto [begin, end] = CrossDeviceOps::owned(r, replicas, b.begin, b.end - b.begin);
        if (end > begin) out.emplace_back(begin, end);
    }
    std::sort(out.begin(), out.end());
    return out;
}

bool parameters_shared(const StrategyConfig& strategy, const DeviceList& devices, bool several_nodes) {
    const auto& o = devices.ordinals;
    if (!strategy.shared_parameters || o.size() < 2) return false;
    if (devices.traits().one_memory) return true;
    return !several_nodes && std::all_of(o.begin(), o.end(), [&](int g) { return g == o[0]; });
}

MemoryPlan plan_memory(const Model& model, const OptimizerConfig& opt, const StrategyConfig& strategy,
                       const Backend& backend, int replicas, int shard_rows, int micro_rows, bool shared,
                       size_t label_bytes, const std::vector<Bucket>* buckets, const std::vector<int>& rows_met) {
    MemoryPlan m;
    const DeviceTraits& traits = backend.traits;
    const uint64_t trainable = model.trainable_size() * sizeof(float);
    m.params = model.flat_size() * sizeof(float);
    m.grads = model.grad_size() * sizeof(float);
    m.optimizer = trainable * uint64_t(optimizer_state_buffers(opt));
    const bool low = precision_dtype(strategy.precision) != DType::f32;
    const size_t act_elem = low && traits.stores_16bit ? 2 : 4;  // CPU and sim round to 16 bits in f32
    m.activations = model.activation_bytes(micro_rows, act_elem, traits.column_block_bytes);
    m.inputs =
        2 * uint64_t(shard_rows) * (uint64_t(model.input_features()) * sizeof(float) + label_bytes) +
        (low && !model.reads_token_ids() ? uint64_t(shard_rows) * uint64_t(model.input_features()) * act_elem : 0);
    m.weight_copy = low ? uint64_t(model.weights_size()) * act_elem : 0;
    if (shared && replicas > 1)  // one copy, counted in shares
        for (uint64_t* one_copy : {&m.params, &m.optimizer, &m.weight_copy})
            *one_copy = (*one_copy + uint64_t(replicas) - 1) / uint64_t(replicas);
    if (!shared && strategy.shard != StrategyConfig::Shard::none && replicas > 1) {  // the largest share
        const std::vector<Bucket> made = buckets ? std::vector<Bucket>() : make_buckets(model, strategy.bucket_mb);
        uint64_t most = 0;
        for (int r = 0; r < replicas; ++r) {
            uint64_t owned = 0;
            for (const auto& [b, e] : owned_ranges(buckets ? *buckets : made, model.trainable_size(), replicas, r))
                owned += e - b;
            most = std::max(most, owned);
        }
        m.optimizer = most * sizeof(float) * uint64_t(optimizer_state_buffers(opt));
        if (strategy.shard == StrategyConfig::Shard::gradients)  // the slots, the state region, the own sums
            m.grads = (plan_gradient_staging(model, buckets ? *buckets : made).buffer + most) * sizeof(float);
    }
    m.wire = strategy.allreduce_dtype == DType::bf16 && replicas > 1 ? uint64_t(model.trainable_size()) * 2 : 0;
    const uint64_t widest = std::max<uint64_t>(model.largest_activation_per_row(), uint64_t(model.input_features()));
    m.workspace = backend.workspace_bytes({micro_rows, widest, strategy.fused_epilogues, model.sequence_positions(),
                                           model.product_widths(), model.convolves(), rows_met});
    // and the step's small buffers (allocate_step_state, create_step_events): metrics, gradient
    // statistics, the loss scale, batch statistics, checksums, a captured step's values
    const bool sharded = !shared && strategy.shard != StrategyConfig::Shard::none;
    m.workspace += 2 * kMetricSlots * sizeof(double) + (shared || sharded ? 4 : 2) * sizeof(float) + 2 * sizeof(float) +
                   uint64_t(model.stats_floats()) * sizeof(float) + (model.tensors().size() + 1) * sizeof(uint64_t) +
                   (strategy.cuda_graph && traits.asynchronous ? 2 * sizeof(StepValues) : 0);
    return m;
}

std::vector<int> micro_batch_rows(const std::vector<int>& global_batches, int all_replicas, int accumulation) {
    std::vector<int> rows;
    for (int g : global_batches)
        for (int r = 0; r < all_replicas; ++r)
            for (int m = 0; m < accumulation; ++m)
                if (const int n = shard_of(shard_of(g, all_replicas, r).rows, accumulation, m).rows; n > 0)
                    rows.push_back(n);
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    return rows;
}

std::string fitting_shard(const Model& model, const OptimizerConfig& opt, const StrategyConfig& strategy,
                          const Backend& backend, int replicas, int shard_rows, int micro_rows, bool shared,
                          size_t label_bytes, uint64_t capacity, const std::vector<int>& rows_met) {
    if (shared || replicas < 2) return "";
    for (StrategyConfig::Shard mode : {StrategyConfig::Shard::optimizer, StrategyConfig::Shard::gradients}) {
        if (strategy.shard >= mode) continue;
        StrategyConfig s = strategy;
        s.shard = mode;
        std::unique_ptr<Model> keep;
        const Model& m = model_for(model, s, replicas, shared, keep);  // as the mode would lay it out
        const uint64_t need =
            plan_memory(m, opt, s, backend, replicas, shard_rows, micro_rows, shared, label_bytes, nullptr, rows_met)
                .total();
        if (need <= capacity)
            return std::string("strategy.shard: ") + shard_name(mode) + " (" + format_bytes(need) + " per replica)";
    }
    return "";
}

}  // namespace mirrored
