#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "base/error.h"
#include "base/philox.h"
#include "base/threads.h"

namespace mirrored {

HostAllocator HostAllocator::aligned() {
    return {[](size_t bytes) {
                void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
                if (!p) throw Error(kExitFailure, "loader: out of host memory");
                return p;
            },
            [](void* p) { std::free(p); }};
}

std::vector<uint32_t> Loader::permutation(size_t n, uint64_t seed, int64_t epoch) {
    std::vector<uint32_t> p(n);
    std::iota(p.begin(), p.end(), 0u);
    for (size_t i = n; i-- > 1;) {
        const Philox4 r = philox(seed, i, kStreamShuffle, static_cast<uint32_t>(epoch));
        const uint64_t x = (uint64_t(r.v[0]) << 32) | r.v[1];
        const size_t j = static_cast<size_t>((static_cast<unsigned __int128>(x) * (i + 1)) >> 64);
        std::swap(p[i], p[j]);
    }
    return p;
}

Loader::Loader(const Dataset& ds, const LoaderOptions& options, HostAllocator allocator)
    : ds_(ds), opt_(options), alloc_(std::move(allocator)) {
    if (opt_.global_batch <= 0) throw ConfigError("train.global_batch_size", "expected a positive integer");
    if (opt_.threads < 0) throw ConfigError("data.loader_threads", "expected a positive integer");
    if (opt_.prefetch <= 0) throw ConfigError("data.prefetch", "expected a positive integer");
    if (opt_.consumers <= 0) throw Error(kExitFailure, "loader: consumers must be positive");
    if (opt_.all_replicas > 0 && (opt_.first_replica < 0 || opt_.first_replica + opt_.consumers > opt_.all_replicas))
        throw Error(kExitFailure, "loader: the node's replicas lie outside the job's");
    if (opt_.augment.enabled() && ds_.shape.size() != 3)
        throw ConfigError("data.augment", "crop and flip need images (input shape [height, width, channels])");
    const size_t n = ds_.count();
    const size_t g = static_cast<size_t>(opt_.global_batch);
    batches_per_epoch_ = static_cast<int64_t>(opt_.drop_last ? n / g : (n + g - 1) / g);
    if (batches_per_epoch_ == 0)
        throw ConfigError("train.global_batch_size", "" + std::to_string(g) + " is larger than the " +
                                                         std::to_string(n) + " samples of " + ds_.name +
                                                         " (set data.drop_last: false or use a smaller batch)");
    slots_.resize(static_cast<size_t>(opt_.prefetch));
    for (size_t i = 0; i < slots_.size(); ++i) {
        Slot& s = slots_[i];
        if (opt_.gather_by_consumers) s.batch.samples = static_cast<uint32_t*>(alloc_.alloc(g * sizeof(uint32_t)));
        else s.batch.features = static_cast<float*>(alloc_.alloc(g * ds_.feature_size() * sizeof(float)));
        if (ds_.has_targets())
            s.batch.targets = static_cast<float*>(alloc_.alloc(g * size_t(ds_.target_size) * sizeof(float)));
        else s.batch.labels = static_cast<int32_t*>(alloc_.alloc(g * size_t(ds_.label_size) * sizeof(int32_t)));
        s.batch.slot = static_cast<int>(i);
        s.batch.owner = this;
    }
}

Loader::~Loader() {
    stop();
    for (Slot& s : slots_) {
        if (s.batch.features) alloc_.free(s.batch.features);
        if (s.batch.samples) alloc_.free(s.batch.samples);
        if (s.batch.labels) alloc_.free(s.batch.labels);
        if (s.batch.targets) alloc_.free(s.batch.targets);
    }
}

int Loader::rows_of(int64_t batch_index) const {
    const int64_t g = opt_.global_batch;
    const int64_t n = static_cast<int64_t>(ds_.count());
    return static_cast<int>(std::min(g, n - batch_index * g));
}

LoaderPosition Loader::position_of(int64_t seq) const {
    const int64_t flat = start_.batch + seq;
    return {start_.epoch + flat / batches_per_epoch_, flat % batches_per_epoch_};
}

LoaderPosition Loader::position() const {
    std::lock_guard<std::mutex> lock(mu_);
    return position_of(next_take_);
}

void Loader::start(LoaderPosition pos) {
    stop();
    if (pos.epoch < 0 || pos.batch < 0 || pos.batch >= batches_per_epoch_)
        throw CheckpointError("loader position (epoch " + std::to_string(pos.epoch) + ", batch " +
                              std::to_string(pos.batch) + ") is outside an epoch of " +
                              std::to_string(batches_per_epoch_) + " batches");
    {
        std::lock_guard<std::mutex> lock(mu_);
        start_ = pos;
        next_fill_ = next_take_ = 0;
        for (size_t i = 0; i < slots_.size(); ++i) {
            slots_[i].ready_seq = -1;
            slots_[i].free_for = static_cast<int64_t>(i);
            slots_[i].pending = 0;
        }
        stopping_ = false;
        error_ = nullptr;
    }
    workers_.reserve(size_t(std::max(opt_.threads, 0)));
    try {
        for (int t = 0; t < opt_.threads; ++t)
            workers_.push_back(
                start_thread("loader thread " + std::to_string(t + 1) + " of " + std::to_string(opt_.threads),
                             [this] { worker(); }));
    } catch (...) {
        stop_workers();  // those already started
        throw;
    }
}

void Loader::stop_workers() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    filled_cv_.notify_all();
    freed_cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
}

