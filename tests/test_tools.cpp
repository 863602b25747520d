// The user-facing tools: the planner's model (exact arithmetic on hand-built cases, then
// validated against measurements on CPU replicas), `mirrored plan`, `mirrored scale`, and the
// links' stress test (bench-allreduce --duration) including a corrupting link.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/error.h"
#include "kernels/sim/sim.h"
#include "kernels/blas.h"
#include "mirrored/checkpoint.h"
#include "mirrored/tools/hardware.h"
#include "mirrored/planner.h"
#include "mirrored/tools/tools.h"
#include "tests/cli.h"
#include "tests/helpers.h"
#include "tests/layers.h"

using namespace mirrored;
using namespace mirrored::test;
using json = nlohmann::json;

namespace {

const char* kSynthetic = R"(run: {name: tools, seed: 2}
strategy: {devices: "cpu:1", bucket_mb: 1}
data: {dataset: synthetic, input_shape: [256], classes: 10, train_samples: 4096, test_samples: 256}
model:
  layers:
    - {type: dense, units: 512, activation: relu}
    - {type: dense, units: 512, activation: relu}
    - {type: dense, units: 10}
optimizer: {type: sgd, lr: 0.05, momentum: 0.9}
train: {epochs: 1, global_batch_size: 256}
)";

json read_json(const std::string& path) { return json::parse(std::ifstream(path)); }

}  // namespace

TEST_CASE("planner: the ring formula and the overlap of buckets with backward, on hand-built cases") {
    const LinkModel link{1e11, 1e-6};
    CHECK(ring_allreduce_seconds(1, 1e9, link) == 0.0);
    CHECK(ring_allreduce_seconds(4, 1e9, link) == doctest::Approx(2.0 * 3 / 4 * 1e9 / 1e11 + 6e-6));
    CommPlan comm;
    comm.backward_share = 0.5;
    comm.buckets = {{1e9, 0.5}, {1e8, 1.0}};  // the first is ready half-way through backward
    const double t0 = ring_allreduce_seconds(2, 1e9, link), t1 = ring_allreduce_seconds(2, 1e8, link);
    // compute 0.1 s: forward 0.05, backward 0.05; bucket 0 starts at 0.075 and takes t0 = 0.010002
    StepPrediction p = predict_step(2, 0.1, comm, link);
    CHECK(p.allreduce_s == doctest::Approx(t0 + t1));
    CHECK(p.exposed_s == doctest::Approx(t1));  // bucket 0 hidden; bucket 1 starts when backward ends
    CHECK(p.step_s == doctest::Approx(0.1 + t1));
    // a slow link: bucket 0 runs past the end of backward and delays bucket 1
    const LinkModel slow{1e10, 1e-6};
    p = predict_step(2, 0.1, comm, slow);
    const double s0 = ring_allreduce_seconds(2, 1e9, slow), s1 = ring_allreduce_seconds(2, 1e8, slow);
    CHECK(p.exposed_s == doctest::Approx(0.075 + s0 + s1 - 0.1));
    // blocking all-reduces (synchronised batchnorm) are exposed whole
    comm.blocking_allreduces = 4;
    comm.blocking_bytes = 1024;
    CHECK(predict_step(2, 0.1, comm, link).exposed_s ==
          doctest::Approx(t1 + 4 * ring_allreduce_seconds(2, 1024, link)));
}

TEST_CASE("planner: the hierarchical all-reduce of K nodes x n GPUs, on hand-built cases") {
    const LinkModel local{1e11, 1e-6}, net{1e10, 5e-6};
    const double S = 1e8;
    // one node: the ring; one GPU per node: the network's ring alone
    CHECK(allreduce_seconds(Topology{8, 1, local, net}, S) == ring_allreduce_seconds(8, S, local));
    CHECK(allreduce_seconds(Topology{1, 4, local, net}, S) == doctest::Approx(2.0 * 3 / 4 * S / 1e10 + 6 * 5e-6));
    // 4 nodes x 8: the node's ring, every GPU's 1/8 slice between the nodes over the shared network, the node's gather
    const double want =
        ring_allreduce_seconds(8, S, local) + 2.0 * 3 / 4 * S / 1e10 + 6 * 5e-6 + 7.0 / 8 * S / 1e11 + 7e-6;
    CHECK(allreduce_seconds(Topology{8, 4, local, net}, S) == doctest::Approx(want));
    // the step: buckets queue behind backward as on one node
    CommPlan comm;
    comm.backward_share = 0.5;
    comm.buckets = {{S, 1.0}};
    const StepPrediction p = predict_step(Topology{8, 4, local, net}, 0.1, comm);
    CHECK(p.exposed_s == doctest::Approx(want));
    CHECK(predict_step(8, 0.1, comm, local).exposed_s == doctest::Approx(ring_allreduce_seconds(8, S, local)));
}

TEST_CASE("planner: the model's buckets, bytes on the wire and memory fit") {
    const Model model({8, 8, 2},
                      {conv(4, 3, 1, true, Activation::relu), batchnorm(true, Activation::none), flatten(),
                       dense(32, Activation::relu), dense(5, Activation::none)},
                      1);
    StrategyConfig s;
    s.bucket_mb = 0.0005;
    const CommPlan f32 = comm_plan(model, s);
    REQUIRE(f32.buckets.size() >= 3);
    CHECK(f32.wire_bytes == doctest::Approx(double(model.flat_size()) * 4));
    double last = 0;
    for (const auto& b : f32.buckets) {  // ready in backward order, the state bucket last
        CHECK(b.ready >= last);
        last = b.ready;
    }
    CHECK(f32.buckets.back().ready == 1.0);
    CHECK(f32.backward_share > 0.5);
    CHECK(f32.backward_share < 0.7);
    CHECK(f32.blocking_allreduces == 2);  // one synchronised batchnorm: forward and backward
    // a projection shortcut's batchnorm synchronises with the block's own: two layers, as built
    const Model res({8, 8, 2},
                    {residual({conv(4, 3, 2, true, Activation::none), batchnorm(true, Activation::none)}, "conv1x1",
                              Activation::relu),
                     flatten(), dense(5, Activation::none)},
                    1);
    CHECK(res.stats_syncs() == 2);
    CHECK(comm_plan(res, s).blocking_allreduces == 4);
    s.allreduce_dtype = DType::bf16;  // gradients in half the bytes, running statistics still f32
    const CommPlan bf = comm_plan(model, s);
    CHECK(bf.wire_bytes ==
          doctest::Approx(double(model.trainable_size()) * 2 + double(model.flat_size() - model.trainable_size()) * 4));
    OptimizerConfig opt;
    const uint64_t cap = gpu_memory_plan(model, opt, s, 2, 1000, 1).total();
    const int rows = largest_fitting_rows(model, opt, s, 2, 1, cap);
    CHECK(rows >= 1000);
    CHECK(gpu_memory_plan(model, opt, s, 2, rows, 1).total() <= cap);
    CHECK(gpu_memory_plan(model, opt, s, 2, rows + 1, 1).total() > cap);
    CHECK(largest_fitting_rows(model, opt, s, 2, 1, 10) == 0);
}

