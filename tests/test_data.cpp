// Data: every reader on files the tests write (good and each corrupt variant), preprocessing,
// and the loader's ordering, sharding, resume and augmentation guarantees.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "data/datasets.h"
#include "base/io.h"
#include "data/loader.h"
#include "base/error.h"
#include "tests/cli.h"
#include "tests/helpers.h"

using namespace mirrored;
using namespace mirrored::test;
namespace fs = std::filesystem;

namespace {

void write_bytes(const std::string& path, const std::vector<unsigned char>& b) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}
void write_gz(const std::string& path, const std::vector<unsigned char>& b) {
    gzFile f = gzopen(path.c_str(), "wb");
    REQUIRE(f != nullptr);
    gzwrite(f, b.data(), unsigned(b.size()));
    gzclose(f);
}

void put_be32(std::vector<unsigned char>& b, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}
std::vector<unsigned char> idx_images(uint32_t n, uint32_t h, uint32_t w) {
    std::vector<unsigned char> b{0, 0, 8, 3};
    put_be32(b, n);
    put_be32(b, h);
    put_be32(b, w);
    for (uint32_t i = 0; i < n * h * w; ++i) b.push_back(static_cast<unsigned char>(i * 7));
    return b;
}
std::vector<unsigned char> idx_labels(uint32_t n, int classes = 10) {
    std::vector<unsigned char> b{0, 0, 8, 1};
    put_be32(b, n);
    for (uint32_t i = 0; i < n; ++i) b.push_back(static_cast<unsigned char>(i % classes));
    return b;
}

// A dataset whose sample i has features (i, i, i): the loader's output names its samples.
Dataset indexed(size_t n) {
    Dataset ds;
    ds.name = "indexed";
    ds.shape = {3};
    ds.classes = 7;
    for (size_t i = 0; i < n; ++i) {
        for (int k = 0; k < 3; ++k) ds.features.push_back(float(i));
        ds.labels.push_back(int32_t(i % 7));
    }
    return ds;
}

std::vector<int> drain(Loader& l, int batches) {
    std::vector<int> out;
    for (int b = 0; b < batches; ++b) {
        const Batch& batch = l.next();
        for (int r = 0; r < batch.rows; ++r) {
            out.push_back(int(batch.features[r * 3]));
            CHECK(batch.labels[r] == int(batch.features[r * 3]) % 7);
        }
        l.release(batch);
    }
    return out;
}

}  // namespace

TEST_CASE("idx: reads images and labels, plain and gzip-compressed, scaled to [0,1]") {
    TempDir d;
    write_bytes(d / "img", idx_images(5, 4, 3));
    write_gz(d / "lab.gz", idx_labels(5));
    const Dataset ds = read_idx(d / "img", d / "lab.gz");
    CHECK(ds.count() == 5);
    CHECK(ds.shape == std::vector<int>{4, 3, 1});
    CHECK(ds.classes == 5);
    CHECK(ds.features[1] == doctest::Approx(7 / 255.0));
    CHECK(ds.labels[3] == 3);
}

TEST_CASE("idx: every corrupt variant stops with the path and what is wrong") {
    TempDir d;
    const auto img = idx_images(6, 4, 4);
    write_bytes(d / "lab", idx_labels(6));
    write_bytes(d / "img", img);
    auto expect = [&](const std::vector<unsigned char>& bytes, const char* what, bool gz = false) {
        const std::string p = d / (gz ? "bad.gz" : "bad");
        if (gz) write_gz(p, bytes);
        else write_bytes(p, bytes);
        CHECK_THROWS_WITH_AS(read_idx(p, d / "lab"), doctest::Contains(what), DataError);
        CHECK_THROWS_WITH_AS(read_idx(p, d / "lab"), doctest::Contains(p.c_str()), DataError);
    };
    CHECK_THROWS_WITH_AS(read_idx(d / "missing", d / "lab"), doctest::Contains("cannot open"), DataError);
    auto bad_magic = img;
    bad_magic[0] = 0x1f;
    expect(bad_magic, "not an IDX file");
    auto bad_type = img;
    bad_type[2] = 0x0D;
    expect(bad_type, "unsupported IDX element type");
    auto bad_rank = img;
    bad_rank[3] = 2;
    expect(bad_rank, "dimension");
    expect(std::vector<unsigned char>(img.begin(), img.end() - 10), "truncated");
    expect(std::vector<unsigned char>(img.begin(), img.begin() + 2), "too short");
    auto extra = img;
    extra.push_back(1);
    expect(extra, "unexpected bytes");
    expect(std::vector<unsigned char>(img.begin(), img.end() - 1), "truncated", true);
    // labels that disagree with the images
    write_bytes(d / "lab7", idx_labels(7));
    CHECK_THROWS_WITH_AS(read_idx(d / "img", d / "lab7"), doctest::Contains("7 labels, but"), DataError);
    // a gzip stream cut short, and one with corrupted bytes
    write_gz(d / "ok.gz", img);
    auto gz = read_file(d / "ok.gz");  // decompressed
    CHECK(gz == img);
    std::ifstream in(d / "ok.gz", std::ios::binary);
    std::vector<unsigned char> raw((std::istreambuf_iterator<char>(in)), {});
    write_bytes(d / "cut.gz", std::vector<unsigned char>(raw.begin(), raw.begin() + raw.size() / 2));
    CHECK_THROWS_WITH_AS(read_idx(d / "cut.gz", d / "lab"), doctest::Contains("cut.gz"), DataError);
    auto flipped = raw;
    for (size_t i = 20; i < flipped.size() - 10; i += 7) flipped[i] ^= 0x5a;
    write_bytes(d / "flip.gz", flipped);
    CHECK_THROWS_AS(read_idx(d / "flip.gz", d / "lab"), DataError);
}

TEST_CASE("idx: dimensions that overflow, exceed int or promise more than memory are refused before any read") {
    TempDir d;
    write_bytes(d / "lab", idx_labels(16));
    auto header = [](uint32_t n, uint32_t h, uint32_t w) {
        std::vector<unsigned char> b{0, 0, 8, 3};
        put_be32(b, n);
        put_be32(b, h);
        put_be32(b, w);
        return b;
    };
    write_bytes(d / "wrap", header(16, 1u << 30, 1u << 30));  // 16 * 2^60 wraps a 64-bit product
    CHECK_THROWS_WITH_AS(read_idx(d / "wrap", d / "lab"), doctest::Contains("more data than fits in memory"),
                         DataError);
    write_bytes(d / "neg", header(16, 0x80000000u, 1));  // >= 2^31 would become a negative int
    CHECK_THROWS_WITH_AS(read_idx(d / "neg", d / "lab"), doctest::Contains("more than 2^31 - 1"), DataError);
    write_bytes(d / "huge", header(1, 1u << 16, 1u << 16));
    CHECK_THROWS_WITH_AS(read_idx(d / "huge", d / "lab"), doctest::Contains("implausibly large"), DataError);
    write_bytes(d / "lie", header(16, 20000, 20000));  // promises 6.4 GB, has none
    CHECK_THROWS_AS(read_idx(d / "lie", d / "lab"), DataError);
}

TEST_CASE(
    "data files: FIFOs, devices and directories are refused without blocking; gzip trailing garbage is an error") {
    TempDir d;
    write_bytes(d / "lab", idx_labels(6));
    const std::string fifo = d / "fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    CHECK_THROWS_WITH_AS(read_idx(fifo, d / "lab"),
                         doctest::Contains("is a FIFO (named pipe), expected a regular file"), DataError);
    CHECK_THROWS_WITH_AS(read_csv(fifo, {}), doctest::Contains("FIFO"), DataError);
    CHECK_THROWS_WITH_AS(read_idx("/dev/zero", d / "lab"), doctest::Contains("/dev/zero: is a character device"),
                         DataError);
    CHECK_THROWS_WITH_AS(read_cifar10({d.path().string()}), doctest::Contains("is a directory"), DataError);
    // gzip: a second member is fine (concatenated .gz files are valid), garbage after it is not
    const auto img = idx_images(6, 4, 4);
    write_gz(d / "a.gz", std::vector<unsigned char>(img.begin(), img.begin() + 40));
    write_gz(d / "b.gz", std::vector<unsigned char>(img.begin() + 40, img.end()));
    std::vector<unsigned char> two;
    for (const char* f : {"a.gz", "b.gz"}) {
        std::ifstream in(d / f, std::ios::binary);
        two.insert(two.end(), std::istreambuf_iterator<char>(in), {});
    }
    write_bytes(d / "two.gz", two);
    CHECK(read_idx(d / "two.gz", d / "lab").count() == 6);
    auto garbage = two;
    for (unsigned char c : std::string("trailing garbage")) garbage.push_back(c);
    write_bytes(d / "garbage.gz", garbage);
    CHECK_THROWS_WITH_AS(read_idx(d / "garbage.gz", d / "lab"),
                         doctest::Contains("16 unexpected bytes after the compressed data"), DataError);
}

