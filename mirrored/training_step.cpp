#include "kernels/ops/batchnorm.h"
#include "kernels/ops/optimizer.h"
#include "kernels/ops/flat.h"
#include "mirrored/training_step.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "mirrored/util.h"
#include "kernels/ops/elementwise.h"
#include "kernels/ops/peer_sums.h"

namespace mirrored {

namespace {

// The comm stream's next work waits for the compute stream's work so far (through `ev`)...
void comm_waits_for_compute(Device& d, Event ev) {
    d.event_record(ev, d.compute_stream());
    d.stream_wait_event(d.comm_stream(), ev);
}
// ...and the compute stream's next work for the comm stream's (through `ev`).
void compute_waits_for_comm(Device& d, Event ev) {
    d.event_record(ev, d.comm_stream());
    d.stream_wait_event(d.compute_stream(), ev);
}

}  // namespace

// A replica's view of the cross-replica statistics sum: its comm stream runs the all-reduce
// between events, so compute waits only for that (CPU: the call itself is the sum).
class TrainingStep::ReplicaStatsSync final : public StatsSync {
public:
    ReplicaStatsSync(TrainingStep& st, int r) : st_(st), r_(r) {}
    float* buffer() override { return st_.set_.replica(r_).stats.data(); }
    size_t capacity() const override { return st_.set_.replica(r_).stats.size(); }
    void all_reduce(size_t n) override {
        Replica& R = st_.set_.replica(r_);
        Device& d = *R.device;
        comm_waits_for_compute(d, R.stats_ready);
        st_.stats_ops_->all_reduce(r_, 0, n);
        compute_waits_for_comm(d, R.stats_done);
    }

private:
    TrainingStep& st_;
    int r_;
};

TrainingStep::TrainingStep(ReplicaSet& set, const LossConfig& loss)
    : set_(set), model_(set.model()), loss_(make_loss(loss)) {
    const std::vector<Device*> devs = set_.device_list();
    buckets_ = set_.buckets();
    for (int r = 0; r < set_.replicas(); ++r) all_indices_.push_back(r);
    if (set_.shared()) joins_ = std::make_unique<ReplicaSync>(devs, set_.threads().barrier(), ReplicaSync::On::compute);
    // Shared parameters: the gradients need no op (each replica sums its slice where it lies);
    // the statistics of synchronised batchnorm still do.
    if (!set_.shared()) make_gradient_ops(devs);
    if (model_.stats_floats() > 0) make_stats_ops(devs);
    for (const auto& t : model_.tensors())
        if (!t.trainable && !t.frozen) state_.push_back(&t);
    if (set_.staged()) find_own_chunks();
    set_.on_failure([this] { abort_ops(); });
    join_nodes();
    choose_graphs();
}

TrainingStep::~TrainingStep() {
    set_.forget_failure_hooks();
    destroy_graphs();
    ops_.reset();
    param_ops_.reset();
    grad_stats_ops_.reset();
    state_ops_.reset();
    stats_ops_.reset();
    joins_.reset();
}

void TrainingStep::abort_ops() noexcept {
    for (auto* ops : {ops_.get(), state_ops_.get(), stats_ops_.get(), param_ops_.get(), grad_stats_ops_.get()})
        if (ops) ops->abort();
}

void TrainingStep::make_gradient_ops(const std::vector<Device*>& devs) {
    const bool exact = set_.config().allreduce_dtype ==
                       DType::f32;  // else the state region (running statistics) needs its own f32 ops
    const size_t ops_elements = exact ? set_.grad_elements() : model_.trainable_size();
    if (set_.config().cross_device_ops == "auto") {
        std::vector<std::pair<size_t, size_t>> ranges;
        for (const Bucket& b : buckets_)
            if (set_.grad_index(b.begin) + (b.end - b.begin) <= ops_elements)
                ranges.emplace_back(set_.grad_index(b.begin), b.end - b.begin);
        // Multi-node: node 0 chooses for every node (the same op sums in the same order as on one node).
        OpsChoice choice;
        if (!set_.nodes() || set_.nodes()->leader())
            choice = choose_cross_device_ops(devs, set_.grad_ptrs(), ops_elements, ranges, set_.threads(),
                                             set_.config().allreduce_dtype, set_.config().resume_cross_device_ops,
                                             set_.sharded());
        if (set_.nodes()) {
            choice.name = set_.nodes()->broadcast(choice.name, "the choice of the cross-device op");
            if (!set_.nodes()->leader()) choice.how = "node 0's choice";
        }
        set_.config().cross_device_ops = choice.name;
        ops_choice_ = "auto, " + choice.how;
    }
    ops_ = make_cross_device_ops(set_.config().cross_device_ops, devs, set_.grad_ptrs(), ops_elements,
                                 set_.threads().barrier(), set_.config().allreduce_dtype);
    if (set_.sharded()) {
        std::vector<float*> params, stats;
        for (int r = 0; r < set_.replicas(); ++r) {
            params.push_back(set_.replica(r).params.data());
            stats.push_back(set_.replica(r).grad_stats.data());
        }
        const std::string& op = set_.config().cross_device_ops;
        if (const std::string why = shard_refusal(op); !why.empty())
            throw ConfigError("strategy.shard", std::string(set_.staged() ? "gradients " : "optimizer ") + why);
        param_ops_ = make_cross_device_ops(op, devs, params, model_.trainable_size(), set_.threads().barrier());
        grad_stats_ops_ = make_cross_device_ops(op, devs, stats, 2, set_.threads().barrier());
    }
    if (model_.has_state() && !exact)
        state_ops_ = make_cross_device_ops(set_.config().cross_device_ops, devs, set_.grad_ptrs(), model_.grad_size(),
                                           set_.threads().barrier());
}

// Synchronised batch normalisation sums over its own buffers.
void TrainingStep::make_stats_ops(const std::vector<Device*>& devs) {
    std::vector<float*> stats;
    for (int r = 0; r < set_.replicas(); ++r) stats.push_back(set_.replica(r).stats.data());
    stats_ops_ = make_cross_device_ops(set_.shared() ? "ring" : set_.config().cross_device_ops, devs, stats,
                                       model_.stats_floats(), set_.threads().barrier());
    for (int r = 0; r < set_.replicas(); ++r) set_.replica(r).sync = std::make_unique<ReplicaStatsSync>(*this, r);
}

// Multi-node: every node must drive as many replicas of the same kind (the job's replica index
// and the shards follow from it); then every cross-device op becomes hierarchical.
void TrainingStep::join_nodes() {
    if (!set_.nodes()) return;
    const std::string mine = std::to_string(set_.replicas()) + " " + set_.devices().backend->name + " replica(s)";
    const auto all = set_.nodes()->all_gather(mine, "the start-up exchange of replica counts");
    for (size_t k = 0; k < all.size(); ++k)
        if (all[k] != all[0])
            throw ConfigError("strategy.devices", "every node must drive the same replicas: node 0 has " + all[0] +
                                                      ", node " + std::to_string(k) + " has " + all[k] +
                                                      " (name them explicitly, e.g. cpu:2, rather than auto)");
    set_.nodes()->open_channels(set_.replicas(), model_.grad_size());
    // strategy.shard's ops stay within the node: replica r of every node owns the same chunks,
    // summed over the nodes already - the node's replicas together cover every chunk once
    for (auto* ops : {ops_.get(), state_ops_.get(), stats_ops_.get()})
        if (ops) ops->join_nodes(set_.nodes(), set_.threads().barrier());
}

void TrainingStep::profile_mark(const Replica& R, Stream s, int label) {
    if (profile_ && R.index == 0) profile_->mark(*R.device, s, label);
}

void TrainingStep::train_step(const Batch& batch, int64_t step, float lr, uint64_t seed, bool sample_timing) {
    set_.guarded([&] {
        // Stays set until collect_timing() reads the events: the trainer reads a log step's
        // numbers only after it has issued the next step.
        if (sample_timing && set_.traits().asynchronous) timing_sampled_ = true;
        // Sampled steps and a test's overflow run uncaptured: the graph holds neither.
        const bool replay = graphs_on_ && !sample_timing && !profile_ && inject_overflow_ < 0 && inject_fault_ < 0 &&
                            graph_step(batch, step, lr, seed);
        const int fault = std::exchange(inject_fault_, -1);
        if (!replay)
            set_.threads().run([&](int r) {
                if (r == fault) {
                    const std::string name = set_.replica(r).device->name();
                    throw DeviceError(name + ": a fault injected in step " + std::to_string(step + 1) +
                                          " (MIRRORED_TEST_REPLICA_FAULT)",
                                      name);
                }
                replica_step(r, batch, step, lr, seed, sample_timing);
            });
        inject_overflow_ = -1;
    });
}

void TrainingStep::replica_step(int r, const Batch& batch, int64_t step, float lr, uint64_t seed, bool sample_timing) {
    const StepShape shape = stage_step(r, batch, nullptr);
    replica_compute(r, shape, step, lr, seed, sample_timing && r == 0 && set_.traits().asynchronous, nullptr);
    // CPU replicas ran the step's kernels on this thread
    if (!set_.traits().asynchronous) {
        Replica& R = set_.replica(r);
        R.scratch_bytes = cpu_thread_scratch_bytes() - R.scratch_base;
    }
}

// Everything read from the batch is read before staging: once every replica has released it,
// the loader refills the slot.
TrainingStep::StepShape TrainingStep::stage_step(int r, const Batch& batch, const StepValues* values) {
    StepShape shape;
    shape.global_rows = batch.global_rows;
    shape.shard = set_.global_shard(batch, r);
    shape.buf = set_.stage_input(set_.replica(r), batch, ReplicaSet::local_shard(batch, shape.shard), values);
    return shape;
}

void TrainingStep::replica_compute(int r, const StepShape& shape, int64_t step, float lr, uint64_t seed, bool timing,
                                   const StepValues* values) {
    Replica& R = set_.replica(r);
    Device& d = *R.device;
    const int n = set_.all_replicas();  // in the job: gradients are summed over every node's replicas
    const double t0 = now_s();
    double comm = 0;
    const int global_rows = shape.global_rows, buf = shape.buf;
    const Shard shard = shape.shard;
    const Stream cs = d.compute_stream();
    if (timing) d.event_record(R.t_begin, cs);
    profile_mark(R, cs, LayerProbe::kBegin);
    const char* input = static_cast<const char*>(set_.stage_for_compute(R, buf, size_t(shard.rows)));
    const size_t row_bytes = set_.input_row_bytes(R);
    const size_t trainable = model_.trainable_size(), flat = model_.grad_size();
    if (model_.has_state())
        fill_floats(d, cs, flat - trainable, 0.0f, set_.grad_at(R, trainable));  // this step's statistics
    profile_mark(R, cs, LayerProbe::kInput);

    // strategy.shard: gradients - every micro-batch reduce-scatters every bucket from its slot
    // and adds the own chunk into the replica's store; a slot used before in this step is taken
    // again once its last bucket's chunk is out (GradientStaging).
    const bool staged = set_.staged();
    const GradientStaging& staging = set_.staging();
    std::fill(R.slot_used.begin(), R.slot_used.end(), 0);
    int micro_batch = 0;
    auto reduce = [&](size_t k) {
        const Bucket& b = buckets_[k];
        const double c0 = now_s();
        comm_waits_for_compute(d, R.bucket_ready);
        const size_t at = set_.grad_index(b.begin), count = b.end - b.begin;
        if (set_.sharded() && b.begin < trainable) {  // each replica sums only its own chunk
            ops_->reduce_scatter(r, at, count);
            if (staged) keep_own_chunk(R, k, micro_batch > 0);
        } else {
            (b.begin >= trainable && state_ops_ ? *state_ops_ : *ops_).all_reduce(r, at, count);
        }
        comm += now_s() - c0;
    };
    const auto take_slots = [&](int after_unit) {
        for (size_t k = 0; k < buckets_.size(); ++k) {
            const int s = staging.slot_of[k];
            if (s < 0 || staging.claim_after[k] != after_unit) continue;
            if (R.slot_used[size_t(s)]) d.stream_wait_event(cs, R.slot_free[size_t(s)]);
            R.slot_used[size_t(s)] = 1;
            for (const auto& [at, count] : staging.gaps[k]) fill_floats(d, cs, count, 0.0f, R.grads.data() + at);
        }
    };
    const bool overlap = (set_.config().bucket_mb > 0 || staged) && n > 1 && !set_.shared();
    const int top_layers = int(model_.layers().size());
    const auto on_unit_done = [&](int unit) {
        bool reduced = false;
        for (size_t k = 0; k < buckets_.size(); ++k)
            if (buckets_[k].ready_after_unit == unit) {
                // CPU replicas reduce right here: the time so far is the layer's backward, the
                // reduction's is its own, not the next layer's
                if (!reduced) profile_mark(R, cs, top_layers + model_.unit_layer(unit));
                reduce(k);
                reduced = true;
            }
        if (staged) take_slots(unit);
        if (reduced) profile_mark(R, cs, LayerProbe::kReduced);
    };
    const float* loss_scale = set_.loss_scaling() ? R.loss_scale.data() : nullptr;
    // the mean over every sample and, in a sequence model, every position
    const int positions = model_.output_positions();
    const float grad_scale = 1.0f / (float(global_rows) * float(positions));
    for (int m = 0; m < set_.accumulation(); ++m) {
        micro_batch = m;
        const Shard micro = shard_of(shard.rows, set_.accumulation(), m);
        Pass p = set_.make_pass(R, cs, micro.rows, set_.global_micro_rows(global_rows, m),
                                int64_t(shard.begin + micro.begin), seed, uint32_t(step), true, values);
        p.accumulate = m > 0 && !staged;  // staged: each micro-batch's sums add into the own store
        p.stats_weight = 1.0f / float(set_.all_replicas() * set_.accumulation());
        if (r == 0) p.probe = profile_;
        const void* logits = model_.forward(p, input + size_t(micro.begin) * row_bytes);
        void* dlogits = model_.dlogits_buffer(R.acts);
        loss_->apply(d, cs, micro.rows * positions, model_.output_classes(), logits,
                     set_.labels_at(R, buf, micro.begin), grad_scale, loss_scale, dlogits, R.train_metrics.data());
        if (inject_overflow_ == r && micro.rows > 0) {  // a test's overflow: backward spreads it to every gradient
            fill_floats(d, cs, 1, INFINITY, R.grad_stats.data());
            convert_values(d, cs, 1, R.grad_stats.data(), DType::f32, dlogits, d.value_dtype());
        }
        profile_mark(R, cs, LayerProbe::kLoss);
        const bool last = m == set_.accumulation() - 1;
        if (staged) take_slots(-1);
        model_.backward(p, dlogits, (last || staged) && overlap ? std::function<void(int)>(on_unit_done) : nullptr);
    }
    if (!values) set_.inputs_consumed(R, buf, cs);  // a graph's inputs are freed after its launch
    if (timing) d.event_record(R.t_backward, cs);
    if (set_.shared()) {
        shared_update(R, step, lr, values, timing, comm);
    } else {
        if (n > 1) {
            for (size_t k = 0; k < buckets_.size(); ++k)  // without overlap every bucket, else the statistics
                if (!overlap || buckets_[k].ready_after_unit < 0) reduce(k);
            compute_waits_for_comm(d, R.reduced);
        }
        if (timing) d.event_record(R.t_reduced, cs);
        profile_mark(R, cs, LayerProbe::kReduced);
        if (set_.sharded()) sharded_update(R, step, lr, values, timing, comm);
        else apply_update(R, step, lr, values);
    }
    if (timing) d.event_record(R.t_end, cs);
    profile_mark(R, cs, LayerProbe::kEnd);
    if (!set_.traits().asynchronous) {  // the host's clock is the device's
        R.comm_s += comm;
        R.compute_s += now_s() - t0 - comm;
    }
}

// The update from the summed gradients, on the compute stream: gradient statistics when clipping
// or loss scaling needs them, the optimizer (skipped by an fp16 overflow), the loss scale, the
// running statistics, and the 16-bit weight copy.
void TrainingStep::apply_update(Replica& R, int64_t step, float lr, const StepValues* values) {
    Device& d = *R.device;
    const Stream cs = d.compute_stream();
    const float* loss_scale = set_.loss_scaling() ? R.loss_scale.data() : nullptr;
    const bool stats = R.optimizer->config().grad_clip_norm > 0 || set_.loss_scaling();
    if (stats) sum_squares(d, cs, model_.trainable_size(), R.grads.data(), loss_scale, R.grad_stats.data());
    R.optimizer->apply(cs, R.params.data(), R.grads.data(), step, lr, stats ? R.grad_stats.data() : nullptr, loss_scale,
                       set_.loss_scaling(), values);
    finish_update(R);
    set_.refresh_weights(R, cs);
}

// After the optimizer, on the compute stream: the loss scale from this step's overflow check, and
// the running statistics (batchnorm's) from their all-reduced sums.
void TrainingStep::finish_update(Replica& R) {
    Device& d = *R.device;
    const Stream cs = d.compute_stream();
    if (set_.loss_scaling())
        loss_scale_update(d, cs, R.loss_scale.data(), R.grad_stats.data(), set_.config().loss_scale_growth_interval);
    for (const TensorInfo* t : state_)
        ema_update(d, cs, t->count, t->momentum, set_.grad_at(R, t->offset), R.params.data() + t->offset);
}

// strategy.shard: gradients - where each bucket's own chunk goes in each replica's own store.
void TrainingStep::find_own_chunks() {
    for (int r = 0; r < set_.replicas(); ++r) {
        const auto& owned = set_.replica(r).optimizer->owned();
        std::vector<size_t> at(buckets_.size(), 0);
        for (size_t k = 0; k < buckets_.size(); ++k) {
            const Bucket& b = buckets_[k];
            const size_t begin = CrossDeviceOps::owned(r, set_.replicas(), b.begin, b.end - b.begin).first;
            for (const auto& o : owned)
                if (begin >= o.begin && begin < o.end) at[k] = o.state_at + (begin - o.begin);
        }
        own_at_.push_back(std::move(at));
    }
}

// strategy.shard: gradients, on the comm stream after bucket k's reduce-scatter: the own chunk's
// sum out of the staging slot into the own store (added: a later micro-batch), then the slot is
// free (Replica::slot_free).
void TrainingStep::keep_own_chunk(Replica& R, size_t k, bool add) {
    Device& d = *R.device;
    const Bucket& b = buckets_[k];
    const auto [begin, end] = CrossDeviceOps::owned(R.index, set_.replicas(), b.begin, b.end - b.begin);
    if (end > begin) {
        const float* sum = set_.grad_at(R, begin);
        float* own = R.owned_grads.data() + own_at_[size_t(R.index)][k];
        if (add) axpy_floats(d, d.comm_stream(), end - begin, 1.0f, sum, own);
        else d.copy_on_device(d.comm_stream(), own, sum, (end - begin) * sizeof(float));
    }
    d.event_record(R.slot_free[size_t(set_.staging().slot_of[k])], d.comm_stream());
}

// An owned range's summed gradients: in the gradient buffer, or staged, in the own store (laid out
// as the optimizer's state).
float* TrainingStep::owned_grads(Replica& R, const Optimizer::Owned& o) const {
    return set_.staged() ? R.owned_grads.data() + o.state_at : R.grads.data() + o.begin;
}

// strategy.shard, on the compute stream once the reduce-scatter is done: the gradient statistics
// over the own chunks, summed across the replicas (every replica gets the same bits, so all agree
// on clipping and on an fp16 overflow) -> the optimizer on the own chunks with the own state ->
// the loss scale and the running statistics (all-reduced whole) -> on the comm stream, every
// replica gathers the others' updated chunks of the parameters -> the 16-bit copy.
void TrainingStep::sharded_update(Replica& R, int64_t step, float lr, const StepValues* values, bool timing,
                                  double& comm_s) {
    Device& d = *R.device;
    const Stream cs = d.compute_stream();
    const float* loss_scale = set_.loss_scaling() ? R.loss_scale.data() : nullptr;
    const bool stats = R.optimizer->config().grad_clip_norm > 0 || set_.loss_scaling();
    const auto& owned = R.optimizer->owned();
    // comm_op: fn's work on the comm stream, after the compute stream's work so far and before its next
    const auto comm_op = [&](auto&& fn) {
        const double c0 = now_s();
        comm_waits_for_compute(d, R.bucket_ready);
        fn();
        compute_waits_for_comm(d, R.reduced);
        comm_s += now_s() - c0;
    };
    if (stats) {
        fill_floats(d, cs, 2, 0.0f, R.grad_stats.data());
        for (const auto& o : owned) {
            sum_squares(d, cs, o.end - o.begin, owned_grads(R, o), loss_scale, R.grad_total.data());
            axpy_floats(d, cs, 2, 1.0f, R.grad_total.data(), R.grad_stats.data());
        }
        comm_op([&] { grad_stats_ops_->all_reduce(R.index, 0, 2); });
    }
    for (const auto& o : owned)
        R.optimizer->apply_range(d, cs, R.params.data(), owned_grads(R, o), o.begin, o.end, step, lr,
                                 stats ? R.grad_stats.data() : nullptr, loss_scale, set_.loss_scaling(), values);
    finish_update(R);
    if (timing) d.event_record(R.t_gather, cs);  // exposed communication, as the all-reduce's wait is
    comm_op([&] {
        for (const Bucket& b : buckets_)
            if (b.begin < model_.trainable_size()) param_ops_->all_gather(R.index, b.begin, b.end - b.begin);
    });
    if (timing) d.event_record(R.t_gathered, cs);
    set_.refresh_weights(R, cs);
}

// Replica r's slice of the flat buffer: equal parts in whole 64-byte lines (no two replicas write
// one cache line); trailing slices may be empty.
std::pair<size_t, size_t> TrainingStep::slice(int r) const {
    constexpr size_t kLine = 16;  // floats
    const size_t flat = model_.grad_size(), n = size_t(set_.replicas());
    const size_t size = ((flat + n - 1) / n + kLine - 1) / kLine * kLine;
    const size_t begin = std::min(flat, size * size_t(r)), end = std::min(flat, begin + size);
    return {begin, end};
}

// Shared parameters (CPU replicas, or replicas of one GPU): every replica's gradients are complete -> replica r sums its
// slice over all replicas (in replica order, into its own buffer: the others read only their own
// slices) and, in a multi-node run, over the nodes -> the gradient statistics, per slice, added in
// replica order -> the optimizer, the running statistics and the 16-bit copy on r's slice of the
// one parameter copy -> nobody computes with the parameters before every slice is updated. With
// no statistics and one node the optimizer sums the trainable part itself, as it reads it.
void TrainingStep::shared_update(Replica& R, int64_t step, float lr, const StepValues* values, bool timing,
                                 double& comm) {
    Device& d = *R.device;
    const Stream cs = d.compute_stream();
    Replica& H = set_.replica(0);
    const auto [begin, end] = slice(R.index);
    const size_t trainable = model_.trainable_size();
    const size_t tb = std::min(begin, trainable), te = std::min(end, trainable);  // the trainable part
    const float* loss_scale = set_.loss_scaling() ? R.loss_scale.data() : nullptr;
    const bool stats = H.optimizer->config().grad_clip_norm > 0 || set_.loss_scaling();
    // Without statistics or other nodes nothing needs the trainable sum before the update: the
    // update sums as it goes (apply_summed_range), and only the running statistics are summed here.
    const bool sum_in_update = !stats && !set_.nodes();
    const size_t sum_from = sum_in_update ? std::max(begin, trainable) : begin;
    const double c0 = now_s();
    join_replicas(R);
    if (end > sum_from) {
        sum_into(d, cs, set_.grad_ptrs().data(), set_.replicas(), R.index, sum_from, end - sum_from);
        if (set_.nodes()) set_.nodes()->sum_channel(R.index, R.grads.data() + begin, end - begin);
    }
    comm += now_s() - c0;
    if (stats) {
        sum_squares(d, cs, te - tb, R.grads.data() + tb, loss_scale, R.grad_stats.data());
        join_replicas(R);
        d.copy_from_peer(cs, R.grad_total.data(), *H.device, H.grad_stats.data(), 2 * sizeof(float));
        for (int q = 1; q < set_.replicas(); ++q)
            d.reduce_from_peer(cs, R.grad_total.data(), *set_.replica(q).device, set_.replica(q).grad_stats.data(),
                               DType::f32, 2);
    }
    if (timing) d.event_record(R.t_reduced, cs);  // the sums are this path's communication
    profile_mark(R, cs, LayerProbe::kReduced);
    if (te > tb && sum_in_update)
        H.optimizer->apply_summed_range(d, cs, H.params.data(), set_.grad_ptrs().data(), set_.replicas(), R.index, tb,
                                        te, step, lr, values);
    else if (te > tb)
        H.optimizer->apply_range(d, cs, H.params.data(), R.grads.data() + tb, tb, te, step, lr,
                                 stats ? R.grad_total.data() : nullptr, loss_scale, set_.loss_scaling(), values);
    if (set_.loss_scaling())
        loss_scale_update(d, cs, R.loss_scale.data(), R.grad_total.data(), set_.config().loss_scale_growth_interval);
    for (const TensorInfo* t : state_) {  // running statistics: the part of each in this slice
        const size_t lo = std::max(begin, t->offset), hi = std::min(end, t->offset + t->count);
        if (hi > lo) ema_update(d, cs, hi - lo, t->momentum, R.grads.data() + lo, H.params.data() + lo);
    }
    if (set_.low_precision() && te > tb)
        convert_values(d, cs, te - tb, H.params.data() + tb, DType::f32, H.weights.data() + d.act_bytes(tb),
                       d.value_dtype());
    join_replicas(R);
}

void TrainingStep::collect_timing(TimeSplit& split, int64_t steps) {
    Replica& R = set_.replica(0);
    if (!set_.traits().asynchronous) {
        split.compute_s += R.compute_s;
        split.comm_s += R.comm_s;
        R.compute_s = R.comm_s = 0;
        return;
    }
    if (!timing_sampled_ || steps <= 0) return;
    Device& d = *R.device;
    set_.guarded([&] { set_.wait_until([&] { return d.event_query(R.t_end); }); });
    const double backward = d.event_elapsed_ms(R.t_begin, R.t_backward) * 1e-3;
    const double gather = set_.sharded() ? d.event_elapsed_ms(R.t_gather, R.t_gathered) * 1e-3 : 0.0;
    const double exposed = d.event_elapsed_ms(R.t_backward, R.t_reduced) * 1e-3 + gather;
    const double update = d.event_elapsed_ms(R.t_reduced, R.t_end) * 1e-3 - gather;
    split.compute_s += (backward + update) * double(steps);
    split.comm_s += exposed * double(steps);
    split.device_step_s = backward + exposed + update;
    timing_sampled_ = false;
}

Metrics TrainingStep::evaluate(Loader& loader) {
    Metrics m;
    set_.guarded([&] {
        for (int r = 0; r < set_.replicas(); ++r) {
            Replica& R = set_.replica(r);
            ReplicaSet::zero_metrics(*R.device, R.device->compute_stream(), R.eval_metrics.data());
        }
        loader.start({0, 0});
        for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
            const Batch& batch = set_.next_batch(loader);
            set_.threads().run([&](int r) {
                Replica& R = set_.replica(r);
                Device& d = *R.device;
                const Shard shard = set_.global_shard(batch, r);
                const int buf = set_.stage_input(R, batch, ReplicaSet::local_shard(batch, shard));
                const char* input = static_cast<const char*>(set_.stage_for_compute(R, buf, size_t(shard.rows)));
                const size_t row_bytes = set_.input_row_bytes(R);
                for (int mi = 0; mi < set_.accumulation(); ++mi) {
                    const Shard micro = shard_of(shard.rows, set_.accumulation(), mi);
                    Pass p = set_.make_pass(R, d.compute_stream(), micro.rows, 0, 0, 0, 0, false);
                    const void* logits = model_.forward(p, input + size_t(micro.begin) * row_bytes);
                    loss_->apply(d, d.compute_stream(), micro.rows * model_.output_positions(), model_.output_classes(),
                                 logits, set_.labels_at(R, buf, micro.begin), 0.0f, nullptr, nullptr,
                                 R.eval_metrics.data());
                }
                set_.inputs_consumed(R, buf, d.compute_stream());
            });
        }
        set_.synchronize();
        loader.stop();  // waits for every release callback
        for (int r = 0; r < set_.replicas(); ++r) {
            Replica& R = set_.replica(r);
            Device& d = *R.device;
            d.copy_to_host(d.compute_stream(), R.eval_host.data(), R.eval_metrics.data(),
                           kMetricSlots * sizeof(double));
            d.stream_synchronize(d.compute_stream());
            m.add(R.eval_host.data());
        }
    });
    set_.sum_over_nodes(m, "the sum of the evaluation metrics");
    return m;
}