TEST_CASE("cost model: a hand-computed run - GPU hours x price, communication, checkpoints, rework, Young/Daly") {
    // 10 h of steps on 8 GPUs at $2.50, 20% of each step exposed communication; a GPU fails every
    // 100 h, so the job every 12.5 h = 45000 s; a 30 s checkpoint every 30 min, a restart 120 s.
    CostInputs in;
    in.work_s = 36000;
    in.exposed_comm_share = 0.2;
    in.gpus = 8;
    in.price_per_gpu_hour = 2.5;
    in.job_mtbf_s = 45000;
    in.checkpoint_interval_s = 1800;
    in.checkpoint_write_s = 30;
    in.restart_s = 120;
    const CostEstimate e = estimate_cost(in);
    // checkpoints: 36000 / 1800 = 20 writes of 30 s = 600 s; each failure loses 1800 / 2 + 120 =
    // 1020 s, so W = 36600 / (1 - 1020 / 45000) = 37448.84 s, 0.8322 failures, 848.84 s redone
    CHECK(e.finishes);
    CHECK(e.checkpoint_s == doctest::Approx(600));
    CHECK(e.wall_s == doctest::Approx(37448.84).epsilon(1e-6));
    CHECK(e.expected_failures == doctest::Approx(0.832196).epsilon(1e-5));
    CHECK(e.rework_s == doctest::Approx(848.84).epsilon(1e-5));
    // $ per second: 8 x 2.5 / 3600; GPU hours 37448.84 x 8 / 3600 = 83.220
    CHECK(e.gpu_hours == doctest::Approx(83.2196).epsilon(1e-5));
    CHECK(e.cost == doctest::Approx(208.049).epsilon(1e-5));
    CHECK(e.comm_cost == doctest::Approx(40.0));  // 36000 x 0.2 x 8 / 3600 x 2.5
    CHECK(e.checkpoint_cost == doctest::Approx(3.3333).epsilon(1e-4));
    CHECK(e.rework_cost == doctest::Approx(4.7158).epsilon(1e-4));
    CHECK(e.young_daly_s == doctest::Approx(1643.168).epsilon(1e-6));  // sqrt(2 x 30 x 45000)
    // the parts add up to the whole: work, checkpoints and rework at the same rate
    CHECK(e.cost == doctest::Approx((in.work_s + e.checkpoint_s + e.rework_s) * 8 * 2.5 / 3600));
    // no failures: the work and the checkpoints only; failures faster than an interval: never done
    in.job_mtbf_s = 0;
    CHECK(estimate_cost(in).wall_s == doctest::Approx(36600));
    CHECK(estimate_cost(in).rework_cost == 0);
    in.job_mtbf_s = 900;
    CHECK(!estimate_cost(in).finishes);
}

TEST_CASE("plan without --profile: a big model's step here is measured on fewer samples, a GPU's on all") {
    const Model m({784}, {dense(256, Activation::relu), dense(10, Activation::none)}, 1);
    const double per_sample = m.train_flops_per_sample();
    LocalShape s = local_shape(m, 64, 1, false, kMeasureFlops);  // a small model: the planned batch
    CHECK(s.rows == 64);
    CHECK(s.warmup == 2);
    CHECK(s.steps == 8);
    s = local_shape(m, 64, 1, false, 10.5 * per_sample);  // as many samples as the budget holds
    CHECK(s.rows == 10);
    CHECK(s.steps == 8);
    s = local_shape(m, 64, 4, false, 0.5 * per_sample);  // one sample per micro-batch, one step each
    CHECK(s.rows == 4);
    CHECK(s.warmup == 1);
    CHECK(s.steps == 1);
    CHECK(local_shape(m, 3, 4, false, 1).rows == 3);   // never more than planned
    CHECK(local_shape(m, 64, 1, true, 1).rows == 64);  // a GPU here runs the batch
    // batch statistics over vectors need two rows per micro-batch
    const Model bn({784},
                   {dense(16, Activation::none), batchnorm(false, Activation::relu), dense(10, Activation::none)}, 1);
    CHECK(local_shape(bn, 64, 2, false, 1).rows == 4);
}

TEST_CASE("plan --price --mtbf: each count priced, the cheapest and the fastest named; bad figures are exit 2") {
    TempDir d;
    const std::string cfg = d.write("t.yaml", kSynthetic), json_path = d / "plan.json", out = d / "plan.txt";
    std::string err;
    REQUIRE_MESSAGE(run_cli({"plan", cfg, "--gpu", "h200", "--gpus", "1,2,8", "--price", "3", "--mtbf", "2000",
                             "--json", json_path},
                            {}, -1, &err, Stdout::file, out) == kExitOk,
                    err);
    const std::string text = read_text(out);
    CHECK(text.find("cost of the run at $3.00 per GPU hour (4096 training samples, 1 epochs)") != std::string::npos);
    CHECK((text.find("cheapest and fastest: ") != std::string::npos ||
           (text.find("cheapest: ") != std::string::npos && text.find("fastest: ") != std::string::npos)));
    // the loader threads each count needs: its samples/s over what one thread reads, measured
    const json planned = read_json(json_path);  // kept: a loop over a temporary's member would dangle
    const json& loader = planned["loader"];
    REQUIRE(loader.is_object());
    const double per_thread = loader["samples_per_sec_per_thread"];
    CHECK(per_thread > 0);
    for (const json& r : planned["results"]) {
        const std::string gpus = std::to_string(r["gpus"].get<int>());
        CAPTURE(gpus);
        CHECK(loader["threads_needed"][gpus] == int(std::ceil(r["samples_per_sec"].get<double>() / per_thread - 1e-9)));
    }
    CHECK(text.find("loader threads to feed them (one thread reads ") != std::string::npos);
    const json costs = read_json(json_path)["costs"];
    REQUIRE(costs.size() == 3);
    for (const json& c : costs) {
        CAPTURE(c.dump());
        CHECK(c["cost_usd"].get<double>() == doctest::Approx(c["gpu_hours"].get<double>() * 3));
        CHECK(c["gpu_hours"].get<double>() == doctest::Approx(c["wall_hours"].get<double>() * c["gpus"].get<double>()));
        CHECK(c["young_daly_interval_s"].get<double>() > 0);
        CHECK(c["comm_wait_usd"].get<double>() <= c["cost_usd"].get<double>());
    }
    CHECK(run_cli({"plan", cfg, "--price", "0"}, {}, -1, &err) == kExitUsage);
    CHECK(run_cli({"plan", cfg, "--price", "2", "--mtbf", "-1"}, {}, -1, &err) == kExitUsage);
    // figures past any meaning, and no numbers, are refused before the arithmetic overflows
    for (const std::vector<std::string>& bad : {std::vector<std::string>{"--price", "2", "--mtbf", "1e300"},
                                                {"--price", "1e308"},
                                                {"--price", "nan"},
                                                {"--price", "2", "--restart-s", "nan"},
                                                {"--price", "2", "--restart-s", "inf"},
                                                {"--price", "2", "--checkpoint-write-s", "1e300"}}) {
        std::vector<std::string> args{"plan", cfg, "--gpu", "h200"};
        args.insert(args.end(), bad.begin(), bad.end());
        CAPTURE(bad.back());
        CHECK(run_cli(args, {}, -1, &err) == kExitUsage);
        CHECK(err.find("expected a number") != std::string::npos);
    }
    // the largest accepted: every figure printed is a number (no -9223372036854775808 s, no nan)
    const std::string big = d / "big.txt";
    REQUIRE(run_cli({"plan", cfg, "--gpu", "h200", "--price", "1e6", "--mtbf", "1e9", "--restart-s", "1e7"}, {}, -1,
                    &err, Stdout::file, big) == kExitOk);
    const std::string big_text = read_text(big);
    CHECK(big_text.find("-9223372036854775808") == std::string::npos);
    CHECK(big_text.find("nan") == std::string::npos);
    CHECK(big_text.find("inf") == std::string::npos);
}

