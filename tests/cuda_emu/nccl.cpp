// The emulated GPU's NCCL: the calls kernels/cuda/nccl_group.cu makes, with NCCL's documented
// semantics for one process driving several GPUs, so that the nccl op's own code runs in the
// test suite. What is checked, because real NCCL would fail, hang or corrupt there:
// - ncclCommInitAll: valid, distinct GPUs ("Duplicate GPU detected" in NCCL);
// - ncclAllReduce, ncclReduce, ncclBroadcast: a live communicator not yet finalized; send and
//   receive buffers of `count` elements in device memory of the communicator's GPU, the same
//   buffer or disjoint (ncclReduce's receive buffer on the root only, ncclBroadcast's send buffer
//   on the root only: elsewhere NCCL ignores them); a root that is a rank; a stream of that GPU;
//   a type and operation the emulator implements (sum of f32, bf16, f16);
// - one thread driving several ranks must issue them between ncclGroupStart and ncclGroupEnd
//   (NCCL: "Using multiple devices per thread ... requires group semantics", else it hangs); at
//   the group's end every rank of a communicator must have issued the same collectives, in the
//   same order, with the same count, type, operation and root (NCCL would hang or mix them);
// - under stream capture, the ranks' streams of one collective must be captured by the same
//   graph; the collective becomes one node after every rank's earlier work.
// The sum runs over the ranks in rank order, rounded to the element type after each addition as
// NCCL's reduction kernels do; every rank (ncclReduce: the root) receives the same bits. Not
// emulated: communicators across processes (ncclGetUniqueId, ncclCommInitRank), other
// collectives, asynchronous errors,
// and NCCL's ring/tree order of additions (so its rounding in bf16/f16 differs).
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tests/cuda_emu/emu_state.h"

struct ncclComm {
    int clique = 0;  // communicators made by one ncclCommInitAll
    int rank = 0, nranks = 1, device = 0;
    bool finalized = false;
};

