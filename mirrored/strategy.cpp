#include "mirrored/strategy.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "base/io.h"
#include "base/error.h"
#include "mirrored/step_profile.h"
#include "mirrored/util.h"

namespace mirrored {

namespace {

// The metric accumulators are doubles; zero bits are 0.0.
void zero_metrics(Device& d, Stream s, double* m) { d.fill(s, 2 * kMetricSlots, 0.0f, reinterpret_cast<float*>(m)); }

// Multi-node: metrics are sums over every node's replicas.
void sum_over_nodes(Metrics& m, Nodes* nodes, const char* what) {
    if (!nodes) return;
    double v[3] = {m.loss_sum, m.correct, m.count};
    nodes->sum(v, 3, what);
    m.loss_sum = v[0];
    m.correct = v[1];
    m.count = v[2];
}

void backoff(int round) {
    if (round < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 20 * (round - 63))));
}

}  // namespace

std::vector<Bucket> make_buckets(const Model& model, double bucket_mb) {
    std::vector<const TensorInfo*> t;
    for (const auto& x : model.tensors())
        if (x.trainable) t.push_back(&x);
    std::sort(t.begin(), t.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    std::vector<Bucket> out;
    const size_t trainable = model.trainable_size();
    if (bucket_mb <= 0) {
        out.push_back(Bucket{0, trainable, t.front()->layer});
    } else {
        const size_t limit = std::max<size_t>(1, size_t(bucket_mb * 1048576.0 / sizeof(float)));
        size_t end = trainable;
        for (int i = int(t.size()) - 1; i >= 0; --i)
            if (end - t[size_t(i)]->offset >= limit || i == 0) {
                out.push_back(Bucket{t[size_t(i)]->offset, end, t[size_t(i)]->layer});
                end = t[size_t(i)]->offset;
            }
        out.back().begin = 0;  // covers any alignment gap before the first tensor
    }
    if (model.has_state()) out.push_back(Bucket{trainable, model.flat_size(), -1});
    return out;
}

std::string MemoryPlan::describe() const {
    return "parameters " + format_bytes(params) + ", gradients " + format_bytes(grads) + ", optimizer state " +
           format_bytes(optimizer) + ", activations " + format_bytes(activations) + ", inputs " + format_bytes(inputs) +
           (weight_copy ? ", 16-bit weight copy " + format_bytes(weight_copy) : std::string()) +
           (wire ? ", bf16 gradient copy " + format_bytes(wire) : std::string()) + ", workspaces " +
           format_bytes(workspace) + "; total " + format_bytes(total());
}

bool parameters_shared(const StrategyConfig& strategy, const DeviceList& devices, bool several_nodes) {
    const auto& o = devices.ordinals;
    if (!strategy.shared_parameters || o.size() < 2) return false;
    if (devices.traits().one_memory) return true;
    return !several_nodes && std::all_of(o.begin(), o.end(), [&](int g) { return g == o[0]; });
}

MemoryPlan plan_memory(const Model& model, const OptimizerConfig& opt, const StrategyConfig& strategy,
                       const Backend& backend, int replicas, int shard_rows, int micro_rows, bool shared,
                       size_t label_bytes) {
    MemoryPlan m;
    const DeviceTraits& traits = backend.traits;
    const uint64_t flat = model.flat_size() * sizeof(float), trainable = model.trainable_size() * sizeof(float);
    m.params = m.grads = flat;
    m.optimizer = trainable * uint64_t(optimizer_state_buffers(opt));
    const bool low = precision_dtype(strategy.precision) != DType::f32;
    const size_t act_elem = low && traits.stores_16bit ? 2 : 4;  // CPU and sim round to 16 bits in f32
    m.activations = model.activation_bytes(micro_rows, act_elem, traits.column_block_bytes);
    m.inputs = 2 * uint64_t(shard_rows) * (uint64_t(model.input_features()) * sizeof(float) + label_bytes) +
               (low ? uint64_t(shard_rows) * uint64_t(model.input_features()) * act_elem : 0);
    m.weight_copy = low ? uint64_t(model.trainable_size()) * act_elem : 0;
    if (shared && replicas > 1)  // one copy, counted in shares
        for (uint64_t* one_copy : {&m.params, &m.optimizer, &m.weight_copy})
            *one_copy = (*one_copy + uint64_t(replicas) - 1) / uint64_t(replicas);
    m.wire = strategy.allreduce_dtype == DType::bf16 && replicas > 1 ? uint64_t(model.trainable_size()) * 2 : 0;
    const uint64_t widest = std::max<uint64_t>(model.largest_activation_per_row(), uint64_t(model.input_features()));
    m.workspace = backend.workspace_bytes({micro_rows, widest, strategy.fused_epilogues});
    return m;
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
    for (Event e : {input_ready[0], input_ready[1], input_free[0], input_free[1], bucket_ready, reduced,
                    metrics_copied, stats_ready, stats_done, t_begin, t_backward, t_reduced, t_end, step_ready,
                    graph_done})
        if (e.handle) device->event_destroy(e);
}

MirroredStrategy::MirroredStrategy(const StrategyConfig& cfg, const Model& model, const OptimizerConfig& opt,
                                   int global_batch, int accumulation_steps, Nodes* nodes, const LossConfig& loss)
    : cfg_(cfg), model_(model), loss_(make_loss(loss)), label_bytes_(label_bytes(loss, model.output_features())),
      nodes_(nodes), devices_(parse_devices(cfg.devices)), accumulation_(accumulation_steps) {
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
    loss_scaling_ = cfg_.precision == Precision::fp16;
    shared_ = parameters_shared(cfg_, devices_, nodes_ != nullptr);
    if (shared_ && devices_.traits().asynchronous && n > PeerBuffers::kMax)
        throw ConfigError("strategy.shared_parameters", "at most " + std::to_string(PeerBuffers::kMax) +
                                                            " replicas of one GPU share one parameter copy; set it false");
    plan_ = plan_memory(model_, opt, cfg_, *devices_.backend, n, shard_rows, micro_rows, shared_, label_bytes_);
    check_device_memory();
    for (int r = 0; r < n; ++r) build_replica(r, shard_rows, micro_rows, opt);
    threads_ = std::make_unique<ReplicaThreads>(n);
    std::vector<Device*> devs;
    for (auto& R : replicas_) devs.push_back(R->device.get());
    buckets_ = make_buckets(model_, cfg_.bucket_mb);
    for (auto& R : replicas_) grad_ptrs_.push_back(R->grads.data());
    for (int r = 0; r < n; ++r) all_indices_.push_back(r);
    if (shared_) joins_ = std::make_unique<ReplicaSync>(devs, threads_->barrier(), ReplicaSync::On::compute);
    // Shared parameters: the gradients need no op (each replica sums its slice where it lies);
    // the statistics of synchronised batchnorm still do.
    if (!shared_) make_gradient_ops(devs);
    if (model_.stats_floats() > 0) make_stats_ops(devs);
    for (const auto& t : model_.tensors())
        if (!t.trainable) state_.push_back(&t);
    join_nodes();
    choose_graphs();
}

void MirroredStrategy::check_batch(int global_batch, int all) const {
    if (accumulation_ < 1) throw ConfigError("train.grad_accumulation_steps", "expected a positive integer");
    if (global_batch % (all * accumulation_) != 0)
        throw ConfigError("train.global_batch_size", "" + std::to_string(global_batch) + " does not divide into " +
                          std::to_string(all) + " replicas x " + std::to_string(accumulation_) +
                          " accumulation steps; use a multiple of " + std::to_string(all * accumulation_));
    if (cfg_.bucket_mb < 0) throw ConfigError("strategy.bucket_mb", "expected a number >= 0");
}

void MirroredStrategy::make_gradient_ops(const std::vector<Device*>& devs) {
    const bool exact = cfg_.allreduce_dtype == DType::f32;  // else the state region (running statistics) needs its own f32 ops
    const size_t ops_elements = exact ? model_.flat_size() : model_.trainable_size();
    if (cfg_.cross_device_ops == "auto") {
        std::vector<std::pair<size_t, size_t>> ranges;
        for (const Bucket& b : buckets_)
            if (b.end <= ops_elements) ranges.emplace_back(b.begin, b.end - b.begin);
        // Multi-node: node 0 chooses for every node (the same op sums in the same order as on one node).
        OpsChoice choice;
        if (!nodes_ || nodes_->leader())
            choice = choose_cross_device_ops(devs, grad_ptrs_, ops_elements, ranges, *threads_, cfg_.allreduce_dtype,
                                             cfg_.resume_cross_device_ops);
        if (nodes_) {
            choice.name = nodes_->broadcast(choice.name, "the choice of the cross-device op");
            if (!nodes_->leader()) choice.how = "node 0's choice";
        }
        cfg_.cross_device_ops = choice.name;
        ops_choice_ = "auto, " + choice.how;
    }
    ops_ = make_cross_device_ops(cfg_.cross_device_ops, devs, grad_ptrs_, ops_elements, threads_->barrier(),
                                 cfg_.allreduce_dtype);
    if (model_.has_state() && !exact)
        state_ops_ = make_cross_device_ops(cfg_.cross_device_ops, devs, grad_ptrs_, model_.flat_size(), threads_->barrier());
}

// Synchronised batch normalisation sums over its own buffers.
void MirroredStrategy::make_stats_ops(const std::vector<Device*>& devs) {
    std::vector<float*> stats;
    for (auto& R : replicas_) stats.push_back(R->stats.data());
    stats_ops_ = make_cross_device_ops(shared_ ? "ring" : cfg_.cross_device_ops, devs, stats, model_.stats_floats(),
                                       threads_->barrier());
    for (int r = 0; r < int(replicas_.size()); ++r) replicas_[r]->sync = make_stats_sync(r);
}

void MirroredStrategy::choose_graphs() {
    if (!cfg_.cuda_graph) return;
    if (!devices_.traits().asynchronous)
        graph_note_ = "CPU replicas run each op as it is issued: there is nothing to capture";
    else if (!devices_.traits().nccl_capturable && cfg_.cross_device_ops == "nccl")
        graph_note_ = std::string("NCCL on ") + devices_.traits().display + " replicas cannot be captured; use ring or direct";
    else graphs_on_ = true;
    if (graphs_on_) graph_fork_ = replicas_[0]->device->event_create();
}

// Multi-node: every node must drive as many replicas of the same kind (the job's replica index
// and the shards follow from it); then every cross-device op becomes hierarchical.
void MirroredStrategy::join_nodes() {
    if (!nodes_) return;
    const std::string mine = std::to_string(replicas()) + " " + devices_.backend->name + " replica(s)";
    const auto all = nodes_->all_gather(mine, "the start-up exchange of replica counts");
    for (size_t k = 0; k < all.size(); ++k)
        if (all[k] != all[0])
            throw ConfigError("strategy.devices", "every node must drive the same replicas: node 0 has " + all[0] +
                              ", node " + std::to_string(k) + " has " + all[k] +
                              " (name them explicitly, e.g. cpu:2, rather than auto)");
    nodes_->open_channels(replicas(), model_.flat_size());
    for (auto* ops : {ops_.get(), state_ops_.get(), stats_ops_.get()})
        if (ops) ops->join_nodes(nodes_, threads_->barrier());
}

// A replica's view of the cross-replica statistics sum: its comm stream runs the all-reduce
// between events, so compute waits only for that (CPU: the call itself is the sum).
class MirroredStrategy::ReplicaStatsSync final : public StatsSync {
public:
    ReplicaStatsSync(MirroredStrategy& st, int r) : st_(st), r_(r) {}
    float* buffer() override { return st_.replicas_[size_t(r_)]->stats.data(); }
    size_t capacity() const override { return st_.replicas_[size_t(r_)]->stats.size(); }
    void all_reduce(size_t n) override {
        Replica& R = *st_.replicas_[size_t(r_)];
        Device& d = *R.device;
        d.event_record(R.stats_ready, d.compute_stream());
        d.stream_wait_event(d.comm_stream(), R.stats_ready);
        st_.stats_ops_->all_reduce(r_, 0, n);
        d.event_record(R.stats_done, d.comm_stream());
        d.stream_wait_event(d.compute_stream(), R.stats_done);
    }

private:
    MirroredStrategy& st_;
    int r_;
};

std::unique_ptr<StatsSync> MirroredStrategy::make_stats_sync(int r) { return std::make_unique<ReplicaStatsSync>(*this, r); }

void MirroredStrategy::profile_mark(const Replica& R, Stream s, int label) {
    if (profile_ && R.index == 0) profile_->mark(*R.device, s, label);
}

Pass MirroredStrategy::make_pass(Replica& R, Stream s, int rows, int global_rows, int64_t row_offset, uint64_t seed,
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
    p.acts = &R.acts;
    p.sync = R.sync.get();
    p.vt = R.device->value_dtype();
    return p;
}

void MirroredStrategy::refresh_weights(Replica& R, Stream s) {
    if (low_precision_)
        R.device->convert(s, model_.trainable_size(), R.params.data(), DType::f32, R.weights.data(), R.device->value_dtype());
}

// The shard's inputs as the model reads them: the staged f32 rows, or converted to the activation
// type (rows from the start of the shard).
const void* MirroredStrategy::stage_for_compute(Replica& R, int buf, size_t rows) {
    if (!low_precision_) return R.inputs[buf].data();
    Device& d = *R.device;
    d.convert(d.compute_stream(), rows * size_t(model_.input_features()), R.inputs[buf].data(), DType::f32,
              R.inputs_act.data(), d.value_dtype());
    return R.inputs_act.data();
}

// GPUs: the replicas on each GPU must fit its free memory (an allocation failure later would be
// clear too, but this says why before anything is built). Host memory is the session's check.
void MirroredStrategy::check_device_memory() const {
    if (!devices_.traits().gpu) return;
    std::map<int, int> per_gpu;
    for (int o : devices_.ordinals) ++per_gpu[o];
    for (auto [ordinal, count] : per_gpu) {
        const uint64_t free = cuda_free_memory(ordinal);
        const uint64_t need = plan_.total() * uint64_t(count);
        if (free && need > free)
            throw DeviceError("cuda:" + std::to_string(ordinal) + ": " + std::to_string(count) + " replica(s) need " +
                              format_bytes(need) + " (" + plan_.describe() + " each), " + format_bytes(free) +
                              " free: use a smaller per-replica batch (train.global_batch_size), more "
                              "train.grad_accumulation_steps, or fewer replicas on this GPU");
    }
}

MirroredStrategy::~MirroredStrategy() {
    shutdown();
    destroy_graphs();
    ops_.reset();
    state_ops_.reset();
    stats_ops_.reset();
    joins_.reset();
    threads_.reset();
}

bool MirroredStrategy::shutdown() noexcept {
    if (!failed_) {
        try {
            synchronize();
        } catch (...) {
            fail();
        }
    }
    return !failed_;
}

void MirroredStrategy::fail() noexcept {
    failed_ = true;
    for (auto* ops : {ops_.get(), state_ops_.get(), stats_ops_.get()})
        if (ops) ops->abort();
    for (auto& R : replicas_)
        if (R && R->device) R->device->abandon();
}

template <typename F>
auto MirroredStrategy::guarded(F&& fn) -> decltype(fn()) {
    if (failed_) throw StrategyFailed();
    try {
        return fn();
    } catch (...) {
        fail();
        throw;
    }
}

void MirroredStrategy::wait_until(const std::function<bool()>& done) {
    for (int round = 0;; ++round) {
        if (done()) return;
        for (auto& R : replicas_) R->device->query_idle();  // throws the error of a failed device
        backoff(round);
    }
}

uint64_t MirroredStrategy::peak_memory_bytes() const {
    uint64_t peak = 0;
    for (const auto& R : replicas_) peak = std::max(peak, R->device->peak_allocated_bytes());
    return peak;
}

StepWork MirroredStrategy::host_work() const {
    HostWork all;
    for (const auto& R : replicas_) all += R->device->host_work();
    return {replicas_[0]->device->host_work(), all, threads_->barrier().arrivals() / uint64_t(replicas_.size())};
}

// The replica's parameters (unless shared and r > 0), gradients, optimizer state, activations.
void MirroredStrategy::allocate_model_state(Replica& R, const OptimizerConfig& opt, int micro_rows) {
    Device& d = *R.device;
    const size_t flat = model_.flat_size();
    const bool holds_params = !shared_ || R.index == 0;  // shared: replica 0 holds the one copy
    if (holds_params) R.params = DeviceBuffer<float>(d, flat);
    R.grads = DeviceBuffer<float>(d, flat);
    if (low_precision_ && holds_params) R.weights = DeviceBuffer<unsigned char>(d, d.act_bytes(model_.trainable_size()));
    if (holds_params) R.optimizer = make_optimizer(d, opt, model_.trainable_size());
    R.acts = model_.make_activations(d, micro_rows);
}

// The double-buffered input and label buffers and their events.
void MirroredStrategy::allocate_inputs(Replica& R, int shard_rows) {
    Device& d = *R.device;
    const size_t features = size_t(model_.input_features());
    for (int b = 0; b < 2; ++b) {
        R.inputs[b] = DeviceBuffer<float>(d, size_t(shard_rows) * features);
        R.labels[b] = DeviceBuffer<unsigned char>(d, size_t(shard_rows) * label_bytes_);
        R.input_ready[b] = d.event_create();
        R.input_free[b] = d.event_create();
    }
    if (low_precision_) R.inputs_act = DeviceBuffer<unsigned char>(d, d.act_bytes(size_t(shard_rows) * features));
}

// What a step reads and writes besides the model: metrics, gradient statistics, the loss scale,
// batch statistics (with the two events that order their exchange), checksums and their pinned
// host copies.
void MirroredStrategy::allocate_step_state(Replica& R) {
    Device& d = *R.device;
    R.train_metrics = DeviceBuffer<double>(d, kMetricSlots);
    R.eval_metrics = DeviceBuffer<double>(d, kMetricSlots);
    R.grad_stats = DeviceBuffer<float>(d, 2);
    if (shared_) R.grad_total = DeviceBuffer<float>(d, 2);
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
void MirroredStrategy::create_step_events(Replica& R) {
    Device& d = *R.device;
    R.bucket_ready = d.event_create();
    R.reduced = d.event_create();
    R.metrics_copied = d.event_create();
    for (Event* e : {&R.t_begin, &R.t_backward, &R.t_reduced, &R.t_end}) *e = d.event_create(true);
    if (cfg_.cuda_graph && devices_.traits().asynchronous) {
        for (auto& v : R.step_values) v = DeviceBuffer<StepValues>(d, 1);
        R.step_ready = d.event_create();
        R.graph_done = d.event_create();
    }
}

// Allocation order is the device calls' order, which the simulated device's fault tests count.
void MirroredStrategy::build_replica(int r, int shard_rows, int micro_rows, const OptimizerConfig& opt) {
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
        d.fill(s, model_.flat_size(), 0.0f, R->grads.data());  // alignment gaps stay zero forever
        zero_metrics(d, s, R->train_metrics.data());
        d.synchronize();
    } catch (const DeviceError& e) {
        const std::string what = e.what();
        throw DeviceError("replica " + std::to_string(r) + ": " + what +
                          (what.find("out of memory") != std::string::npos
                               ? ". Each replica holds the whole model plus activations for " +
                                     std::to_string(micro_rows) + " rows: try a smaller per-replica batch "
                                     "(train.global_batch_size) or more train.grad_accumulation_steps"
                               : ""));
    }
    replicas_.push_back(std::move(R));
}

std::string MirroredStrategy::topology_report() const {
    std::string s;
    const std::string kind = devices_.backend->name;
    for (const StagedPair& p : staged_pairs_)
        s += kind + ":" + std::to_string(p.from) + " -> " + kind + ":" + std::to_string(p.to) +
             ": staged peer copies (" + p.why + "), slower than direct peer loads\n";
    std::set<int> distinct(devices_.ordinals.begin(), devices_.ordinals.end());
    if (devices_.traits().shares_ordinals && distinct.size() < devices_.ordinals.size())
        s += "several replicas share a GPU (logical devices): they exchange data within its memory\n";
    return s;
}

HostAllocator MirroredStrategy::host_allocator() {
    if (!devices_.traits().asynchronous) return HostAllocator::aligned();
    Device* d = replicas_[0]->device.get();  // portable pinned memory serves every GPU
    return {[d](size_t bytes) { return d->alloc_host_bytes(bytes); }, [d](void* p) { d->free_host_bytes(p); }};
}

void MirroredStrategy::synchronize() {
    guarded([&] {
        wait_until([&] {
            bool idle = true;
            for (auto& R : replicas_) idle = R->device->query_idle() && idle;
            return idle;
        });
    });
}

void MirroredStrategy::init_and_broadcast() {
    guarded([&] {
        Replica& R0 = *replicas_[0];
        model_.init_params(*R0.device, R0.device->compute_stream(), R0.params.data());
        R0.device->synchronize();
        if (nodes_) {  // node 0's initial parameters, through the host: not a step, once per run
            std::vector<float> host(model_.flat_size());
            Device& d = *R0.device;
            d.copy_to_host(d.compute_stream(), host.data(), R0.params.data(), host.size() * sizeof(float));
            d.synchronize();
            nodes_->broadcast(host.data(), host.size(), "the broadcast of the initial parameters");
            d.copy_to_device(d.compute_stream(), R0.params.data(), host.data(), host.size() * sizeof(float));
            d.synchronize();
        }
        threads_->run([&](int r) {
            if (shared_ && r != 0) return;  // one copy
            Device& d = *replicas_[r]->device;
            if (r != 0)
                d.copy_from_peer(d.compute_stream(), replicas_[r]->params.data(), *R0.device, R0.params.data(),
                                 model_.flat_size() * sizeof(float));
            refresh_weights(*replicas_[r], d.compute_stream());
            d.synchronize();
        });
    });
}

const Batch& MirroredStrategy::next_batch(Loader& loader) {
    return *guarded([&] {
        const Batch* b = nullptr;
        wait_until([&] { return (b = loader.next_for(0.005)) != nullptr; });
        return b;
    });
}

int MirroredStrategy::stage_input(Replica& R, const Batch& batch, const Shard& shard, const StepValues* values) {
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
        if (devices_.traits().asynchronous) throw Error(kExitFailure, "strategy: a batch without features for a GPU replica");
        batch.owner->gather(batch, shard.begin, shard.rows, R.inputs[buf].data());
    }
    const void* labels = batch.targets ? static_cast<const void*>(batch.targets) : batch.labels;
    d.copy_to_device(cs, R.labels[buf].data(), static_cast<const char*>(labels) + size_t(shard.begin) * label_bytes_,
                     size_t(shard.rows) * label_bytes_);
    if (values) d.copy_to_device(cs, R.step_values[buf].data(), values, sizeof(StepValues));  // pageable: a snapshot
    d.event_record(R.input_ready[buf], cs);
    // The slot's Batch outlives the callback (the slot is not refilled before every replica has
    // released it), so it is the callback's only argument; the host may be steps ahead by then.
    d.host_callback(cs, [](void* p) {
        const auto* b = static_cast<const Batch*>(p);
        b->owner->release(*b);
    }, const_cast<Batch*>(&batch));
    d.stream_wait_event(d.compute_stream(), R.input_ready[buf]);
    return buf;
}

