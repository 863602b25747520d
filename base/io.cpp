#include "base/io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <mutex>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace mirrored {

namespace {

constexpr size_t kInBuffer = size_t(1) << 16;

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw InputError(path + ": " + what); }

const char* file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO (named pipe)";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

// Opens a regular file without blocking (a FIFO's open would wait for a writer forever).
int open_regular(const std::string& path, uint64_t& size) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        fail(path, std::string("cannot stat: ") + std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(path, std::string("is ") + file_kind(st.st_mode) + ", expected a regular file");
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    size = uint64_t(st.st_size);
    return fd;
}

uint64_t read_number(const char* path) {
    std::ifstream in(path);
    std::string s;
    if (!(in >> s) || s == "max" || s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return 0;
    return std::stoull(s);
}

}  // namespace

bool checked_mul(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }
bool checked_add(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_add_overflow(a, b, &out); }

struct InputFile::Gz {
    z_stream z{};
    unsigned char in[kInBuffer];
    bool ended = false;  // the last member ended and nothing followed
    uint64_t members = 0;
};

InputFile::InputFile(const std::string& path, bool inflate) : path_(path) {
    fd_ = open_regular(path, file_size_);
    start(inflate);
}

InputFile::InputFile(const std::string& name, const unsigned char* data, size_t size, bool inflate)
    : path_(name), mem_(data), mem_size_(size), file_size_(size) {
    start(inflate);
}

void InputFile::start(bool inflate) {
    unsigned char magic[2];
    const size_t got = inflate ? read_raw(magic, 2) : 0;
    if (got == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        gz_ = std::make_unique<Gz>();
        if (inflateInit2(&gz_->z, 16 + MAX_WBITS) != Z_OK) fail(path_, "cannot initialise zlib");
        std::memcpy(gz_->in, magic, 2);
        gz_->z.next_in = gz_->in;
        gz_->z.avail_in = 2;
    } else if (fd_ >= 0) {
        ::lseek(fd_, 0, SEEK_SET);
    } else {
        mem_pos_ = 0;
    }
}

InputFile::~InputFile() {
    if (gz_) inflateEnd(&gz_->z);
    if (fd_ >= 0) ::close(fd_);
}

size_t InputFile::read_raw(void* dst, size_t n) {
    if (fd_ < 0) {
        const size_t k = std::min(n, mem_size_ - mem_pos_);
        if (k) std::memcpy(dst, mem_ + mem_pos_, k);
        mem_pos_ += k;
        return k;
    }
    size_t done = 0;
    while (done < n) {
        const ssize_t r = ::read(fd_, static_cast<char*>(dst) + done, n - done);
        if (r < 0) {
            if (errno == EINTR) continue;
            fail(path_, std::string("read failed: ") + std::strerror(errno));
        }
        if (r == 0) break;
        done += size_t(r);
    }
    return done;
}

