// One host thread per replica, and the barrier they meet at.
//
// Why a thread per replica: CPU replicas need one to compute in parallel at all, and CUDA
// replicas need one so that issuing eight GPUs' kernels is not serialised behind one host thread
// (launch cost, not GPU time, bounds small steps). The same code then drives both.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/error.h"

namespace mirrored {

struct BarrierAborted : std::runtime_error {
    BarrierAborted() : std::runtime_error("a replica failed; the others stopped at a barrier") {}
};

// An error that follows from another replica's failure (collectives it broke): run() reports it
// only when no replica's own error comes in the same job, so the cause is what the user reads.
struct FollowOnError : DeviceError {
    explicit FollowOnError(const std::string& w) : DeviceError(w) {}
};

// A reusable barrier that a failing replica can break, so the others never wait forever.
// Arrivals first spin for a bounded time (replicas usually arrive close together, and waking a
// sleeping thread costs tens of microseconds), but only when every replica thread can have a core
// to itself: with more replica threads than cores a spinning thread would steal the core the
// late replica needs, so they sleep at once.
class ReplicaBarrier {
public:
    static constexpr int64_t kSpinNs = 20'000;
    explicit ReplicaBarrier(int n);
    void arrive_and_wait();
    void abort();
    void reset();  // after an abort, once every thread has left
    int size() const { return n_; }
    int64_t spin_ns() const { return spin_ns_; }
    uint64_t arrivals() const { return arrivals_.load(); }  // arrive_and_wait calls, all threads

private:
    const int n_;
    int64_t spin_ns_ = 0;
    std::atomic<uint64_t> arrivals_{0};
    std::mutex mu_;
    std::condition_variable cv_;
    int waiting_ = 0;
    std::atomic<uint64_t> generation_{0};
    std::atomic<bool> aborted_{false};
};

// Runs fn(replica) on every replica's own thread and returns once all have returned. Replica 0's
// thread is the caller's: one thread hand-off fewer per call, and on a machine with as many
// cores as replicas no core sits with a thread that only waits. The first exception any replica
// throws is rethrown here (after the barrier is broken and all returned).
class ReplicaThreads {
public:
    explicit ReplicaThreads(int n);
    ~ReplicaThreads();
    ReplicaThreads(const ReplicaThreads&) = delete;
    ReplicaThreads& operator=(const ReplicaThreads&) = delete;

    void run(const std::function<void(int)>& fn);
    ReplicaBarrier& barrier() { return barrier_; }
    int size() const { return n_; }

private:
    void loop(int r);
    void stop();                                              // ends and joins the replica threads
    void run_one(const std::function<void(int)>& fn, int r);  // records the first failure
    const int n_;
    std::vector<std::thread> threads_;  // replicas 1..n-1
    ReplicaBarrier barrier_;
    std::mutex mu_;
    std::condition_variable start_cv_, done_cv_;
    const int64_t spin_ns_;  // the barrier's: only while every replica thread has a core
    // Written under mu_; atomic so that idle threads may spin on them before sleeping.
    const std::function<void(int)>* job_ = nullptr;
    std::atomic<uint64_t> job_generation_{0};
    std::atomic<int> remaining_{0};
    std::atomic<bool> quit_{false};
    std::exception_ptr error_;
    bool error_follows_on_ = false;  // error_ is a FollowOnError: a cause may replace it
};

}  // namespace mirrored