void MirroredStrategy::train_step(const Batch& batch, int64_t step, float lr, uint64_t seed, bool sample_timing) {
    guarded([&] {
        // Stays set until collect_timing() reads the events: the trainer reads a log step's
        // numbers only after it has issued the next step.
        if (sample_timing && devices_.traits().asynchronous) timing_sampled_ = true;
        // Sampled steps and a test's overflow run uncaptured: the graph holds neither.
        const bool replay =
            graphs_on_ && !sample_timing && !profile_ && inject_overflow_ < 0 && graph_step(batch, step, lr, seed);
        if (!replay) threads_->run([&](int r) { replica_step(r, batch, step, lr, seed, sample_timing); });
        inject_overflow_ = -1;
    });
    if (cfg_.verify_every_steps > 0 && (step + 1) % cfg_.verify_every_steps == 0) verify_replicas();
}
int MirroredStrategy::global_micro_rows(int global_rows, int m) const {
    int rows = 0;
    for (int g = 0; g < all_replicas(); ++g) rows += shard_of(shard_of(global_rows, all_replicas(), g).rows, accumulation_, m).rows;
    return rows;
}

void MirroredStrategy::replica_step(int r, const Batch& batch, int64_t step, float lr, uint64_t seed,
                                    bool sample_timing) {
    const StepShape shape = stage_step(r, batch, nullptr);
    replica_compute(r, shape, step, lr, seed, sample_timing && r == 0 && devices_.traits().asynchronous, nullptr);
}

