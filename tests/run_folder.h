// Reading a run folder back in tests: summary.json, metrics.jsonl without what depends on the
// clock, and the comparison that says two runs trained identically.
#pragma once

#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace mirrored::test {

inline nlohmann::json summary(const std::string& out) {
    return nlohmann::json::parse(std::ifstream(out + "/summary.json"));
}

inline std::vector<nlohmann::json> metrics(const std::string& out) {
    std::vector<nlohmann::json> v;
    std::ifstream in(out + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
        nlohmann::json j = nlohmann::json::parse(line);
        if (j["type"] == "alert" || j["type"] == "resume" || j["type"] == "continued")
            continue;  // the run's history, not its training
        j.erase("time");
        j.erase("samples_per_sec");
        j.erase("tokens_per_sec");
        j.erase("time_split");
        v.push_back(j);
    }
    return v;
}

// The same results, replica checksums and metrics, bit for bit.
inline void expect_same_run(const std::string& a, const std::string& b) {
    const nlohmann::json sa = summary(a), sb = summary(b);
    for (const char* k : {"test_accuracy", "test_loss", "train_loss", "replica_checksums", "steps"}) {
        CAPTURE(k);
        CHECK(sa[k] == sb[k]);
    }
    CHECK(metrics(a) == metrics(b));
}

}  // namespace mirrored::test