TEST_CASE(
    "InputFile::read_rest: a raw file over the bound is refused before a byte is read; gzip is bounded as it "
    "inflates") {
    TempDir d;
    const std::string big = d / "big.csv";
    { std::ofstream(big) << "x,y\n"; }
    fs::resize_file(big, uint64_t(3) << 30);  // sparse: 3 GiB on disk costs nothing
    {
        InputFile in(big);
        std::vector<unsigned char> out;
        CHECK_THROWS_WITH_AS(in.read_rest(out, size_t(1) << 20, "the CSV file"),
                             doctest::Contains("big.csv: the CSV file is 3.0 GiB, more than the 1.0 MiB it may take"),
                             InputError);
        CHECK(out.capacity() < (size_t(1) << 20));  // refused before anything was read into it
    }
    // within the bound: all of it, in its exact size (what at_end had peeked included)
    std::vector<unsigned char> bytes(100000);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7);
    write_bytes(d / "raw", bytes);
    for (const size_t head : {size_t(0), size_t(3)}) {
        InputFile in(d / "raw");
        std::vector<unsigned char> out;
        if (head) in.read_exact(out, head, "the head");
        CHECK(!in.at_end());
        in.read_rest(out, bytes.size(), "the rest");
        CHECK(out == bytes);
        CHECK(out.capacity() == bytes.size());  // reserved once, never grown past it
    }
    {
        InputFile in(d / "raw");
        std::vector<unsigned char> out;
        CHECK_THROWS_WITH_AS(in.read_rest(out, bytes.size() - 1, "the rest"),
                             doctest::Contains("is 97.7 KiB, more than"), InputError);
    }
    // compressed: the size is known only by inflating, and the bound stops it there
    write_gz(d / "raw.gz", bytes);
    InputFile gz(d / "raw.gz");
    std::vector<unsigned char> out;
    CHECK_THROWS_WITH_AS(gz.read_rest(out, 1000, "the rest"), doctest::Contains("is larger than 1000 bytes"),
                         InputError);
    InputFile whole(d / "raw.gz");
    out.clear();
    whole.read_rest(out, bytes.size(), "the rest");
    CHECK(out == bytes);
}

TEST_CASE("data: a test label outside the training labels' classes is a data error naming the labels file and record") {
    TempDir d;
    write_bytes(d / "img", idx_images(6, 4, 4));
    write_bytes(d / "lab", idx_labels(6, 3));
    auto bad = idx_labels(6, 3);
    bad[8 + 4] = 200;  // record 4
    write_bytes(d / "tlab", bad);
    DataConfig c = make_data_config(
        "idx", {{"train.images", "img"}, {"train.labels", "lab"}, {"test.images", "img"}, {"test.labels", "tlab"}});
    c.root = d.path().string();
    const std::string want = (d / "tlab") + ": label 200 of record 4 is not among the classes";
    CHECK_THROWS_WITH_AS(load_datasets(c, "", 1), doctest::Contains(want.c_str()), DataError);
}

// A mapped file cut short by another process while a run reads it: the access past its new end
// faults (SIGBUS); the handler names the file and exits 3, never a bare signal (exit 135). In a
// child, which only truncates and reads (no allocation after the fork).
TEST_CASE("mapped files: one truncated under the reader ends the process with exit 3 naming it") {
    TempDir d;
    const std::string path = d / "train.bin", err_path = d / "err.txt";
    write_bytes(path, std::vector<unsigned char>(3 * 4096, 7));
    const MappedFile map(path);
    REQUIRE(map.size() == 3 * 4096);
    const int err_fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const int file_fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE((err_fd >= 0 && file_fd >= 0));
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::dup2(err_fd, STDERR_FILENO);
        if (::ftruncate(file_fd, 100) != 0) ::_exit(90);
        volatile unsigned char last = map.data()[map.size() - 1];  // past the new end: SIGBUS
        (void)last;
        ::_exit(91);  // not reached
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    ::close(err_fd);
    ::close(file_fd);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == kExitData);
    const std::string said{std::istreambuf_iterator<char>(std::ifstream(err_path).rdbuf()), {}};
    CHECK(said.find("error: " + path + ": the file was cut short while this run read it") == 0);
}

TEST_CASE("csv: a UTF-8 byte-order mark is not part of the first field") {
    TempDir d;
    d.write("bom.csv", "\xEF\xBB\xBFlabel,x1,x2\n1,0.5,1\n0,1.5,2\n");
    Dataset ds = read_csv(d / "bom.csv", CsvOptions{{"label"}});
    CHECK(ds.labels == std::vector<int32_t>{1, 0});
    ds = read_csv(d / "bom.csv", CsvOptions{});  // found by its name, not taken from the last column
    CHECK(ds.labels == std::vector<int32_t>{1, 0});
    d.write("bom2.csv",
            "\xEF\xBB\xBF"
            "1,0.5,1\n0,1.5,2\n");  // no header: the first row is data
    CHECK(read_csv(d / "bom2.csv", CsvOptions{}).count() == 2);
    d.write("nul.csv", std::string("a,label\n1,0\n\0\x01,1\n", 16));
    CHECK_THROWS_WITH_AS(read_csv(d / "nul.csv", {}), doctest::Contains("nul.csv:3: a NUL byte"), DataError);
}

TEST_CASE("synthetic: sizes that overflow or exceed memory are a configuration error before allocation") {
    const DataConfig huge = make_data_config("synthetic", {{"input_shape", "[1048576, 1048576, 1048576]"}});
    CHECK_THROWS_WITH_AS(load_datasets(huge, "", 1), doctest::Contains("data.input_shape"), ConfigError);
    const DataConfig many = make_data_config("synthetic", {{"train_samples", std::to_string(uint64_t(1) << 32)}});
    CHECK_THROWS_WITH_AS(load_datasets(many, "", 1), doctest::Contains("are available"), ConfigError);
}

TEST_CASE("cifar10: reads records as HWC, rejects truncated files and bad labels") {
    TempDir d;
    std::vector<unsigned char> b;
    for (int r = 0; r < 3; ++r) {
        b.push_back(static_cast<unsigned char>(r + 2));
        for (int c = 0; c < 3; ++c)
            for (int p = 0; p < 1024; ++p) b.push_back(static_cast<unsigned char>(c * 50 + (p % 5)));
    }
    write_bytes(d / "data_batch_1.bin", b);
    const Dataset ds = read_cifar10({d / "data_batch_1.bin"});
    CHECK(ds.count() == 3);
    CHECK(ds.shape == std::vector<int>{32, 32, 3});
    CHECK(ds.labels[1] == 3);
    CHECK(ds.features[1] == doctest::Approx(50 / 255.0));  // pixel 0, channel G
    // several files in order, raw and gzip-compressed: the raw ones' records are counted up front
    // (the features sized once), the compressed one grows them; the same data either way
    write_gz(d / "data_batch_2.bin.gz", b);
    write_bytes(d / "data_batch_3.bin", b);
    const Dataset many = read_cifar10({d / "data_batch_1.bin", d / "data_batch_2.bin.gz", d / "data_batch_3.bin"});
    CHECK(many.count() == 9);
    CHECK(many.labels == std::vector<int32_t>{2, 3, 4, 2, 3, 4, 2, 3, 4});
    CHECK(std::vector<float>(many.features.begin() + 3 * 3072, many.features.begin() + 6 * 3072) ==
          std::vector<float>(ds.features.begin(), ds.features.end()));
    CHECK(std::vector<float>(many.features.begin() + 6 * 3072, many.features.end()) ==
          std::vector<float>(ds.features.begin(), ds.features.end()));
    write_bytes(d / "short.bin", std::vector<unsigned char>(b.begin(), b.end() - 100));
    CHECK_THROWS_WITH_AS(read_cifar10({d / "short.bin"}), doctest::Contains("not a whole number"), DataError);
    b[3073] = 11;
    write_bytes(d / "label.bin", b);
    CHECK_THROWS_WITH_AS(read_cifar10({d / "label.bin"}), doctest::Contains("label 11 of record 1"), DataError);
    CHECK_THROWS_WITH_AS(read_cifar10({d / "nope.bin"}), doctest::Contains("nope.bin: cannot open"), DataError);
}