TEST_CASE("hardware table: every GPU and link has figures and a source; unknown names list the known ones") {
    for (const GpuSpec& g : gpu_specs()) {
        CAPTURE(g.name);
        CHECK(g.memory_gib > 0);
        CHECK(g.tflops(Precision::bf16) >= g.tflops(Precision::fp32) * 0.99);
        CHECK(!g.source.empty());
        CHECK(find_link(g.link).bus_gbs > 0);
    }
    for (const LinkSpec& l : link_specs()) CHECK(!l.source.empty());
    for (const NetworkSpec& n : network_specs()) {
        CAPTURE(n.name);
        CHECK(n.node_gbs > 0);
        CHECK(n.latency_us > 0);
        CHECK(!n.source.empty());
    }
    CHECK_THROWS_WITH_AS(find_network("wifi"), doctest::Contains("ib-ndr"), ConfigError);
    CHECK_THROWS_WITH_AS(find_gpu("v100"), doctest::Contains("known: h200, h100"), ConfigError);
    CHECK_THROWS_WITH_AS(find_link("infiniband"), doctest::Contains("nvlink4"), ConfigError);
}

// The stated tolerances: on CPU replicas, in the size range where the memory system's bandwidth
// is flat, the ring formula with the link calibrated at 128 MiB predicts the measured all-reduce
// at 64 and 256 MiB within 50% (the memory bandwidth of a shared 2-core machine alone varies
// that much between runs); the step model (compute measured on one replica, the all-reduce from
// the link) predicts the measured 2-replica step within 40% (on a quiet machine it is 12-24%
// short: two CPU replicas share the L3, the memory and the loader's core, which the model, made
// for a GPU per replica, leaves out; a busy machine adds its own). The best of three attempts counts.
// It times the machine, so it is in the suite `timing` (make test-timing), not in make test.
TEST_CASE("planner validated on CPU replicas: all-reduce within 50%, step time within 40% of the measurement" *
          doctest::test_suite("timing")) {
    if (std::thread::hardware_concurrency() < 2) {
        mark_skipped("needs 2 cores for 2 CPU replicas");
        return;
    }
#if defined(__SANITIZE_THREAD__)
    // ThreadSanitizer slows memory accesses and synchronisation by different factors: what it
    // times says nothing about the model (the plain build runs this test).
    mark_skipped("timing under ThreadSanitizer");
    return;
#endif
    double worst_allreduce = 1e9;
    for (int attempt = 0; attempt < 3 && worst_allreduce > 0.50; ++attempt) {
        // Sizes where the bandwidth is flat on the machines seen: on a Xeon VM reporting a
        // 300 MiB L3 a 32 MiB ring ran 1.7x faster per byte than a 64 MiB one (it failed the 50%
        // calibrated at 64 MiB); from 64 MiB to 1 GiB the bandwidth stayed within 15%.
        const LinkModel link = measure_link("cpu:2", "ring", DType::f32, size_t(128) << 20);
        double worst = 0;
        for (size_t mb : {64, 256}) {
            const double measured = measure_allreduce_seconds("cpu:2", "ring", DType::f32, mb << 20);
            const double predicted = ring_allreduce_seconds(2, double(mb << 20), link);
            MESSAGE(mb << " MiB: predicted " << predicted * 1e3 << " ms, measured " << measured * 1e3 << " ms");
            worst = std::max(worst, std::fabs(predicted - measured) / measured);
        }
        worst_allreduce = std::min(worst_allreduce, worst);
    }
    CHECK(worst_allreduce <= 0.50);

    TempDir d;
    const std::string cfg = d.write("t.yaml", kSynthetic);
    double best = 1e9;
    for (int attempt = 0; attempt < 3 && best > 0.40; ++attempt) {
        const std::string out = d / ("scale" + std::to_string(attempt));
        REQUIRE(run_cli({"scale", cfg, "--kind", "cpu", "--replicas", "1,2", "--steps", "20", "--out", out}) ==
                kExitOk);
        const json r = read_json(out + "/scaling.json")["results"][1];
        const double measured = r["step_ms"], predicted = r["predicted"]["step_ms"];
        MESSAGE("2 replicas: predicted " << predicted << " ms, measured " << measured << " ms");
        best = std::min(best, std::fabs(predicted - measured) / measured);
    }
    CHECK(best <= 0.40);
}

// Marks partition a step from its begin to its end, so the parts add up to the whole; on
// simulated GPUs a profiled step runs uncaptured even with cuda_graph on.
TEST_CASE("bench-step --layers: each top-level layer's forward and backward, the phases, adding up to the step") {
    TempDir d;
    const std::string cfg = d.write("t.yaml", kSynthetic);
    struct Case {
        const char* devices;
        std::vector<std::string> sets;
    };
    const Case cases[] = {
        {"cpu:2", {}},
        {"sim:0,1", {"train.grad_accumulation_steps=2", "strategy.cuda_graph=true"}},
        {"sim:0,0", {"strategy.shared_parameters=true", "train.precision=bf16"}},
        // staged gradients: every micro-batch reduces after each layer
        {"cpu:2", {"strategy.shard=gradients", "strategy.bucket_mb=0.1", "train.grad_accumulation_steps=2"}}};
    for (const Case& c : cases) {
        CAPTURE(c.devices);
        const std::string json_path = d / "step.json", stdout_path = d / "step.txt";
        std::vector<std::string> args{"bench-step", cfg, "--devices", c.devices, "--steps", "4",
                                      "--warmup",   "3", "--layers",  "3",       "--json",  json_path};
        for (const std::string& set : c.sets) args.insert(args.end(), {"--set", set});
        std::string err;
        const int rc = run_cli(args, {}, -1, &err, Stdout::file, stdout_path);
        CAPTURE(err);
        REQUIRE(rc == kExitOk);
        const json p = read_json(json_path)["results"][0]["profile"];
        CHECK(p["steps"] == 3);
        REQUIRE(p["layers"].size() == 3);
        double sum = 0;
        for (const json& l : p["layers"]) {
            CHECK(l["forward_us"].get<double>() > 0);
            CHECK(l["backward_us"].get<double>() > 0);
            CHECK(l["forward_gflops"].get<double>() > 0);
            sum += l["forward_us"].get<double>() + l["backward_us"].get<double>();
        }
        CHECK(p["layers"][0]["layer"] == "layers.0 dense [256] -> [512] relu");
        for (const char* phase : {"input", "loss", "reduce", "update"}) {
            CHECK(p["phases_us"][phase].get<double>() >= 0);
            sum += p["phases_us"][phase].get<double>();
        }
        CHECK(p["step_us"].get<double>() > 0);
        CHECK(std::fabs(sum - p["step_us"].get<double>()) <= 1e-6 * p["step_us"].get<double>() + 1e-3);
        std::ifstream in(stdout_path);
        const std::string text((std::istreambuf_iterator<char>(in)), {});
        CHECK(text.find("layers.1 dense [512] -> [512] relu") != std::string::npos);
        CHECK(text.find("update (optimizer)") != std::string::npos);
    }
}

