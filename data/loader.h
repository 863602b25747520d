// Threaded, prefetching loader of global batches.
//
// The unit is the global batch (as in MirroredStrategy); the strategy splits it into one
// contiguous shard per replica. Batch b of epoch e holds samples perm_e[b*G .. b*G+G), where
// perm_e is a Fisher-Yates shuffle drawn from Philox(seed, e): the order depends on nothing but
// (seed, epoch), whatever the number of loader threads or replicas.
//
// `threads` workers fill a ring of `prefetch` slots ahead of the consumer (0: the consumer's
// thread fills each batch when it asks for it). Slots are allocated once, through the given
// allocator (pinned host memory when replicas are GPUs). A slot returns to the ring when every
// consumer has released it, so a replica can keep a batch until its asynchronous host-to-device
// copy is done.
//
// With `gather_by_consumers` a slot holds the batch's sample indices and labels, not its
// features: each consumer copies its own rows with gather(), straight into its input buffer.
// CPU replicas use it - every core is a replica's, so a worker copying whole batches would only
// take time from them, and the rows would be copied twice (data set -> slot -> replica).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/dataset.h"

namespace mirrored {

struct AugmentOptions {
    int crop_padding = 0;  // random crop of the original size from the image padded by this
    bool horizontal_flip = false;
    bool enabled() const { return crop_padding > 0 || horizontal_flip; }
    bool operator==(const AugmentOptions&) const = default;
};

struct LoaderOptions {
    int global_batch = 128;
    int threads = 2;
    int prefetch = 4;
    bool drop_last = true;  // false: the last batch of an epoch may be smaller
    bool shuffle = true;
    uint64_t seed = 1;
    int consumers = 1;                 // releases needed before a slot is reused
    bool gather_by_consumers = false;  // slots hold sample indices; consumers gather() features
    // Multi-node: the process loads only its node's part of every global batch - the shards of
    // replicas [first_replica, first_replica + consumers) of all_replicas. 0: the whole batch.
    int all_replicas = 0;
    int first_replica = 0;
    AugmentOptions augment;
};

// Position of the next batch the consumer will receive.
struct LoaderPosition {
    int64_t epoch = 0;
    int64_t batch = 0;
    bool operator==(const LoaderPosition&) const = default;
};

struct Batch {
    int64_t epoch = 0, index = 0;   // index within the epoch
    int rows = 0;                   // rows held: the global batch, or this node's part of it
    int global_rows = 0;            // rows of the global batch
    int first_row = 0;              // global row of features[0]
    float* features = nullptr;      // [rows, feature_size]; nullptr when consumers gather()
    int32_t* labels = nullptr;      // [rows, label_size] class indexes; nullptr when the data set has targets
    float* targets = nullptr;       // [rows, target_size] when it has
    uint32_t* samples = nullptr;    // [rows] data set index of each row (gather_by_consumers only)
    int slot = -1;                  // the loader's ring slot (for release)
    class Loader* owner = nullptr;  // so a bare Batch* can be released (CUDA host callbacks)
};

// Replica r's contiguous shard of a global batch of `rows`: [begin, begin + rows). Shards differ
// in size by at most one row (only a final partial batch can make them differ).
struct Shard {
    int begin = 0, rows = 0;
};
inline Shard shard_of(int rows, int replicas, int r) {
    const int base = rows / replicas, extra = rows % replicas;
    return {r * base + (r < extra ? r : extra), base + (r < extra ? 1 : 0)};
}

// The rows of replicas [first, first + count) of `replicas`: one node's part of a global batch.
inline Shard part_of(int rows, int replicas, int first, int count) {
    const Shard a = shard_of(rows, replicas, first), b = shard_of(rows, replicas, first + count - 1);
    return {a.begin, b.begin + b.rows - a.begin};
}

struct HostAllocator {
    std::function<void*(size_t)> alloc;
    std::function<void(void*)> free;
    static HostAllocator aligned();  // plain 64-byte aligned host memory
};

class Loader {
public:
    Loader(const Dataset& ds, const LoaderOptions& options, HostAllocator allocator = HostAllocator::aligned());
    ~Loader();
    Loader(const Loader&) = delete;
    Loader& operator=(const Loader&) = delete;