// Everything read from the batch is read before staging: once every replica has released it,
// the loader refills the slot.
MirroredStrategy::StepShape MirroredStrategy::stage_step(int r, const Batch& batch, const StepValues* values) {
    StepShape shape;
    shape.global_rows = batch.global_rows;
    shape.shard = global_shard(batch, r);
    shape.buf = stage_input(*replicas_[size_t(r)], batch, local_shard(batch, shape.shard), values);
    return shape;
}

void MirroredStrategy::replica_compute(int r, const StepShape& shape, int64_t step, float lr, uint64_t seed,
                                       bool timing, const StepValues* values) {
    Replica& R = *replicas_[size_t(r)];
    Device& d = *R.device;
    const int n = all_replicas();  // in the job: gradients are summed over every node's replicas
    const double t0 = now_s();
    double comm = 0;
    const int global_rows = shape.global_rows, buf = shape.buf;
    const Shard shard = shape.shard;
    const Stream cs = d.compute_stream(), comm_s = d.comm_stream();
    if (timing) d.event_record(R.t_begin, cs);
    profile_mark(R, cs, StepProfile::kBegin);
    const char* input = static_cast<const char*>(stage_for_compute(R, buf, size_t(shard.rows)));
    const size_t row_bytes = size_t(model_.input_features()) * (low_precision_ ? d.act_bytes(1) : sizeof(float));
    const size_t trainable = model_.trainable_size(), flat = model_.flat_size();
    if (model_.has_state()) d.fill(cs, flat - trainable, 0.0f, R.grads.data() + trainable);  // this step's statistics
    profile_mark(R, cs, StepProfile::kInput);

    auto reduce = [&](const Bucket& b) {
        const double c0 = now_s();
        d.event_record(R.bucket_ready, cs);
        d.stream_wait_event(comm_s, R.bucket_ready);
        (b.begin >= trainable && state_ops_ ? *state_ops_ : *ops_).all_reduce(r, b.begin, b.end - b.begin);
        comm += now_s() - c0;
    };
    const bool overlap = cfg_.bucket_mb > 0 && n > 1 && !shared_;
    const auto on_layer_done = [&](int layer) {
        bool reduced = false;
        for (const Bucket& b : buckets_)
            if (b.ready_after_layer == layer) {
                reduce(b);
                reduced = true;
            }
        // CPU replicas reduce right here: their time is the reduction's, not the next layer's
        if (reduced) profile_mark(R, cs, StepProfile::kReduced);
    };
    const float* loss_scale = loss_scaling_ ? R.loss_scale.data() : nullptr;
    const float grad_scale = 1.0f / float(global_rows);
    for (int m = 0; m < accumulation_; ++m) {
        const Shard micro = shard_of(shard.rows, accumulation_, m);
        Pass p = make_pass(R, cs, micro.rows, global_micro_rows(global_rows, m), int64_t(shard.begin + micro.begin),
                           seed, uint32_t(step), true, values);
        p.accumulate = m > 0;
        p.stats_weight = 1.0f / float(all_replicas() * accumulation_);
        if (r == 0) p.probe = profile_;
        const void* logits = model_.forward(p, input + size_t(micro.begin) * row_bytes);
        void* dlogits = model_.dlogits_buffer(R.acts);
        loss_->apply(d, cs, micro.rows, model_.output_features(), logits,
                     R.labels[buf].data() + size_t(micro.begin) * label_bytes_, grad_scale, loss_scale, dlogits,
                     R.train_metrics.data());
        if (inject_overflow_ == r && micro.rows > 0) {  // a test's overflow: backward spreads it to every gradient
            d.fill(cs, 1, INFINITY, R.grad_stats.data());
            d.convert(cs, 1, R.grad_stats.data(), DType::f32, dlogits, d.value_dtype());
        }
        profile_mark(R, cs, StepProfile::kLoss);
        const bool last = m == accumulation_ - 1;
        model_.backward(p, dlogits, last && overlap ? std::function<void(int)>(on_layer_done) : nullptr);
    }
    if (!values) d.event_record(R.input_free[buf], cs);  // a graph's inputs are freed after its launch
    if (timing) d.event_record(R.t_backward, cs);
    if (shared_) {
        shared_update(R, step, lr, values, timing, comm);
    } else {
        if (n > 1) {
            for (const Bucket& b : buckets_)  // without overlap every bucket, else the statistics
                if (!overlap || b.ready_after_layer < 0) reduce(b);
            d.event_record(R.reduced, comm_s);
            d.stream_wait_event(cs, R.reduced);
        }
        if (timing) d.event_record(R.t_reduced, cs);
        profile_mark(R, cs, StepProfile::kReduced);
        apply_update(R, step, lr, values);
    }
    if (timing) d.event_record(R.t_end, cs);
    profile_mark(R, cs, StepProfile::kEnd);
    if (!devices_.traits().asynchronous) {  // the host's clock is the device's
        R.comm_s += comm;
        R.compute_s += now_s() - t0 - comm;
    }
}