TEST_CASE("scale: a table, scaling.json with every field, a verdict; on simulated GPUs too") {
    TempDir d;
    const std::string cfg = d.write("t.yaml", kSynthetic);
    for (const char* kind : {"cpu", "sim"}) {
        CAPTURE(kind);
        const std::string out = d / kind;
        const std::string stdout_path = d / (std::string(kind) + ".txt");
        std::string err;
        const int rc = run_cli({"scale", cfg, "--kind", kind, "--replicas", std::string(kind) == "cpu" ? "1" : "1,2",
                                "--steps", "5", "--warmup", "1", "--out", out},
                               {}, -1, &err, Stdout::file, stdout_path);
        CAPTURE(err);
        REQUIRE(rc == kExitOk);
        const json j = read_json(out + "/scaling.json");
        CHECK(j["kind"] == kind);
        CHECK(j["mode"] == "weak");
        for (const auto& r : j["results"])
            for (const char* k : {"replicas", "step_ms", "step_ms_min", "step_ms_max", "samples_per_sec", "speedup",
                                  "efficiency", "time_split", "allreduce_bytes_per_step", "busbw_gbs", "predicted"})
                CHECK(r.contains(k));
        std::ifstream in(stdout_path);
        const std::string text((std::istreambuf_iterator<char>(in)), {});
        CHECK(text.find("kind " + std::string(kind) + ":") != std::string::npos);  // says what the numbers mean
        if (std::string(kind) == "sim") {
            CHECK(j["results"][1]["global_batch"] == 512);  // weak: the per-replica batch stays 256
            CHECK(text.find("1 -> 2 replicas:") != std::string::npos);
            CHECK(j["results"][1]["busbw_gbs"].get<double>() > 0);
        }
    }
    // shared parameters (the shipped MLP configs) run no all-reduce: the direct op stands in, and
    // the sampled steps' timing on one simulated GPU includes their sums
    for (const char* kind : {"cpu", "sim"}) {
        CAPTURE(kind);
        const std::string out = d / (std::string("shared-") + kind), stdout_path = out + ".txt";
        std::string err;
        const int rc = run_cli({"scale", cfg, "--kind", kind, "--replicas", "1,2", "--steps", "5", "--warmup", "1",
                                "--set", "strategy.shared_parameters=true", "--out", out},
                               {}, -1, &err, Stdout::file, stdout_path);
        CAPTURE(err);
        REQUIRE(rc == kExitOk);
        const json r = read_json(out + "/scaling.json")["results"][1];
        CHECK(r["cross_device_ops"] == "shared");
        CHECK(r["busbw_gbs"].get<double>() > 0);
        CHECK(r["time_split"]["comm_s"].get<double>() >= 0);
        std::ifstream in(stdout_path);
        const std::string text((std::istreambuf_iterator<char>(in)), {});
        CHECK(text.find("shared parameters: no all-reduce runs") != std::string::npos);
    }
}

TEST_CASE(
    "plan --profile: what a profile holds is checked - types, ranges, the one-replica point - never an internal "
    "error") {
    auto per_sample = [](const std::string& text) { return profile_seconds_per_sample(text, "p.json"); };
    CHECK(per_sample(R"({"results": [{"replicas": 2, "step_ms": 5, "global_batch": 512},
                                      {"replicas": 1, "step_ms": 10, "global_batch": 256}]})") ==
          doctest::Approx(10e-3 / 256));
    const std::vector<std::pair<std::string, std::string>> bad{
        {"nul", "p.json is not JSON"},
        {"[1, 2]", "p.json has no results"},
        {R"({"results": {"replicas": 1}})", "p.json has no results"},
        {R"({"results": [{"replicas": "1"}]})", "p.json: results[0].replicas is string, expected a number"},
        {R"({"results": [7, {"replicas": 1, "step_ms": [1], "global_batch": 2}]})", "results[1].step_ms is array"},
        {R"({"results": [{"replicas": 1, "step_ms": 10, "global_batch": null}]})", "results[0].global_batch is null"},
        {R"({"results": [{"replicas": 1, "step_ms": 1e308, "global_batch": 1}]})",
         "step_ms 1e+308 and global_batch 1 are not a measurement"},
        {R"({"results": [{"replicas": 1, "step_ms": -3, "global_batch": 8}]})", "not a measurement"},
        {R"({"results": [{"replicas": 1, "step_ms": 3, "global_batch": 1e12}]})", "not a measurement"},
        {R"({"results": [{"replicas": 1, "step_ms": 3, "global_batch": 2.5}]})", "not a measurement"},
        {R"({"results": [{"replicas": 1.5, "step_ms": 3, "global_batch": 2}]})", "no one-replica point"},
    };
    for (const auto& [text, says] : bad) {
        CAPTURE(text);
        CHECK_THROWS_WITH_AS(per_sample(text), doctest::Contains(says.c_str()), ConfigError);
    }
}