namespace {

std::mutex g_mutex;
std::set<ncclComm*> g_live;
int g_next_clique = 0;

enum class Kind { all_reduce, reduce, broadcast };
const char* kind_name(Kind k) {
    return k == Kind::all_reduce ? "ncclAllReduce" : k == Kind::reduce ? "ncclReduce" : "ncclBroadcast";
}

struct Call {
    Kind kind;
    int root;  // ncclReduce, ncclBroadcast
    ncclComm* comm;
    const void* send;
    void* recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    cudaStream_t stream;
};
thread_local int t_group_depth = 0;
thread_local std::vector<Call> t_pending;  // issued in the open group, run at its end
thread_local std::string t_last_error;

ncclResult_t fail(ncclResult_t r, const std::string& why) {
    std::fprintf(stderr, "emulated NCCL: %s\n", why.c_str());
    t_last_error = why;
    return r;
}

bool live(ncclComm* c) {
    std::lock_guard<std::mutex> lock(g_mutex);
    return c && g_live.count(c);
}

size_t type_bytes(ncclDataType_t t) {
    switch (t) {
        case ncclFloat32:
            return 4;
        case ncclBfloat16:
        case ncclFloat16:
            return 2;
        default:
            return 0;  // not emulated
    }
}

// The CUDA element type of an NCCL one the emulator implements.
cudaDataType cuda_type(ncclDataType_t t) {
    return t == ncclBfloat16 ? CUDA_R_16BF : t == ncclFloat16 ? CUDA_R_16F : CUDA_R_32F;
}

// The collective's result - the sum over the ranks in rank order, or the root's send buffer -
// written to every rank's receive buffer (ncclReduce: the root's only): read everything before
// writing anything, as the buffers may be the send buffers.
void run_collective(const std::vector<Call>& ranks) {
    const Call& first = ranks[0];
    const cudaDataType t = cuda_type(first.type);
    std::vector<float> out(first.count);
    if (first.kind == Kind::broadcast) {
        for (size_t i = 0; i < first.count; ++i) out[i] = emu::load(ranks[size_t(first.root)].send, t, i);
    } else {
        for (size_t i = 0; i < first.count; ++i) {
            float acc = emu::load(first.send, t, i);
            for (size_t r = 1; r < ranks.size(); ++r) acc = emu::rounded(acc + emu::load(ranks[r].send, t, i), t);
            out[i] = acc;
        }
    }
    for (const Call& c : ranks) {
        if (c.kind == Kind::reduce && c.comm->rank != c.root) continue;
        for (size_t i = 0; i < c.count; ++i) emu::store(c.recv, t, i, out[i]);
    }
}

// One collective: the calls of every rank of a communicator, checked against each other.
ncclResult_t issue(std::vector<Call> ranks) {
    const Call& a = ranks[0];
    for (const Call& c : ranks)
        if (c.kind != a.kind || c.count != a.count || c.type != a.type || c.op != a.op || c.root != a.root)
            return fail(ncclInvalidUsage, std::string("the ranks' ") + kind_name(a.kind) +
                                              " calls in this place differ in collective, count, type, operation or "
                                              "root (NCCL would hang or combine mismatched data)");
    std::vector<cudaStream_t> streams;
    for (const Call& c : ranks) streams.push_back(c.stream);
    const std::string why = emu::submit_collective(streams, [ranks] { run_collective(ranks); });
    return why.empty() ? ncclSuccess : fail(ncclInvalidUsage, why);
}

// The end of the outermost group: the calls grouped into collectives, per communicator clique in
// issue order.
ncclResult_t run_group(std::vector<Call> calls) {
    std::map<int, std::vector<std::vector<Call>>> by_clique;  // clique -> rank -> its calls in order
    for (const Call& c : calls) {
        auto& ranks = by_clique[c.comm->clique];
        ranks.resize(size_t(c.comm->nranks));
        ranks[size_t(c.comm->rank)].push_back(c);
    }
    for (auto& [clique, ranks] : by_clique) {
        for (const auto& r : ranks)
            if (r.size() != ranks[0].size())
                return fail(ncclInvalidUsage, "at ncclGroupEnd a rank of a communicator has issued " +
                                                  std::to_string(r.size()) + " collectives and another " +
                                                  std::to_string(ranks[0].size()) +
                                                  " (one thread driving all ranks: NCCL would hang)");
        for (size_t k = 0; k < ranks[0].size(); ++k) {
            std::vector<Call> collective;
            for (const auto& r : ranks) collective.push_back(r[k]);
            if (const ncclResult_t e = issue(std::move(collective))) return e;
        }
    }
    return ncclSuccess;
}

bool overlap(const void* a, const void* b, size_t bytes) {
    const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
    return x < y + bytes && y < x + bytes;
}

}  // namespace

ncclResult_t ncclGetVersion(int* version) {
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess:
            return "no error";
        case ncclUnhandledCudaError:
            return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
        case ncclSystemError:
            return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
        case ncclInternalError:
            return "internal error - please report this issue to the NCCL developers";
        case ncclInvalidArgument:
            return "invalid argument (run with NCCL_DEBUG=WARN for details)";
        case ncclInvalidUsage:
            return "invalid usage (run with NCCL_DEBUG=WARN for details)";
        case ncclRemoteError:
            return "remote process exited or there was a network error";
        case ncclInProgress:
            return "NCCL operation in progress";
        default:
            return "unknown result code";
    }
}
const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