// The update from the summed gradients, on the compute stream: gradient statistics when clipping
// or loss scaling needs them, the optimizer (skipped by an fp16 overflow), the loss scale, the
// running statistics, and the 16-bit weight copy.
void MirroredStrategy::apply_update(Replica& R, int64_t step, float lr, const StepValues* values) {
    Device& d = *R.device;
    const Stream cs = d.compute_stream();
    const float* loss_scale = loss_scaling_ ? R.loss_scale.data() : nullptr;
    const bool stats = R.optimizer->config().grad_clip_norm > 0 || loss_scaling_;
    if (stats) d.sum_squares(cs, model_.trainable_size(), R.grads.data(), loss_scale, R.grad_stats.data());
    R.optimizer->apply(cs, R.params.data(), R.grads.data(), step, lr, stats ? R.grad_stats.data() : nullptr, loss_scale,
                       loss_scaling_, values);
    if (loss_scaling_) d.loss_scale_update(cs, R.loss_scale.data(), R.grad_stats.data(), cfg_.loss_scale_growth_interval);
    for (const TensorInfo* t : state_)
        d.ema_update(cs, t->count, t->momentum, R.grads.data() + t->offset, R.params.data() + t->offset);
    refresh_weights(R, cs);
}

// ---- cuda_graph: a step from one launch -------------------------------------------------------
// Per step the host stages each replica's shard and step values (copies, events and the loader's
// release callback: a fixed number per replica), makes replica 0's compute stream wait for every
// replica's, launches the step's graph there, and makes every compute stream wait for its end.
// The graph holds every replica's forward, backward, bucketed all-reduce (the ring's cross-device
// event joins become edges) and update: no replica thread, barrier or per-bucket call on the host.
bool MirroredStrategy::graph_step(const Batch& batch, int64_t step, float lr, uint64_t seed) {
    const int buf = replicas_[0]->next_buffer;  // every replica stages into the same buffer index
    const int rows = batch.global_rows;  // read before staging: once released, the loader refills the batch
    const std::pair<int, int> key{buf, rows};
    auto found = std::find_if(graphs_.begin(), graphs_.end(), [&](const StepGraph& g) { return g.buf == buf && g.global_rows == rows; });
    if (found == graphs_.end()) {
        if (std::find(graph_warm_.begin(), graph_warm_.end(), key) == graph_warm_.end()) {
            if (graph_warm_.size() < 2 * kMaxGraphs) graph_warm_.push_back(key);
            return false;  // a shape's first step runs uncaptured: libraries initialise outside the capture
        }
        if (graphs_.size() >= kMaxGraphs) return false;
    }
    Replica& R0 = *replicas_[0];
    Device& d0 = *R0.device;
    const Stream cs0 = d0.compute_stream();
    // Every optimizer has the same configuration: one step's values serve every replica.
    const StepValues values = R0.optimizer->step_values(step, lr);
    std::vector<StepShape>& shapes = graph_shapes_;  // sized once: nothing is allocated per step
    shapes.resize(replicas_.size());
    for (int r = 0; r < replicas(); ++r) {
        shapes[size_t(r)] = stage_step(r, batch, &values);
        if (r > 0) {  // the launch follows replica r's earlier work (staging, metrics) too
            Device& d = *replicas_[size_t(r)]->device;
            d.event_record(replicas_[size_t(r)]->step_ready, d.compute_stream());
            d0.stream_wait_event(cs0, replicas_[size_t(r)]->step_ready);
        }
    }
    if (found == graphs_.end()) {
        try {
            graphs_.push_back({buf, rows, capture_step(shapes, step, lr, seed)});
        } catch (const DeviceError& e) {  // the path that has not run on every GPU: say how to avoid it
            throw DeviceError(std::string("strategy.cuda_graph: capturing step ") + std::to_string(step) + " failed: " +
                              e.what() + "; rerun with --set strategy.cuda_graph=false to resume without graphs");
        }
        found = graphs_.end() - 1;
    }
    d0.graph_launch(found->graph, cs0);
    d0.event_record(R0.graph_done, cs0);
    for (int r = 0; r < replicas(); ++r) {
        Replica& R = *replicas_[size_t(r)];
        Device& d = *R.device;
        if (r > 0) d.stream_wait_event(d.compute_stream(), R0.graph_done);
        d.event_record(R.input_free[shapes[size_t(r)].buf], d.compute_stream());
    }
    return true;
}

