#include "mirrored/cross_device_ops.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>

#include "base/error.h"
#include "base/machine_cache.h"
#include "kernels/ops/flat.h"
#include "kernels/ops/elementwise.h"

namespace mirrored {

// How replica r's slice of a range crosses the nodes: an in-place sum over every node's replica
// r, enqueued on the replica's comm stream.
class NodeLink {
public:
    virtual ~NodeLink() = default;
    virtual void all_reduce(Device& d, float* data, size_t count) = 0;
    virtual void abort() noexcept {}
};

namespace {

// CPU and simulated replicas: MPI on the host, as a host callback in the comm stream's order (a
// CPU replica runs it at once; a simulated GPU on its stream's own thread, so that the channels
// never wait for each other). Each range the callbacks sum - a bucket's slice, a fixed set - gets
// one record that lives as long as the link and is the callback's argument, so a captured step
// replays the same callbacks with the same ranges.
class HostNodeLink final : public NodeLink {
public:
    HostNodeLink(Nodes& nodes, int channel) : nodes_(nodes), channel_(channel) {}
    void all_reduce(Device& d, float* data, size_t count) override {
        // Only replica `channel`'s thread calls this; callbacks read their own record only.
        Range* range = nullptr;
        for (const auto& r : ranges_)
            if (r->data == data && r->count == count) range = r.get();
        if (!range) {  // the first step: one record per range, kept
            ranges_.push_back(std::make_unique<Range>(Range{this, data, count}));
            range = ranges_.back().get();
        }
        d.host_callback(d.comm_stream(), &HostNodeLink::run, range);
    }

private:
    struct Range {
        HostNodeLink* link = nullptr;
        float* data = nullptr;
        size_t count = 0;
    };
    static void run(void* arg) {
        const Range& r = *static_cast<const Range*>(arg);
        HostNodeLink& l = *r.link;
        try {
            l.nodes_.sum_channel(l.channel_, r.data, r.count);
        } catch (const std::exception& e) {  // on a stream's thread: nobody to throw to; stop the job
            std::fprintf(stderr, "error: node %d (%s): %s\n", l.nodes_.rank(), l.nodes_.host().c_str(), e.what());
            l.nodes_.abort(kExitDevice);
        }
    }
    Nodes& nodes_;
    const int channel_;
    std::vector<std::unique_ptr<Range>> ranges_;
};

// GPUs: an NCCL communicator per local replica index, one rank per node, on the comm stream.
class NcclNodeLink final : public NodeLink {
public:
    explicit NcclNodeLink(std::unique_ptr<NcclNodeComm> comm) : comm_(std::move(comm)) {}
    void all_reduce(Device& d, float* data, size_t count) override {
        comm_->all_reduce_sum(d.comm_stream(), data, count);
    }
    void abort() noexcept override { comm_->abort(); }

private:
    std::unique_ptr<NcclNodeComm> comm_;
};

}  // namespace

CrossDeviceOps::CrossDeviceOps(std::vector<Device*> devices, std::vector<float*> buffers, size_t elements, DType wire)
    : devices_(std::move(devices)), buffers_(std::move(buffers)), elements_(elements), wire_(wire) {
    if (wire_ != DType::f32 && wire_ != DType::bf16)
        throw ConfigError("strategy.allreduce_dtype",
                          std::string("unsupported '") + dtype_name(wire_) + "' (known: fp32, bf16)");
    for (size_t r = 0; r < devices_.size(); ++r) {
        if (wire_ == DType::f32 || devices_.size() == 1) {  // one replica: nothing to send
            views_.push_back(buffers_[r]);
        } else {
            packed_.emplace_back(*devices_[r], elements_);
            views_.push_back(packed_.back().data());
        }
    }
}

void CrossDeviceOps::check_call(size_t offset, size_t count) const {
    if (broken_)
        throw FollowOnError(std::string("cross-device ops (") + name() +
                            "): unusable after an aborted all-reduce; the replicas must be rebuilt");
    if (offset > elements_ || count > elements_ - offset)
        throw Error(kExitFailure, std::string("cross-device ops (") + name() + "): range past the buffer");
}

void CrossDeviceOps::check_splittable() const {
    if (!shards() || wire_ != DType::f32)
        throw Error(kExitFailure,
                    std::string("cross-device ops (") + name() +
                        "): reduce-scatter and all-gather need an op that splits (ring, nccl) and the f32 wire");
}

// Multi-node: the node's reduce-scatter, then replica r's chunk summed over replica r of every
// node - the first half of across_nodes, so the chunk gets the bits all_reduce gives it.
void CrossDeviceOps::reduce_scatter(int r, size_t offset, size_t count) {
    check_call(offset, count);
    check_splittable();
    try {
        run_reduce_scatter(r, offset, count);
        const auto [begin, end] = owned(r, replicas(), offset, count);
        if (!links_.empty() && end > begin)
            links_[size_t(r)]->all_reduce(*devices_[size_t(r)], static_cast<float*>(data(r, begin)), end - begin);
    } catch (...) {
        broken_ = true;
        throw;
    }
}

void CrossDeviceOps::all_gather(int r, size_t offset, size_t count) {
    check_call(offset, count);
    check_splittable();
    try {
        run_all_gather(r, offset, count);
    } catch (...) {
        broken_ = true;
        throw;
    }
}

void CrossDeviceOps::all_reduce(int r, size_t offset, size_t count) {
    check_call(offset, count);
    try {
        if (wire_ == DType::f32 || replicas() == 1) {
            run(r, offset, count);
            across_nodes(r, offset, count);
            return;
        }
        Device& d = *devices_[size_t(r)];
        uint16_t* wire = packed_[size_t(r)].data() + offset;
        pack_bf16_values(d, d.comm_stream(), count, buffers_[size_t(r)] + offset, wire);
        run(r, offset, count);
        unpack_bf16_values(d, d.comm_stream(), count, wire, buffers_[size_t(r)] + offset);
    } catch (...) {
        broken_ = true;
        throw;
    }
}

CrossDeviceOps::~CrossDeviceOps() = default;

void CrossDeviceOps::abort() noexcept {
    broken_ = true;
    for (auto& l : links_) l->abort();
}

void CrossDeviceOps::join_nodes(Nodes* nodes, ReplicaBarrier& barrier) {
    if (!nodes) return;
    if (wire_ != DType::f32)
        throw ConfigError("strategy.allreduce_dtype", "bf16 gradients are not exchanged between nodes yet; use fp32");
    for (int r = 0; r < replicas(); ++r) {
        Device& d = *devices_[size_t(r)];
        if (d.traits().nccl_between_nodes) {  // node 0 makes each channel's id; the channels in order on every node
            const std::string id =
                nodes->broadcast(nodes->leader() ? nccl_unique_id() : std::string(), "the exchange of NCCL ids");
            links_.push_back(std::make_unique<NcclNodeLink>(make_nccl_node_comm(id, nodes->rank(), nodes->count(), d)));
        } else {
            links_.push_back(std::make_unique<HostNodeLink>(*nodes, r));
        }
        all_.push_back(r);
    }
    node_sync_ = std::make_unique<ReplicaSync>(devices_, barrier);
}

// run() has ended on every replica's comm stream with its buffer holding the node's sum, and no
// replica reads another's buffer after that point.
void CrossDeviceOps::across_nodes(int r, size_t offset, size_t count) {
    if (links_.empty() || count == 0) return;
    const int n = replicas();
    const Chunks c(count, n, wire_);
    Device& me = *devices_[size_t(r)];
    if (c.length(r) > 0)
        links_[size_t(r)]->all_reduce(me, static_cast<float*>(data(r, offset + c.begin(r))), c.length(r));
    if (n == 1) return;
    node_sync_->wait_for(r, all_);  // every replica's slice holds the sum over the nodes
    for (int q = 0; q < n; ++q)
        if (q != r && c.length(q) > 0)
            me.copy_from_peer(me.comm_stream(), data(r, offset + c.begin(q)), *devices_[size_t(q)],
                              data(q, offset + c.begin(q)), c.length(q) * sizeof(float));
    node_sync_->wait_for(r, all_);  // nobody changes its buffer while another still copies from it
}

namespace {

// The ops `auto` times for these devices, in the registry's order.
std::vector<std::string> auto_candidates(const std::vector<Device*>& devices, bool split) {
    std::vector<std::string> c;
    for (const CrossDeviceOpsKind* k : cross_device_ops_kinds().entries())
        if (k->candidate(devices) && (k->shards || !split)) c.push_back(k->name);
    return c;
}

// Seconds for one all-reduce of every range (split: a reduce-scatter of every range, then an
// all-gather of every range, as a sharded step runs them), every replica on its own thread: the
// median of up to 7 runs after a warm-up (NCCL sets up on its first call), at most about a second.
double time_ops(const std::string& kind, const std::vector<Device*>& devices, const std::vector<float*>& buffers,
                size_t elements, const std::vector<std::pair<size_t, size_t>>& ranges, ReplicaThreads& threads,
                DType wire, bool split) {
    auto ops = make_cross_device_ops(kind, devices, buffers, elements, threads.barrier(), wire);
    auto once = [&] {
        const auto t0 = std::chrono::steady_clock::now();
        threads.run([&](int r) {
            if (split) {
                for (const auto& [begin, count] : ranges) ops->reduce_scatter(r, begin, count);
                for (const auto& [begin, count] : ranges) ops->all_gather(r, begin, count);
            } else {
                for (const auto& [begin, count] : ranges) ops->all_reduce(r, begin, count);
            }
            devices[size_t(r)]->synchronize();
        });
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    once();
    std::vector<double> t;
    double total = 0;
    while (t.size() < 7 && (t.size() < 3 || total < 1.0)) {
        t.push_back(once());
        total += t.back();
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace

OpsChoice choose_cross_device_ops(const std::vector<Device*>& devices, const std::vector<float*>& buffers,
                                  size_t elements, const std::vector<std::pair<size_t, size_t>>& ranges,
                                  ReplicaThreads& threads, DType wire, const std::string& keep, bool split) {
    if (devices.size() < 2) return {"ring", "one replica: nothing to reduce"};
    const std::vector<std::string> candidates = auto_candidates(devices, split);
    const bool can_keep = std::find(candidates.begin(), candidates.end(), keep) != candidates.end();
    if (can_keep)
        return {keep, "the op of the checkpoint resumed from, which these devices run (its sums in its order)"};
    if (split && candidates.size() == 1)
        return {candidates[0], "the one op here that splits into reduce-scatter and all-gather (strategy.shard)"};
    // The key: what the time depends on - the machine (a home directory may be shared), the
    // devices (GPU models; a CPU replica's description carries measured figures, so its name),
    // the bucket layout and the wire type.
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string key = std::string(host) + "|" + dtype_name(wire) + "|" + std::to_string(elements);
    for (const Device* d : devices)
        key += "|" + d->name() + (d->traits().stable_description ? " " + d->description() : "");
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the ranges: many buckets make a long list
    for (const auto& [begin, count] : ranges)
        for (uint64_t v : {uint64_t(begin), uint64_t(count)}) h = (h ^ v) * 1099511628211ull;
    key += "|" + std::to_string(ranges.size()) + " ranges " + std::to_string(h);
    if (split) key += "|split";
    // a checkpoint's op auto cannot choose here (other devices, or set by name): the resume notes it
    const std::string unkept = keep.empty() || keep == "shared"
                                   ? ""
                                   : "the checkpoint's " + keep + " is not among the ops auto chooses from here; ";
    if (const auto cached = cache_lookup("cross-device-ops.txt", key)) {
        const size_t sp = cached->find(' ');
        const std::string name = cached->substr(0, sp);
        if (std::find(candidates.begin(), candidates.end(), name) != candidates.end())
            return {name, unkept + "cached: " + (sp == std::string::npos ? std::string() : cached->substr(sp + 1))};
    }
    for (size_t r = 0; r < devices.size(); ++r) {  // no NaN or denormals to slow the adds
        fill_floats(*devices[r], devices[r]->compute_stream(), elements, 0.0f, buffers[r]);
        devices[r]->synchronize();
    }
    OpsChoice best;
    double best_s = 0;
    std::string times;
    for (const std::string& kind : candidates) {
        const double s = time_ops(kind, devices, buffers, elements, ranges, threads, wire, split);
        char line[96];
        std::snprintf(line, sizeof line, "%s%s %.3f ms", times.empty() ? "" : ", ", kind.c_str(), s * 1e3);
        times += line;
        if (best.name.empty() || s < best_s) {
            best.name = kind;
            best_s = s;
        }
    }
    times += " per step";
    cache_store("cross-device-ops.txt", key, best.name + " " + times);
    best.how = unkept + "measured: " + times;
    return best;
}

extern const CrossDeviceOpsKind kRingKind, kDirectKind, kNcclKind, kReduceToOneKind;

const Registry<CrossDeviceOpsKind>& cross_device_ops_kinds() {
    static const Registry<CrossDeviceOpsKind> kinds("cross-device op",
                                                    {&kRingKind, &kDirectKind, &kNcclKind, &kReduceToOneKind});
    return kinds;
}

std::string shard_refusal(const std::string& op) {
    if (op == "auto" || cross_device_ops_kinds().get(op, "strategy.cross_device_ops").shards) return "";
    std::string split;
    for (const CrossDeviceOpsKind* k : cross_device_ops_kinds().entries())
        if (k->shards) split.append(split.empty() ? "" : ", ").append(k->name);
    return "needs an op that splits into reduce-scatter and all-gather; strategy.cross_device_ops " + op +
           " does not (ops that do: " + split + ")";
}

std::unique_ptr<CrossDeviceOps> make_cross_device_ops(const std::string& kind, std::vector<Device*> devices,
                                                      std::vector<float*> buffers, size_t elements,
                                                      ReplicaBarrier& barrier, DType wire) {
    if (devices.empty() || devices.size() != buffers.size())
        throw Error(kExitFailure, "cross-device ops need one buffer per replica");
    if (barrier.size() != int(devices.size()))
        throw Error(kExitFailure, "cross-device ops: barrier size differs from replica count");
    return cross_device_ops_kinds()
        .get(kind, "strategy.cross_device_ops")
        .create(std::move(devices), std::move(buffers), elements, wire, barrier);
}

}  // namespace mirrored