TEST_CASE("csv: header detection, label by name or index, errors name the line") {
    TempDir d;
    d.write("a.csv", "x1, x2 ,kind\n0.5,1,2\n\n-1e-3,2.5,0\n3,4,1\n");
    Dataset ds = read_csv(d / "a.csv", CsvOptions{{"kind"}});
    CHECK(ds.count() == 3);
    CHECK(ds.shape == std::vector<int>{2});
    CHECK(ds.labels == std::vector<int32_t>{2, 0, 1});
    CHECK(ds.features[2] == doctest::Approx(-1e-3));
    CHECK(ds.classes == 3);
    d.write("b.csv", "1,0.5,0\n0,1.5,2\n");
    ds = read_csv(d / "b.csv", CsvOptions{{"0"}});
    CHECK(ds.labels == std::vector<int32_t>{1, 0});
    CHECK(ds.features == std::vector<float>{0.5f, 0.0f, 1.5f, 2.0f});
    ds = read_csv(d / "b.csv", CsvOptions{});  // no header: the last column
    CHECK(ds.labels == std::vector<int32_t>{0, 2});

    d.write("cols.csv", "a,b,label\n1,2,0\n1,2\n");
    CHECK_THROWS_WITH_AS(read_csv(d / "cols.csv", {}), doctest::Contains("cols.csv:3: expected 3 columns, found 2"),
                         DataError);
    d.write("nan.csv", "a,b,label\n1,2,0\n1,abc,1\n");
    CHECK_THROWS_WITH_AS(read_csv(d / "nan.csv", {}),
                         doctest::Contains("nan.csv:3: column 2 (b): 'abc' is not a finite number"), DataError);
    d.write("lab.csv", "a,label\n1,0.5\n");
    CHECK_THROWS_WITH_AS(read_csv(d / "lab.csv", {}), doctest::Contains("lab.csv:2: label '0.5'"), DataError);
    d.write("neg.csv", "a,label\n1,-1\n");
    CHECK_THROWS_WITH_AS(read_csv(d / "neg.csv", {}), doctest::Contains("not a non-negative integer"), DataError);
    d.write("empty.csv", "a,label\n");
    CHECK_THROWS_WITH_AS(read_csv(d / "empty.csv", {}), doctest::Contains("no data rows"), DataError);
    CHECK_THROWS_WITH_AS(read_csv(d / "a.csv", CsvOptions{{"nope"}}), doctest::Contains("no column named 'nope'"),
                         DataError);
    // a spreadsheet's quotes: the header names "label", and quoted numbers are numbers
    d.write("quoted.csv", "\"label\",\"x\"\n\"1\",\"0.5\"\n0,1.5\n");
    ds = read_csv(d / "quoted.csv", {});
    CHECK(ds.labels == std::vector<int32_t>{1, 0});
    CHECK(ds.features == std::vector<float>{0.5f, 1.5f});
    // lines ended by \r alone (old Mac programs)
    d.write("cr.csv", "a,label\r1,0\r2,1\r");
    ds = read_csv(d / "cr.csv", {});
    CHECK(ds.labels == std::vector<int32_t>{0, 1});
    // a class index too large to be one, said so; a float too small for a float is 0, too large refused
    d.write("big.csv", "a,label\n1,4294967296\n");
    CHECK_THROWS_WITH_AS(read_csv(d / "big.csv", {}),
                         doctest::Contains("big.csv:2: label '4294967296' is out of range"), DataError);
    d.write("tiny.csv", "a,label\n1e-50,0\n-2e-400,1\n");
    ds = read_csv(d / "tiny.csv", {});
    CHECK(ds.features == std::vector<float>{0.0f, 0.0f});
    d.write("huge.csv", "a,label\n1e39,0\n");
    CHECK_THROWS_WITH_AS(read_csv(d / "huge.csv", {}), doctest::Contains("'1e39' is beyond a 32-bit float's range"),
                         DataError);
}

TEST_CASE("csv: float targets from one or several label columns, for regression and multi-label losses") {
    TempDir d;
    d.write("t.csv", "x1,price,x2,tag\n0.5,10.25,1,1\n-1,-3.5,2,0\n");
    CsvOptions o;
    o.targets = true;
    o.label_columns = {"price"};
    Dataset ds = read_csv(d / "t.csv", o);
    CHECK(ds.count() == 2);
    CHECK(ds.target_size == 1);
    CHECK(ds.labels.empty());
    CHECK(ds.targets == std::vector<float>{10.25f, -3.5f});
    CHECK(ds.shape == std::vector<int>{3});
    CHECK(ds.features == std::vector<float>{0.5f, 1, 1, -1, 2, 0});
    o.label_columns = {"tag", "1"};  // by name and by index, in the order given
    ds = read_csv(d / "t.csv", o);
    CHECK(ds.target_size == 2);
    CHECK(ds.targets == std::vector<float>{1, 10.25f, 0, -3.5f});
    CHECK(ds.features == std::vector<float>{0.5f, 1, -1, 2});
    o.label_columns = {};  // the last column, as for class labels
    CHECK(read_csv(d / "t.csv", o).targets == std::vector<float>{1, 0});
    // a fingerprint sees the targets; class-labelled data is hashed as before they existed
    Dataset other = ds;
    other.targets[3] = -3.25f;
    CHECK(fingerprint(other) != fingerprint(ds));
    o.label_columns = {"tag", "tag"};
    CHECK_THROWS_WITH_AS(read_csv(d / "t.csv", o), doctest::Contains("label column 'tag' is named twice"), DataError);
    o.label_columns = {"x1", "price", "x2", "tag"};
    CHECK_THROWS_WITH_AS(read_csv(d / "t.csv", o), doctest::Contains("no features left"), DataError);
    o.targets = false;
    o.label_columns = {"tag", "price"};
    CHECK_THROWS_WITH_AS(read_csv(d / "t.csv", o), doctest::Contains("several label columns are float targets"),
                         DataError);
}

// The readers size their buffers with resize_features (CIFAR-10 grows one batch file at a time):
// as vector::resize, whatever the page advice - values kept, new ones zero.
TEST_CASE("resize_features keeps the values it has and zero-fills the rest, across huge-page-sized growth") {
    std::vector<float> f;
    resize_features(f, 1000);
    CHECK(std::all_of(f.begin(), f.end(), [](float v) { return v == 0.0f; }));
    for (const size_t n : {size_t(3) << 20, size_t(5) << 20, size_t(5) << 20}) {  // 12 MB, 20 MB, the same
        const size_t kept = f.size();
        for (size_t i = 0; i < kept; ++i) f[i] = float(i % 1000) + 0.5f;
        resize_features(f, n);
        REQUIRE(f.size() == n);
        bool same = true, zeros = true;
        for (size_t i = 0; i < kept; ++i) same = same && f[i] == float(i % 1000) + 0.5f;
        for (size_t i = kept; i < n; ++i) zeros = zeros && f[i] == 0.0f;
        CHECK(same);
        CHECK(zeros);
    }
}

TEST_CASE(
    "load_datasets: a data set large enough for huge pages keeps every value (the page hint changes no contents)") {
    // 3000 samples of 784: 9.4 MB, several whole 2 MiB pages
    DataConfig c = make_data_config(
        "synthetic", {{"input_shape", "[784]"}, {"classes", "10"}, {"train_samples", "3000"}, {"test_samples", "700"}});
    const Datasets d = load_datasets(c, "", 5);
    SyntheticOptions o;
    o.shape = {784};
    o.classes = 10;
    o.seed = 5;
    o.samples = 3000;
    Dataset want = make_synthetic(o);
    o.samples = 700;
    o.split = 1;
    Dataset want_test = make_synthetic(o);
    if (c.normalize != DataConfig::Normalize::none) {
        const Normalization n = compute_normalization(want);
        normalize(want, n);
        normalize(want_test, n);
    }
    CHECK(d.train.features == want.features);
    CHECK(d.test.features == want_test.features);
    CHECK(d.train.labels == want.labels);
}