// One capture on replica 0's compute stream: the other replicas' compute streams join it by the
// fork event, their comm streams by the bucket events, and all join back before it ends. The
// replica threads issue the work as in an uncaptured step (their barriers order the capture,
// not the replays).
Graph MirroredStrategy::capture_step(const std::vector<StepShape>& shapes, int64_t step, float lr, uint64_t seed) {
    Device& d0 = *replicas_[0]->device;
    const Stream cs0 = d0.compute_stream();
    d0.capture_begin(cs0);
    d0.event_record(graph_fork_, cs0);
    for (int r = 1; r < replicas(); ++r) {
        Device& d = *replicas_[size_t(r)]->device;
        d.stream_wait_event(d.compute_stream(), graph_fork_);
    }
    threads_->run([&](int r) {
        Replica& R = *replicas_[size_t(r)];
        const StepShape& shape = shapes[size_t(r)];
        replica_compute(r, shape, step, lr, seed, false, R.step_values[size_t(shape.buf)].data());
    });
    for (int r = 1; r < replicas(); ++r) {  // graph_done of the others: their part's end
        Replica& R = *replicas_[size_t(r)];
        R.device->event_record(R.graph_done, R.device->compute_stream());
        d0.stream_wait_event(cs0, R.graph_done);
    }
    return d0.capture_end(cs0);
}

