#include "mirrored/replica_set.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <thread>

#include "base/io.h"
#include "mirrored/cross_device_ops.h"
#include "mirrored/util.h"
#include "kernels/ops/flat.h"
#include "kernels/ops/elementwise.h"

namespace mirrored {

namespace {

void backoff(int round) {
    if (round < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 20 * (round - 63))));
}

}  // namespace

// All-zero bits are 0.0: the doubles are cleared as twice as many floats, by the fill every
// backend has.
void ReplicaSet::zero_metrics(Device& d, Stream s, double* metrics) {
    // cppcheck-suppress invalidPointerCast
    fill_floats(d, s, 2 * kMetricSlots, 0.0f, reinterpret_cast<float*>(metrics));
}

void ReplicaSet::sum_over_nodes(Metrics& m, const char* what) const {
    if (!nodes_) return;
    double v[3] = {m.loss_sum, m.correct, m.count};
    nodes_->sum(v, 3, what);
    m.loss_sum = v[0];
    m.correct = v[1];
    m.count = v[2];
}

Replica::~Replica() {
    if (!device) return;
    if (!device->abandoned()) {
        try {
            device->synchronize();
        } catch (...) {
            device->abandon();
        }
    }
    for (Event e :
         {input_ready[0], input_ready[1], input_free[0], input_free[1], bucket_ready, reduced, metrics_copied,
          stats_ready, stats_done, t_begin, t_backward, t_reduced, t_end, t_gather, t_gathered, step_ready, graph_done})
        if (e.handle) device->event_destroy(e);
    for (Event e : trail)
        if (e.handle) device->event_destroy(e);
    for (Event e : slot_free) device->event_destroy(e);
}

ReplicaSet::ReplicaSet(const StrategyConfig& cfg, const Model& model, const OptimizerConfig& opt, int global_batch,
                       int accumulation_steps, Nodes* nodes, size_t label_bytes, const std::vector<int>& batches)
    : cfg_(cfg),
      model_(model),
      nodes_(nodes),
      devices_(parse_devices(cfg.devices)),
      accumulation_(accumulation_steps),
      label_bytes_(label_bytes) {
    const int n = int(devices_.ordinals.size());
    const int all = n * node_count();  // all_replicas() once the replicas are built
    check_batch(global_batch, all);
    // CPU replicas (and the simulated GPUs' streams, which compute with the CPU reference) are
    // the parallelism: one BLAS thread each.
    if (!devices_.traits().gpu) cpu_set_blas_threads(1);
    staged_pairs_ = devices_.backend->enable_peer_access(devices_.ordinals);
    const int shard_rows = (global_batch + all - 1) / all;
    const int micro_rows = (shard_rows + accumulation_ - 1) / accumulation_;
    low_precision_ = precision_dtype(cfg_.precision) != DType::f32;
    convert_inputs_ = low_precision_ && !model_.reads_token_ids();
    loss_scaling_ = cfg_.precision == Precision::fp16;
    shared_ = parameters_shared(cfg_, devices_, nodes_ != nullptr);
    if (shared_ && devices_.traits().asynchronous && n > PeerBuffers::kMax)
        throw ConfigError("strategy.shared_parameters",
                          "at most " + std::to_string(PeerBuffers::kMax) +
                              " replicas of one GPU share one parameter copy; set it false");
    sharded_ = cfg_.shard != StrategyConfig::Shard::none && !shared_;
    if (sharded_ && cfg_.allreduce_dtype != DType::f32)  // the config reader says so first; code may not
        throw ConfigError("strategy.shard",
                          "the optimizer state is sharded with fp32 gradients only; set "
                          "strategy.allreduce_dtype: fp32");
    buckets_ = make_buckets(model_, cfg_.bucket_mb);
    staged_ = sharded_ && cfg_.shard == StrategyConfig::Shard::gradients && n > 1;
    if (staged_) staging_ = plan_gradient_staging(model_, buckets_);
    rows_met_ = batches.empty() ? std::vector<int>() : micro_batch_rows(batches, all, accumulation_);
    plan_ = plan_memory(model_, opt, cfg_, *devices_.backend, n, shard_rows, micro_rows, shared_, label_bytes_,
                        &buckets_, rows_met_);
    check_device_memory(opt, shard_rows, micro_rows);
    for (int r = 0; r < n; ++r) build_replica(r, shard_rows, micro_rows, opt);
    threads_ = std::make_unique<ReplicaThreads>(n);
    replicas_[0]->scratch_base = cpu_thread_scratch_bytes();  // the others' threads are new
    for (auto& R : replicas_) grad_ptrs_.push_back(R->grads.data());
}

