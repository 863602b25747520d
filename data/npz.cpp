#include "data/npz.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/io.h"

namespace mirrored {

namespace {

constexpr uint32_t kEndOfDirectory = 0x06054b50, kZip64End = 0x06064b50, kZip64Locator = 0x07064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50, kLocalHeader = 0x04034b50;
constexpr uint64_t kMaxDirectoryBytes = uint64_t(64) << 20;

uint64_t le(const unsigned char* p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
    return v;
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
    throw DataError(path + ": not a readable .npz archive: " + what);
}

// Sizes and offsets stored as 0xFFFFFFFF are in the zip64 extra field, in this order.
void zip64_extra(const std::string& path, const unsigned char* extra, size_t n, NpzMember& m, bool need_size,
                 bool need_compressed, bool need_offset) {
    for (size_t at = 0; at + 4 <= n;) {
        const uint64_t id = le(extra + at, 2), len = le(extra + at + 2, 2);
        if (at + 4 + len > n) bad(path, "a member's extra field runs past its end");
        if (id == 1) {
            const unsigned char* p = extra + at + 4;
            size_t used = 0;
            auto take = [&](uint64_t& v) {
                if (used + 8 > len) bad(path, "a zip64 extra field too short for the sizes it replaces");
                v = le(p + used, 8);
                used += 8;
            };
            if (need_size) take(m.size);
            if (need_compressed) take(m.compressed);
            if (need_offset) take(m.header_offset);
            return;
        }
        at += 4 + len;
    }
    bad(path, "a member's size or offset is in a zip64 field that is missing");
}

}  // namespace

std::string array_name(const std::string& member) {
    if (member.size() > 4 && member.compare(member.size() - 4, 4, ".npy") == 0)
        return member.substr(0, member.size() - 4);
    return member;
}

std::vector<NpzMember> npz_members(const std::string& path, uint64_t file_size, const ReadAt& read) {
    // The end-of-directory record: in the last 22 bytes, or before a comment of up to 64 KiB.
    const size_t tail = size_t(std::min<uint64_t>(file_size, 22 + 65535));
    if (tail < 22) bad(path, std::to_string(file_size) + " bytes, shorter than a zip's end record");
    std::vector<unsigned char> t(tail);
    read(file_size - tail, tail, t.data());
    size_t end = tail - 22 + 1;
    do {
        --end;
    } while (end > 0 && le(t.data() + end, 4) != kEndOfDirectory);
    if (le(t.data() + end, 4) != kEndOfDirectory) bad(path, "no end-of-directory record (not a zip file)");
    const unsigned char* e = t.data() + end;
    uint64_t entries = le(e + 10, 2), dir_size = le(e + 12, 4), dir_offset = le(e + 16, 4);
    if (entries == 0xFFFF || dir_size == 0xFFFFFFFF || dir_offset == 0xFFFFFFFF) {  // zip64
        const uint64_t end_pos = file_size - tail + end;
        if (end_pos < 20) bad(path, "a zip64 archive without its locator");
        unsigned char loc[20];
        read(end_pos - 20, 20, loc);
        if (le(loc, 4) != kZip64Locator) bad(path, "a zip64 archive without its locator");
        const uint64_t rec = le(loc + 8, 8);
        if (rec > file_size || file_size - rec < 56) bad(path, "a zip64 end record outside the file");
        unsigned char r[56];
        read(rec, 56, r);
        if (le(r, 4) != kZip64End) bad(path, "a corrupt zip64 end record");
        entries = le(r + 32, 8);
        dir_size = le(r + 40, 8);
        dir_offset = le(r + 48, 8);
    }
    if (dir_offset > file_size || dir_size > file_size - dir_offset || dir_size > kMaxDirectoryBytes)
        bad(path, "its directory (" + std::to_string(dir_size) + " bytes at " + std::to_string(dir_offset) +
                      ") is not inside the file");
    std::vector<unsigned char> dir(static_cast<size_t>(dir_size));
    read(dir_offset, dir.size(), dir.data());
    std::vector<NpzMember> out;
    size_t at = 0;
    for (uint64_t i = 0; i < entries; ++i) {
        if (at + 46 > dir.size() || le(dir.data() + at, 4) != kDirectoryEntry)
            bad(path, "directory entry " + std::to_string(i) + " is corrupt or cut short");
        const unsigned char* d = dir.data() + at;
        const size_t name_len = size_t(le(d + 28, 2)), extra_len = size_t(le(d + 30, 2)),
                     comment_len = size_t(le(d + 32, 2));
        if (at + 46 + name_len + extra_len + comment_len > dir.size())
            bad(path, "directory entry " + std::to_string(i) + " runs past the directory");
        NpzMember m;
        m.name.assign(reinterpret_cast<const char*>(d + 46), name_len);
        if (le(d + 8, 2) & 1) bad(path, "member " + m.name + " is encrypted");
        m.method = uint16_t(le(d + 10, 2));
        m.crc = uint32_t(le(d + 16, 4));
        m.compressed = le(d + 20, 4);
        m.size = le(d + 24, 4);
        m.header_offset = le(d + 42, 4);
        const bool s = m.size == 0xFFFFFFFF, c = m.compressed == 0xFFFFFFFF, o = m.header_offset == 0xFFFFFFFF;
        if (s || c || o) zip64_extra(path, d + 46 + name_len, extra_len, m, s, c, o);
        out.push_back(std::move(m));
        at += 46 + name_len + extra_len + comment_len;
    }
    return out;
}

std::vector<unsigned char> read_npz_member(const std::string& path, uint64_t file_size, const ReadAt& read,
                                           const std::string& array, uint64_t memory_limit) {
    const std::vector<NpzMember> members = npz_members(path, file_size, read);
    const std::string where = path + ":" + array;
    auto it = std::find_if(members.begin(), members.end(),
                           [&](const NpzMember& m) { return m.name == array + ".npy" || m.name == array; });
    if (it == members.end()) {
        std::string names;
        for (const NpzMember& m : members) names += (names.empty() ? "" : ", ") + array_name(m.name);
        throw DataError(path + ": no array named '" + array + "' (it holds: " + (names.empty() ? "nothing" : names) +
                        ")");
    }
    const NpzMember& m = *it;
    if (m.method != 0 && m.method != 8)
        throw DataError(where + ": compression method " + std::to_string(m.method) +
                        " (numpy writes 0, stored, or 8, deflated)");
    if (m.size > memory_limit)
        throw DataError(where + ": " + std::to_string(m.size) + " bytes do not fit in the memory available");
    // deflate shrinks at most 1032:1: a larger claim is a bomb, refused before allocating
    if (m.method == 8 && (m.compressed == 0 || (m.size - std::min<uint64_t>(m.size, 1024)) / 1032 > m.compressed))
        throw DataError(where + ": " + std::to_string(m.compressed) + " deflated bytes cannot hold the " +
                        std::to_string(m.size) + " bytes the archive declares");
    if (m.header_offset > file_size || file_size - m.header_offset < 30)
        bad(path, "member " + m.name + "'s header is outside the file");
    unsigned char local[30];
    read(m.header_offset, 30, local);
    if (le(local, 4) != kLocalHeader) bad(path, "member " + m.name + "'s local header is corrupt");
    const uint64_t data = m.header_offset + 30 + le(local + 26, 2) + le(local + 28, 2);
    if (data > file_size || m.compressed > file_size - data) bad(path, "member " + m.name + " runs past the file");
    std::vector<unsigned char> out(static_cast<size_t>(m.size));
    if (m.method == 0) {
        if (m.compressed != m.size) bad(path, "stored member " + m.name + " with two different sizes");
        read(data, out.size(), out.data());
    } else {
        std::vector<unsigned char> packed(static_cast<size_t>(m.compressed));
        read(data, packed.size(), packed.data());
        z_stream z{};
        if (inflateInit2(&z, -MAX_WBITS) != Z_OK) throw DataError(where + ": zlib cannot start");
        size_t in_at = 0, out_at = 0;
        int rc = Z_OK;
        // in pieces of at most 1 GiB: z_stream counts in 32-bit words
        while (rc == Z_OK) {
            const size_t in_n = std::min<size_t>(packed.size() - in_at, size_t(1) << 30);
            const size_t out_n = std::min<size_t>(out.size() - out_at, size_t(1) << 30);
            z.next_in = packed.data() + in_at;
            z.avail_in = uInt(in_n);
            z.next_out = out.data() + out_at;
            z.avail_out = uInt(out_n);
            rc = inflate(&z, Z_NO_FLUSH);
            in_at += in_n - z.avail_in;
            out_at += out_n - z.avail_out;
            if (rc == Z_BUF_ERROR && (in_n == 0 || out_n == 0)) break;  // out of input or of room
        }
        inflateEnd(&z);
        if (rc != Z_STREAM_END || out_at != out.size())
            throw DataError(where + ": corrupt deflated data (" + std::to_string(out_at) + " of " +
                            std::to_string(out.size()) + " bytes inflated" +
                            (rc == Z_STREAM_END ? "" : ", stream unfinished") + ")");
    }
    uLong crc = crc32(0, nullptr, 0);
    for (size_t at = 0; at < out.size(); at += size_t(1) << 30)
        crc = crc32(crc, out.data() + at, uInt(std::min<size_t>(out.size() - at, size_t(1) << 30)));
    if (uint32_t(crc) != m.crc) throw DataError(where + ": CRC-32 mismatch: the member is corrupt");
    return out;
}

namespace {

// Calls f(file_size, read) over a regular file.
template <typename F>
auto over_file(const std::string& path, F&& f) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw DataError(path + ": cannot open (" + std::strerror(errno) + ")");
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) throw DataError(path + ": not a regular file");
    const ReadAt read = [&](uint64_t offset, size_t n, unsigned char* dst) {
        size_t got = 0;
        while (got < n) {
            const ssize_t r = ::pread(fd, dst + got, n - got, off_t(offset + got));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) throw DataError(path + ": read failed (" + std::strerror(errno) + ")");
            if (r == 0) throw DataError(path + ": truncated (a read at byte " + std::to_string(offset + got) + ")");
            got += size_t(r);
        }
    };
    return f(uint64_t(st.st_size), read);
}

}  // namespace

std::vector<std::string> npz_arrays(const std::string& path) {
    return over_file(path, [&](uint64_t size, const ReadAt& read) {
        std::vector<std::string> names;
        for (const NpzMember& m : npz_members(path, size, read)) names.push_back(array_name(m.name));
        return names;
    });
}

std::vector<unsigned char> read_npz_member(const std::string& path, const std::string& array) {
    return over_file(path, [&](uint64_t size, const ReadAt& read) {
        const uint64_t avail = available_host_memory();
        return read_npz_member(path, size, read, array, avail ? avail / 2 : uint64_t(1) << 40);
    });
}

}  // namespace mirrored