void MirroredStrategy::destroy_graphs() noexcept {
    if (replicas_.empty()) return;
    Device& d0 = *replicas_[0]->device;
    for (const StepGraph& g : graphs_) d0.graph_destroy(g.graph);
    graphs_.clear();
    if (graph_fork_.handle) d0.event_destroy(graph_fork_);
    graph_fork_ = {};
}

// Replica r's slice of the flat buffer: equal parts in whole 64-byte lines (no two replicas write
// one cache line); trailing slices may be empty.
Shard MirroredStrategy::slice(int r) const {
    constexpr size_t kLine = 16;  // floats
    const size_t flat = model_.flat_size(), n = size_t(replicas());
    const size_t size = ((flat + n - 1) / n + kLine - 1) / kLine * kLine;
    const size_t begin = std::min(flat, size * size_t(r)), end = std::min(flat, begin + size);
    return {int(begin), int(end - begin)};
}

// Shared parameters (CPU replicas): every replica's gradients are complete -> replica r sums its
// slice over all replicas (in replica order, into its own buffer: the others read only their own
// slices) and, in a multi-node run, over the nodes -> the gradient statistics, per slice, added in
// replica order -> the optimizer, the running statistics and the 16-bit copy on r's slice of the
// one parameter copy -> nobody computes with the parameters before every slice is updated. With
// no statistics and one node the optimizer sums the trainable part itself, as it reads it.
void MirroredStrategy::shared_update(Replica& R, int64_t step, float lr, const StepValues* values, bool timing,
                                     double& comm) {
    Device& d = *R.device;
    const Stream cs = d.compute_stream();
    Replica& H = *replicas_[0];
    const Shard sl = slice(R.index);
    const size_t begin = size_t(sl.begin), end = begin + size_t(sl.rows), trainable = model_.trainable_size();
    const size_t tb = std::min(begin, trainable), te = std::min(end, trainable);  // the trainable part
    const float* loss_scale = loss_scaling_ ? R.loss_scale.data() : nullptr;
    const bool stats = H.optimizer->config().grad_clip_norm > 0 || loss_scaling_;
    // Without statistics or other nodes nothing needs the trainable sum before the update: the
    // update sums as it goes (apply_summed_range), and only the running statistics are summed here.
    const bool sum_in_update = !stats && !nodes_;
    const size_t sum_from = sum_in_update ? std::max(begin, trainable) : begin;
    const double c0 = now_s();
    join_replicas(R);
    if (end > sum_from) {
        d.sum_into(cs, grad_ptrs_.data(), replicas(), R.index, sum_from, end - sum_from);
        if (nodes_) nodes_->sum_channel(R.index, R.grads.data() + begin, end - begin);
    }
    comm += now_s() - c0;
    if (stats) {
        d.sum_squares(cs, te - tb, R.grads.data() + tb, loss_scale, R.grad_stats.data());
        join_replicas(R);
        d.copy_from_peer(cs, R.grad_total.data(), *H.device, H.grad_stats.data(), 2 * sizeof(float));
        for (int q = 1; q < replicas(); ++q)
            d.reduce_from_peer(cs, R.grad_total.data(), *replicas_[q]->device, replicas_[q]->grad_stats.data(), DType::f32, 2);
    }
    if (timing) d.event_record(R.t_reduced, cs);  // the sums are this path's communication
    profile_mark(R, cs, StepProfile::kReduced);
    if (te > tb && sum_in_update)
        H.optimizer->apply_summed_range(d, cs, H.params.data(), grad_ptrs_.data(), replicas(), R.index, tb, te, step, lr,
                                        values);
    else if (te > tb)
        H.optimizer->apply_range(d, cs, H.params.data(), R.grads.data(), tb, te, step, lr,
                                 stats ? R.grad_total.data() : nullptr, loss_scale, loss_scaling_, values);
    if (loss_scaling_) d.loss_scale_update(cs, R.loss_scale.data(), R.grad_total.data(), cfg_.loss_scale_growth_interval);
    for (const TensorInfo* t : state_) {  // running statistics: the part of each in this slice
        const size_t lo = std::max(begin, t->offset), hi = std::min(end, t->offset + t->count);
        if (hi > lo) d.ema_update(cs, hi - lo, t->momentum, R.grads.data() + lo, H.params.data() + lo);
    }
    if (low_precision_ && te > tb)
        d.convert(cs, te - tb, H.params.data() + tb, DType::f32, H.weights.data() + d.act_bytes(tb), d.value_dtype());
    join_replicas(R);
}

