#include "mirrored/planner.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "kernels/buffer.h"
#include "base/error.h"
#include "mirrored/allreduce_rig.h"
#include "mirrored/util.h"

namespace mirrored {

double ring_allreduce_seconds(int n, double bytes, const LinkModel& link) {
    if (n <= 1 || bytes <= 0) return 0.0;
    return 2.0 * (n - 1) / n * bytes / link.bus_bytes_per_s + 2.0 * (n - 1) * link.step_latency_s;
}

double allreduce_seconds(const Topology& t, double bytes) {
    const double in_node = ring_allreduce_seconds(t.per_node, bytes, t.local);
    if (t.nodes <= 1 || bytes <= 0) return in_node;
    const int n = t.per_node;
    const double between = ring_allreduce_seconds(t.nodes, bytes, t.net);  // every GPU's slice; the n share the network
    const double gather =
        n > 1 ? double(n - 1) / n * bytes / t.local.bus_bytes_per_s + (n - 1) * t.local.step_latency_s : 0.0;
    return in_node + between + gather;
}

CommPlan comm_plan(const Model& model, const StrategyConfig& strategy) {
    CommPlan c;
    const auto flops = model.layer_flops();
    double total_backward = 0, total = 0;
    for (const auto& f : flops) total_backward += f.backward, total += f.forward + f.backward;
    if (total > 0) c.backward_share = total_backward / total;
    // done_after[l]: the fraction of backward finished once layer l's backward is (it runs last to first)
    std::vector<double> done_after(flops.size(), 1.0);
    double acc = 0;
    for (size_t l = flops.size(); l-- > 0;) {
        acc += flops[l].backward;
        done_after[l] = total_backward > 0 ? acc / total_backward : 1.0;
    }
    // A bucket is ready once its gradient unit is done, part of the way through its layer's
    // backward (a transformer block's sub-layers): the layer's units are taken to share its
    // backward in proportion to their parameters, as its products do.
    std::vector<double> unit_params(size_t(model.gradient_units()), 0.0), layer_params(flops.size(), 0.0);
    for (const GradientPiece& t : model.gradient_pieces())
        if (t.unit >= 0) unit_params[size_t(t.unit)] += double(t.end - t.begin);
    for (int u = 0; u < model.gradient_units(); ++u)
        if (size_t(model.unit_layer(u)) < flops.size())
            layer_params[size_t(model.unit_layer(u))] += unit_params[size_t(u)];
    const auto ready_after = [&](int unit) {
        const size_t l = size_t(model.unit_layer(unit));
        if (l >= flops.size() || layer_params[l] <= 0) return l < done_after.size() ? done_after[l] : 1.0;
        double from_unit = 0;  // this layer's parameters in this unit and the ones backward reached before it
        for (int u = unit; u < model.gradient_units() && size_t(model.unit_layer(u)) == l; ++u)
            from_unit += unit_params[size_t(u)];
        const double layer_share = total_backward > 0 ? flops[l].backward / total_backward : 0.0;
        return done_after[l] - layer_share * (1.0 - from_unit / layer_params[l]);
    };
    const double grad_elem = double(dtype_size(strategy.allreduce_dtype));
    for (const Bucket& b : make_buckets(model, strategy.bucket_mb)) {
        const bool state = b.ready_after_unit < 0;
        BucketTiming t;
        t.bytes = double(b.end - b.begin) * (state ? 4.0 : grad_elem);
        t.ready = state ? 1.0 : ready_after(b.ready_after_unit);
        c.wire_bytes += t.bytes;
        c.buckets.push_back(t);
    }
    const int sync = model.stats_syncs();
    if (sync > 0) {
        c.blocking_allreduces = 2 * sync;
        c.blocking_bytes = double(model.stats_floats()) * 4.0 / sync;  // per layer, roughly
    }
    return c;
}

StepPrediction predict_step(const Topology& topo, double compute_s, const CommPlan& comm, bool sharded, int scatters) {
    StepPrediction p;
    p.compute_s = compute_s;
    const double backward = compute_s * comm.backward_share, forward = compute_s - backward;
    double comm_end = 0, gather = 0, scatter = 0;
    for (const BucketTiming& b : comm.buckets) {
        double t = allreduce_seconds(topo, b.bytes), overlapped = t;
        if (sharded) {  // the node's reduce-scatter and the chunk's sum over the nodes; the node's gather after
            const double local = ring_allreduce_seconds(topo.per_node, b.bytes, topo.local);
            overlapped = local / 2 + (topo.nodes > 1 ? ring_allreduce_seconds(topo.nodes, b.bytes, topo.net) : 0.0);
            gather += local / 2;
            scatter += overlapped;
            t = overlapped + local / 2;
        }
        comm_end = std::max(comm_end, forward + b.ready * backward) + overlapped;
        p.allreduce_s += t;
    }
    if (sharded) gather += ring_allreduce_seconds(topo.per_node, 2 * sizeof(float), topo.local);  // the norm's sum
    double earlier = 0;  // the earlier micro-batches' reduce-scatters, past their own backward
    if (sharded && scatters > 1) {
        p.allreduce_s += double(scatters - 1) * scatter;
        earlier = double(scatters - 1) * std::max(0.0, scatter - backward / double(scatters));
    }
    const double blocking = comm.blocking_allreduces * allreduce_seconds(topo, comm.blocking_bytes);
    p.allreduce_s += blocking;
    p.exposed_s = std::max(0.0, comm_end - compute_s) + blocking + gather + earlier;
    p.step_s = compute_s + p.exposed_s;
    return p;
}

MemoryPlan gpu_memory_plan(const Model& model, const OptimizerConfig& opt, const StrategyConfig& strategy, int replicas,
                           int rows, int accumulation) {
    const int micro = (rows + accumulation - 1) / accumulation;
    return plan_memory(model, opt, strategy, *find_backend("cuda"), replicas, rows, micro);
}

int largest_fitting_rows(const Model& model, const OptimizerConfig& opt, const StrategyConfig& strategy, int replicas,
                         int accumulation, uint64_t capacity_bytes) {
    auto fits = [&](int rows) {
        return gpu_memory_plan(model, opt, strategy, replicas, rows, accumulation).total() <= capacity_bytes;
    };
    if (!fits(1)) return 0;
    int lo = 1, hi = 2;
    while (hi < (1 << 24) && fits(hi)) lo = hi, hi *= 2;  // memory grows with rows: double, then bisect
    while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    return lo;
}

namespace {

int iterations_for(size_t bytes) { return int(std::clamp<double>(2e8 / double(bytes), 3, 200)); }

}  // namespace

double measure_allreduce_seconds(const std::string& devices, const std::string& op, DType wire, size_t bytes) {
    const size_t floats = std::max<size_t>(bytes / 4, 1);
    AllReduceRig rig(devices, op, wire, floats);
    rig.zero();
    return rig.median_seconds(floats, iterations_for(bytes), 5);
}

LinkModel measure_link(const std::string& devices, const std::string& op, DType wire, size_t bytes) {
    constexpr size_t kSmall = 4096;
    const size_t large = std::max<size_t>(bytes / 4 * 4, 2 * kSmall);
    AllReduceRig rig(devices, op, wire, large / 4);
    rig.zero();
    const int n = rig.replicas();
    LinkModel link;
    if (n < 2) return link;
    const double t_small = rig.median_seconds(kSmall / 4, 200, 5);
    const double t_large = rig.median_seconds(large / 4, iterations_for(large), 3);
    const double wire_scale = double(dtype_size(wire)) / 4.0;  // bytes on the wire per f32 gradient byte
    link.step_latency_s = t_small / (2.0 * (n - 1));
    const double bandwidth_time = std::max(t_large - 2.0 * (n - 1) * link.step_latency_s, t_large * 0.5);
    link.bus_bytes_per_s = 2.0 * (n - 1) / n * double(large) * wire_scale / bandwidth_time;
    return link;
}

double profile_seconds_per_sample(const std::string& json_text, const std::string& source) {
    using json = nlohmann::json;
    const std::string where = "--profile: " + source;
    json j;
    try {
        j = json::parse(json_text);
    } catch (const std::exception& e) {
        throw ConfigError(where + " is not JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("results") || !j["results"].is_array())
        throw ConfigError(where + " has no results (expected scaling.json from `mirrored scale` or bench-step --json)");
    const json& results = j["results"];
    for (size_t i = 0; i < results.size(); ++i) {
        const json& r = results[i];
        auto number = [&](const char* key) -> std::optional<double> {
            const auto it = r.find(key);
            if (it == r.end()) return std::nullopt;
            if (!it->is_number())
                throw ConfigError(where + ": results[" + std::to_string(i) + "]." + key + " is " + it->type_name() +
                                  ", expected a number");
            return it->get<double>();
        };
        if (!r.is_object() || number("replicas") != 1.0) continue;
        const auto step_ms = number("step_ms"), rows = number("global_batch");
        if (!step_ms || !rows) continue;
        // a step from a microsecond to a day, a batch of whole samples below 2^31
        if (!(*step_ms >= 1e-3 && *step_ms <= 86400e3) || !(*rows >= 1 && *rows < 2147483648.0) ||
            *rows != std::floor(*rows))
            throw ConfigError(
                where + ": results[" + std::to_string(i) + "]: step_ms " + decimal_text(*step_ms) +
                " and global_batch " + decimal_text(*rows) +
                " are not a measurement (expected a step of 0.001 ms to a day, a whole batch of 1 to 2^31-1)");
        return *step_ms / 1e3 / *rows;
    }
    throw ConfigError(where + " has no one-replica point with step_ms and global_batch");
}

CostEstimate estimate_cost(const CostInputs& in) {
    CostEstimate e;
    const double interval = in.checkpoint_interval_s > 0 ? in.checkpoint_interval_s : in.work_s;
    e.checkpoint_s = in.checkpoint_interval_s > 0 ? in.work_s / in.checkpoint_interval_s * in.checkpoint_write_s : 0;
    const double kept = in.work_s + e.checkpoint_s;
    e.wall_s = kept;
    if (in.job_mtbf_s > 0) {
        const double lost_share = (interval / 2 + in.restart_s) / in.job_mtbf_s;  // of each hour, redone
        e.finishes = lost_share < 1;
        e.wall_s = e.finishes ? kept / (1 - lost_share) : std::numeric_limits<double>::infinity();
        e.expected_failures = e.wall_s / in.job_mtbf_s;
        if (in.checkpoint_write_s > 0) e.young_daly_s = std::sqrt(2 * in.checkpoint_write_s * in.job_mtbf_s);
    }
    e.rework_s = e.wall_s - kept;
    const double per_second = in.gpus * in.price_per_gpu_hour / 3600;
    e.gpu_hours = e.wall_s * in.gpus / 3600;
    e.cost = e.wall_s * per_second;
    e.comm_cost = in.work_s * in.exposed_comm_share * per_second;
    e.checkpoint_cost = e.checkpoint_s * per_second;
    e.rework_cost = e.rework_s * per_second;
    return e;
}

}  // namespace mirrored