TEST_CASE(
    "synthetic: deterministic by seed and for any thread count (every thread refused too), every class present, train "
    "and test share the rule") {
    SyntheticOptions o;
    o.shape = {20};
    o.classes = 5;
    o.samples = 2000;
    o.seed = 3;
    const Dataset a = make_synthetic(o), b = make_synthetic(o);
    CHECK(a.features == b.features);
    CHECK(a.labels == b.labels);
    for (int threads : {1, 3, 7}) {  // generated in ranges per thread: the same data for any count
        CAPTURE(threads);
        SyntheticOptions ot = o;
        ot.threads = threads;
        const Dataset c = make_synthetic(ot);
        CHECK(c.features == a.features);
        CHECK(c.labels == a.labels);
    }
    // The system refusing every thread (a child process as 'nobody' under a limit of 1): this
    // thread makes every range, the same data.
    if (const auto limit = thread_limit_as_nobody(1)) {
        int fds[2];
        REQUIRE(::pipe(fds) == 0);
        std::fflush(nullptr);
        const pid_t pid = ::fork();
        if (pid == 0) {
            ::close(fds[0]);
            apply_thread_limit(&*limit);
            char same = 0;
            try {  // nothing may leave the child but _exit: it would run the rest of the suite
                SyntheticOptions ot = o;
                ot.threads = 4;
                const Dataset c = make_synthetic(ot);
                same = c.features == a.features && c.labels == a.labels ? 1 : 0;
            } catch (...) {
                ::_exit(95);
            }
            ::_exit(::write(fds[1], &same, 1) == 1 ? 0 : 96);
        }
        ::close(fds[1]);
        char same = 0;
        CHECK(::read(fds[0], &same, 1) == 1);
        ::close(fds[0]);
        CHECK(wait_status_within(pid, 60) == 0);
        CHECK(same == 1);
    } else {
        MESSAGE("not run: refusing threads needs root and a user 'nobody'");
    }
    std::set<int> seen(a.labels.begin(), a.labels.end());
    CHECK(seen.size() == 5);
    o.split = 1;
    const Dataset t = make_synthetic(o);
    CHECK(t.features != a.features);
    // the rule is learnable: class means of train classify test far above chance (20%)
    std::vector<std::vector<double>> mean(5, std::vector<double>(20, 0.0));
    std::vector<int> count(5, 0);
    for (size_t i = 0; i < a.count(); ++i) {
        ++count[a.labels[i]];
        for (int j = 0; j < 20; ++j) mean[a.labels[i]][j] += a.features[i * 20 + j];
    }
    int correct = 0;
    for (size_t i = 0; i < t.count(); ++i) {
        int best = 0;
        double best_score = -1e30;
        for (int c = 0; c < 5; ++c) {
            double s = 0;
            for (int j = 0; j < 20; ++j) s += mean[c][j] / count[c] * t.features[i * 20 + j];
            if (s > best_score) best_score = s, best = c;
        }
        correct += best == t.labels[i];
    }
    CHECK(correct > int(t.count()) / 2);
}

TEST_CASE("normalisation: per-channel mean 0 and std 1 on the training set; pad value follows") {
    Dataset ds;
    ds.shape = {2, 2, 3};
    Rng rng(1);
    for (int i = 0; i < 50; ++i)
        for (int p = 0; p < 4; ++p)
            for (int c = 0; c < 3; ++c) ds.features.push_back(rng.uniform(1, 0.0f, 1.0f)[0] * (c + 1) + c);
    ds.labels.assign(50, 0);
    const Normalization n = compute_normalization(ds);
    normalize(ds, n);
    for (int c = 0; c < 3; ++c) {
        double s = 0, sq = 0;
        for (size_t i = c; i < ds.features.size(); i += 3)
            s += ds.features[i], sq += double(ds.features[i]) * ds.features[i];
        CHECK(s / 200 == doctest::Approx(0).epsilon(1e-5));
        CHECK(sq / 200 == doctest::Approx(1).epsilon(1e-4));
        CHECK(ds.pad_value[c] == doctest::Approx(-n.mean[c] / n.std[c]));
    }
    CHECK_THROWS_AS(normalize(ds, Normalization{{0.5f}, {1.0f}}), ConfigError);
}

TEST_CASE("loader: every sample exactly once per epoch across all replica shards") {
    const Dataset ds = indexed(1000);
    LoaderOptions o;
    o.global_batch = 96;
    o.threads = 3;
    o.prefetch = 3;
    o.seed = 5;
    Loader l(ds, o);
    l.start({});
    CHECK(l.batches_per_epoch() == 10);  // 40 samples dropped
    for (int epoch = 0; epoch < 2; ++epoch) {
        std::vector<int> seen(1000, 0);
        for (int b = 0; b < 10; ++b) {
            const Batch& batch = l.next();
            CHECK(batch.epoch == epoch);
            for (int replicas : {1, 3, 4, 8}) {  // shards tile the batch
                int covered = 0;
                for (int r = 0; r < replicas; ++r) {
                    const Shard s = shard_of(batch.rows, replicas, r);
                    CHECK(s.begin == covered);
                    covered += s.rows;
                }
                CHECK(covered == batch.rows);
            }
            for (int r = 0; r < batch.rows; ++r) ++seen[int(batch.features[r * 3])];
            l.release(batch);
        }
        CHECK(std::count(seen.begin(), seen.end(), 1) == 960);
        CHECK(std::count(seen.begin(), seen.end(), 0) == 40);
    }
}

TEST_CASE("loader: each node loads only its replicas' rows of every global batch, partial batches included") {
    const Dataset ds = indexed(100);
    LoaderOptions whole;
    whole.global_batch = 30;
    whole.drop_last = false;
    whole.seed = 4;
    Loader all(ds, whole);
    all.start({});
    // 3 nodes x 2 replicas: node k holds the shards of replicas 2k and 2k+1 of 6.
    std::vector<std::unique_ptr<Loader>> nodes;
    for (int k = 0; k < 3; ++k) {
        LoaderOptions o = whole;
        o.consumers = 2;
        o.all_replicas = 6;
        o.first_replica = 2 * k;
        nodes.push_back(std::make_unique<Loader>(ds, o));
        nodes.back()->start({});
    }
    for (int b = 0; b < 4; ++b) {  // the last batch has 10 rows: shards of 2 and 1
        const Batch& g = all.next();
        for (int k = 0; k < 3; ++k) {
            const Batch& part = nodes[size_t(k)]->next();
            const Shard first = shard_of(g.rows, 6, 2 * k), second = shard_of(g.rows, 6, 2 * k + 1);
            CHECK(part.global_rows == g.rows);
            CHECK(part.first_row == first.begin);
            CHECK(part.rows == first.rows + second.rows);
            for (int r = 0; r < part.rows; ++r) CHECK(part.features[r * 3] == g.features[(part.first_row + r) * 3]);
            nodes[size_t(k)]->release(part);
            nodes[size_t(k)]->release(part);
        }
        all.release(g);
    }
}

TEST_CASE("loader: the same order for 1, 2 and 4 threads; depends only on (seed, epoch)") {
    const Dataset ds = indexed(777);
    std::vector<std::vector<int>> orders;
    for (int threads : {1, 2, 4}) {
        LoaderOptions o;
        o.global_batch = 50;
        o.threads = threads;
        o.prefetch = 2 + threads;
        o.seed = 9;
        Loader l(ds, o);
        l.start({});
        orders.push_back(drain(l, 3 * 15));
    }
    CHECK(orders[0] == orders[1]);
    CHECK(orders[0] == orders[2]);
    CHECK(std::vector<int>(orders[0].begin(), orders[0].begin() + 750) !=
          std::vector<int>(orders[0].begin() + 750, orders[0].begin() + 1500));  // epochs differ
    CHECK(Loader::permutation(777, 9, 1) == Loader::permutation(777, 9, 1));
    CHECK(Loader::permutation(777, 9, 1) != Loader::permutation(777, 10, 1));
}

