// Graphs on the simulated GPU: stream capture across devices, replay, and the rules CUDA enforces
// inside a capture - so the captured training step (strategy.cuda_graph) is tested without a GPU.
// The strategy's use of graphs is tested in test_strategy.cpp.
#include <doctest/doctest.h>

#include "base/error.h"
#include "kernels/sim/sim.h"
#include "kernels/ops/flat.h"
#include "tests/helpers.h"

using namespace mirrored;
using namespace mirrored::test;

namespace {

struct SimGraphScope {
    explicit SimGraphScope(int delay_us) {
        sim_reset();
        sim_set_delays(delay_us);
        backend_of(DeviceType::sim).enable_peer_access({0, 1});
    }
    ~SimGraphScope() { sim_reset(); }
};

// Two GPUs' worth of work with a fork and a join: GPU 0 scales x, GPU 1 adds x into y (peer
// load) and scales y, GPU 0 adds y back into x. Issued on each device's compute stream.
struct TwoGpuWork {
    Device& a;
    Device& b;
    float* x;  // on a
    float* y;  // on b
    size_t n;
    Event fork, join;
    void issue() const {
        scale_floats(a, a.compute_stream(), n, 2.0f, x);
        a.event_record(fork, a.compute_stream());
        b.stream_wait_event(b.compute_stream(), fork);
        b.reduce_from_peer(b.compute_stream(), y, a, x, DType::f32, n);
        scale_floats(b, b.compute_stream(), n, 0.5f, y);
        b.event_record(join, b.compute_stream());
        a.stream_wait_event(a.compute_stream(), join);
        a.reduce_from_peer(a.compute_stream(), x, b, y, DType::f32, n);
    }
};

}  // namespace

TEST_CASE(
    "sim graphs: work captured across two GPUs runs only when launched, and N launches equal N issued runs bit for "
    "bit") {
    SimGraphScope scope(30);
    Rng rng(71);
    const size_t n = 4099;
    const std::vector<float> x0 = rng.normal(n), y0 = rng.normal(n);
    auto a = make_sim_device(0), b = make_sim_device(1);
    REQUIRE(a->supports_graphs());
    auto run = [&](bool captured, int times) {
        DeviceBuffer<float> x = upload(*a, x0), y = upload(*b, y0);
        a->synchronize();
        b->synchronize();
        TwoGpuWork w{*a, *b, x.data(), y.data(), n, a->event_create(), b->event_create()};
        if (captured) {
            a->capture_begin(a->compute_stream());
            w.issue();
            const Graph g = a->capture_end(a->compute_stream());
            a->synchronize();
            b->synchronize();
            CHECK(download(*a, x) == x0);  // nothing ran during the capture
            CHECK(download(*b, y) == y0);
            const HostWork before = a->host_work();
            for (int i = 0; i < times; ++i) a->graph_launch(g, a->compute_stream());
            CHECK((a->host_work() - before).total() == uint64_t(times));  // one host call per replay
            CHECK((a->host_work() - before).graph_launches == uint64_t(times));
            // The launch stream's later work waits for the whole graph, GPU 1's part included.
            std::vector<float> got(n);
            a->copy_to_host(a->compute_stream(), got.data(), x.data(), n * sizeof(float));
            a->graph_destroy(g);
        } else {
            for (int i = 0; i < times; ++i) w.issue();
        }
        a->synchronize();
        b->synchronize();
        std::pair<std::vector<float>, std::vector<float>> out{download(*a, x), download(*b, y)};
        a->event_destroy(w.fork);
        b->event_destroy(w.join);
        return out;
    };
    for (int times : {1, 3}) {
        CAPTURE(times);
        const auto want = run(false, times), got = run(true, times);
        CHECK(got.first == want.first);
        CHECK(got.second == want.second);
        CHECK(got.first != x0);
    }
}