TEST_CASE("scale and plan: bad input is exit 2 with what was expected") {
    TempDir d;
    const std::string cfg = d.write("t.yaml", kSynthetic);
    struct Case {
        std::vector<std::string> args;
        const char* says;
    };
    const std::vector<Case> cases{
        {{"scale", cfg, "--kind", "cpu", "--replicas", "1,4096"}, "provides at most"},
        {{"scale", cfg, "--kind", "tpu"}, "expected cuda, cuda-shared, cpu or sim"},
        {{"scale", cfg, "--mode", "sideways"}, "expected weak or strong"},
        {{"scale", cfg, "--replicas", "0"}, "positive integers"},
        {{"plan", cfg, "--gpu", "v100"}, "known: h200"},
        {{"plan", cfg, "--link", "carrier-pigeon"}, "known: nvlink4"},
        {{"plan", cfg, "--gpus", "2,x"}, "positive integers"},
        {{"plan", cfg, "--tflops", "-3"}, "--tflops: expected a number above 0, got '-3'"},
        {{"plan", cfg, "--profile", d / "missing.json"}, "cannot read"},
        {{"plan", cfg, "--profile", d.write("typed.json", R"({"results": [{"replicas": "1"}]})")},
         "results[0].replicas is string, expected a number"},
        {{"plan", cfg, "--nodes", "2", "--network", "wifi"}, "known: eth-100"},
        {{"plan", cfg, "--nodes", "0"}, "--nodes"},
        {{"plan", cfg, "--network-gbs", "-1"}, "--network-gbs: expected a number above 0, got '-1'"},
        {{"bench-allreduce", "--devices", "cpu:2", "--duration", "0"}, "positive duration"},
        {{"bench-gemm", "--shapes", "64x512"}, "expected shapes like 64x512x784:nt"},
        {{"bench-gemm", "--shapes", "64x512x784:xt"}, "expected shapes like"},
        {{"bench-gemm", "--shapes", "64x0x784"}, "expected shapes like"},
        {{"bench-allreduce", "--devices", "cpu:2", "--duration", "soon"}, "positive duration"},
        {{"bench-allreduce", "--devices", "cpu:1", "--duration", "1s"}, "at least 2 replicas"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.args[0] + " " + c.args[c.args.size() - 1]);
        std::string err;
        CHECK(run_cli(c.args, {}, -1, &err) == kExitUsage);
        CHECK(err.find(c.says) != std::string::npos);
        CAPTURE(err);
    }
    // a model the planner cannot size: no input shape, and data that cannot tell it
    const std::string no_shape = d.write("n.yaml", R"(data: {dataset: idx, root: /nonexistent}
model: {layers: [{type: dense, units: 4}]}
)");
    std::string err;
    CHECK(run_cli({"plan", no_shape}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("model.input_shape") != std::string::npos);
}

TEST_CASE("bench-gemm --shapes: a replica's own GEMM shapes and transposes, each row and the sum") {
    TempDir d;
    const std::string json_path = d / "gemm.json";
    REQUIRE(run_cli({"bench-gemm", "--shapes", "8x5x3:tn,7x6x4,9x2x5:nn", "--json", json_path}) == kExitOk);
    const json rows = read_json(json_path)["results"];
    REQUIRE(rows.size() == 3);
    CHECK(rows[0]["m"] == 8);
    CHECK(rows[0]["n"] == 5);
    CHECK(rows[0]["k"] == 3);
    CHECK(rows[0]["ops"] == "tn");
    CHECK(rows[1]["ops"] == "nt");  // the default: a dense layer's forward
    CHECK(rows[2]["ops"] == "nn");
    for (const auto& r : rows) CHECK(r["gflops"].get<double>() > 0);
}

TEST_CASE(
    "plan: memory per GPU, fit and the largest batch that fits, ZeRO-1, speedup; JSON; a profile replaces the "
    "compute") {
    TempDir d;
    const std::string cfg = d.write("t.yaml", kSynthetic);
    const std::string out = d / "plan.json";
    REQUIRE(run_cli({"plan", cfg, "--gpus", "1,2,8", "--gpu", "h200", "--json", out}) == kExitOk);
    json j = read_json(out);
    REQUIRE(j["results"].size() == 3);
    for (const auto& r : j["results"]) {
        CHECK(r["fits"] == true);
        CHECK(r["largest_per_gpu_batch"].get<int>() > 256);
        CHECK(r["step_ms"].get<double>() > 0);
    }
    const auto& r8 = j["results"][2];
    // strategy.shard optimizer: each GPU keeps its chunks' state, 1/8 but for the chunks' rounding
    CHECK(r8["zero1_saving_bytes"].get<double>() ==
          doctest::Approx(r8["memory"]["optimizer"].get<double>() * 7 / 8).epsilon(0.01));
    CHECK(j["results"][0]["zero1_saving_bytes"] == 0.0);  // one GPU: nothing to share
    REQUIRE(run_cli({"plan", cfg, "--gpus", "1,2,8", "--gpu", "h200", "--json", out, "--set",
                     "strategy.shard=optimizer"}) == kExitOk);
    const json sharded = read_json(out)["results"][2];
    for (const char* part : {"parameters", "gradients", "optimizer", "activations"})  // one GPU keeps it all
        CHECK(read_json(out)["results"][0]["memory"][part] == j["results"][0]["memory"][part]);
    CHECK(sharded["memory"]["optimizer"].get<double>() ==
          doctest::Approx(r8["memory"]["optimizer"].get<double>() / 8).epsilon(0.05));
    CHECK(sharded["memory_bytes"].get<double>() ==
          doctest::Approx(r8["memory_bytes"].get<double>() - r8["zero1_saving_bytes"].get<double>()));
    CHECK(sharded["zero1_saving_bytes"] == 0.0);  // taken
    CHECK(sharded["recommendation"] == "strategy.shard: optimizer, as configured");
    CHECK(r8["recommendation"] == "replicate (strategy.shard: none)");
    // memory between the sharded and the unsharded need: the recommendation is to shard
    const double need = r8["memory_bytes"].get<double>(), saved = r8["zero1_saving_bytes"].get<double>();
    char gb[32];
    std::snprintf(gb, sizeof gb, "%.9f", (need - saved / 2 + 1073741824.0) / 1e9);  // less the CUDA context's GiB
    REQUIRE(run_cli({"plan", cfg, "--gpus", "1,2,8", "--memory-gb", gb, "--json", out}) == kExitOk);
    const json tight = read_json(out);
    CHECK(tight["results"][2]["fits"] == false);
    CHECK(tight["results"][2]["recommendation"].get<std::string>().rfind("strategy.shard: optimizer (", 0) == 0);
    CHECK(tight["results"][0]["fits"] == false);  // one GPU has nothing to share
    CHECK(tight["results"][0]["recommendation"].get<std::string>().find("a per-GPU batch of at most") == 0);
    CHECK(j["results"][0]["speedup"] == 1.0);
    // strategy.shard gradients, a deeper model in buckets of about a layer: each GPU keeps its
    // chunks' gradients and a few staging slots, so it saves more than ZeRO-1; with memory between
    // the two needs, it is the recommendation; configured, it is what the plan counts
    std::string deep = kSynthetic;
    const std::string layer = "    - {type: dense, units: 256, activation: relu}\n";
    std::string layers;
    for (int i = 0; i < 8; ++i) layers += layer;
    deep.replace(deep.find("    - {type: dense, units: 512"),
                 2 * std::string("    - {type: dense, units: 512, activation: relu}\n").size(), layers);
    const std::string deep_cfg = d.write("deep.yaml", deep);
    const std::vector<std::string> small{"--set", "strategy.bucket_mb=0.25"};
    auto plan8 = [&](std::vector<std::string> extra) {
        std::vector<std::string> a{"plan", deep_cfg, "--gpus", "8", "--json", out};
        a.insert(a.end(), small.begin(), small.end());
        a.insert(a.end(), extra.begin(), extra.end());
        REQUIRE(run_cli(a) == kExitOk);
        return read_json(out)["results"][0];
    };
    const json plain8 = plan8({"--gpu", "h200"});
    const double z1 = plain8["zero1_saving_bytes"].get<double>(), z2 = plain8["zero2_saving_bytes"].get<double>();
    CHECK(z2 > z1 + plain8["memory"]["gradients"].get<double>() / 3);
    CHECK(plain8["zero2_step_ms"].get<double>() >= plain8["zero1_step_ms"].get<double>());
    std::snprintf(gb, sizeof gb, "%.9f", (plain8["memory_bytes"].get<double>() - (z1 + z2) / 2 + 1073741824.0) / 1e9);
    const json between = plan8({"--memory-gb", gb});
    CHECK(between["fits"] == false);
    CHECK(between["recommendation"].get<std::string>().rfind("strategy.shard: gradients (", 0) == 0);
    const json staged = plan8({"--gpu", "h200", "--set", "strategy.shard=gradients"});
    CHECK(staged["memory_bytes"].get<double>() == doctest::Approx(plain8["memory_bytes"].get<double>() - z2));
    CHECK(staged["recommendation"] == "strategy.shard: gradients, as configured");
    // too little memory: does not fit, and says the largest per-GPU batch that does
    REQUIRE(run_cli({"plan", cfg, "--gpus", "2", "--memory-gb", "1.0035", "--json", out}) == kExitOk);
    j = read_json(out);
    CHECK(j["results"][0]["fits"] == false);
    CHECK(j["results"][0]["largest_per_gpu_batch"].get<int>() < 256);
    // a profile measured elsewhere: 10 ms for 256 samples on one replica
    const std::string profile =
        d.write("p.json", R"({"results": [{"replicas": 1, "global_batch": 256, "step_ms": 10.0}]})");
    REQUIRE(run_cli({"plan", cfg, "--gpus", "1,2", "--profile", profile, "--json", out}) == kExitOk);
    j = read_json(out);
    CHECK(j["results"][0]["compute_ms"].get<double>() == doctest::Approx(10.0));
    CHECK(j["results"][1]["step_ms"].get<double>() >= 10.0);
    // nodes: 2 x 8 GPUs over a slow network, against 8 on one node
    REQUIRE(run_cli({"plan", cfg, "--gpus", "8", "--nodes", "2", "--network", "eth-100", "--profile", profile, "--json",
                     out}) == kExitOk);
    j = read_json(out);
    CHECK(j["nodes"] == 2);
    CHECK(j["network"]["name"] == "eth-100");
    CHECK(j["results"][0]["gpus"] == 16);
    CHECK(j["results"][0]["gpus_per_node"] == 8);
    CHECK(j["results"][0]["speedup"].get<double>() < 2.0);  // the network costs something
    CHECK(j["results"][0]["speedup"].get<double>() > 1.0);
}

TEST_CASE("stress test: every result verified; a corrupting link fails with exit 5 naming the replica pair") {
    std::string err;
    CHECK(run_cli({"bench-allreduce", "--devices", "sim:0,1,2", "--max-bytes", "64K", "--duration", "1s"}, {}, -1,
                  &err) == kExitOk);
    // the 40th copy simulated GPU 1 makes from a peer flips a bit: replica 1 receives from replica 0
    CHECK(run_cli({"bench-allreduce", "--devices", "sim:0,1,2", "--max-bytes", "64K", "--duration", "5s"},
                  {{"MIRRORED_SIM_CORRUPT", "1:40"}}, -1, &err) == kExitDevice);
    CHECK(err.find("replica 1 (sim:1)") != std::string::npos);
    CHECK(err.find("suspect the link from replica 0 (sim:0) to replica 1") != std::string::npos);
    CAPTURE(err);
    // the plain table verifies too
    CHECK(run_cli({"bench-allreduce", "--devices", "sim:0,1", "--max-bytes", "64K"}, {{"MIRRORED_SIM_CORRUPT", "0:1"}},
                  -1, &err) == kExitDevice);
    // a link that stops answering (simulated GPU 1's 200th launch never finishes): exit 5 within
    // --timeout, in the stress test and in the table, not a process that waits forever
    for (const bool stress : {true, false}) {
        std::vector<std::string> args{"bench-allreduce", "--devices", "sim:0,1", "--max-bytes", "64K",
                                      "--timeout",       "2s"};
        if (stress) args.insert(args.end(), {"--duration", "60s"});
        CHECK(run_cli(args, {{"MIRRORED_SIM_HANG", "1:200"}}, -1, &err) == kExitDevice);  // not 0 after 60 s
        CHECK(err.find(stress ? "no progress for 2 s in the stress test (--timeout)"
                              : "no progress for 2 s in the all-reduce "
                                "table (--timeout)") != std::string::npos);
        CHECK(err.find("check the links") != std::string::npos);
    }
}

namespace {

// "Zen" of "BLAS: OpenBLAS 0.3.21, kernel Zen (chosen ...)".
std::string kernel_named(const std::string& blas_line) {
    const size_t at = blas_line.find("kernel ");
    if (at == std::string::npos) return "";
    const size_t from = at + 7;
    return blas_line.substr(from, blas_line.find(' ', from) - from);
}

}  // namespace

TEST_CASE("BLAS kernel: a process started by one that chose its kernel runs that kernel without measuring again") {
    // Results are compared bit for bit between this process and the CLI runs it starts: the CLI
    // must not choose again (where the first choice was below the CPU's best class, a second,
    // noisy measurement started from it picked another kernel, and the runs rounded differently).
    TempDir d;
    auto blas_line = [&](const std::vector<std::pair<std::string, std::string>>& env) {
        return devices_blas_line(d / "devices.txt", env);
    };
    const std::string empty_cache = d / "empty-cache";
    const std::string own = blas_kernel();
    const std::string inherited = blas_line({{"MIRRORED_CACHE_DIR", empty_cache}});
    CAPTURE(inherited);
    CHECK(kernel_named(inherited) == own.substr(0, own.find(' ')));
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        mark_skipped("the CPU has no AVX2: no kernel to choose");
        return;
    }
    // Haswell, below the best class on AVX-512 CPUs, as the parent's choice: kept, not re-measured
    const std::string kept = blas_line({{"OPENBLAS_CORETYPE", "Haswell"},
                                        {"MIRRORED_CACHE_DIR", empty_cache},
                                        {"MIRRORED_BLAS_INHERITED", "Haswell|50.0|Prescott|16.0"}});
    CAPTURE(kept);
    CHECK(kept.find("kernel Haswell (chosen by mirrored by measurement: 50 GFLOP/s against 16 for Prescott") !=
          std::string::npos);
    CHECK(kept.find("by the process that started this one") != std::string::npos);
    CHECK(!std::filesystem::exists(empty_cache + "/blas-kernel.txt"));  // nothing was measured
    // a marker for another kernel than the one OpenBLAS runs (OPENBLAS_CORETYPE changed since) is ignored
    const std::string stale = blas_line({{"OPENBLAS_CORETYPE", "Prescott"},
                                         {"MIRRORED_CACHE_DIR", empty_cache},
                                         {"MIRRORED_BLAS_INHERITED", "Haswell|50.0|Prescott|16.0"}});
    CAPTURE(stale);
    CHECK(kernel_named(stale) != "Prescott");
    CHECK(stale.find("by the process that started this one") == std::string::npos);
}