TEST_CASE("loader: a final partial batch when drop_last is false, split as evenly as possible") {
    const Dataset ds = indexed(100);
    LoaderOptions o;
    o.global_batch = 32;
    o.drop_last = false;
    Loader l(ds, o);
    CHECK(l.batches_per_epoch() == 4);
    CHECK(l.rows_of(3) == 4);
    l.start({});
    std::set<int> seen;
    for (int b = 0; b < 4; ++b) {
        const Batch& batch = l.next();
        CHECK(batch.rows == (b == 3 ? 4 : 32));
        for (int r = 0; r < batch.rows; ++r) seen.insert(int(batch.features[r * 3]));
        l.release(batch);
    }
    CHECK(seen.size() == 100);
    CHECK(shard_of(4, 3, 0).rows == 2);
    CHECK(shard_of(4, 3, 2).rows == 1);
    CHECK(shard_of(2, 4, 3).rows == 0);
    o.drop_last = true;
    o.global_batch = 101;
    CHECK_THROWS_WITH_AS(Loader(ds, o), doctest::Contains("train.global_batch_size"), ConfigError);
}

TEST_CASE("loader: position saved mid-epoch restores the exact continuation") {
    const Dataset ds = indexed(500);
    LoaderOptions o;
    o.global_batch = 64;
    o.threads = 2;
    o.seed = 4;
    Loader a(ds, o);
    a.start({});
    drain(a, 11);  // epoch 1, batch 4
    const LoaderPosition saved = a.position();
    CHECK(saved == LoaderPosition{1, 4});
    const auto rest = drain(a, 9);
    Loader b(ds, o);
    b.start(saved);
    CHECK(drain(b, 9) == rest);
    CHECK_THROWS_AS(b.start({0, 99}), CheckpointError);
}

TEST_CASE("loader: stop() waits for a release still owed by a late consumer; stop_workers() does not") {
    const Dataset ds = indexed(300);
    LoaderOptions o;
    o.global_batch = 10;
    o.threads = 4;
    o.prefetch = 2;
    o.consumers = 2;
    {
        Loader l(ds, o);
        l.start({});
        const Batch& b = l.next();
        l.release(b);  // one consumer done; the other (a device copy, say) still reads the slot
        std::atomic<bool> released{false};
        std::thread late([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            released = true;
            l.release(b);
        });
        l.stop();
        CHECK(released);  // stop() returned only after the last release
        late.join();
        CHECK(l.position() == LoaderPosition{0, 1});
    }
    Loader l(ds, o);
    l.start({});
    const Batch& held = l.next();
    l.stop_workers();  // the failure path: joins at once although the slot is still owed
    l.release(held);
    l.release(held);
}  // destroyed after the slot came back

TEST_CASE("augmentation: deterministic per (seed, epoch, sample); crop and flip move pixels") {
    Dataset ds;
    ds.shape = {4, 5, 2};
    ds.classes = 1;
    for (int i = 0; i < 8; ++i) {
        for (int p = 0; p < 40; ++p) ds.features.push_back(float(p));  // pixel value = its index
        ds.labels.push_back(0);
    }
    ds.pad_value = {-7.0f, -8.0f};
    LoaderOptions o;
    o.global_batch = 8;
    o.shuffle = false;
    o.augment.horizontal_flip = true;
    o.augment.crop_padding = 1;
    auto epoch_images = [&](int64_t epoch) {
        Loader l(ds, o);
        l.start({epoch, 0});
        const Batch& b = l.next();
        std::vector<float> v(b.features, b.features + 8 * 40);
        l.release(b);
        return v;
    };
    const auto e0 = epoch_images(0);
    CHECK(epoch_images(0) == e0);
    CHECK(epoch_images(1) != e0);
    // each output is the input shifted by (dy, dx) in [-1, 1], possibly mirrored, padded with pad_value
    for (int s = 0; s < 8; ++s) {
        const float* img = &e0[s * 40];
        bool matched = false;
        for (int flip = 0; flip < 2 && !matched; ++flip)
            for (int dy = -1; dy <= 1 && !matched; ++dy)
                for (int dx = -1; dx <= 1 && !matched; ++dx) {
                    bool ok = true;
                    for (int y = 0; y < 4; ++y)
                        for (int x = 0; x < 5; ++x)
                            for (int c = 0; c < 2; ++c) {
                                const int sy = y + dy, sx = (flip ? 4 - x : x) + dx;
                                const float want = (sy < 0 || sy >= 4 || sx < 0 || sx >= 5)
                                                       ? ds.pad_value[c]
                                                       : float((sy * 5 + sx) * 2 + c);
                                ok = ok && img[(y * 5 + x) * 2 + c] == want;
                            }
                    matched = ok;
                }
        CHECK(matched);
    }
}

TEST_CASE(
    "loader: consumers gathering their own rows get what a worker's copy holds (threads 0 and 2, augmented, node "
    "parts)") {
    Dataset ds;  // images, so that augmentation applies; sample i's pixels start at i * 1000
    ds.name = "images";
    ds.shape = {4, 5, 2};
    ds.classes = 3;
    for (int i = 0; i < 97; ++i) {
        for (int p = 0; p < 40; ++p) ds.features.push_back(float(i * 1000 + p));
        ds.labels.push_back(i % 3);
    }
    ds.pad_value = {-7.0f, -8.0f};
    for (bool augment : {false, true})
        for (int threads : {0, 2})
            for (int node : {-1, 1}) {  // -1: one process; 1: the second of 2 nodes x 2 replicas
                CAPTURE(augment);
                CAPTURE(threads);
                CAPTURE(node);
                LoaderOptions o;
                o.global_batch = 20;
                o.drop_last = false;  // 5 batches, the last of 17 rows
                o.seed = 5;
                o.consumers = 2;
                if (node >= 0) {
                    o.all_replicas = 4;
                    o.first_replica = 2 * node;
                }
                if (augment) {
                    o.augment.crop_padding = 1;
                    o.augment.horizontal_flip = true;
                }
                Loader copied(ds, o);
                o.gather_by_consumers = true;
                o.threads = threads;
                Loader gathered(ds, o);
                copied.start({1, 2});  // mid-run, as after a resume
                gathered.start({1, 2});
                for (int b = 0; b < 7; ++b) {  // across the epoch boundary
                    const Batch& want = copied.next();
                    const Batch& got = gathered.next();
                    REQUIRE(got.features == nullptr);
                    CHECK(got.epoch == want.epoch);
                    CHECK(got.index == want.index);
                    REQUIRE(got.rows == want.rows);
                    CHECK(got.first_row == want.first_row);
                    CHECK(std::equal(got.labels, got.labels + got.rows, want.labels));
                    // each consumer its shard, in any order, into its own buffer
                    for (int c = 1; c >= 0; --c) {
                        const Shard sh = shard_of(got.rows, 2, c);
                        std::vector<float> rows(size_t(sh.rows) * 40, -1.0f);
                        gathered.gather(got, sh.begin, sh.rows, rows.data());
                        CHECK(std::equal(rows.begin(), rows.end(), want.features + size_t(sh.begin) * 40));
                        gathered.release(got);
                    }
                    copied.release(want);
                    copied.release(want);
                }
                CHECK(gathered.position() == copied.position());
                std::vector<float> out(40);
                const Batch& b = gathered.next();
                CHECK_THROWS_AS(gathered.gather(b, b.rows, 1, out.data()), Error);  // past the end
                CHECK_THROWS_AS(gathered.gather(b, -1, 1, out.data()), Error);
                const Batch& c = copied.next();
                CHECK_THROWS_AS(copied.gather(c, 0, 1, out.data()), Error);  // not gathering
                for (int k = 0; k < 2; ++k) {                                // stop() waits for every release
                    gathered.release(b);
                    copied.release(c);
                }
            }
}

TEST_CASE(
    "loader: without workers, next_for() fills on the caller's thread and gives up at the timeout while a slot is "
    "still held") {
    const Dataset ds = indexed(100);
    LoaderOptions o;
    o.global_batch = 10;
    o.threads = 0;
    o.prefetch = 2;
    Loader l(ds, o);
    l.start({});
    LoaderOptions w = o;
    w.threads = 1;
    Loader ref(ds, w);
    ref.start({});
    CHECK(drain(l, 13) == drain(ref, 13));  // across an epoch
    const Batch* a = l.next_for(1.0);
    const Batch* b = l.next_for(1.0);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(l.next_for(0.05) == nullptr);  // both slots held: no hang, no batch
    const int64_t first = a->index;
    l.release(*a);
    const Batch* c = l.next_for(1.0);
    REQUIRE(c);
    CHECK(c->index == (first + 2) % 10);
    l.release(*b);
    l.release(*c);
}