size_t InputFile::read(void* dst, size_t n) {
    if (n == 0) return 0;
    size_t done = 0;
    if (peeked_ >= 0) {
        static_cast<unsigned char*>(dst)[0] = static_cast<unsigned char>(peeked_);
        peeked_ = -1;
        done = 1;
    }
    if (!gz_) return done + read_raw(static_cast<char*>(dst) + done, n - done);
    Gz& g = *gz_;
    while (done < n && !g.ended) {
        if (g.z.avail_in == 0) {
            g.z.next_in = g.in;
            g.z.avail_in = uInt(read_raw(g.in, kInBuffer));
        }
        g.z.next_out = static_cast<unsigned char*>(dst) + done;
        g.z.avail_out = uInt(std::min<size_t>(n - done, 1u << 30));
        const size_t before = g.z.avail_out;
        const int rc = inflate(&g.z, Z_NO_FLUSH);
        done += before - g.z.avail_out;
        if (rc == Z_STREAM_END) {
            ++g.members;
            // Another gzip member may follow (concatenated files are valid gzip); anything
            // else after the compressed data is an error rather than silently ignored.
            if (g.z.avail_in < 2) {
                if (g.z.avail_in == 1) g.in[0] = *g.z.next_in;
                const size_t more = read_raw(g.in + g.z.avail_in, kInBuffer - g.z.avail_in);
                g.z.avail_in += uInt(more);
                g.z.next_in = g.in;
            }
            if (g.z.avail_in == 0) {
                g.ended = true;
                break;
            }
            if (g.z.avail_in >= 2 && g.z.next_in[0] == 0x1f && g.z.next_in[1] == 0x8b) {
                inflateReset(&g.z);
                continue;
            }
            uint64_t trailing = g.z.avail_in;
            unsigned char sink[4096];
            for (size_t r; (r = read_raw(sink, sizeof sink)) > 0;) trailing += r;
            fail(path_, std::to_string(trailing) + " unexpected bytes after the compressed data");
        }
        if (rc == Z_BUF_ERROR && g.z.avail_in == 0) {  // no progress and no input left
            fail(path_, "truncated compressed data (the gzip stream ends early)");
        }
        if (rc != Z_OK && rc != Z_BUF_ERROR)
            fail(path_, std::string("corrupt compressed data (") +
                            (g.z.msg ? g.z.msg : "zlib error " + std::to_string(rc)) + ")");
    }
    return done;
}

void InputFile::read_exact(std::vector<unsigned char>& out, size_t n, const std::string& what_for) {
    // Grows as data arrives rather than reserving n up front: a header may lie about n.
    const size_t start = out.size();
    size_t got = 0;
    while (got < n) {
        const size_t chunk = std::min<size_t>(n - got, size_t(1) << 22);
        out.resize(start + got + chunk);
        const size_t r = read(out.data() + start + got, chunk);
        got += r;
        if (r < chunk) {
            out.resize(start + got);
            fail(path_, "truncated: " + what_for + " needs " + std::to_string(n) + " bytes, only " +
                            std::to_string(got) + " follow");
        }
    }
}

void InputFile::read_rest(std::vector<unsigned char>& out, size_t limit, const std::string& what_for) {
    // An uncompressed file says its size: one too large is refused before a byte is read (not
    // after filling the memory it may take; a 30 GB file took a minute here, and 11 GB of RAM).
    if (!gz_) {
        uint64_t left = mem_size_ - mem_pos_;
        if (fd_ >= 0) {
            const off_t at = ::lseek(fd_, 0, SEEK_CUR);
            left = at >= 0 && uint64_t(at) < file_size_ ? file_size_ - uint64_t(at) : 0;
        }
        left += peeked_ >= 0;
        if (left > limit - std::min(limit, out.size()))
            fail(path_, what_for + " is " + format_bytes(out.size() + left) + ", more than the " + format_bytes(limit) +
                            " it may take (the memory available or the format's bound)");
        out.reserve(out.size() + size_t(left));
    }
    for (;;) {
        const size_t start = out.size();
        size_t chunk = std::clamp<size_t>(start, size_t(1) << 16, size_t(1) << 24);  // grows with the file
        if (const size_t room = out.capacity() - start; room > 0) {
            chunk = std::min(chunk, room);  // fill what is reserved before growing
        } else if (!gz_ && at_end()) {
            return;  // all the size said: no reallocation only to find the end
        }
        out.resize(start + chunk);
        const size_t r = read(out.data() + start, chunk);
        out.resize(start + r);
        if (out.size() > limit)
            fail(path_,
                 what_for + " is larger than " + format_bytes(limit) + " (the memory available or the format's bound)");
        if (r == 0) return;
    }
}

bool InputFile::at_end() {
    if (peeked_ >= 0) return false;
    unsigned char b;
    if (read(&b, 1) == 0) return true;
    peeked_ = b;
    return false;
}