void MirroredStrategy::collect_timing(TimeSplit& split, int64_t steps) {
    Replica& R = *replicas_[0];
    if (!devices_.traits().asynchronous) {
        split.compute_s += R.compute_s;
        split.comm_s += R.comm_s;
        R.compute_s = R.comm_s = 0;
        return;
    }
    if (!timing_sampled_ || steps <= 0) return;
    Device& d = *R.device;
    guarded([&] { wait_until([&] { return d.event_query(R.t_end); }); });
    const double backward = d.event_elapsed_ms(R.t_begin, R.t_backward) * 1e-3;
    const double exposed = d.event_elapsed_ms(R.t_backward, R.t_reduced) * 1e-3;
    const double update = d.event_elapsed_ms(R.t_reduced, R.t_end) * 1e-3;
    split.compute_s += (backward + update) * double(steps);
    split.comm_s += exposed * double(steps);
    split.device_step_s = backward + exposed + update;
    timing_sampled_ = false;
}

void MirroredStrategy::request_train_metrics() {
    guarded([&] {
        for (auto& Rp : replicas_) {
            Replica& R = *Rp;
            Device& d = *R.device;
            const Stream s = d.compute_stream();
            d.copy_to_host(s, R.metrics_host.data(), R.train_metrics.data(), kMetricSlots * sizeof(double));
            if (loss_scaling_) d.copy_to_host(s, R.loss_scale_host.data(), R.loss_scale.data(), 2 * sizeof(float));
            d.event_record(R.metrics_copied, s);
            zero_metrics(d, s, R.train_metrics.data());
        }
    });
}

bool MirroredStrategy::train_metrics_ready() {
    return guarded([&] {
        for (auto& R : replicas_)
            if (!R->device->event_query(R->metrics_copied)) return false;
        return true;
    });
}

Metrics MirroredStrategy::take_train_metrics() {
    guarded([&] { wait_until([&] { return train_metrics_ready(); }); });
    Metrics m;
    for (auto& R : replicas_) m.add(R->metrics_host.data());
    sum_over_nodes(m, nodes_, "the sum of the training metrics");
    return m;
}

float MirroredStrategy::loss_scale() const { return loss_scaling_ ? replicas_[0]->loss_scale_host[0] : 1.0f; }

std::array<float, 2> MirroredStrategy::loss_scale_state() {
    if (!loss_scaling_) return {1.0f, 0.0f};
    synchronize();
    return guarded([&] {
        Replica& R = *replicas_[0];
        std::array<float, 2> s{};
        R.device->copy_to_host(R.device->compute_stream(), s.data(), R.loss_scale.data(), sizeof s);
        return s;
    });
}

void MirroredStrategy::restore_loss_scale(const std::array<float, 2>& state) {
    if (!loss_scaling_) return;
    guarded([&] {
        for (auto& R : replicas_) {
            Device& d = *R->device;
            d.copy_to_device(d.compute_stream(), R->loss_scale.data(), state.data(), sizeof state);
            d.synchronize();
            R->loss_scale_host[0] = state[0];
        }
    });
}

std::vector<std::array<double, 3>> MirroredStrategy::peek_train_metrics() {
    synchronize();
    return guarded([&] {
        std::vector<std::array<double, 3>> out;
        for (auto& R : replicas_) {
            Device& d = *R->device;
            d.copy_to_host(d.compute_stream(), R->metrics_host.data(), R->train_metrics.data(), kMetricSlots * sizeof(double));
            d.stream_synchronize(d.compute_stream());
            out.push_back({R->metrics_host[kMetricLossSum], R->metrics_host[kMetricCorrect], R->metrics_host[kMetricCount]});
        }
        if (!nodes_) return out;
        std::vector<uint64_t> bits;  // doubles travel as their bits: nothing is added
        for (const auto& a : out)
            for (double x : a) bits.push_back(std::bit_cast<uint64_t>(x));
        const std::vector<uint64_t> all = nodes_->all_gather(bits, "the exchange of the metric accumulators");
        std::vector<std::array<double, 3>> job(all.size() / 3);
        for (size_t i = 0; i < all.size(); ++i) job[i / 3][i % 3] = std::bit_cast<double>(all[i]);
        return job;
    });
}

void MirroredStrategy::restore_train_metrics(const std::vector<std::array<double, 3>>& m) {
    std::vector<std::array<double, 3>> per(replicas(), {0, 0, 0});
    if (int(m.size()) == all_replicas())
        std::copy(m.begin() + first_replica(), m.begin() + first_replica() + replicas(), per.begin());
    else if (node_rank() == 0)
        for (const auto& x : m)
            for (int k = 0; k < 3; ++k) per[0][k] += x[k];
    guarded([&] {
        for (int r = 0; r < replicas(); ++r) {
            Device& d = *replicas_[r]->device;
            const double v[kMetricSlots] = {per[r][0], per[r][1], per[r][2], 0.0};
            std::memcpy(replicas_[r]->metrics_host.data(), v, sizeof v);
            d.copy_to_device(d.compute_stream(), replicas_[r]->train_metrics.data(), replicas_[r]->metrics_host.data(), sizeof v);
            d.stream_synchronize(d.compute_stream());
        }
    });
}

Metrics MirroredStrategy::evaluate(Loader& loader) {
    Metrics m;
    guarded([&] {
        for (auto& R : replicas_) zero_metrics(*R->device, R->device->compute_stream(), R->eval_metrics.data());
        loader.start({0, 0});
        for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
            const Batch& batch = next_batch(loader);
            threads_->run([&](int r) {
                Replica& R = *replicas_[r];
                Device& d = *R.device;
                const Shard shard = global_shard(batch, r);
                const int buf = stage_input(R, batch, local_shard(batch, shard));
                const char* input = static_cast<const char*>(stage_for_compute(R, buf, size_t(shard.rows)));
                const size_t row_bytes = size_t(model_.input_features()) * (low_precision_ ? d.act_bytes(1) : sizeof(float));
                for (int mi = 0; mi < accumulation_; ++mi) {
                    const Shard micro = shard_of(shard.rows, accumulation_, mi);
                    Pass p = make_pass(R, d.compute_stream(), micro.rows, 0, 0, 0, 0, false);
                    const void* logits = model_.forward(p, input + size_t(micro.begin) * row_bytes);
                    loss_->apply(d, d.compute_stream(), micro.rows, model_.output_features(), logits,
                                 R.labels[buf].data() + size_t(micro.begin) * label_bytes_, 0.0f, nullptr, nullptr,
                                 R.eval_metrics.data());
                }
                d.event_record(R.input_free[buf], d.compute_stream());
            });
        }
        synchronize();
        loader.stop();  // waits for every release callback
        for (auto& R : replicas_) {
            Device& d = *R->device;
            d.copy_to_host(d.compute_stream(), R->eval_host.data(), R->eval_metrics.data(), kMetricSlots * sizeof(double));
            d.stream_synchronize(d.compute_stream());
            m.add(R->eval_host.data());
        }
    });
    sum_over_nodes(m, nodes_, "the sum of the evaluation metrics");
    return m;
}