TEST_CASE("Fashion-MNIST files, when installed: 60000/10000 samples, 28x28, 10 classes") {
    const DataConfig c;  // the defaults name the Fashion-MNIST files
    const std::string probe = resolve_data_path(c, "", data_format_options(c)->fields()[0].second);  // train.images
    if (!fs::exists(probe)) {
        mark_skipped(probe + " not installed (package dataset-fashion-mnist, or set MIRRORED_DATA_DIR)");
        return;
    }
    const Datasets d = load_datasets(c, "", 1);
    CHECK(d.train.count() == 60000);
    CHECK(d.test.count() == 10000);
    CHECK(d.train.shape == std::vector<int>{28, 28, 1});
    CHECK(d.train.classes == 10);
    CHECK(d.normalization.mean[0] == doctest::Approx(0.286).epsilon(0.01));
    CHECK(d.normalization.std[0] == doctest::Approx(0.353).epsilon(0.01));
}

namespace {

// A .npy file as numpy.save writes it: magic, version, header length, the dict padded to 64 bytes.
std::string npy_bytes(const std::string& descr, const std::string& shape, const std::string& data, int version = 1,
                      const std::string& order = "False") {
    std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + order + ", 'shape': " + shape + ", }";
    const size_t prefix = version == 1 ? 10 : 12;
    while ((prefix + dict.size() + 1) % 64) dict += ' ';
    dict += '\n';
    std::string out = "\x93NUMPY";
    out += char(version);
    out += '\0';
    const uint32_t n = uint32_t(dict.size());
    for (size_t b = 0; b < (version == 1 ? 2u : 4u); ++b) out += char((n >> (8 * b)) & 0xff);
    return out + dict + data;
}
template <typename T>
std::string raw(const std::vector<T>& v, bool big_endian = false) {
    std::string s;
    for (T x : v) {
        char b[sizeof(T)];
        std::memcpy(b, &x, sizeof(T));
        if (big_endian) std::reverse(b, b + sizeof(T));
        s.append(b, sizeof(T));
    }
    return s;
}
template <typename T>
std::string raw(std::initializer_list<T> v, bool big_endian = false) {
    return raw(std::vector<T>(v), big_endian);
}

}  // namespace

namespace {

// A zip archive as numpy.savez writes one: members stored (method 0) or deflated (method 8). zip64:
// as Python's zipfile writes archives past 4 GiB - every size and offset 0xFFFFFFFF, the values
// in zip64 extra fields, and the zip64 end record and its locator before the end record.
struct ZipMember {
    std::string name, data;
    bool deflate = false;
};
std::string zip_bytes(const std::vector<ZipMember>& members, bool zip64 = false) {
    auto le = [](std::string& s, uint64_t v, int n) {
        for (int i = 0; i < n; ++i) s.push_back(char((v >> (8 * i)) & 0xff));
    };
    std::string out, dir;
    for (const ZipMember& m : members) {
        std::string body = m.data;
        if (m.deflate) {
            z_stream z{};
            REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
            body.assign(deflateBound(&z, uLong(m.data.size())), '\0');
            z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(m.data.data()));
            z.avail_in = uInt(m.data.size());
            z.next_out = reinterpret_cast<Bytef*>(body.data());
            z.avail_out = uInt(body.size());
            REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
            body.resize(z.total_out);
            deflateEnd(&z);
        }
        const uint32_t crc = uint32_t(crc32(0, reinterpret_cast<const Bytef*>(m.data.data()), uInt(m.data.size())));
        const uint64_t offset = out.size();
        for (std::string* h : {&out, &dir}) {
            const bool central = h == &dir;
            const uint64_t wide = 0xFFFFFFFF;
            le(*h, central ? 0x02014b50 : 0x04034b50, 4);
            if (central) le(*h, zip64 ? 45 : 20, 2);  // version made by
            le(*h, zip64 ? 45 : 20, 2);               // version needed
            le(*h, 0, 2);                             // flags
            le(*h, m.deflate ? 8 : 0, 2);
            le(*h, 0, 4);  // time, date
            le(*h, crc, 4);
            le(*h, zip64 ? wide : body.size(), 4);
            le(*h, zip64 ? wide : m.data.size(), 4);
            le(*h, m.name.size(), 2);
            std::string extra;  // zip64: uncompressed size, compressed size (and the offset, centrally)
            if (zip64) {
                le(extra, 1, 2);
                le(extra, central ? 24 : 16, 2);
                le(extra, m.data.size(), 8);
                le(extra, body.size(), 8);
                if (central) le(extra, offset, 8);
            }
            le(*h, extra.size(), 2);
            if (central) {
                le(*h, 0, 2);  // comment
                le(*h, 0, 4);  // disk, internal attributes
                le(*h, 0, 4);  // external attributes
                le(*h, zip64 ? wide : offset, 4);
            }
            *h += m.name;
            *h += extra;
        }
        out += body;
    }
    const uint64_t dir_offset = out.size();
    out += dir;
    if (zip64) {
        const uint64_t record = out.size();
        le(out, 0x06064b50, 4);  // the zip64 end record
        le(out, 44, 8);          // its size after this field
        le(out, 45, 2);
        le(out, 45, 2);
        le(out, 0, 8);  // this disk, the directory's
        le(out, members.size(), 8);
        le(out, members.size(), 8);
        le(out, dir.size(), 8);
        le(out, dir_offset, 8);
        le(out, 0x07064b50, 4);  // its locator
        le(out, 0, 4);
        le(out, record, 8);
        le(out, 1, 4);
    }
    le(out, 0x06054b50, 4);
    le(out, 0, 4);
    le(out, zip64 ? 0xFFFF : members.size(), 2);
    le(out, zip64 ? 0xFFFF : members.size(), 2);
    le(out, zip64 ? 0xFFFFFFFF : dir.size(), 4);
    le(out, zip64 ? 0xFFFFFFFF : dir_offset, 4);
    le(out, 0, 2);
    return out;
}

}  // namespace

