// Host input that never blocks, never runs away and never reads more than it should:
// - only regular files are opened (a FIFO would block the open forever, /dev/zero never ends,
//   a directory is not a file), without blocking;
// - gzip input is inflated by hand, so that output is bounded and bytes after the compressed
//   stream (other than further gzip members) are an error, not silently ignored;
// - reads are bounded by what the format promises and by the memory available.
// Errors carry a message for the caller to wrap in its own error type (data, checkpoint, config).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mirrored {

// Why an input could not be read, "<path>: <what is wrong>"; the caller rethrows it as its own
// error type (DataError, CheckpointError, ConfigError) with the exit code that goes with it.
struct InputError : std::runtime_error {
    explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

// A regular file opened for reading, transparently inflating gzip (by its magic bytes).
class InputFile {
public:
    // Throws InputError: missing, not a regular file, unreadable. With inflate false, gzip data
    // is read as it is (formats that are never compressed).
    explicit InputFile(const std::string& path, bool inflate = true);
    // The same over bytes in memory (tests, fuzzing); `name` stands in for the path in messages.
    InputFile(const std::string& name, const unsigned char* data, size_t size, bool inflate = true);
    ~InputFile();
    InputFile(const InputFile&) = delete;
    InputFile& operator=(const InputFile&) = delete;

    const std::string& path() const { return path_; }
    bool compressed() const { return gz_ != nullptr; }
    uint64_t file_size() const { return file_size_; }  // on disk (compressed size for gzip)

    // Reads up to n bytes; returns how many (0 at the end). Throws InputError on corrupt gzip
    // data or bytes after the gzip stream that do not start another member.
    size_t read(void* dst, size_t n);
    // Appends exactly n bytes to out, or throws InputError("truncated ..." with what_for).
    void read_exact(std::vector<unsigned char>& out, size_t n, const std::string& what_for);
    // Appends everything that is left, throwing InputError once more than limit bytes arrive.
    void read_rest(std::vector<unsigned char>& out, size_t limit, const std::string& what_for);
    // True when nothing is left (reads one byte ahead to know).
    bool at_end();

private:
    struct Gz;
    void start(bool inflate);  // detects gzip by its magic bytes
    size_t read_raw(void* dst, size_t n);
    std::string path_;
    int fd_ = -1;
    const unsigned char* mem_ = nullptr;  // memory-backed when fd_ < 0
    size_t mem_size_ = 0, mem_pos_ = 0;
    uint64_t file_size_ = 0;
    std::unique_ptr<Gz> gz_;
    int peeked_ = -1;  // a byte read ahead by at_end()
};

// A regular file mapped read-only: the kernel reads pages as they are touched and may drop them
// again, so a file larger than memory can be read and nothing is copied into the process's heap.
// A file truncated by another process while mapped faults on access past its new end: a SIGBUS
// handler for the process's mappings names the file and exits with 3 (data), never a bare signal.
// (Data files are written atomically, by rename, by the project's scripts.)
class MappedFile {
public:
    explicit MappedFile(const std::string& path);  // InputError: missing, not regular, cannot map
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    const std::string& path() const { return path_; }
    const unsigned char* data() const { return data_; }
    size_t size() const { return size_; }
    // Read-ahead hint: sequential for one pass over the file, random for windows drawn anywhere.
    void advise_sequential(bool sequential) const;
    // Lets the pages read so far go from this process (they are read again from the file when next
    // touched): after a pass over the whole file, so that it does not stay resident.
    void drop_resident() const;

private:
    std::string path_;
    const unsigned char* data_ = nullptr;
    size_t size_ = 0;
};

// A whole regular file, not inflated (checkpoints, configs), at most max_bytes: InputError if the
// file is not regular, unreadable, or larger.
std::string read_regular_file(const std::string& path, uint64_t max_bytes);

// The tightest memory limit among the cgroups this process is in: each group on its path, from
// its own up to the root, in cgroup v2 (memory.max) and v1 (memory.limit_in_bytes), as a
// container, a Slurm job or `systemd-run -p MemoryMax=` sets one. proc_cgroup is the text of
// /proc/self/cgroup, mount the cgroup file system's root. limit 0: none.
struct CgroupMemory {
    uint64_t limit = 0, used = 0;  // bytes; used: by that group and its children now
    std::string file;              // the file the limit was read from
};
CgroupMemory cgroup_memory(const std::string& proc_cgroup, const std::string& mount = "/sys/fs/cgroup");
CgroupMemory process_cgroup_memory();  // this process's, read now

// Host memory this process may still allocate: MemAvailable, lowered by a cgroup limit when one
// is set. 0 if unknown.
uint64_t available_host_memory();
uint64_t machine_memory();                 // MemTotal (0 if unknown)
std::string format_bytes(uint64_t bytes);  // "3.2 GiB"
// A string as an error message shows it: control bytes - and bytes from 0x80 when escape_high, for
// text that is not valid UTF-8 - as \xNN, cut after `limit` bytes with "...".
std::string shown_text(std::string_view s, size_t limit, bool escape_high = false);

// Overflow-checked size arithmetic on untrusted numbers: false on overflow.
bool checked_mul(uint64_t a, uint64_t b, uint64_t& out);
bool checked_add(uint64_t a, uint64_t b, uint64_t& out);

}  // namespace mirrored