TEST_CASE("sim graphs: a launch runs after the launch stream's earlier work and before its later work") {
    SimGraphScope scope(200);
    auto a = make_sim_device(0);
    const size_t n = 1000;
    DeviceBuffer<float> x(*a, n);
    const Stream s = a->compute_stream();
    a->capture_begin(s);
    scale_floats(*a, s, n, 3.0f, x.data());
    const Graph g = a->capture_end(s);
    for (int round = 0; round < 5; ++round) {
        fill_floats(*a, s, n, 1.0f + float(round), x.data());
        a->graph_launch(g, s);
        axpy_floats(*a, s, n, 1.0f, x.data(), x.data());  // doubles what the graph left
        const std::vector<float> got = download(*a, x);
        CHECK(got[0] == 6.0f * (1.0f + float(round)));
        CHECK(got[n - 1] == got[0]);
    }
    a->graph_destroy(g);
}

TEST_CASE(
    "sim graphs: CUDA's capture rules - isolation, unjoined streams, pageable copies, host syncs - throw and name the "
    "rule") {
    SimGraphScope scope(0);
    auto a = make_sim_device(0), b = make_sim_device(1);
    const Stream s = a->compute_stream();
    DeviceBuffer<float> x(*a, 16), y(*b, 16);
    std::vector<float> host(16, 1.0f);

    SUBCASE("waiting on an event recorded outside the capture invalidates it") {
        const Event outside = b->event_create();
        b->event_record(outside, b->compute_stream());
        a->capture_begin(s);
        CHECK_THROWS_WITH_AS(a->stream_wait_event(s, outside), doctest::Contains("recorded outside the capture"),
                             DeviceError);
        CHECK_THROWS_WITH_AS(a->capture_end(s), doctest::Contains("invalidated"), DeviceError);
        b->event_destroy(outside);
    }
    SUBCASE("a stream that joined and never joined back") {
        const Event fork = a->event_create();
        a->capture_begin(s);
        a->event_record(fork, s);
        b->stream_wait_event(b->compute_stream(), fork);
        fill_floats(*b, b->compute_stream(), 16, 2.0f, y.data());
        CHECK_THROWS_WITH_AS(a->capture_end(s), doctest::Contains("not joined back"), DeviceError);
        // the capture has ended: the event may not be waited on until recorded again
        CHECK_THROWS_WITH_AS(b->stream_wait_event(b->copy_stream(), fork), doctest::Contains("record it again"),
                             DeviceError);
        a->event_record(fork, s);
        b->stream_wait_event(b->copy_stream(), fork);
        a->event_destroy(fork);
    }
    SUBCASE("copies from pageable memory and host synchronisation on a captured stream") {
        a->capture_begin(s);
        CHECK_THROWS_WITH_AS(a->copy_to_device(s, x.data(), host.data(), 64), doctest::Contains("pageable"),
                             DeviceError);
        CHECK_THROWS_WITH_AS(a->capture_end(s), doctest::Contains("invalidated"), DeviceError);
        a->capture_begin(s);
        CHECK_THROWS_WITH_AS(a->stream_synchronize(s), doctest::Contains("being captured"), DeviceError);
        CHECK_THROWS_AS(a->capture_end(s), DeviceError);
        a->capture_begin(s);
        CHECK_THROWS_AS(a->capture_begin(s), DeviceError);  // already capturing
        CHECK_THROWS_WITH_AS(a->capture_end(a->comm_stream()), doctest::Contains("not the origin"), DeviceError);
        const Graph g = a->capture_end(s);  // empty, valid
        a->graph_launch(g, s);
        a->synchronize();
        a->graph_destroy(g);
    }
    SUBCASE("CPU replicas have nothing to capture") {
        auto cpu = make_cpu_device(0);
        CHECK_FALSE(cpu->supports_graphs());
        CHECK_THROWS_WITH_AS(cpu->capture_begin(cpu->compute_stream()), doctest::Contains("needs a GPU"), DeviceError);
    }
    a->synchronize();
    b->synchronize();
}
