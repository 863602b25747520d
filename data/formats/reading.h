// What the format readers (data/formats/*.cpp) share: bounds on what a file may promise, the
// error a failed read becomes, label checks, up-front sizing, and the mapped array source that
// idx and npy both use. Not for code outside data/.
#pragma once

#include <cstdint>
#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/io.h"
#include "data/dataset.h"

namespace mirrored {

// What a reader may hold in memory: what the machine has left (else a generous fixed bound).
uint64_t memory_bound();

// Runs a reader, turning I/O errors into data errors.
template <typename F>
auto as_data_error(F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const InputError& e) {
        throw DataError(e.what());
    }
}

// The classes the labels need (the largest + 1); a label outside [0, limit) is refused.
int check_labels(const std::vector<int32_t>& labels, int limit, const std::string& path);

constexpr uint64_t kMaxSamples = uint64_t(INT32_MAX);  // sample indices are 32-bit in the loader
constexpr uint64_t kMaxFeatures = uint64_t(1) << 26;   // per sample: widths are ints, with room

// Sizes a data set's features and labels for `samples` samples up front, so that a reader fills
// them in place - no regrowing and copying as it goes, and pages that fault in huge instead of
// being collapsed afterwards. Only a capacity hint: above the bound a reader's own reads enforce
// (their clear error comes first) or without the memory for it, the data grows as it comes:
// returns false then.
bool reserve_samples(Dataset& ds, uint64_t samples, size_t features);

// An array as a .npy header describes it (idx images are described as the u8 array they are).
struct NpyArray {
    char kind = 0;  // b(ool), i(nt), u(int), f(loat)
    int itemsize = 0;
    bool big_endian = false;
    std::vector<uint64_t> shape;
    uint64_t count = 1;
    std::vector<unsigned char> bytes;
    double at(size_t i) const;                   // element i as a double
    double value(const unsigned char* p) const;  // the element at p (of this dtype) as a double
};

// The mapped array x (its data at `offset` in map) as ds's sample source.
void attach_mapped(Dataset& ds, const std::shared_ptr<const MappedFile>& map, const NpyArray& x, size_t offset);

}  // namespace mirrored