std::vector<float> TrainingStep::predict(const float* x, size_t rows) {
    set_.synchronize();
    return set_.guarded([&] {
        Replica& R = set_.replica(0);
        Device& d = *R.device;
        const size_t features = size_t(model_.input_features()), classes = size_t(model_.output_features());
        const size_t chunk =
            std::min<size_t>(size_t(R.acts.max_rows()), R.inputs[0].size() / std::max<size_t>(features, 1));
        std::vector<float> out(rows * classes), logits32(chunk * classes);
        DeviceBuffer<float> staged(d, chunk * classes);
        for (size_t done = 0; done < rows; done += chunk) {
            const int n = int(std::min(chunk, rows - done));
            d.copy_to_device(d.compute_stream(), R.inputs[0].data(), x + done * features,
                             size_t(n) * features * sizeof(float));
            const void* input = set_.stage_for_compute(R, 0, size_t(n));
            Pass p = set_.make_pass(R, d.compute_stream(), n, n, 0, 0, 0, false);
            const void* logits = model_.forward(p, input);
            convert_values(d, d.compute_stream(), size_t(n) * classes, logits, d.value_dtype(), staged.data(),
                           DType::f32);
            d.copy_to_host(d.compute_stream(), out.data() + done * classes, staged.data(),
                           size_t(n) * classes * sizeof(float));
            d.synchronize();
        }
        return out;
    });
}

}  // namespace mirrored