TEST_CASE("npy: features and labels of any numeric dtype, images, targets; hostile headers refused") {
    TempDir d;
    // float32 features (N=3, F=2), int64 labels
    d.write("x.npy", npy_bytes("<f4", "(3, 2)", raw<float>({0.5f, 1, 2, 3, 4, -5})));
    d.write("y.npy", npy_bytes("<i8", "(3,)", raw<int64_t>({0, 2, 1})));
    Dataset ds = read_npy(d / "x.npy", d / "y.npy", false);
    CHECK(ds.shape == std::vector<int>{2});
    CHECK(ds.features == std::vector<float>{0.5f, 1, 2, 3, 4, -5});
    CHECK(ds.labels == std::vector<int32_t>{0, 2, 1});
    CHECK(ds.classes == 3);
    // uint8 images (N, H, W) as pixels in [0, 1]; big-endian int32 labels; format version 2
    d.write("img.npy", npy_bytes("|u1", "(2, 1, 2)", std::string("\x00\xff\x33\x66", 4), 2));
    d.write("lab.npy", npy_bytes(">i4", "(2,)", raw<int32_t>({1, 0}, true)));
    ds = read_npy(d / "img.npy", d / "lab.npy", false);
    CHECK(ds.shape == std::vector<int>{1, 2, 1});
    CHECK(ds.features ==
          std::vector<float>{0.0f, 255 * (1.0f / 255.0f), 0x33 * (1.0f / 255.0f), 0x66 * (1.0f / 255.0f)});
    CHECK(ds.labels == std::vector<int32_t>{1, 0});
    // float64 targets (N, 2) for a regression loss; float16 features
    d.write("h.npy", npy_bytes("<f2", "(2, 1)", raw<uint16_t>({0x3c00, 0xc000})));  // 1.0, -2.0
    d.write("t.npy", npy_bytes("<f8", "(2, 2)", raw<double>({0.25, 1, -3, 4})));
    ds = read_npy(d / "h.npy", d / "t.npy", true);
    CHECK(ds.features == std::vector<float>{1.0f, -2.0f});
    CHECK(ds.target_size == 2);
    CHECK(ds.targets == std::vector<float>{0.25f, 1, -3, 4});
    // through the config, as a run reads it
    const DataConfig c = make_data_config("npy", {{"train.features", d / "x.npy"},
                                                  {"train.labels", d / "y.npy"},
                                                  {"test.features", d / "x.npy"},
                                                  {"test.labels", d / "y.npy"}});
    CHECK(load_datasets(c, "", 1).train.count() == 3);
    // and trained on, end to end
    const std::string cfg = d.write("npy.yaml", R"(run: {name: npy}
strategy: {devices: "cpu:1"}
data: {dataset: npy, train: {features: x.npy, labels: y.npy}, test: {features: x.npy, labels: y.npy}}
model: {layers: [{type: dense, units: 3}]}
train: {epochs: 2, global_batch_size: 3}
)");
    CHECK(run_cli({"train", cfg, "--output", d / "run"}) == kExitOk);
    CHECK(fs::exists(d / "run/summary.json"));

    struct Bad {
        std::string file, want;
    };
    const std::string lab3 = d.write("lab3.npy", npy_bytes("<i8", "(3,)", raw<int64_t>({0, 1, 0})));
    for (const Bad& b : {
             Bad{npy_bytes("|O", "(3, 2)", std::string(48, '\0')), "never unpickles"},
             Bad{npy_bytes("<f4", "(3, 2)", raw<float>({1, 2, 3, 4, 5, 6}), 1, "True"), "Fortran order"},
             Bad{npy_bytes("<f4", "(3, 2)", raw<float>({1, 2, 3, 4, 5})), "truncated"},
             Bad{npy_bytes("<f4", "(3, 2)", raw<float>({1, 2, 3, 4, 5, 6, 7})), "more data than its header's shape"},
             Bad{npy_bytes("<f4", "(3, 2)", raw<float>({1, 2, NAN, 4, 5, 6})), "value 0 of sample 1 is not a finite"},
             Bad{npy_bytes("<c8", "(3, 2)", std::string(48, '\0')), "is not a bool, integer or float array"},
             Bad{npy_bytes("<f4", "(3,)", raw<float>({1, 2, 3})), "expected (N, features)"},
             Bad{npy_bytes("<f4", "(4294967296, 4294967296)", ""), "implausibly large"},
             Bad{"\x93NUMPX\x01\x01\x10\x01{}", "bad magic"},
             Bad{npy_bytes("<f4", "(3, 2)", raw<float>({1, 2, 3, 4, 5, 6})).replace(20, 5, "xxxxx"), "header"},
         }) {
        CAPTURE(b.want);
        d.write("bad.npy", b.file);
        CHECK_THROWS_WITH_AS(read_npy(d / "bad.npy", lab3, false), doctest::Contains(b.want.c_str()), DataError);
    }
    // labels that do not fit the features or the loss
    d.write("fl.npy", npy_bytes("<f4", "(3,)", raw<float>({0, 1, 0})));
    CHECK_THROWS_WITH_AS(read_npy(d / "x.npy", d / "fl.npy", false), doctest::Contains("float labels"), DataError);
    d.write("y2.npy", npy_bytes("<i8", "(2,)", raw<int64_t>({0, 1})));
    CHECK_THROWS_WITH_AS(read_npy(d / "x.npy", d / "y2.npy", false), doctest::Contains("labels of shape (2,) for 3"),
                         DataError);
    d.write("neg.npy", npy_bytes("<i2", "(3,)", raw<int16_t>({0, -1, 0})));
    CHECK_THROWS_WITH_AS(read_npy(d / "x.npy", d / "neg.npy", false), doctest::Contains("out of range"), DataError);
}

TEST_CASE("mmap: .npy features and IDX images read from the mapped file are bit-identical to reading them whole") {
    TempDir d;
    Rng rng(7);
    // uint8 images (N, 4, 4, 3) with class labels; float32 rows (N, 5) with float targets
    const int n = 37;
    std::string pixels;
    for (int i = 0; i < n * 48; ++i) pixels.push_back(char(rng.integer(0, 255)));
    d.write("img.npy", npy_bytes("|u1", "(37, 4, 4, 3)", pixels));
    std::vector<int64_t> classes;
    for (int i = 0; i < n; ++i) classes.push_back(rng.integer(0, 4));
    d.write("cls.npy", npy_bytes("<i8", "(37,)", raw<int64_t>(classes)));
    d.write("rows.npy", npy_bytes("<f4", "(37, 5)", raw<float>(rng.normal(size_t(n) * 5))));
    d.write("tgt.npy", npy_bytes("<f8", "(37, 2)", raw<double>(std::vector<double>(size_t(n) * 2, 0.5))));
    auto load = [&](const std::string& x, const std::string& y, const std::string& mmap, bool targets) {
        DataConfig c = make_data_config(
            "npy",
            {{"train.features", x}, {"train.labels", y}, {"test.features", x}, {"test.labels", y}, {"mmap", mmap}},
            targets);
        c.root = d.path().string();
        return load_datasets(c, "", 1);
    };
    for (auto [x, y, targets] : {std::tuple{"img.npy", "cls.npy", false}, std::tuple{"rows.npy", "tgt.npy", true}}) {
        CAPTURE(x);
        const Datasets memory = load(x, y, "never", targets), mapped = load(x, y, "always", targets);
        CHECK(!memory.train.source);
        REQUIRE(mapped.train.source);
        CHECK(mapped.normalization == memory.normalization);  // every sample, summed in the same order
        REQUIRE(mapped.train.count() == memory.train.count());
        CHECK(mapped.train.classes == memory.train.classes);
        std::vector<float> a(memory.train.feature_size()), b(a.size());
        for (size_t i = 0; i < memory.train.count(); ++i) {
            int32_t la = -1, lb = -2;
            read_sample(memory.train, i, 0, a.data(), targets ? nullptr : &la);
            read_sample(mapped.train, i, 0, b.data(), targets ? nullptr : &lb);
            CHECK(a == b);
            if (!targets) CHECK(la == lb);
        }
        if (targets) CHECK(mapped.train.targets == memory.train.targets);
        CHECK(fingerprint(load(x, y, "always", targets).train) == fingerprint(mapped.train));
    }
    // IDX images, uncompressed: the same
    write_bytes(d / "img.idx", idx_images(23, 5, 6));
    write_bytes(d / "lab.idx", idx_labels(23));
    auto idx = [&](const std::string& mmap) {
        DataConfig c = make_data_config("idx", {{"train.images", d / "img.idx"},
                                                {"train.labels", d / "lab.idx"},
                                                {"test.images", d / "img.idx"},
                                                {"test.labels", d / "lab.idx"},
                                                {"mmap", mmap}});
        return load_datasets(c, "", 1);
    };
    const Datasets im = idx("never"), mm = idx("always");
    REQUIRE(mm.train.source);
    CHECK(mm.normalization == im.normalization);
    CHECK(mm.train.classes == im.train.classes);
    std::vector<float> a(im.train.feature_size()), b(a.size());
    for (size_t i = 0; i < im.train.count(); ++i) {
        int32_t la = -1, lb = -2;
        read_sample(im.train, i, 0, a.data(), &la);
        read_sample(mm.train, i, 0, b.data(), &lb);
        CHECK(a == b);
        CHECK(la == lb);
    }
    auto cut = idx_images(23, 5, 6);
    cut.pop_back();
    write_bytes(d / "cut.idx", cut);
    DataConfig cc = make_data_config("idx", {{"train.images", d / "cut.idx"},
                                             {"train.labels", d / "lab.idx"},
                                             {"test.images", d / "img.idx"},
                                             {"test.labels", d / "lab.idx"},
                                             {"mmap", "always"}});
    try {
        load_datasets(cc, "", 1);
        FAIL("a cut IDX file mapped");
    } catch (const DataError& e) {
        CHECK(std::string(e.what()) ==
              d / "cut.idx" + ": 689 bytes of images, the header promises 23 images (690 bytes)");
    }

    // what the in-memory reader refuses, the mapped one refuses too, naming the file
    std::vector<float> bad_rows(size_t(n) * 5, 1.0f);
    bad_rows[5 * 3 + 2] = std::nanf("");
    d.write("nan.npy", npy_bytes("<f4", "(37, 5)", raw<float>(bad_rows)));
    auto error = [&](const std::string& x, const std::string& mmap) -> std::string {
        try {
            load(x, "cls.npy", mmap, false);
        } catch (const DataError& e) {
            return e.what();
        }
        return "(no error)";
    };
    CHECK(error("nan.npy", "always") == d / "nan.npy" + ": value 2 of sample 3 is not a finite number");
    // a finite double beyond float's range is said as such, and a dimension of 19 digits is a number
    std::vector<double> huge_rows(size_t(n) * 5, 1.0);
    huge_rows[5 * 4 + 1] = 1e300;
    d.write("huge.npy", npy_bytes("<f8", "(37, 5)", raw<double>(huge_rows)));
    CHECK(error("huge.npy", "never") ==
          d / "huge.npy" + ": value 1 of sample 4 is 1e+300, beyond a 32-bit float's range (3.4e38)");
    d.write("wide.npy", npy_bytes("<f4", "(4611686018427387904, 5)", ""));
    CHECK(error("wide.npy", "never").find("a dimension of 4611686018427387904 is implausibly large") !=
          std::string::npos);
    d.write("short.npy", npy_bytes("<f4", "(37, 5)", raw<float>(std::vector<float>(10, 1.0f))));
    CHECK(error("short.npy", "always")
              .find(d / "short.npy" + ": 40 bytes of data, its header's shape (37, 5) holds 740") == 0);
    const std::string rows = read_text(d / "rows.npy");
    write_gz(d / "rows.npy.gz", std::vector<unsigned char>(rows.begin(), rows.end()));
    CHECK(error("rows.npy.gz", "always") ==
          d / "rows.npy.gz" + ": data.mmap: always maps uncompressed files; this one is gzip-compressed (gunzip it)");
}