ReplicaSet::~ReplicaSet() {
    shutdown();
    threads_.reset();
}

std::vector<Device*> ReplicaSet::device_list() const {
    std::vector<Device*> devs;
    for (const auto& R : replicas_) devs.push_back(R->device.get());
    return devs;
}

void ReplicaSet::check_batch(int global_batch, int all) const {
    if (accumulation_ < 1) throw ConfigError("train.grad_accumulation_steps", "expected a positive integer");
    if (global_batch % (all * accumulation_) != 0)
        throw ConfigError("train.global_batch_size",
                          "" + std::to_string(global_batch) + " does not divide into " + std::to_string(all) +
                              " replicas x " + std::to_string(accumulation_) +
                              " accumulation steps; use a multiple of " + std::to_string(all * accumulation_));
    if (cfg_.bucket_mb < 0) throw ConfigError("strategy.bucket_mb", "expected a number >= 0");
}

// GPUs: the replicas on each GPU must fit its free memory (an allocation failure later would be
// clear too, but this says why before anything is built). Host memory is the session's check.
// Names the sharding that would fit, where one would.
void ReplicaSet::check_device_memory(const OptimizerConfig& opt, int shard_rows, int micro_rows) const {
    if (!devices_.traits().gpu) return;
    std::map<int, int> per_gpu;
    for (int o : devices_.ordinals) ++per_gpu[o];
    for (auto [ordinal, count] : per_gpu) {
        const uint64_t free = cuda_free_memory(ordinal);
        const uint64_t need = plan_.total() * uint64_t(count);
        if (!free || need <= free) continue;
        const std::string shard =
            fitting_shard(model_, opt, cfg_, *devices_.backend, int(devices_.ordinals.size()), shard_rows, micro_rows,
                          shared_, label_bytes_, free / uint64_t(count), rows_met_);
        throw DeviceError("cuda:" + std::to_string(ordinal) + ": " + std::to_string(count) + " replica(s) need " +
                          format_bytes(need) + " (" + plan_.describe() + " each), " + format_bytes(free) +
                          " free: " + (shard.empty() ? "" : "set " + shard + ", or ") +
                          "use a smaller per-replica batch (train.global_batch_size), more "
                          "train.grad_accumulation_steps, train.recompute: blocks, or fewer replicas on this GPU");
    }
}

// The replica's parameters (unless shared and r > 0), gradients, optimizer state, activations.
void ReplicaSet::allocate_model_state(Replica& R, const OptimizerConfig& opt, int micro_rows) {
    Device& d = *R.device;
    const size_t flat = model_.flat_size();
    const bool holds_params = !shared_ || R.index == 0;  // shared: replica 0 holds the one copy
    if (holds_params) R.params = DeviceBuffer<float>(d, flat);
    R.grads = DeviceBuffer<float>(d, grad_elements());
    if (low_precision_ && holds_params) R.weights = DeviceBuffer<unsigned char>(d, d.act_bytes(model_.weights_size()));
    if (holds_params) {
        const size_t trainable = model_.trainable_size();
        R.optimizer = sharded_
                          ? make_optimizer(d, opt, trainable,
                                           owned_ranges(buckets_, trainable, int(devices_.ordinals.size()), R.index))
                          : make_optimizer(d, opt, trainable);
        if (opt.weight_decay_on == OptimizerConfig::DecayOn::matrices) R.optimizer->decay_only(model_.matrix_ranges());
        if (staged_) R.owned_grads = DeviceBuffer<float>(d, R.optimizer->state_size());
    }
    R.acts = model_.make_activations(d, micro_rows);
}

// The double-buffered input and label buffers and their events.
void ReplicaSet::allocate_inputs(Replica& R, int shard_rows) {
    Device& d = *R.device;
    const size_t features = size_t(model_.input_features());
    for (int b = 0; b < 2; ++b) {
        R.inputs[b] = DeviceBuffer<float>(d, size_t(shard_rows) * features);
        R.labels[b] = DeviceBuffer<unsigned char>(d, size_t(shard_rows) * label_bytes_);
        R.input_ready[b] = d.event_create();
        R.input_free[b] = d.event_create();
    }
    if (convert_inputs_) R.inputs_act = DeviceBuffer<unsigned char>(d, d.act_bytes(size_t(shard_rows) * features));
}