void Loader::stop() {
    stop_workers();
    std::unique_lock<std::mutex> lock(mu_);
    freed_cv_.wait(lock, [&] {
        for (const Slot& s : slots_)
            if (s.pending > 0) return false;
        return true;
    });
}

const Batch& Loader::next() {
    for (;;)
        if (const Batch* b = next_for(3600.0)) return *b;
}

const Batch* Loader::next_for(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    const int64_t seq = next_take_;
    Slot& slot = slots_[static_cast<size_t>(seq % opt_.prefetch)];
    if (opt_.threads == 0 && slot.ready_seq != seq && !stopping_) {
        // No workers: fill here, once every consumer has released the slot's previous batch.
        if (!freed_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                [&] { return slot.free_for == seq || stopping_; }))
            return nullptr;
        if (!stopping_) {
            lock.unlock();
            fill(slot, seq);  // throws to the caller
            lock.lock();
            slot.ready_seq = seq;
            next_fill_ = seq + 1;
        }
    }
    if (slot.ready_seq != seq && !error_) {
        const auto t0 = std::chrono::steady_clock::now();
        const bool ready = filled_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                               [&] { return slot.ready_seq == seq || error_ || stopping_; });
        wait_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
        if (!ready) return nullptr;
    }
    if (error_) std::rethrow_exception(error_);
    if (slot.ready_seq != seq) throw Error(kExitFailure, "loader: next() on a stopped loader");
    slot.pending = opt_.consumers;
    ++next_take_;
    return &slot.batch;
}

void Loader::release(const Batch& b) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        Slot& slot = slots_[static_cast<size_t>(b.slot)];
        if (--slot.pending > 0) return;
        slot.free_for = slot.ready_seq + opt_.prefetch;
    }
    freed_cv_.notify_all();
}

std::shared_ptr<const std::vector<uint32_t>> Loader::epoch_order(int64_t epoch) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = orders_.find(epoch);
        if (it != orders_.end()) return it->second;
    }
    std::vector<uint32_t> order;
    if (opt_.shuffle) order = permutation(ds_.count(), opt_.seed, epoch);
    else {
        order.resize(ds_.count());
        std::iota(order.begin(), order.end(), 0u);
    }
    auto shared = std::make_shared<const std::vector<uint32_t>>(std::move(order));
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = orders_.emplace(epoch, shared);
    while (orders_.size() > 3 && orders_.begin()->first < epoch) orders_.erase(orders_.begin());
    return it->second;
}

void Loader::worker() {
    for (;;) {
        int64_t seq;
        Slot* slot;
        {
            std::unique_lock<std::mutex> lock(mu_);
            if (stopping_) return;
            seq = next_fill_++;
            slot = &slots_[static_cast<size_t>(seq % opt_.prefetch)];
            freed_cv_.wait(lock, [&] { return stopping_ || slot->free_for == seq; });
            if (stopping_) return;
        }
        try {
            fill(*slot, seq);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!error_) error_ = std::current_exception();
            filled_cv_.notify_all();
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            slot->ready_seq = seq;
        }
        filled_cv_.notify_all();
    }
}

void Loader::fill(Slot& slot, int64_t seq) {
    const auto start = std::chrono::steady_clock::now();
    fill_rows(slot, seq);
    fill_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    filled_rows_ += slot.batch.rows;
    ++filled_batches_;
}

double Loader::seconds_per_sample() const {
    const int64_t rows = filled_rows_.load();
    return rows > 0 ? double(fill_ns_.load()) * 1e-9 / double(rows) : 0.0;
}

