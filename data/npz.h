// NumPy .npz archives (numpy.savez, numpy.savez_compressed): a zip file of .npy members. Only
// what numpy writes is read - stored or deflated members, zip64 sizes and offsets - never
// encrypted ones; each member is bounded by its declared size and the memory available, checked
// against its CRC-32, and named in errors as "<archive>:<member>".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mirrored {

// Reads n bytes at offset into dst, or throws DataError (the archive is cut short).
using ReadAt = std::function<void(uint64_t offset, size_t n, unsigned char* dst)>;

struct NpzMember {
    std::string name;  // as stored, e.g. "x.npy"
    uint16_t method = 0;
    uint32_t crc = 0;
    uint64_t compressed = 0, size = 0, header_offset = 0;
};

// The members listed in the archive's central directory.
std::vector<NpzMember> npz_members(const std::string& path, uint64_t file_size, const ReadAt& read);

// The member named `array` (numpy's key: "x" finds "x.npy"), whole; DataError naming the arrays
// the archive holds when there is none of that name.
std::vector<unsigned char> read_npz_member(const std::string& path, uint64_t file_size, const ReadAt& read,
                                           const std::string& array, uint64_t memory_limit);

// The same for a file on disk.
std::vector<unsigned char> read_npz_member(const std::string& path, const std::string& array);
// The arrays of an archive on disk, by numpy's keys ("x" for the member "x.npy").
std::vector<std::string> npz_arrays(const std::string& path);
std::string array_name(const std::string& member);

}  // namespace mirrored