namespace {

// The cached kernels of blas-kernel.txt, one per line (the value's first word).
std::vector<std::string> cached_kernels(const std::string& file) {
    std::ifstream in(file);
    std::vector<std::string> kernels;
    std::string line;
    while (std::getline(in, line)) {
        const size_t tab = line.find('\t');
        if (tab != std::string::npos) kernels.push_back(line.substr(tab + 1, line.find(' ', tab) - tab - 1));
    }
    return kernels;
}

}  // namespace

TEST_CASE("BLAS kernel: a cached choice this CPU cannot run, or one that fails on start-up, is measured again") {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        mark_skipped("the CPU has no AVX2: no kernel to choose");
        return;
    }
    TempDir d;
    const std::string cache = d / "cache", file = cache + "/blas-kernel.txt";
    const std::vector<std::pair<std::string, std::string>> generic{{"OPENBLAS_CORETYPE", "Prescott"},
                                                                   {"MIRRORED_CACHE_DIR", cache}};
    const std::string first = devices_blas_line(d / "devices.txt", generic);
    CAPTURE(first);
    const std::string core = kernel_named(first);
    REQUIRE(cached_kernels(file) == std::vector<std::string>{core});
    // the entry names a kernel that is not among this CPU's (a hand edit; a machine of another
    // class once cached it under the same name): not run, measured again and replaced
    {
        std::ifstream in(file);
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        text.replace(text.find("\t" + core + " "), core.size() + 2, "\tNoSuchKernel ");
        std::ofstream(file) << text;
    }
    const std::string again = devices_blas_line(d / "devices.txt", generic);
    CAPTURE(again);
    CHECK(again.find("chosen by mirrored by measurement") != std::string::npos);
    CHECK(cached_kernels(file) == std::vector<std::string>{kernel_named(again)});
    // a re-executed process whose chosen kernel did not load (here: OPENBLAS_CORETYPE says
    // Prescott, the marker another) runs the one it started with, and drops the cached choice
    auto mismatched = generic;
    mismatched.push_back({"MIRRORED_BLAS_CHOSEN", kernel_named(again) + "|50.0|Prescott|10.0"});
    const std::string rejected = devices_blas_line(d / "devices.txt", mismatched);
    CAPTURE(rejected);
    CHECK(rejected.find("failed its check on start-up") != std::string::npos);
    CHECK(cached_kernels(file).empty());
}