double Loader::seconds_per_batch() const {
    const int64_t batches = filled_batches_.load();
    return batches > 0 ? double(fill_ns_.load()) * 1e-9 / double(batches) : 0.0;
}

void Loader::fill_rows(Slot& slot, int64_t seq) {
    const LoaderPosition pos = position_of(seq);
    const auto order = epoch_order(pos.epoch);
    Batch& b = slot.batch;
    b.epoch = pos.epoch;
    b.index = pos.batch;
    b.global_rows = rows_of(pos.batch);
    const Shard part = opt_.all_replicas > 0
                           ? part_of(b.global_rows, opt_.all_replicas, opt_.first_replica, opt_.consumers)
                           : Shard{0, b.global_rows};
    b.rows = part.rows;
    b.first_row = part.begin;
    const size_t fs = ds_.feature_size();
    const size_t first = static_cast<size_t>(pos.batch) * static_cast<size_t>(opt_.global_batch) + size_t(part.begin);
    for (int r = 0; r < b.rows; ++r) {
        const uint32_t idx = (*order)[first + static_cast<size_t>(r)];
        if (b.targets)
            std::memcpy(b.targets + size_t(r) * size_t(ds_.target_size),
                        &ds_.targets[size_t(idx) * size_t(ds_.target_size)], size_t(ds_.target_size) * sizeof(float));
        else read_sample(ds_, idx, b.epoch, nullptr, b.labels + size_t(r) * size_t(ds_.label_size));
        if (opt_.gather_by_consumers) b.samples[r] = idx;
        else copy_sample(idx, b.epoch, b.features + size_t(r) * fs);
    }
}

void Loader::gather(const Batch& b, int begin, int rows, float* dst) const {
    if (!b.samples || begin < 0 || rows < 0 || begin > b.rows - rows)
        throw Error(kExitFailure, "loader: gather of rows outside the batch, or without gather_by_consumers");
    const size_t fs = ds_.feature_size();
    for (int r = 0; r < rows; ++r) copy_sample(b.samples[begin + r], b.epoch, dst + size_t(r) * fs);
}

void Loader::copy_sample(uint32_t idx, int64_t epoch, float* dst) const {
    const AugmentOptions& aug = opt_.augment;
    if (!aug.enabled()) return read_sample(ds_, idx, epoch, dst, nullptr);
    const float* src = ds_.source ? nullptr : ds_.features.data() + size_t(idx) * ds_.feature_size();
    if (ds_.source) {  // read where the crop can reach the whole image; one buffer per thread, kept
        thread_local std::vector<float> image;
        image.resize(ds_.feature_size());
        read_sample(ds_, idx, epoch, image.data(), nullptr);
        src = image.data();
    }
    // Crop offset and flip are a pure function of (seed, epoch, sample index).
    const int h = ds_.shape[0], w = ds_.shape[1], c = ds_.shape[2];
    const Philox4 rnd = philox(opt_.seed, idx, kStreamAugment, static_cast<uint32_t>(epoch));
    const int span = 2 * aug.crop_padding + 1;
    const int dy = aug.crop_padding ? int(rnd.v[0] % uint32_t(span)) - aug.crop_padding : 0;
    const int dx = aug.crop_padding ? int(rnd.v[1] % uint32_t(span)) - aug.crop_padding : 0;
    const bool flip = aug.horizontal_flip && (rnd.v[2] & 1u);
    auto pad = [&](float* out, int pixels) {
        for (int p = 0; p < pixels; ++p)
            for (int k = 0; k < c; ++k) out[size_t(p) * c + k] = ds_.pad_value.empty() ? 0.0f : ds_.pad_value[k];
    };
    for (int y = 0; y < h; ++y) {
        float* out = dst + size_t(y) * w * c;
        const int sy = y + dy;
        if (sy < 0 || sy >= h) {
            pad(out, w);
            continue;
        }
        const float* row = src + size_t(sy) * w * c;
        // output x reads source column (flip ? w-1-x : x) + dx; valid where that is in [0, w)
        const int lo = flip ? std::max(0, dx) : std::max(0, -dx);
        const int hi = flip ? std::min(w, w + dx) : std::min(w, w - dx);
        pad(out, lo);
        if (!flip) {
            std::memcpy(out + size_t(lo) * c, row + size_t(lo + dx) * c, size_t(hi - lo) * c * sizeof(float));
        } else {
            for (int x = lo; x < hi; ++x)
                std::memcpy(out + size_t(x) * c, row + size_t(w - 1 - x + dx) * c, size_t(c) * sizeof(float));
        }
        pad(out + size_t(hi) * c, w - hi);
    }
}

}  // namespace mirrored
