#include "mirrored/replica_threads.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "base/threads.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mirrored {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__)
    _mm_pause();
#endif
}

int usable_cores() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
    return int(std::max(1u, std::thread::hardware_concurrency()));
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Spins until done() or for about ns; true when done() held.
template <typename Done>
bool spin_until(Done done, int64_t ns) {
    if (ns <= 0) return false;
    const int64_t deadline = now_ns() + ns;
    for (int i = 0;; ++i) {
        if (done()) return true;
        cpu_relax();
        if ((i & 63) == 63 && now_ns() > deadline) return false;
    }
}
}  // namespace

ReplicaBarrier::ReplicaBarrier(int n) : n_(n), spin_ns_(n > 1 && n <= usable_cores() ? kSpinNs : 0) {}

void ReplicaBarrier::arrive_and_wait() {
    if (aborted_) throw BarrierAborted();
    arrivals_.fetch_add(1, std::memory_order_relaxed);
    if (n_ == 1) return;
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_.load();
    if (++waiting_ == n_) {
        waiting_ = 0;
        generation_.fetch_add(1);
        lock.unlock();
        cv_.notify_all();
        return;
    }
    lock.unlock();
    if (spin_until([&] { return generation_.load(std::memory_order_acquire) != gen || aborted_; }, spin_ns_)) {
        if (generation_.load() != gen) return;
        throw BarrierAborted();
    }
    lock.lock();
    cv_.wait(lock, [&] { return generation_.load() != gen || aborted_; });
    if (generation_.load() == gen) throw BarrierAborted();
}

void ReplicaBarrier::abort() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        aborted_ = true;
    }
    cv_.notify_all();
}

void ReplicaBarrier::reset() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = false;
    waiting_ = 0;
}

ReplicaThreads::ReplicaThreads(int n) : n_(n), barrier_(n), spin_ns_(barrier_.spin_ns()) {
    threads_.reserve(size_t(std::max(n - 1, 0)));
    try {
        for (int r = 1; r < n; ++r)
            threads_.push_back(start_thread("the thread of replica " + std::to_string(r) + " of " + std::to_string(n),
                                            [this, r] { loop(r); }));
    } catch (...) {
        stop();  // the replica threads already started
        throw;
    }
}

ReplicaThreads::~ReplicaThreads() { stop(); }

void ReplicaThreads::stop() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        quit_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
}

void ReplicaThreads::run(const std::function<void(int)>& fn) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        job_ = &fn;
        remaining_ = n_ - 1;
        error_ = nullptr;
        error_follows_on_ = false;
        ++job_generation_;
    }
    start_cv_.notify_all();
    run_one(fn, 0);
    spin_until([&] { return remaining_.load(std::memory_order_acquire) == 0; }, spin_ns_);
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return remaining_ == 0; });
    job_ = nullptr;
    if (error_) {
        barrier_.reset();
        std::rethrow_exception(error_);
    }
}

void ReplicaThreads::run_one(const std::function<void(int)>& fn, int r) {
    try {
        fn(r);
    } catch (const BarrierAborted&) {
        // another replica failed first; its exception is the one reported
    } catch (const FollowOnError&) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception(), error_follows_on_ = true;
        barrier_.abort();
    } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_ || error_follows_on_) error_ = std::current_exception(), error_follows_on_ = false;
        barrier_.abort();
    }
}

void ReplicaThreads::loop(int r) {
    uint64_t seen = 0;
    for (;;) {
        const std::function<void(int)>* job;
        spin_until([&] { return job_generation_.load(std::memory_order_acquire) != seen || quit_; }, spin_ns_);
        {
            std::unique_lock<std::mutex> lock(mu_);
            start_cv_.wait(lock, [&] { return quit_ || job_generation_ != seen; });
            if (quit_) return;
            seen = job_generation_;
            job = job_;
        }
        run_one(*job, r);
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (--remaining_ == 0) done_cv_.notify_all();
        }
    }
}

}  // namespace mirrored