ncclResult_t ncclGetUniqueId(ncclUniqueId*) {
    return fail(ncclInvalidUsage, "communicators across processes (ncclGetUniqueId) are not emulated");
}
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int) {
    return fail(ncclInvalidUsage, "communicators across processes (ncclCommInitRank) are not emulated");
}

ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
    if (!comms || ndev < 1) return fail(ncclInvalidArgument, "ncclCommInitAll: no communicators asked for");
    for (int r = 0; r < ndev; ++r) {
        const int d = devlist ? devlist[r] : r;
        if (d < 0 || d >= emu::gpus())
            return fail(ncclInvalidArgument, "ncclCommInitAll: rank " + std::to_string(r) + " on GPU " +
                                                 std::to_string(d) + ", which does not exist");
        for (int q = 0; q < r; ++q)
            if ((devlist ? devlist[q] : q) == d)
                return fail(ncclInvalidUsage, "Duplicate GPU detected: rank " + std::to_string(q) + " and rank " +
                                                  std::to_string(r) + " both on CUDA device " + std::to_string(d));
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    const int clique = g_next_clique++;
    for (int r = 0; r < ndev; ++r) {
        comms[r] = new ncclComm{clique, r, ndev, devlist ? devlist[r] : r, false};
        g_live.insert(comms[r]);
    }
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c) {
    if (!live(c)) return fail(ncclInvalidArgument, "ncclCommFinalize of a communicator that is not live");
    c->finalized = true;
    return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!live(c)) return fail(ncclInvalidArgument, "ncclCommDestroy of a communicator that is not live");
    for (const Call& p : t_pending)
        if (p.comm == c) return fail(ncclInvalidUsage, "ncclCommDestroy of a communicator with calls in an open group");
    std::lock_guard<std::mutex> lock(g_mutex);
    g_live.erase(c);
    delete c;
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclSuccess;
    if (!live(c)) return fail(ncclInvalidArgument, "ncclCommAbort of a communicator that is not live");
    std::erase_if(t_pending, [c](const Call& p) { return p.comm == c; });
    std::lock_guard<std::mutex> lock(g_mutex);
    g_live.erase(c);
    delete c;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
    ++t_group_depth;
    return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
    if (t_group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--t_group_depth > 0) return ncclSuccess;
    std::vector<Call> calls;
    calls.swap(t_pending);
    return run_group(std::move(calls));
}

namespace {

// A collective call's checks, then queued in the open group (or run, on a one-rank communicator).
ncclResult_t enqueue(Call c) {
    const char* name = kind_name(c.kind);
    const std::string n = name;
    if (!live(c.comm)) return fail(ncclInvalidArgument, n + " on a communicator that is not live");
    if (c.comm->finalized) return fail(ncclInvalidUsage, n + " on a finalized communicator");
    const size_t bytes = type_bytes(c.type);
    if (bytes == 0 || c.op != ncclSum)
        return fail(ncclInvalidArgument, n + ": the emulator implements the sum of f32, bf16 and f16 only");
    if (c.count > SIZE_MAX / bytes) return fail(ncclInvalidArgument, n + ": count * element size overflows");
    if (c.root < 0 || c.root >= c.comm->nranks)
        return fail(ncclInvalidArgument, n + ": root " + std::to_string(c.root) + " of a " +
                                             std::to_string(c.comm->nranks) + "-rank communicator");
    if (emu::stream_gpu(c.stream) != c.comm->device)
        return fail(ncclInvalidArgument, n + ": a stream of GPU " + std::to_string(emu::stream_gpu(c.stream)) +
                                             " for the communicator of GPU " + std::to_string(c.comm->device));
    const bool root = c.comm->rank == c.root;
    const bool reads = c.kind != Kind::broadcast || root, writes = c.kind != Kind::reduce || root;
    std::string why;
    if (reads) why = emu::device_memory_of(c.send, c.count * bytes, c.comm->device, (n + " send buffer").c_str());
    if (why.empty() && writes)
        why = emu::device_memory_of(c.recv, c.count * bytes, c.comm->device, (n + " receive buffer").c_str());
    if (why.empty() && reads && writes && c.send != c.recv && overlap(c.send, c.recv, c.count * bytes))
        why = n + ": send and receive buffers overlap without being the same (in-place) buffer";
    if (!why.empty()) return fail(ncclInvalidArgument, why);
    if (c.count == 0) return ncclSuccess;
    if (t_group_depth > 0) {
        t_pending.push_back(c);
        return ncclSuccess;
    }
    if (c.comm->nranks > 1)
        return fail(ncclInvalidUsage, n + " of a " + std::to_string(c.comm->nranks) +
                                          "-rank communicator outside a group: the emulator needs every rank issued "
                                          "by one thread between ncclGroupStart and ncclGroupEnd");
    return issue({c});
}

}  // namespace

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    return enqueue({Kind::all_reduce, 0, comm, send, recv, count, type, op, stream});
}

ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    return enqueue({Kind::reduce, root, comm, send, recv, count, type, op, stream});
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    return enqueue({Kind::broadcast, root, comm, send, recv, count, type, ncclSum, stream});
}