namespace {

// The live mappings, for the SIGBUS handler: a file cut short by another process while mapped
// faults on the first access past its new end. Instead of a bare signal (exit 135, no word), the
// handler names the file and ends the run as a data error (exit 3); every checkpoint written stays.
constexpr int kMaxMappings = 256;
struct MappingSlot {
    std::atomic<bool> taken{false};           // claimed by one mapping, then filled
    std::atomic<uintptr_t> begin{0}, end{0};  // begin set last: the slot is live once it is not 0
    std::atomic<const char*> path{nullptr};
};
MappingSlot g_mappings[kMaxMappings];
struct sigaction g_previous_sigbus {};  // the handler before ours (a sanitizer's, a library's)

void write_stderr(const char* s) {
    for (size_t n = std::strlen(s); n > 0;) {
        const ssize_t w = ::write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w;
        n -= size_t(w);
    }
}

void on_sigbus(int sig, siginfo_t* info, void*) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(info->si_addr);
    for (const MappingSlot& m : g_mappings) {
        const uintptr_t begin = m.begin.load(std::memory_order_acquire);
        if (!begin || at < begin || at >= m.end.load(std::memory_order_acquire)) continue;
        write_stderr("error: ");
        write_stderr(m.path.load(std::memory_order_acquire));
        write_stderr(
            ": the file was cut short while this run read it (truncated or rewritten in place by another "
            "process); restore it and run again: the run resumes from its last checkpoint\n");
        ::_exit(3);  // kExitData
    }
    ::sigaction(sig, &g_previous_sigbus, nullptr);  // not a mapped file's: the fault it is, as before
    ::raise(sig);
}

void watch_mapping(const void* data, size_t size, const std::string& path) {
    static std::once_flag installed;
    std::call_once(installed, [] {
        struct sigaction sa {};
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
    });
    for (MappingSlot& m : g_mappings) {
        bool free = false;
        if (!m.taken.compare_exchange_strong(free, true, std::memory_order_acq_rel)) continue;
        m.path.store(path.c_str(), std::memory_order_release);
        m.end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_release);
        m.begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
        return;
    }
    // more live mappings than slots: this one faults as a bare SIGBUS, as any mapping would
}

void unwatch_mapping(const void* data) {
    for (MappingSlot& m : g_mappings) {
        uintptr_t mine = reinterpret_cast<uintptr_t>(data);
        if (!m.begin.compare_exchange_strong(mine, 0, std::memory_order_acq_rel)) continue;
        m.taken.store(false, std::memory_order_release);
        return;
    }
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
    uint64_t size = 0;
    const int fd = open_regular(path, size);
    if (size > uint64_t(SIZE_MAX)) {
        ::close(fd);
        fail(path, "is " + format_bytes(size) + ", more than this process can map");
    }
    size_ = size_t(size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int e = errno;
            ::close(fd);
            fail(path, std::string("cannot map into memory: ") + std::strerror(e));
        }
        data_ = static_cast<const unsigned char*>(p);
        watch_mapping(data_, size_, path_);
    }
    ::close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
    if (!data_) return;
    unwatch_mapping(data_);
    ::munmap(const_cast<unsigned char*>(data_), size_);
}

void MappedFile::drop_resident() const {
    if (data_) ::madvise(const_cast<unsigned char*>(data_), size_, MADV_DONTNEED);
}

void MappedFile::advise_sequential(bool sequential) const {
    if (data_) ::madvise(const_cast<unsigned char*>(data_), size_, sequential ? MADV_SEQUENTIAL : MADV_RANDOM);
}

std::string read_regular_file(const std::string& path, uint64_t max_bytes) {
    uint64_t size = 0;
    const int fd = open_regular(path, size);
    if (size > max_bytes) {
        ::close(fd);
        fail(path, "is " + format_bytes(size) + ", more than the " + format_bytes(max_bytes) + " such a file may be");
    }
    std::string s(size_t(size), '\0');
    size_t done = 0;
    while (done < s.size()) {
        const ssize_t r = ::read(fd, s.data() + done, s.size() - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            const int e = errno;
            ::close(fd);
            fail(path, r < 0 ? std::string("read failed: ") + std::strerror(e) : "the file shrank while being read");
        }
        done += size_t(r);
    }
    ::close(fd);
    return s;
}