    int64_t batches_per_epoch() const { return batches_per_epoch_; }
    int threads() const { return opt_.threads; }
    bool gathers() const { return opt_.gather_by_consumers; }  // consumers copy (and decode) their own rows
    int rows_of(int64_t batch_index) const;                    // global batch size, or less for a final partial batch
    const Dataset& dataset() const { return ds_; }

    // Starts (or restarts) the workers so that the next batch delivered is at `pos`.
    void start(LoaderPosition pos);
    // Blocks until the next batch is ready. Rethrows a worker's exception.
    const Batch& next();
    // The same, waiting at most timeout_s: nullptr when the batch is not ready by then (so a
    // caller can check on the devices whose callbacks free the slots, or on signals).
    const Batch* next_for(double timeout_s);
    // One consumer is done with the batch's memory. Thread-safe; callable from a CUDA host callback.
    void release(const Batch& b);
    // gather_by_consumers: copies the features of rows [begin, begin + rows) of a batch handed
    // out and not yet released (augmented as a worker would) to dst, [rows, feature_size].
    // Thread-safe: replicas gather their shards at once.
    void gather(const Batch& b, int begin, int rows, float* dst) const;
    LoaderPosition position() const;                                // of the batch next() will return
    double wait_seconds() const { return wait_ns_.load() * 1e-9; }  // time next() spent blocked
    void reset_wait() { wait_ns_ = 0; }
    // Seconds of one thread per sample filling batches, since start or reset_fill_time(): what a
    // sample costs the loader (read, decode, transform; with gather_by_consumers only its label).
    double seconds_per_sample() const;
    double seconds_per_batch() const;  // the same per global batch (this node's part of it)
    void reset_fill_time() { fill_ns_ = 0, filled_rows_ = 0, filled_batches_ = 0; }
    // Joins every worker, then waits until every batch handed out has been released by all its
    // consumers: a device copy still reading a slot (its release is a host callback queued behind
    // the copy) finishes before the slot's memory can go. The destructor stops too.
    void stop();
    // The error path after a device failure: joins the workers without waiting for releases that
    // may never come. Outstanding slots stay allocated; the caller keeps the Loader alive (or
    // leaks it) while device work might still release them.
    void stop_workers();

    // The sample order of one epoch (exposed for tests and tools).
    static std::vector<uint32_t> permutation(size_t n, uint64_t seed, int64_t epoch);

private:
    struct Slot {
        Batch batch;
        int64_t ready_seq = -1;  // sequence number whose data the slot holds
        int64_t free_for = 0;    // the slot may be filled with this sequence number
        int pending = 0;         // releases outstanding
    };
    LoaderPosition position_of(int64_t seq) const;
    void worker();
    void fill(Slot& slot, int64_t seq);  // fill_rows, timed
    void fill_rows(Slot& slot, int64_t seq);
    void copy_sample(uint32_t index, int64_t epoch, float* dst) const;  // augmented when enabled
    std::shared_ptr<const std::vector<uint32_t>> epoch_order(int64_t epoch);

    const Dataset& ds_;
    LoaderOptions opt_;
    HostAllocator alloc_;
    int64_t batches_per_epoch_ = 0;
    std::vector<Slot> slots_;
    LoaderPosition start_;
    int64_t next_fill_ = 0;  // next sequence number a worker claims
    int64_t next_take_ = 0;  // next sequence number the consumer takes
    std::map<int64_t, std::shared_ptr<const std::vector<uint32_t>>> orders_;
    mutable std::mutex mu_;
    std::condition_variable filled_cv_, freed_cv_;
    bool stopping_ = false;
    std::exception_ptr error_;
    std::vector<std::thread> workers_;
    std::atomic<int64_t> wait_ns_{0};
    std::atomic<int64_t> fill_ns_{0}, filled_rows_{0}, filled_batches_{0};
};

}  // namespace mirrored