TEST_CASE(
    "npz: arrays of numpy.savez archives, stored or deflated, zip64 too; missing arrays and corrupt archives named") {
    TempDir d;
    const std::string x = npy_bytes("<f4", "(3, 2)", raw<float>({0.5f, 1, 2, 3, 4, -5}));
    const std::string y = npy_bytes("<i8", "(3,)", raw<int64_t>({0, 2, 1}));
    d.write("x.npy", x);
    d.write("y.npy", y);
    d.write("stored.npz", zip_bytes({{"x.npy", x}, {"y.npy", y}}));
    d.write("deflated.npz", zip_bytes({{"x.npy", x, true}, {"y.npy", y, true}}));
    const Dataset want = read_npy(d / "x.npy", d / "y.npy", false);
    auto load = [&](const std::string& features, const std::string& labels) {
        DataConfig c = make_data_config("npy", {{"train.features", features},
                                                {"train.labels", labels},
                                                {"test.features", features},
                                                {"test.labels", labels}});
        c.root = d.path().string();
        c.normalize = DataConfig::Normalize::none;
        return load_datasets(c, "", 1);
    };
    d.write("stored64.npz", zip_bytes({{"x.npy", x}, {"y.npy", y}}, true));
    d.write("deflated64.npz", zip_bytes({{"x.npy", x, true}, {"y.npy", y, true}}, true));
    for (const char* archive : {"stored.npz", "deflated.npz", "stored64.npz", "deflated64.npz"}) {
        CAPTURE(archive);
        const Datasets got = load(std::string(archive) + ":x", std::string(archive) + ":y");
        CHECK(got.train.features == want.features);
        CHECK(got.train.labels == want.labels);
        CHECK(got.train.name == d / archive + ":x");
    }
    auto error = [&](const std::string& features, const std::string& labels) -> std::string {
        try {
            load(features, labels);
        } catch (const DataError& e) {
            return e.what();
        }
        return "(no error)";
    };
    CHECK(error("stored.npz", "stored.npz:y") ==
          d / "stored.npz" + ": an .npz archive: name the array, as stored.npz:<array> (it holds: x, y)");
    CHECK(error("stored.npz:x", "stored.npz:labels") ==
          d / "stored.npz" + ": no array named 'labels' (it holds: x, y)");
    std::string corrupt = zip_bytes({{"x.npy", x}, {"y.npy", y}});
    corrupt[40] ^= 1;  // inside x.npy's data
    d.write("crc.npz", corrupt);
    CHECK(error("crc.npz:x", "crc.npz:y") == d / "crc.npz" + ":x: CRC-32 mismatch: the member is corrupt");
    const std::string zip = zip_bytes({{"x.npy", x, true}, {"y.npy", y, true}});
    d.write("cut.npz", zip.substr(0, zip.size() - 30));
    CHECK(error("cut.npz:x", "cut.npz:y").find(d / "cut.npz" + ": not a readable .npz archive: ") == 0);
    std::string bad_deflate = zip;
    bad_deflate[35] ^= 0x55;  // inside x.npy's deflated stream
    d.write("inflate.npz", bad_deflate);
    const std::string e = error("inflate.npz:x", "inflate.npz:y");
    CHECK((e.find(":x: corrupt deflated data") != std::string::npos ||
           e.find(":x: CRC-32 mismatch") != std::string::npos));
    std::string bomb = zip_bytes({{"x.npy", x, true}, {"y.npy", y, true}});
    const size_t central = bomb.find("PK\x01\x02");
    REQUIRE(central != std::string::npos);
    for (int i = 0; i < 4; ++i) bomb[central + 24 + size_t(i)] = char((1000000000u >> (8 * i)) & 0xff);  // x.npy's size
    d.write("bomb.npz", bomb);
    CHECK(error("bomb.npz:x", "bomb.npz:y")
              .find("deflated bytes cannot hold the 1000000000 bytes the archive declares") != std::string::npos);
    // zip64 archives with their records damaged: named, never read past
    const std::string zip64 = zip_bytes({{"x.npy", x}, {"y.npy", y}}, true);
    std::string no_locator = zip64;
    no_locator[no_locator.size() - 22 - 20] ^= 1;  // the locator's signature
    d.write("nolocator.npz", no_locator);
    CHECK(error("nolocator.npz:x", "nolocator.npz:y") ==
          d / "nolocator.npz" + ": not a readable .npz archive: a zip64 archive without its locator");
    std::string far_record = zip64;
    far_record[far_record.size() - 22 - 20 + 8 + 7] = char(0x7f);  // the record's offset: far past the file
    d.write("farrecord.npz", far_record);
    CHECK(error("farrecord.npz:x", "farrecord.npz:y") ==
          d / "farrecord.npz" + ": not a readable .npz archive: a zip64 end record outside the file");
    std::string no_extra = zip64;
    const size_t entry = no_extra.find("PK\x01\x02");
    REQUIRE(entry != std::string::npos);
    no_extra[entry + 46 + 5] = 7;  // x.npy's central extra field: id 7, not zip64's 1
    d.write("noextra.npz", no_extra);
    CHECK(error("noextra.npz:x", "noextra.npz:y") ==
          d / "noextra.npz" +
              ": not a readable .npz archive: a member's size or offset is in a zip64 field that is missing");
    d.write("object.npz", zip_bytes({{"x.npy", npy_bytes("|O", "(3, 2)", std::string(48, '\0'))}, {"y.npy", y}}));
    CHECK(error("object.npz:x", "object.npz:y").find("never unpickles") != std::string::npos);

    // archives numpy itself wrote
    if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
        mark_skipped("NumPy is not installed (Debian and Ubuntu: python3-numpy): its own .npz files not read");
        return;
    }
    const std::string script =
        "import numpy as np\n"
        "x = np.arange(24, dtype=np.uint8).reshape(3, 2, 4)\n"
        "y = np.array([2, 0, 1], dtype=np.int16)\n"
        "np.savez('" +
        d / "np.npz" +
        "', images=x, labels=y)\n"
        "np.savez_compressed('" +
        d / "npc.npz" + "', images=x, labels=y)\n";
    REQUIRE(std::system(("/usr/bin/python3 -c \"" + script + "\"").c_str()) == 0);
    for (const char* archive : {"np.npz", "npc.npz"}) {
        CAPTURE(archive);
        const Datasets got = load(std::string(archive) + ":images", std::string(archive) + ":labels");
        CHECK(got.train.shape == std::vector<int>{2, 4, 1});
        REQUIRE(got.train.features.size() == 24);
        for (size_t i = 0; i < 24; ++i) CHECK(got.train.features[i] == float(i) * (1.0f / 255.0f));
        CHECK(got.train.labels == std::vector<int32_t>{2, 0, 1});
    }
}