TEST_CASE("BLAS kernel: reported, and a kernel below what the CPU runs is replaced by the fastest correct one") {
    CHECK(blas_probe_gflops() > 0);  // this process's kernel passes the reference check
    TempDir d;
    auto devices = [&](const std::vector<std::pair<std::string, std::string>>& env) {
        return devices_blas_line(d / "devices.txt", env);
    };
    const std::string cache = d / "cache";
    // the generic Prescott kernel, as OpenBLAS falls back to on CPUs it does not know
    const std::vector<std::pair<std::string, std::string>> generic{{"OPENBLAS_CORETYPE", "Prescott"},
                                                                   {"MIRRORED_CACHE_DIR", cache}};
    const std::string chosen = devices(generic);
    CAPTURE(chosen);
    CHECK(chosen.find("OpenBLAS") != std::string::npos);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        CHECK(chosen.find("kernel Prescott") == std::string::npos);
        CHECK(chosen.find("chosen by mirrored by measurement") != std::string::npos);
        CHECK(std::filesystem::exists(cache + "/blas-kernel.txt"));
        // the second start reuses the cached choice, and says so
        const std::string again = devices(generic);
        CHECK(kernel_named(again) == kernel_named(chosen));
        CHECK(again.find("chosen by mirrored by measurement on an earlier start (from the machine cache") !=
              std::string::npos);
        // A process started on the chosen kernel (OPENBLAS_CORETYPE inherited from the one that
        // chose it) keeps it: it finds the same cached answer, it does not measure again from there.
        const std::string core = kernel_named(chosen);
        REQUIRE(!core.empty());
        const std::string on_chosen =
            devices({{"OPENBLAS_CORETYPE", core}, {"MIRRORED_CACHE_DIR", cache}, {"MIRRORED_BLAS_INHERITED", ""}});
        CAPTURE(on_chosen);
        CHECK(kernel_named(on_chosen) == core);
    } else {
        mark_skipped("the CPU has no AVX2: Prescott may be the right kernel");
    }
    auto kept = generic;
    kept.push_back({"MIRRORED_BLAS_AUTO", "0"});
    CHECK(devices(kept).find("kernel Prescott (OPENBLAS_CORETYPE in the environment, MIRRORED_BLAS_AUTO=0)") !=
          std::string::npos);
}