std::vector<float> MirroredStrategy::predict(const float* x, size_t rows) {
    synchronize();
    return guarded([&] {
        Replica& R = *replicas_[0];
        Device& d = *R.device;
        const size_t features = size_t(model_.input_features()), classes = size_t(model_.output_features());
        const size_t chunk = std::min<size_t>(size_t(R.acts.max_rows()), R.inputs[0].size() / std::max<size_t>(features, 1));
        std::vector<float> out(rows * classes), logits32(chunk * classes);
        DeviceBuffer<float> staged(d, chunk * classes);
        for (size_t done = 0; done < rows; done += chunk) {
            const int n = int(std::min(chunk, rows - done));
            d.copy_to_device(d.compute_stream(), R.inputs[0].data(), x + done * features, size_t(n) * features * sizeof(float));
            const void* input = stage_for_compute(R, 0, size_t(n));
            Pass p = make_pass(R, d.compute_stream(), n, n, 0, 0, 0, false);
            const void* logits = model_.forward(p, input);
            d.convert(d.compute_stream(), size_t(n) * classes, logits, d.value_dtype(), staged.data(), DType::f32);
            d.copy_to_host(d.compute_stream(), out.data() + done * classes, staged.data(), size_t(n) * classes * sizeof(float));
            d.synchronize();
        }
        return out;
    });
}

uint64_t MirroredStrategy::checksum(int r) {
    synchronize();
    return guarded([&] {
        Replica& R = *replicas_[r];
        Device& d = *R.device;
        const size_t last = model_.tensors().size();
        d.checksum(d.compute_stream(), model_.flat_size(), holder(R).params.data(), R.checksums.data() + last);
        d.copy_to_host(d.compute_stream(), R.checksums_host.data() + last, R.checksums.data() + last, sizeof(uint64_t));
        d.stream_synchronize(d.compute_stream());
        return R.checksums_host[last];
    });
}

std::vector<uint64_t> MirroredStrategy::all_checksums() {
    std::vector<uint64_t> mine;
    for (int r = 0; r < replicas(); ++r) mine.push_back(checksum(r));
    return nodes_ ? nodes_->all_gather(mine, "the exchange of the replicas' checksums") : mine;
}

void MirroredStrategy::verify_replicas() {
    const auto& tensors = model_.tensors();
    synchronize();
    guarded([&] {
        for (auto& Rp : replicas_) {
            Device& d = *Rp->device;
            for (size_t t = 0; t < tensors.size(); ++t)
                d.checksum(d.compute_stream(), tensors[t].count, holder(*Rp).params.data() + tensors[t].offset,
                           Rp->checksums.data() + t);
            d.copy_to_host(d.compute_stream(), Rp->checksums_host.data(), Rp->checksums.data(),
                           tensors.size() * sizeof(uint64_t));
        }
        for (auto& Rp : replicas_) Rp->device->stream_synchronize(Rp->device->compute_stream());
    });
    for (size_t t = 0; t < tensors.size(); ++t)
        for (int r = 1; r < replicas(); ++r)
            if (replicas_[r]->checksums_host[t] != replicas_[0]->checksums_host[t])
                throw DeviceError("replicas diverged: " + tensors[t].name + " on replica " + std::to_string(r) + " (" +
                                  replicas_[r]->device->name() + ") differs from replica 0 (" +
                                  replicas_[0]->device->name() + ")");
    if (!nodes_) return;
    std::vector<uint64_t> mine(replicas_[0]->checksums_host.data(), replicas_[0]->checksums_host.data() + tensors.size());
    const std::vector<uint64_t> all = nodes_->all_gather(mine, "the replica verification");
    for (int k = 1; k < node_count(); ++k)
        for (size_t t = 0; t < tensors.size(); ++t)
            if (all[size_t(k) * tensors.size() + t] != all[t])
                throw DeviceError("replicas diverged: " + tensors[t].name + " on node " + std::to_string(k) +
                                  " differs from node 0");
}

std::vector<float> MirroredStrategy::download_params() {
    synchronize();
    return guarded([&] {
        Replica& R = *replicas_[0];
        std::vector<float> h(model_.flat_size());
        R.device->copy_to_host(R.device->compute_stream(), h.data(), R.params.data(), h.size() * sizeof(float));
        R.device->stream_synchronize(R.device->compute_stream());
        return h;
    });
}

std::vector<std::pair<std::string, std::vector<float>>> MirroredStrategy::download_optimizer_state() {
    synchronize();
    return guarded([&] {
        Replica& R = *replicas_[0];
        std::vector<std::pair<std::string, std::vector<float>>> out;
        for (auto& [name, buf] : R.optimizer->state()) {
            std::vector<float> h(buf->size());
            R.device->copy_to_host(R.device->compute_stream(), h.data(), buf->data(), buf->bytes());
            out.emplace_back(name, std::move(h));
        }
        R.device->stream_synchronize(R.device->compute_stream());
        return out;
    });
}

void MirroredStrategy::upload_state(const std::vector<float>& params,
                                    const std::vector<std::pair<std::string, std::vector<float>>>& state) {
    // Everything is checked before anything is copied.
    if (params.size() != replicas_[0]->params.size()) throw CheckpointError("checkpoint parameters do not fit the model");
    auto mine = replicas_[0]->optimizer->state();
    if (mine.size() != state.size()) throw CheckpointError("checkpoint optimizer state does not fit the optimizer");
    for (size_t i = 0; i < mine.size(); ++i)
        if (mine[i].first != state[i].first || mine[i].second->size() != state[i].second.size())
            throw CheckpointError("checkpoint optimizer state '" + state[i].first + "' does not fit the optimizer");
    guarded([&] {
        for (auto& Rp : replicas_) {
            if (&holder(*Rp) != Rp.get()) continue;  // shared parameters: one copy
            Device& d = *Rp->device;
            d.copy_to_device(d.compute_stream(), Rp->params.data(), params.data(), params.size() * sizeof(float));
            auto own = Rp->optimizer->state();
            for (size_t i = 0; i < own.size(); ++i)
                d.copy_to_device(d.compute_stream(), own[i].second->data(), state[i].second.data(),
                                 state[i].second.size() * sizeof(float));
            refresh_weights(*Rp, d.compute_stream());
            d.synchronize();
        }
    });
}

}  // namespace mirrored