// What a step reads and writes besides the model: metrics, gradient statistics, the loss scale,
// batch statistics (with the two events that order their exchange), checksums and their pinned
// host copies.
void ReplicaSet::allocate_step_state(Replica& R) {
    Device& d = *R.device;
    R.train_metrics = DeviceBuffer<double>(d, kMetricSlots);
    R.eval_metrics = DeviceBuffer<double>(d, kMetricSlots);
    R.grad_stats = DeviceBuffer<float>(d, 2);
    if (shared_ || sharded_) R.grad_total = DeviceBuffer<float>(d, 2);
    R.loss_scale = DeviceBuffer<float>(d, 2);
    R.loss_scale_host = HostBuffer<float>(d, 2);
    R.loss_scale_host[0] = kInitialLossScale;
    R.loss_scale_host[1] = 0.0f;
    d.copy_to_device(d.compute_stream(), R.loss_scale.data(), R.loss_scale_host.data(), 2 * sizeof(float));
    if (model_.stats_floats() > 0) R.stats = DeviceBuffer<float>(d, model_.stats_floats());
    R.stats_ready = d.event_create();
    R.stats_done = d.event_create();
    R.checksums = DeviceBuffer<uint64_t>(d, model_.tensors().size() + 1);
    R.metrics_host = HostBuffer<double>(d, kMetricSlots);
    R.eval_host = HostBuffer<double>(d, kMetricSlots);
    R.checksums_host = HostBuffer<uint64_t>(d, model_.tensors().size() + 1);
}

// The events a step orders its streams and replicas with, its timing events, and the captured
// step's per-step values (cuda_graph).
void ReplicaSet::create_step_events(Replica& R) {
    Device& d = *R.device;
    R.bucket_ready = d.event_create();
    R.reduced = d.event_create();
    R.metrics_copied = d.event_create();
    for (int k = 0; k < Replica::kTrail; ++k) {
        R.trail[k] = d.event_create();
        R.trail_use[k].store(-1, std::memory_order_relaxed);
    }
    for (Event* e : {&R.t_begin, &R.t_backward, &R.t_reduced, &R.t_end}) *e = d.event_create(true);
    if (sharded_)
        for (Event* e : {&R.t_gather, &R.t_gathered}) *e = d.event_create(true);
    for (int s = 0; s < staging_.slots; ++s) R.slot_free.push_back(d.event_create());
    R.slot_used.assign(size_t(staging_.slots), 0);
    if (cfg_.cuda_graph && devices_.traits().asynchronous) {
        for (auto& v : R.step_values) v = DeviceBuffer<StepValues>(d, 1);
        R.step_ready = d.event_create();
        R.graph_done = d.event_create();
    }
}

// Allocation order is the device calls' order, which the simulated device's fault tests count.
void ReplicaSet::build_replica(int r, int shard_rows, int micro_rows, const OptimizerConfig& opt) {
    auto R = std::make_unique<Replica>();
    R->index = r;
    try {
        R->device = devices_.backend->make(devices_.ordinals[size_t(r)]);
        Device& d = *R->device;
        d.set_precision(cfg_.precision);
        d.set_fused_epilogues(cfg_.fused_epilogues);
        allocate_model_state(*R, opt, micro_rows);
        allocate_inputs(*R, shard_rows);
        allocate_step_state(*R);
        create_step_events(*R);
        const Stream s = d.compute_stream();
        fill_floats(d, s, grad_elements(), 0.0f, R->grads.data());  // alignment gaps stay zero (staged: see gaps)
        zero_metrics(d, s, R->train_metrics.data());
        d.synchronize();
    } catch (const DeviceError& e) {
        const std::string what = e.what();
        throw DeviceError(
            "replica " + std::to_string(r) + ": " + what +
                (what.find("out of memory") != std::string::npos
                     ? ". Each replica holds the whole model plus activations for " + std::to_string(micro_rows) +
                           " rows: try a smaller per-replica batch "
                           "(train.global_batch_size) or more train.grad_accumulation_steps"
                     : ""),
            e.device());
    }
    replicas_.push_back(std::move(R));
}