namespace {

uint64_t meminfo(const char* key) {
    std::ifstream in("/proc/meminfo");
    std::string name, unit;
    uint64_t kb = 0;
    while (in >> name >> kb >> unit)
        if (name == key) return kb * 1024;
    return 0;
}

}  // namespace

CgroupMemory cgroup_memory(const std::string& proc_cgroup, const std::string& mount) {
    CgroupMemory best;
    // One hierarchy: the group at `path` under `root` and each parent, reading limit_file.
    auto walk = [&](const std::string& root, std::string path, const char* limit_file, const char* used_file) {
        while (true) {
            const std::string dir = root + (path == "/" ? "" : path);
            uint64_t limit = read_number((dir + "/" + limit_file).c_str());
            if (limit >= (uint64_t(1) << 60)) limit = 0;  // v1 reports "unlimited" as a huge number
            if (limit > 0 && (best.limit == 0 || limit < best.limit)) {
                best.limit = limit;
                best.used = read_number((dir + "/" + used_file).c_str());
                best.file = dir + "/" + limit_file;
            }
            if (path.empty() || path == "/") return;
            const size_t slash = path.find_last_of('/');
            path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
        }
    };
    std::istringstream lines(proc_cgroup);
    std::string line;
    while (std::getline(lines, line)) {  // "id:controllers:path"
        const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
        if (b == std::string::npos) continue;
        const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",", path = line.substr(b + 1);
        if (path.empty() || path[0] != '/' || path.find("/..") != std::string::npos) continue;
        if (line.compare(0, a, "0") == 0 && controllers == ",,") {  // v2, alone or beside v1 (hybrid)
            walk(mount, path, "memory.max", "memory.current");
            walk(mount + "/unified", path, "memory.max", "memory.current");
        } else if (controllers.find(",memory,") != std::string::npos) {
            walk(mount + "/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes");
        }
    }
    return best;
}

CgroupMemory process_cgroup_memory() {
    std::ifstream in("/proc/self/cgroup");
    std::stringstream text;
    text << in.rdbuf();
    return cgroup_memory(text.str());
}

uint64_t available_host_memory() {
    // Read at most every 100 ms: callers ask per file, and /proc and cgroup reads are not free.
    static std::mutex mu;
    static uint64_t cached = 0;
    static std::chrono::steady_clock::time_point when;
    std::lock_guard<std::mutex> lock(mu);
    const auto now = std::chrono::steady_clock::now();
    if (cached != 0 && now - when < std::chrono::milliseconds(100)) return cached;
    uint64_t avail = meminfo("MemAvailable:");
    const CgroupMemory cg = process_cgroup_memory();
    if (cg.limit > 0) {
        const uint64_t room = cg.limit > cg.used ? cg.limit - cg.used : 0;
        avail = avail == 0 ? room : std::min(avail, room);
    }
    cached = avail;
    when = now;
    return avail;
}

uint64_t machine_memory() { return meminfo("MemTotal:"); }

std::string shown_text(std::string_view s, size_t limit, bool escape_high) {
    std::string out;
    for (unsigned char ch : s.substr(0, limit)) {
        if (ch < 0x20 || ch == 0x7f || (escape_high && ch >= 0x80)) {
            char e[8];
            std::snprintf(e, sizeof e, "\\x%02x", ch);
            out += e;
        } else {
            out += char(ch);
        }
    }
    return s.size() > limit ? out + "..." : out;
}

std::string format_bytes(uint64_t bytes) {
    char b[48];
    if (bytes >= (uint64_t(1) << 30)) std::snprintf(b, sizeof b, "%.1f GiB", double(bytes) / double(uint64_t(1) << 30));
    else if (bytes >= (uint64_t(1) << 20)) std::snprintf(b, sizeof b, "%.1f MiB", double(bytes) / double(1 << 20));
    else if (bytes >= 1024) std::snprintf(b, sizeof b, "%.1f KiB", double(bytes) / 1024.0);
    else std::snprintf(b, sizeof b, "%llu bytes", static_cast<unsigned long long>(bytes));
    return b;
}

}  // namespace mirrored
