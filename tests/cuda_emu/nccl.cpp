// The emulated GPU's NCCL: the calls kernels/cuda/nccl_group.cu makes, with NCCL's documented
// semantics for one process driving several GPUs, so that the nccl op's own code runs in the
// test suite. What is checked, because real NCCL would fail, hang or corrupt there:
// - ncclCommInitAll: valid, distinct GPUs ("Duplicate GPU detected" in NCCL);
// - ncclAllReduce: a live communicator not yet finalized; send and receive buffers of `count`
//   elements in device memory of the communicator's GPU, the same buffer or disjoint; a stream of
//   that GPU; a type and operation the emulator implements (sum of f32, bf16, f16);
// - one thread driving several ranks must issue them between ncclGroupStart and ncclGroupEnd
//   (NCCL: "Using multiple devices per thread ... requires group semantics", else it hangs); at
//   the group's end every rank of a communicator must have issued the same collectives, in the
//   same order, with the same count, type and operation (NCCL would hang or mix them);
// - under stream capture, the ranks' streams of one collective must be captured by the same
//   graph; the collective becomes one node after every rank's earlier work.
// The sum runs over the ranks in rank order, rounded to the element type after each addition as
// NCCL's reduction kernels do; every rank receives the same bits. Not emulated: communicators
// across processes (ncclGetUniqueId, ncclCommInitRank), other collectives, asynchronous errors,
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

struct Call {
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

// The sum over the ranks (rank order), written to every rank's receive buffer: read everything
// before writing anything, as the buffers may be the send buffers.
void reduce(const std::vector<Call>& ranks) {
    const Call& first = ranks[0];
    const cudaDataType t = cuda_type(first.type);
    std::vector<float> sum(first.count);
    for (size_t i = 0; i < first.count; ++i) {
        float acc = emu::load(first.send, t, i);
        for (size_t r = 1; r < ranks.size(); ++r) acc = emu::rounded(acc + emu::load(ranks[r].send, t, i), t);
        sum[i] = acc;
    }
    for (const Call& c : ranks)
        for (size_t i = 0; i < c.count; ++i) emu::store(c.recv, t, i, sum[i]);
}

// One collective: the calls of every rank of a communicator, checked against each other.
ncclResult_t issue(std::vector<Call> ranks) {
    const Call& a = ranks[0];
    for (const Call& c : ranks)
        if (c.count != a.count || c.type != a.type || c.op != a.op)
            return fail(ncclInvalidUsage,
                        "the ranks of one all-reduce differ in count, type or operation (NCCL would "
                        "hang or combine mismatched data)");
    std::vector<cudaStream_t> streams;
    for (const Call& c : ranks) streams.push_back(c.stream);
    const std::string why = emu::submit_collective(streams, [ranks] { reduce(ranks); });
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

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    if (!live(comm)) return fail(ncclInvalidArgument, "ncclAllReduce on a communicator that is not live");
    if (comm->finalized) return fail(ncclInvalidUsage, "ncclAllReduce on a finalized communicator");
    const size_t bytes = type_bytes(type);
    if (bytes == 0 || op != ncclSum)
        return fail(ncclInvalidArgument, "ncclAllReduce: the emulator implements the sum of f32, bf16 and f16 only");
    if (count > SIZE_MAX / bytes) return fail(ncclInvalidArgument, "ncclAllReduce: count * element size overflows");
    if (emu::stream_gpu(stream) != comm->device)
        return fail(ncclInvalidArgument, "ncclAllReduce: a stream of GPU " + std::to_string(emu::stream_gpu(stream)) +
                                             " for the communicator of GPU " + std::to_string(comm->device));
    std::string why = emu::device_memory_of(send, count * bytes, comm->device, "ncclAllReduce send buffer");
    if (why.empty()) why = emu::device_memory_of(recv, count * bytes, comm->device, "ncclAllReduce receive buffer");
    if (why.empty() && send != recv && overlap(send, recv, count * bytes))
        why = "ncclAllReduce: send and receive buffers overlap without being the same (in-place) buffer";
    if (!why.empty()) return fail(ncclInvalidArgument, why);
    if (count == 0) return ncclSuccess;
    const Call c{comm, send, recv, count, type, op, stream};
    if (t_group_depth > 0) {
        t_pending.push_back(c);
        return ncclSuccess;
    }
    if (comm->nranks > 1)
        return fail(ncclInvalidUsage, "ncclAllReduce of a " + std::to_string(comm->nranks) +
                                          "-rank communicator outside a group: the emulator needs every rank issued "
                                          "by one thread between ncclGroupStart and ncclGroupEnd");
    return issue({c});
}