void ReplicaSet::fail() noexcept {
    failed_ = true;
    for (const auto& hook : failure_hooks_) hook();
    for (auto& R : replicas_)
        if (R && R->device) R->device->abandon();
}

bool ReplicaSet::shutdown() noexcept {
    if (!failed_) {
        try {
            synchronize();
        } catch (...) {
            fail();
        }
    }
    return !failed_;
}

void ReplicaSet::synchronize() {
    guarded([&] {
        wait_until([&] {
            bool idle = true;
            for (auto& R : replicas_) idle = R->device->query_idle() && idle;
            return idle;
        });
    });
}

void ReplicaSet::wait_until(const std::function<bool()>& done) {
    for (int round = 0;; ++round) {
        if (done()) return;
        for (auto& R : replicas_) R->device->query_idle();  // throws the error of a failed device
        backoff(round);
    }
}

uint64_t ReplicaSet::peak_memory_bytes() const {
    uint64_t peak = 0;
    for (const auto& R : replicas_) peak = std::max(peak, R->peak_memory_bytes());
    return peak;
}

uint64_t ReplicaSet::memory_per_replica_bytes() const {
    uint64_t sum = 0;
    for (const auto& R : replicas_) sum += R->peak_memory_bytes();
    return sum / uint64_t(replicas_.size());
}

StepWork ReplicaSet::host_work() const {
    HostWork all;
    for (const auto& R : replicas_) all += R->device->host_work();
    return {replicas_[0]->device->host_work(), all, threads_->barrier().arrivals() / uint64_t(replicas_.size())};
}

std::string ReplicaSet::topology_report() const {
    std::string s;
    const std::string kind = devices_.backend->name;
    for (const StagedPair& p : staged_pairs_)
        s += kind + ":" + std::to_string(p.from) + " -> " + kind + ":" + std::to_string(p.to) +
             ": staged peer copies (" + p.why + "), slower than direct peer loads\n";
    if (devices_.traits().shares_ordinals && devices_.distinct() < devices_.ordinals.size())
        s += "several replicas share a GPU (logical devices): they exchange data within its memory\n";
    return s;
}

HostAllocator ReplicaSet::host_allocator() {
    if (!devices_.traits().asynchronous) return HostAllocator::aligned();
    Device* d = replicas_[0]->device.get();  // portable pinned memory serves every GPU
    return {[d](size_t bytes) { return d->alloc_host_bytes(bytes); }, [d](void* p) { d->free_host_bytes(p); }};
}

const Batch& ReplicaSet::next_batch(Loader& loader) {
    return *guarded([&] {
        const Batch* b = nullptr;
        wait_until([&] { return (b = loader.next_for(0.005)) != nullptr; });
        return b;
    });
}

void ReplicaSet::inputs_consumed(Replica& R, int buf, Stream s) {
    Device& d = *R.device;
    d.event_record(R.input_free[buf], s);
    const int64_t use = R.input_uses++;
    const int k = int(use % Replica::kTrail);
    d.event_record(R.trail[k], s);
    R.trail_use[k].store(use, std::memory_order_release);
}

std::string ReplicaSet::lagging_device() const {
    constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
    std::vector<int64_t> oldest(replicas_.size(), kNone);  // per replica, its oldest unfinished use
    for (size_t r = 0; r < replicas_.size(); ++r) {
        Replica& R = *replicas_[r];
        for (int k = 0; k < Replica::kTrail; ++k) {
            const int64_t use = R.trail_use[k].load(std::memory_order_acquire);
            if (use < 0) continue;
            try {
                if (!R.device->event_query(R.trail[k])) oldest[r] = std::min(oldest[r], use);
            } catch (const DeviceError& e) {
                return e.device();  // a device's own fault names it; a refused call names none
            }
        }
    }
    const int64_t first = *std::min_element(oldest.begin(), oldest.end());
    if (first == kNone) return "";  // every replica is done with its inputs: not a device's hang
    std::string device;
    bool others_ahead = false;
    for (size_t r = 0; r < replicas_.size(); ++r) {
        if (oldest[r] != first) {
            others_ahead = true;
        } else if (device.empty()) {
            device = replicas_[r]->device->name();
        } else if (device != replicas_[r]->device->name()) {
            return "";  // two devices stopped at the same point
        }
    }
    for (size_t r = 0; r < replicas_.size(); ++r)  // every replica of that device is behind
        if (replicas_[r]->device->name() == device && oldest[r] != first) return "";
    return others_ahead ? device : "";
}

