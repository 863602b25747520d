// Every seed and every kept regression input of the fuzz targets, replayed through the same
// target functions libFuzzer drives: a crash found once stays fixed (tests/fuzz/targets.h).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "tests/fuzz/targets.h"

namespace fs = std::filesystem;

TEST_CASE("fuzz corpora and regressions replay cleanly through every parser") {
    size_t inputs = 0;
    for (const auto& t : mirrored::fuzz::kTargets)
        for (const char* kind : {"corpus", "regressions"}) {
            const fs::path dir = fs::path("tests/fuzz") / kind / t.name;
            if (!fs::is_directory(dir)) continue;
            for (const auto& e : fs::directory_iterator(dir)) {
                std::ifstream in(e.path(), std::ios::binary);
                const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
                CAPTURE(e.path().string());
                CHECK_NOTHROW(t.fn(bytes.data(), bytes.size()));
                ++inputs;
            }
        }
    CHECK(inputs >= 30);  // the seeds are there (run from the repository root, as make test does)
}
