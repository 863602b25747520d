// Move-only owners of device memory and of host memory a device copies from asynchronously
// (pinned for CUDA devices). Copying is deleted to prevent performance accidents; trainer code
// never frees memory itself.
#pragma once

#include <cstddef>
#include <utility>

#include "kernels/device.h"

namespace mirrored {

template <typename T, bool kHost>
class OwnedBuffer {
public:
    OwnedBuffer() = default;
    OwnedBuffer(Device& dev, size_t count) : dev_(&dev), count_(count) {
        if (count)
            ptr_ =
                static_cast<T*>(kHost ? dev.alloc_host_bytes(count * sizeof(T)) : dev.alloc_bytes(count * sizeof(T)));
    }
    ~OwnedBuffer() { reset(); }
    OwnedBuffer(const OwnedBuffer&) = delete;
    OwnedBuffer& operator=(const OwnedBuffer&) = delete;
    OwnedBuffer(OwnedBuffer&& o) noexcept
        : dev_(o.dev_), ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
    OwnedBuffer& operator=(OwnedBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            dev_ = o.dev_;
            ptr_ = std::exchange(o.ptr_, nullptr);
            count_ = std::exchange(o.count_, 0);
        }
        return *this;
    }
    void reset() noexcept {
        if (ptr_) {
            if constexpr (kHost) dev_->free_host_bytes(ptr_);
            else dev_->free_bytes(ptr_);
        }
        ptr_ = nullptr;
        count_ = 0;
    }
    T* data() const { return ptr_; }
    size_t size() const { return count_; }
    size_t bytes() const { return count_ * sizeof(T); }
    Device* device() const { return dev_; }
    T& operator[](size_t i) const requires kHost { return ptr_[i]; }

private:
    Device* dev_ = nullptr;
    T* ptr_ = nullptr;
    size_t count_ = 0;
};

template <typename T>
using DeviceBuffer = OwnedBuffer<T, false>;
template <typename T>
using HostBuffer = OwnedBuffer<T, true>;  // host memory, pinned where the device benefits

}  // namespace mirrored