// A run killed during a checkpoint and resumed: metrics.csv holds the records of metrics.jsonl,
// each stamped with the wall clock, the resume among them; `report` draws as many points as were
// logged, marks the resume, and writes figures and one page that embeds them.
TEST_CASE("report: metrics.csv beside metrics.jsonl; the curves of a resumed run, every logged point drawn") {
    TempDir d;
    std::string text = kSynthetic;
    text += "checkpoint: {every_steps: 4}\n";
    const std::string cfg = d.write("t.yaml", text), run = d / "run";
    const std::vector<std::string> args{
        "train", cfg, "--output", run, "--set", "train.epochs=2", "--set", "train.log_every_steps=2"};
    CHECK(run_cli(args, {{"MIRRORED_TEST_KILL_DURING_CHECKPOINT", "12"}}) == 128 + SIGKILL);
    REQUIRE(run_cli(args, {}, -1, nullptr, Stdout::file, d / "train.txt") == kExitOk);
    CHECK(read_text(d / "train.txt").find("curves: mirrored report " + run) != std::string::npos);

    std::vector<json> records;
    std::map<std::string, int> count;
    for (std::ifstream in(run + "/metrics.jsonl"); in;) {
        std::string line;
        if (!std::getline(in, line) || line.empty()) continue;
        records.push_back(json::parse(line));
        CHECK(records.back().contains("time"));
        ++count[records.back()["type"].get<std::string>()];
    }
    REQUIRE(count["resume"] == 1);
    for (const json& r : records)
        if (r["type"] == "resume") {
            CHECK(r["step"] == 8);          // the checkpoint of step 12 was cut short: 8 is the newest
            CHECK(r["redone_steps"] == 4);  // logged up to 12 before the kill
        }
    CHECK(count["train"] == 16);  // 2 epochs of 16 steps, every 2nd logged; the redone ones once
    // what the resumed process cost in device hours (one CPU replica: one device), adding up
    const json s = read_json(run + "/summary.json");
    const json& h = s["device_hours"];
    CHECK(h["devices"] == 1);
    CHECK(h["total"].get<double>() == doctest::Approx(s["wall_time_s"].get<double>() / 3600).epsilon(0.01));
    CHECK(h["compute"].get<double>() + h["data_wait"].get<double>() + h["comm_wait"].get<double>() +
              h["other"].get<double>() ==
          doctest::Approx(h["total"].get<double>()).epsilon(0.01));
    CHECK(h["redone"].get<double>() > 0);  // 4 of the 24 steps this process ran
    CHECK(h["redone"].get<double>() <
          h["compute"].get<double>() + h["data_wait"].get<double>() + h["comm_wait"].get<double>());
    // and the run across both processes: the hours the checkpoint of step 8 recorded, plus the
    // killed process's steps after it (lost, as long as this process took to redo them)
    const std::vector<std::string> kept = list_checkpoints(run + "/checkpoints");
    REQUIRE(!kept.empty());
    const double at_end = std::stod(read_safetensors(kept.back(), true).metadata.at("device_hours"));
    CHECK(h["earlier_processes"].get<double>() > h["redone"].get<double>());  // the checkpoint's hours too
    CHECK(h["run_total"].get<double>() ==
          doctest::Approx(h["earlier_processes"].get<double>() + h["total"].get<double>()).epsilon(1e-9));
    CHECK(at_end > h["earlier_processes"].get<double>());  // the last checkpoint, at the end: nearly all of it
    CHECK(at_end <= h["run_total"].get<double>());
    std::vector<std::string> rows;
    for (std::ifstream in(run + "/metrics.csv"); in;) {
        std::string line;
        if (std::getline(in, line) && !line.empty()) rows.push_back(line);
    }
    REQUIRE(rows.size() == records.size() + 1);
    CHECK(rows[0].rfind("type,time,step,epoch,loss,accuracy,lr,samples_per_sec,data_wait,compute,comm", 0) == 0);
    for (size_t i = 0; i < records.size(); ++i) {
        CAPTURE(rows[i + 1]);
        const std::string type = records[i]["type"], step = std::to_string(records[i]["step"].get<int64_t>());
        CHECK(rows[i + 1].rfind(type + ",", 0) == 0);
        CHECK(rows[i + 1].find("," + step + ",") != std::string::npos);
    }

    if (std::system("/usr/bin/python3 -c 'import matplotlib' 2>/dev/null") != 0) {
        mark_skipped("python3-matplotlib is not installed (scripts/install_deps.sh installs it): report not drawn");
        return;
    }
    std::string err;
    REQUIRE_MESSAGE(run_cli({"report", run}, {}, -1, &err) == kExitOk, err);
    const std::string out = run + "/report";
    const json rep = read_json(out + "/report.json");
    const json& plotted = rep["runs"][0]["plotted"];
    CHECK(plotted["train_loss"] == count["train"]);
    CHECK(plotted["train_loss_time"] == count["train"]);
    CHECK(plotted["test_loss"] == count["eval"]);
    CHECK(plotted["lr"] == count["train"]);
    CHECK(plotted["samples_per_sec"] == count["train"]);
    CHECK(plotted["resumes"] == 1);
    CHECK(rep["table"][0]["steps redone"] == 4);
    CHECK(rep["table"][0]["device hours"].get<double>() == doctest::Approx(h["total"].get<double>()));
    const std::string page = read_text(out + "/report.html");
    for (const char* png :
         {"loss.png", "accuracy.png", "loss_time.png", "lr.png", "throughput.png", "time_split.png"}) {
        CAPTURE(png);
        const std::string bytes = read_text(out + "/" + png);
        CHECK(bytes.rfind("\x89PNG\r\n\x1a\n", 0) == 0);
        CHECK(page.find(std::string("alt='") + png + "' src='data:image/png;base64,") != std::string::npos);
    }
    // two runs overlaid; a folder the report did not write is refused, an empty one used
    CHECK(run_cli({"report", run, run, "--out", d / "two"}) == kExitOk);
    CHECK(read_json(d / "two/report.json")["runs"].size() == 2);
    CHECK(run_cli({"report", run, "--out", run + "/checkpoints"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("a report did not write") != std::string::npos);
    CHECK(run_cli({"report", d / "nothing"}, {}, -1, &err) == kExitUsage);
    CHECK(err.find("no metrics.jsonl") != std::string::npos);
}

// `report` on hostile run folders: names that read as options or as matplotlib's mathematics,
// records whose fields have the wrong JSON type, and an output folder that cannot be written,
// whose partial output a rerun then writes over.
TEST_CASE("report: folders named like options or with $, records of the wrong type, an unwritable --out") {
    if (std::system("/usr/bin/python3 -c 'import matplotlib' 2>/dev/null") != 0) {
        mark_skipped("python3-matplotlib is not installed (scripts/install_deps.sh installs it): report not drawn");
        return;
    }
    TempDir d;
    const auto make_run = [&](const std::string& name) {
        const fs::path run = d.path() / name;
        fs::create_directories(run);
        std::ofstream f(run / "metrics.jsonl");
        f << R"({"type": "train", "step": 1, "time": 10.0, "loss": 2.5, "lr": 0.1, "samples_per_sec": 100})"
          << "\n"
          << R"({"type": "train", "step": 2, "time": 11.0, "loss": "NaN", "lr": [1], "time_split": 7})"
          << "\n"
          << R"({"type": "train", "step": {"a": 1}, "time": "late", "loss": true})"
          << "\n"
          << R"({"type": "eval", "step": 2, "time": 12.0, "test_loss": 2.0, "test_accuracy": null})"
          << "\n"
          << R"({"type": "resume", "step": "x", "time": 12.5, "redone_steps": "many"})"
          << "\n"
          << R"({"type": ["train"]})"
          << "\n"
          << R"([1, 2, 3])"
          << "\n"
          << std::string(5000, '[')  // nested past Python's recursion limit
          << "\n"
          << R"({"type": "train", "step": 3, "time": 13.0, "loss": 2.0})"
          << "\n";
        return run.string();
    };
    // a folder named "--out=.." would have sent the report into the parent; "-h" printed help
    const std::string dashed = make_run("--out=.."), help = make_run("-h"), dollar = make_run("cost $5 $x^2");
    std::string err;
    const fs::path cwd = fs::current_path();
    fs::current_path(d.path());
    const int rc_dashed = run_cli({"report", "--out", "r1", "--", "--out=.."}, {}, -1, &err);
    const int rc_help = run_cli({"report", "--out", "r2", "--", "-h"}, {}, -1, &err);
    fs::current_path(cwd);
    CHECK(rc_dashed == kExitOk);
    CHECK(rc_help == kExitOk);
    CHECK(fs::exists(d.path() / "r1" / "report.html"));
    CHECK(fs::exists(d.path() / "r2" / "report.html"));
    CHECK(!fs::exists(d.path().parent_path() / "report.html"));
    REQUIRE_MESSAGE(run_cli({"report", dollar, "--out", d / "r3"}, {}, -1, &err) == kExitOk, err);
    const json rep = read_json(d / "r3/report.json");
    const json& run = rep["runs"][0];
    CHECK(run["records"]["train"] == 4);       // the three train records and the last; the wrong types absent
    CHECK(run["skipped_lines"] == 3);          // a type that is a list, an array, a nesting
    CHECK(run["plotted"]["train_loss"] == 2);  // steps 1 and 3: "NaN", true and a step of an object are not numbers
    CHECK(run["plotted"]["lr"] == 1);
    CHECK(run["plotted"]["resumes"] == 1);
    CHECK(rep["table"][0]["steps redone"] == 0);
    // an --out that cannot be written: exit 4 (as every failed write) naming it; the rerun writes
    // over the partial output
    const fs::path out = d.path() / "r4";
    fs::create_directories(out / "report.json.tmp");  // the atomic write's temporary is a folder: EISDIR
    { std::ofstream(out / "report.json") << "{}"; }
    CHECK(run_cli({"report", dollar, "--out", out.string()}, {}, -1, &err) == kExitCheckpoint);
    CHECK(err.find("could not be written") != std::string::npos);
    CHECK(err.find("report.json.tmp") != std::string::npos);
    fs::remove(out / "report.json.tmp");
    REQUIRE_MESSAGE(run_cli({"report", dollar, "--out", out.string()}, {}, -1, &err) == kExitOk, err);
    CHECK(read_json(out / "report.json")["runs"].size() == 1);
}