int ReplicaSet::stage_input(Replica& R, const Batch& batch, const Shard& shard, const StepValues* values) {
    Device& d = *R.device;
    const int buf = R.next_buffer;
    R.next_buffer ^= 1;
    const size_t features = size_t(model_.input_features());
    const Stream cs = d.copy_stream();
    d.stream_wait_event(cs, R.input_free[buf]);  // the step two back has finished with this buffer
    if (batch.features) {
        d.copy_to_device(cs, R.inputs[buf].data(), batch.features + size_t(shard.begin) * features,
                         size_t(shard.rows) * features * sizeof(float));
    } else {  // CPU replicas gather their rows from the data set themselves (gathers_input())
        if (devices_.traits().asynchronous)
            throw Error(kExitFailure, "strategy: a batch without features for a GPU replica");
        batch.owner->gather(batch, shard.begin, shard.rows, R.inputs[buf].data());
    }
    const void* labels = batch.targets ? static_cast<const void*>(batch.targets) : batch.labels;
    d.copy_to_device(cs, R.labels[buf].data(), static_cast<const char*>(labels) + size_t(shard.begin) * label_bytes_,
                     size_t(shard.rows) * label_bytes_);
    if (values) set_step_values(d, cs, *values, R.step_values[buf].data());
    d.event_record(R.input_ready[buf], cs);
    // The slot's Batch outlives the callback (the slot is not refilled before every replica has
    // released it), so it is the callback's only argument; the host may be steps ahead by then.
    d.host_callback(
        cs,
        [](void* p) {
            const auto* b = static_cast<const Batch*>(p);
            b->owner->release(*b);
        },
        const_cast<Batch*>(&batch));
    d.stream_wait_event(d.compute_stream(), R.input_ready[buf]);
    return buf;
}

// The shard's inputs as the model reads them: the staged f32 rows, or converted to the activation
// type (rows from the start of the shard).
const void* ReplicaSet::stage_for_compute(Replica& R, int buf, size_t rows) {
    if (!convert_inputs_) return R.inputs[buf].data();
    Device& d = *R.device;
    convert_values(d, d.compute_stream(), rows * size_t(model_.input_features()), R.inputs[buf].data(), DType::f32,
                   R.inputs_act.data(), d.value_dtype());
    return R.inputs_act.data();
}

Pass ReplicaSet::make_pass(Replica& R, Stream s, int rows, int global_rows, int64_t row_offset, uint64_t seed,
                           uint32_t step, bool training, const StepValues* values) {
    Pass p;
    p.dev = R.device.get();
    p.stream = s;
    p.rows = rows;
    p.global_rows = global_rows;
    p.row_offset = row_offset;
    p.seed = seed;
    p.step = step;
    p.values = values;
    p.training = training;
    Replica& H = holder(R);
    p.params = H.params.data();
    p.weights = low_precision_ ? static_cast<const void*>(H.weights.data()) : H.params.data();
    p.grads = R.grads.data();
    p.frozen_from = model_.grad_size();
    p.placement = staged_ ? &staging_.placement : nullptr;
    p.acts = &R.acts;
    p.sync = R.sync.get();
    p.vt = R.device->value_dtype();
    return p;
}

void ReplicaSet::refresh_weights(Replica& R, Stream s, bool all) {
    if (low_precision_)  // frozen tensors change only when loaded (all)
        convert_values(*R.device, s, all ? model_.weights_size() : model_.trainable_size(), R.params.data(), DType::f32,
                       R.weights.data(), R.device->value_dtype());
}

size_t ReplicaSet::input_row_bytes(const Replica& R) const {
    return size_t(model_.input_features()) * (convert_inputs_ ? R.device->act_bytes(1) : sizeof(float));
}

int ReplicaSet::global_micro_rows(int global_rows, int m) const {
    int rows = 0;
    for (int g = 0; g < all_replicas(); ++g)
        rows += shard_of(shard_of(global_rows, all_replicas(), g).rows, accumulation_, m).rows;
    return rows;
}

}  // namespace mirrored
