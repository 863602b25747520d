// The nodes of a multi-node run: one mirrored process per node, launched by mpirun, each driving
// its local replicas exactly as a single-node run does, joined by MPI (Open MPI from the
// distribution). Global replica index = node x local replicas + local index.
//
// Nodes::join() finds out whether mpirun started this process; without MPI in the environment it
// returns nullptr and the program behaves exactly as a single-node run. The number of nodes is
// discovered, never configured.
//
// Every collective is bounded: a watchdog thread aborts the whole job (MPI_Abort, exit 5 on every
// rank) when one has waited longer than the timeout - a hung or stopped node must not hang the
// others. A node that dies is noticed by mpirun, which stops the job at once.
//
// Two kinds of collectives: those of the trainer's thread (metrics, flags, checksums, strings),
// and one gradient channel per local replica index, used concurrently by the replica threads
// (MPI_THREAD_MULTIPLE, one communicator per channel so that their messages never mix).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mirrored {

class Nodes {
public:
    // nullptr unless this process was started by mpirun with more than one process. Throws
    // DeviceError when it was, but this build has no MPI (or MPI cannot start).
    static std::unique_ptr<Nodes> join(int* argc, char*** argv);
    // Whether this build can join nodes (it was built with MPI).
    static bool available();
    ~Nodes();  // MPI_Finalize (the watchdog stops first)

    int rank() const { return rank_; }
    int count() const { return count_; }
    bool leader() const { return rank_ == 0; }  // the one writer of the run folder
    const std::string& host() const { return host_; }
    // "Open MPI v4.1.4" (callable before any join), or "none" in a build without MPI.
    static std::string library();

    // Collectives of the trainer's thread; every node calls the same ones in the same order.
    // `what` names the collective in a timeout's message.
    void sum(double* values, int n, const char* what);
    bool any(bool flag, const char* what);
    std::vector<std::string> all_gather(const std::string& mine, const char* what);
    std::vector<uint64_t> all_gather(const std::vector<uint64_t>& mine, const char* what);  // same size everywhere
    std::string broadcast(const std::string& from_leader, const char* what);
    void broadcast(float* data, size_t n, const char* what);  // from the leader

    // Gradient channels: `channels` (local replicas) of at most `elements` floats each; call once
    // before the replica threads use them. sum_channel(c, data, n): the sum over the nodes of every
    // node's channel c, in place; every node ends with the identical result (each element is summed
    // once, on one node, by reduce-scatter, then gathered).
    void open_channels(int channels, size_t elements);
    void sum_channel(int channel, float* data, size_t n);

    // Collectives that wait longer than this abort the job (strategy.collective_timeout_s).
    void set_timeout(double seconds);
    // The error path: prints nothing more, stops every node's process with this exit code.
    [[noreturn]] void abort(int code);

    struct Impl;

private:
    Nodes() = default;
    std::unique_ptr<Impl> impl_;
    int rank_ = 0, count_ = 1;
    std::string host_;
};

}  // namespace mirrored
