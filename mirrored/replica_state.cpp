#include "mirrored/replica_state.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "mirrored/util.h"
#include "kernels/ops/flat.h"

namespace mirrored {

void ReplicaState::init_and_broadcast() {
    set_.guarded([&] {
        Replica& R0 = set_.replica(0);
        set_.model().init_params(*R0.device, R0.device->compute_stream(), R0.params.data());
        R0.device->synchronize();
        if (set_.nodes()) {  // node 0's initial parameters, through the host: not a step, once per run
            std::vector<float> host(set_.model().flat_size());
            Device& d = *R0.device;
            d.copy_to_host(d.compute_stream(), host.data(), R0.params.data(), host.size() * sizeof(float));
            d.synchronize();
            set_.nodes()->broadcast(host.data(), host.size(), "the broadcast of the initial parameters");
            d.copy_to_device(d.compute_stream(), R0.params.data(), host.data(), host.size() * sizeof(float));
            d.synchronize();
        }
        set_.threads().run([&](int r) {
            if (set_.shared() && r != 0) return;  // one copy
            Device& d = *set_.replica(r).device;
            if (r != 0)
                d.copy_from_peer(d.compute_stream(), set_.replica(r).params.data(), *R0.device, R0.params.data(),
                                 set_.model().flat_size() * sizeof(float));
            set_.refresh_weights(set_.replica(r), d.compute_stream(), true);
            d.synchronize();
        });
    });
}

void ReplicaState::request_train_metrics() {
    set_.guarded([&] {
        for (auto& Rp : set_.members()) {
            Replica& R = *Rp;
            Device& d = *R.device;
            const Stream s = d.compute_stream();
            d.copy_to_host(s, R.metrics_host.data(), R.train_metrics.data(), kMetricSlots * sizeof(double));
            if (set_.loss_scaling())
                d.copy_to_host(s, R.loss_scale_host.data(), R.loss_scale.data(), 2 * sizeof(float));
            d.event_record(R.metrics_copied, s);
            ReplicaSet::zero_metrics(d, s, R.train_metrics.data());
        }
    });
}

bool ReplicaState::train_metrics_ready() {
    return set_.guarded([&] {
        for (auto& R : set_.members())
            if (!R->device->event_query(R->metrics_copied)) return false;
        return true;
    });
}

Metrics ReplicaState::take_train_metrics() {
    set_.guarded([&] { set_.wait_until([&] { return train_metrics_ready(); }); });
    Metrics m;
    for (auto& R : set_.members()) m.add(R->metrics_host.data());
    set_.sum_over_nodes(m, "the sum of the training metrics");
    return m;
}

float ReplicaState::loss_scale() const { return set_.loss_scaling() ? set_.replica(0).loss_scale_host[0] : 1.0f; }

std::array<float, 2> ReplicaState::loss_scale_state() {
    if (!set_.loss_scaling()) return {1.0f, 0.0f};
    set_.synchronize();
    return set_.guarded([&] {
        Replica& R = set_.replica(0);
        std::array<float, 2> s{};
        R.device->copy_to_host(R.device->compute_stream(), s.data(), R.loss_scale.data(), sizeof s);
        R.device->stream_synchronize(R.device->compute_stream());  // the copy is asynchronous
        return s;
    });
}

void ReplicaState::restore_loss_scale(const std::array<float, 2>& state) {
    if (!set_.loss_scaling()) return;
    set_.guarded([&] {
        for (auto& R : set_.members()) {
            Device& d = *R->device;
            d.copy_to_device(d.compute_stream(), R->loss_scale.data(), state.data(), sizeof state);
            d.synchronize();
            R->loss_scale_host[0] = state[0];
        }
    });
}

std::vector<std::array<double, 3>> ReplicaState::peek_train_metrics() {
    set_.synchronize();
    return set_.guarded([&] {
        std::vector<std::array<double, 3>> out;
        for (auto& R : set_.members()) {
            Device& d = *R->device;
            d.copy_to_host(d.compute_stream(), R->metrics_host.data(), R->train_metrics.data(),
                           kMetricSlots * sizeof(double));
            d.stream_synchronize(d.compute_stream());
            out.push_back(
                {R->metrics_host[kMetricLossSum], R->metrics_host[kMetricCorrect], R->metrics_host[kMetricCount]});
        }
        if (!set_.nodes()) return out;
        std::vector<uint64_t> bits;  // doubles travel as their bits: nothing is added
        for (const auto& a : out)
            for (double x : a) bits.push_back(std::bit_cast<uint64_t>(x));
        const std::vector<uint64_t> all = set_.nodes()->all_gather(bits, "the exchange of the metric accumulators");
        std::vector<std::array<double, 3>> job(all.size() / 3);
        for (size_t i = 0; i < all.size(); ++i) job[i / 3][i % 3] = std::bit_cast<double>(all[i]);
        return job;
    });
}

void ReplicaState::restore_train_metrics(const std::vector<std::array<double, 3>>& m) {
    std::vector<std::array<double, 3>> per(set_.replicas(), {0, 0, 0});
    if (int(m.size()) == set_.all_replicas())
        std::copy(m.begin() + set_.first_replica(), m.begin() + set_.first_replica() + set_.replicas(), per.begin());
    else if (set_.node_rank() == 0)
        for (const auto& x : m)
            for (int k = 0; k < 3; ++k) per[0][k] += x[k];
    set_.guarded([&] {
        for (int r = 0; r < set_.replicas(); ++r) {
            Device& d = *set_.replica(r).device;
            const double v[kMetricSlots] = {per[r][0], per[r][1], per[r][2], 0.0};
            std::memcpy(set_.replica(r).metrics_host.data(), v, sizeof v);
            d.copy_to_device(d.compute_stream(), set_.replica(r).train_metrics.data(),
                             set_.replica(r).metrics_host.data(), sizeof v);
            d.stream_synchronize(d.compute_stream());
        }
    });
}

uint64_t ReplicaState::checksum(int r) {
    set_.synchronize();
    return set_.guarded([&] {
        Replica& R = set_.replica(r);
        Device& d = *R.device;
        const size_t last = set_.model().tensors().size();
        checksum_floats(d, d.compute_stream(), set_.model().flat_size(), set_.holder(R).params.data(),
                        R.checksums.data() + last);
        d.copy_to_host(d.compute_stream(), R.checksums_host.data() + last, R.checksums.data() + last, sizeof(uint64_t));
        d.stream_synchronize(d.compute_stream());
        return R.checksums_host[last];
    });
}

std::vector<uint64_t> ReplicaState::all_checksums() {
    std::vector<uint64_t> mine;
    for (int r = 0; r < set_.replicas(); ++r) mine.push_back(checksum(r));
    return set_.nodes() ? set_.nodes()->all_gather(mine, "the exchange of the replicas' checksums") : mine;
}

void ReplicaState::verify_replicas() {
    const auto& tensors = set_.model().tensors();
    set_.synchronize();
    set_.guarded([&] {
        for (auto& Rp : set_.members()) {
            Device& d = *Rp->device;
            for (size_t t = 0; t < tensors.size(); ++t)
                checksum_floats(d, d.compute_stream(), tensors[t].count,
                                set_.holder(*Rp).params.data() + tensors[t].offset, Rp->checksums.data() + t);
            d.copy_to_host(d.compute_stream(), Rp->checksums_host.data(), Rp->checksums.data(),
                           tensors.size() * sizeof(uint64_t));
        }
        for (auto& Rp : set_.members()) Rp->device->stream_synchronize(Rp->device->compute_stream());
    });
    for (size_t t = 0; t < tensors.size(); ++t)
        for (int r = 1; r < set_.replicas(); ++r)
            if (set_.replica(r).checksums_host[t] != set_.replica(0).checksums_host[t])
                throw DeviceError("replicas diverged: " + tensors[t].name + " on replica " + std::to_string(r) + " (" +
                                  set_.replica(r).device->name() + ") differs from replica 0 (" +
                                  set_.replica(0).device->name() + ")");
    if (!set_.nodes()) return;
    std::vector<uint64_t> mine(set_.replica(0).checksums_host.data(),
                               set_.replica(0).checksums_host.data() + tensors.size());
    const std::vector<uint64_t> all = set_.nodes()->all_gather(mine, "the replica verification");
    for (int k = 1; k < set_.node_count(); ++k)
        for (size_t t = 0; t < tensors.size(); ++t)
            if (all[size_t(k) * tensors.size() + t] != all[t])
                throw DeviceError("replicas diverged: " + tensors[t].name + " on node " + std::to_string(k) +
                                  " differs from node 0");
}

std::vector<float> ReplicaState::download_params() {
    std::vector<float> h(set_.model().flat_size());
    download_param_range(0, h.data(), h.size());
    return h;
}

// The replicas whose optimizers hold the state between them: every replica's own chunks when
// sharded, else replica 0's whole (the others hold copies, or share it).
std::vector<Replica*> ReplicaState::state_holders() {
    std::vector<Replica*> out;
    for (auto& R : set_.members())
        if (set_.sharded() || R->index == 0) out.push_back(R.get());
    return out;
}

// Checkpoints hold the full state in the parameters' layout, whichever replicas held which part:
// a run resumes with another strategy.shard or replica count.
std::vector<std::pair<std::string, std::vector<float>>> ReplicaState::download_optimizer_state() {
    set_.synchronize();
    return set_.guarded([&] {
        std::vector<std::pair<std::string, std::vector<float>>> out;
        for (Replica* R : state_holders()) {
            Device& d = *R->device;
            const auto states = R->optimizer->state();
            if (out.empty())
                for (const auto& [name, buf] : states) out.emplace_back(name, std::vector<float>(R->optimizer->size()));
            std::vector<float> own(R->optimizer->state_size());
            for (size_t i = 0; i < states.size(); ++i) {
                d.copy_to_host(d.compute_stream(), own.data(), states[i].second->data(), own.size() * sizeof(float));
                d.stream_synchronize(d.compute_stream());
                for (const auto& o : R->optimizer->owned())
                    std::copy_n(own.data() + o.state_at, o.end - o.begin, out[i].second.data() + o.begin);
            }
        }
        return out;
    });
}

void ReplicaState::upload_state(const std::vector<float>& params,
                                const std::vector<std::pair<std::string, std::vector<float>>>& state) {
    // Everything is checked before anything is copied.
    if (params.size() != set_.replica(0).params.size())
        throw CheckpointError("checkpoint parameters do not fit the model");
    Optimizer& first = *set_.replica(0).optimizer;
    auto mine = first.state();
    if (mine.size() != state.size()) throw CheckpointError("checkpoint optimizer state does not fit the optimizer");
    for (size_t i = 0; i < mine.size(); ++i)
        if (mine[i].first != state[i].first || first.size() != state[i].second.size())
            throw CheckpointError("checkpoint optimizer state '" + state[i].first + "' does not fit the optimizer");
    set_.guarded([&] {
        for (auto& Rp : set_.members()) {
            if (&set_.holder(*Rp) != Rp.get()) continue;  // shared parameters: one copy
            Device& d = *Rp->device;
            d.copy_to_device(d.compute_stream(), Rp->params.data(), params.data(), params.size() * sizeof(float));
            auto own = Rp->optimizer->state();
            std::vector<float> part(Rp->optimizer->state_size());
            for (size_t i = 0; i < own.size(); ++i) {
                for (const auto& o : Rp->optimizer->owned())
                    std::copy_n(state[i].second.data() + o.begin, o.end - o.begin, part.data() + o.state_at);
                d.copy_to_device(d.compute_stream(), own[i].second->data(), part.data(), part.size() * sizeof(float));
                d.synchronize();  // part is refilled for the next state
            }
            set_.refresh_weights(*Rp, d.compute_stream(), true);
            d.synchronize();
        }
    });
}

void ReplicaState::upload_param_range(size_t offset, const float* values, size_t count) {
    if (offset > set_.model().flat_size() || count > set_.model().flat_size() - offset)
        throw std::logic_error("upload_param_range: past the parameters");
    set_.guarded([&] {
        for (auto& Rp : set_.members()) {
            if (&set_.holder(*Rp) != Rp.get()) continue;  // shared parameters: one copy
            Device& d = *Rp->device;
            d.copy_to_device(d.compute_stream(), Rp->params.data() + offset, values, count * sizeof(float));
            d.stream_synchronize(d.compute_stream());  // values are the caller's again
        }
    });
}

void ReplicaState::refresh_weights() {
    set_.guarded([&] {
        for (auto& Rp : set_.members()) {
            if (&set_.holder(*Rp) != Rp.get()) continue;
            set_.refresh_weights(*Rp, Rp->device->compute_stream(), true);
            Rp->device->synchronize();
        }
    });
}

void ReplicaState::download_param_range(size_t offset, float* values, size_t count) {
    if (offset > set_.model().flat_size() || count > set_.model().flat_size() - offset)
        throw std::logic_error("download_param_range: past the parameters");
    set_.synchronize();
    set_.guarded([&] {
        Replica& R = set_.replica(0);
        R.device->copy_to_host(R.device->compute_stream(), values, R.params.data() + offset, count * sizeof(float));
        R.device->stream_synchronize(R.device->compute_stream());
    });
}

}  // namespace mirrored
