// Move-only owners of device and host memory. Copying is deleted to prevent performance
// accidents; trainer code never calls free itself.
#pragma once

#include <cstddef>
#include <utility>

#include "kernels/device.h"

namespace mirrored {

template <typename T>
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(Device& dev, size_t count)
        : dev_(&dev), ptr_(count ? static_cast<T*>(dev.alloc_bytes(count * sizeof(T))) : nullptr),
          count_(count) {}
    ~DeviceBuffer() { reset(); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept
        : dev_(o.dev_), ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            dev_ = o.dev_;
            ptr_ = std::exchange(o.ptr_, nullptr);
            count_ = std::exchange(o.count_, 0);
        }
        return *this;
    }
    void reset() noexcept {
        if (ptr_) dev_->free_bytes(ptr_);
        ptr_ = nullptr;
        count_ = 0;
    }
    T* data() const { return ptr_; }
    size_t size() const { return count_; }
    size_t bytes() const { return count_ * sizeof(T); }
    Device* device() const { return dev_; }

private:
    Device* dev_ = nullptr;
    T* ptr_ = nullptr;
    size_t count_ = 0;
};

// Host memory a device can copy from asynchronously (pinned for CUDA devices).
template <typename T>
class HostBuffer {
public:
    HostBuffer() = default;
    HostBuffer(Device& dev, size_t count)
        : dev_(&dev),
          ptr_(count ? static_cast<T*>(dev.alloc_host_bytes(count * sizeof(T))) : nullptr),
          count_(count) {}
    ~HostBuffer() { reset(); }
    HostBuffer(const HostBuffer&) = delete;
    HostBuffer& operator=(const HostBuffer&) = delete;
    HostBuffer(HostBuffer&& o) noexcept
        : dev_(o.dev_), ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
    HostBuffer& operator=(HostBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            dev_ = o.dev_;
            ptr_ = std::exchange(o.ptr_, nullptr);
            count_ = std::exchange(o.count_, 0);
        }
        return *this;
    }
    void reset() noexcept {
        if (ptr_) dev_->free_host_bytes(ptr_);
        ptr_ = nullptr;
        count_ = 0;
    }
    T* data() const { return ptr_; }
    size_t size() const { return count_; }
    T& operator[](size_t i) const { return ptr_[i]; }

private:
    Device* dev_ = nullptr;
    T* ptr_ = nullptr;
    size_t count_ = 0;
};

}  // namespace mirrored
