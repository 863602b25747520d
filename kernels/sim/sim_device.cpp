// The simulated GPU (kernels/sim/sim.h says what it simulates and why). Each stream is a worker
// thread; ops are tasks that call the CPU reference; events are markers shared between streams.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backends.h"
#include "kernels/device.h"
#include "base/env.h"
#include "base/error.h"
#include "kernels/nccl.h"
#include "kernels/op_math.h"
#include "kernels/peer_staging.h"
#include "kernels/sim/sim.h"
#include "kernels/sim/sim_internal.h"

namespace mirrored {

namespace {

constexpr int kMaxSimGpus = 64;
constexpr uint32_t kNanBits = 0x7FC00000u;

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- process-wide state: one mutex and one condition variable guard every marker and wake
// every waiter. Simple, and the simulation is for correctness, not speed.
std::mutex g_mu;
std::condition_variable g_cv;

struct Marker {  // one record of an event, or the end of one task the host waits for
    bool done = false;
    double time = 0;  // when it completed
};
using MarkerPtr = std::shared_ptr<Marker>;

struct GpuState {  // per simulated GPU, guarded by g_mu
    uint64_t launches = 0, fault_at = 0;
    uint64_t hang_at = 0;                      // a hung kernel: the hang_at-th launch never finishes
    uint64_t peer_copies = 0, corrupt_at = 0;  // a bad link: the corrupt_at-th copy from a peer flips a bit
    uint64_t api_calls = 0, api_error_at = 0;
    std::string sticky;           // the first fault: every later host call fails with it
    bool peer[kMaxSimGpus] = {};  // peer[b]: kernels here may load memory of GPU b
};

// A random delay per stream operation of up to this much (MIRRORED_SIM_DELAY_US): a second
// already reorders any step; more would only look like a hang.
constexpr int64_t kMaxSimDelayUs = 1000000;

struct World {
    GpuState gpus[kMaxSimGpus];
    std::atomic<int> max_delay_us{0};
    std::atomic<bool> peer_access{true};
    std::map<uintptr_t, size_t> device_mem, pinned_mem;  // begin -> bytes
};

World& world() {
    static World* w = [] {
        auto* x = new World;  // never destroyed: stream threads may outlive static destructors
        x->max_delay_us = int(env_integer("MIRRORED_SIM_DELAY_US", 0, 0, kMaxSimDelayUs));
        if (const char* p = std::getenv("MIRRORED_SIM_NO_PEER")) x->peer_access = !(*p && *p != '0');
        // "G:K" knobs: the K-th event of their kind on simulated GPU G (a malformed one is exit 2)
        const auto knob = [x](const char* name, uint64_t GpuState::*at_field) {
            const std::vector<std::string> f =
                env_fields(name, {{0, kMaxSimGpus - 1}, {1, int64_t(1) << 62}},
                           "GPU:COUNT, e.g. 0:120 (simulated GPU 0 to " + std::to_string(kMaxSimGpus - 1) +
                               ", the 1st or a later event)");
            if (!f.empty()) x->gpus[std::stoi(f[0])].*at_field = std::stoull(f[1]);
        };
        knob("MIRRORED_SIM_FAULT", &GpuState::fault_at);
        knob("MIRRORED_SIM_HANG", &GpuState::hang_at);
        knob("MIRRORED_SIM_CORRUPT", &GpuState::corrupt_at);
        return x;
    }();
    return *w;
}

void complete(const MarkerPtr& m) {
    {
        std::lock_guard<std::mutex> lock(g_mu);
        m->done = true;
        m->time = now_seconds();
    }
    g_cv.notify_all();
}

bool in_registry(const std::map<uintptr_t, size_t>& reg, const void* p, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = reg.upper_bound(a);
    if (it == reg.begin()) return false;
    --it;
    return a >= it->first && a + bytes <= it->first + std::max<size_t>(it->second, 1);
}

void* alloc_poisoned(size_t bytes) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (p) std::fill_n(static_cast<uint32_t*>(p), rounded / 4, kNanBits);
    return p;
}

class SimDevice;

struct Task {
    enum class Kind { launch, copy, other } kind = Kind::other;
    const char* what = "";
    std::function<void()> fn;
};

class SimStream;

// A stream capture in progress (Device::capture_begin): the work of every captured stream, in
// issue order. Record and wait nodes carry the cross-stream dependencies; a replay gives each
// record a fresh marker. Guarded by g_mu.
struct CaptureNode {
    enum class Kind { task, record, wait } kind = Kind::task;
    int stream = 0;   // index into Capture::streams
    Task task;        // kind task
    int record = -1;  // record: its number; wait: the record it waits for
};
struct Capture {
    uint64_t id = 0;
    std::vector<SimStream*> streams;  // the origin first, then each stream as it joined
    std::vector<CaptureNode> nodes;
    int records = 0;
    bool ended = false;
    std::string invalid;  // why the capture failed: capture_end reports it
    int index_of(SimStream* st) const { return int(std::find(streams.begin(), streams.end(), st) - streams.begin()); }
};
using CapturePtr = std::shared_ptr<Capture>;

// One stream: a worker thread running its queue in order.
class SimStream {
public:
    SimStream(SimDevice& dev, uint64_t seed) : dev_(dev), rng_(seed), thread_([this] { loop(); }) {}
    SimDevice& device() const { return dev_; }
    CapturePtr capture;  // while this stream is being captured (guarded by g_mu)
    ~SimStream() {
        {
            std::lock_guard<std::mutex> lock(mu_);
            quit_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    void push(Task t);
    bool idle() {
        std::lock_guard<std::mutex> lock(mu_);
        return queue_.empty() && !busy_;
    }
    void discard() {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.clear();
        idle_cv_.notify_all();
    }
    // Waits until the queue is empty and no task runs. After abandon() queued tasks are dropped
    // and blocked waits give up, so this ends; before, it waits like cudaFree.
    void drain() {
        std::unique_lock<std::mutex> lock(mu_);
        idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    }

private:
    void loop();
    SimDevice& dev_;
    std::mt19937_64 rng_;
    std::mutex mu_;
    std::condition_variable cv_, idle_cv_;
    std::deque<Task> queue_;
    bool busy_ = false, quit_ = false;
    std::thread thread_;  // last: starts once the rest is constructed
};

class SimDevice final : public Device {
public:
    explicit SimDevice(int ordinal)
        : Device(DeviceType::sim, ordinal, "sim:" + std::to_string(ordinal)), cpu_(make_cpu_device(ordinal)) {
        if (ordinal < 0 || ordinal >= kMaxSimGpus)
            throw DeviceError("sim:" + std::to_string(ordinal) + ": simulated GPUs are numbered 0 to " +
                              std::to_string(kMaxSimGpus - 1));
        world();  // its knobs read here, on the caller's thread: a malformed one is an error to report
        const uint64_t seed = uint64_t(ordinal) * 7919u + reinterpret_cast<uintptr_t>(this);
        for (int i = 0; i < 4; ++i) streams_.push_back(std::make_unique<SimStream>(*this, seed + uint64_t(i)));
        compute_.handle = streams_[0].get();
        comm_.handle = streams_[1].get();
        copy_.handle = streams_[2].get();
        staging_ = std::make_unique<PeerStaging>(*this, Stream{streams_[3].get()});
    }

    ~SimDevice() override {
        staging_.reset();
        drain_all();
        streams_.clear();  // joins the threads
    }

    std::string description() const override {
        return "simulated GPU " + std::to_string(ordinal()) + " (CUDA semantics on CPU threads, CPU reference ops)";
    }

    // ---- the host-call check every method starts with ---------------------------------
    // Counts the call, throws an injected error, and throws the sticky error of a failed GPU,
    // naming the call, this file and line, and the device (as CUDA_CHECK does).
    void api(const char* what, int line) {
        std::lock_guard<std::mutex> lock(g_mu);
        GpuState& g = world().gpus[ordinal()];
        ++g.api_calls;
        if (g.api_error_at != 0 && g.api_calls == g.api_error_at) {
            g.api_error_at = 0;
            throw DeviceError(name() + ": " + what + " failed: invalid argument (simulated error at host call " +
                              std::to_string(g.api_calls) + ") (" + __FILE__ + ":" + std::to_string(line) + ")");
        }
        if (!g.sticky.empty())
            throw DeviceError(
                name() + ": " + what + " failed: " + g.sticky + " (" + __FILE__ + ":" + std::to_string(line) + ")",
                name());
    }
#define SIM_API(what) api(what, __LINE__)

    // Host synchronisation, pageable copies (and the simulated NCCL) have no place in a graph:
    // they throw and invalidate the capture, as CUDA's cudaErrorStreamCaptureUnsupported does.
    void refuse_in_capture(Stream s, const char* what) {
        std::lock_guard<std::mutex> lock(g_mu);
        SimStream& st = stream(s);
        if (!st.capture) return;
        st.capture->invalid = std::string(what) + " inside the capture";
        throw DeviceError(name() + ": " + what + ": not permitted while the stream is being captured");
    }
    // Whether queued work must be dropped (the device was abandoned or its GPU failed). g_mu held.
    bool dropping_locked() const { return abandoned_ || !world().gpus[ordinal()].sticky.empty(); }

    // A task on stream s; launches and copies are counted and launches may fault.
    void enqueue(Stream s, Task::Kind kind, const char* what, std::function<void()> fn) {
        if (kind == Task::Kind::launch) ++work_.launches;
        if (kind == Task::Kind::copy) ++work_.copies;
        stream(s).push(Task{kind, what, std::move(fn)});
    }
    void launch(Stream s, const char* what, std::function<void()> fn) {
        enqueue(s, Task::Kind::launch, what, std::move(fn));
    }

    // Runs on a stream thread: false when the task must be dropped. A launch that hits the
    // injected fault makes the GPU's error sticky instead of running.
    bool admit(const Task& t) {
        {
            std::lock_guard<std::mutex> lock(g_mu);
            if (dropping_locked()) return false;
            if (t.kind != Task::Kind::launch) return true;
            GpuState& g = world().gpus[ordinal()];
            ++g.launches;
            if (g.fault_at != 0 && g.launches == g.fault_at) {
                g.sticky = std::string("an illegal memory access was encountered (simulated fault in launch ") +
                           std::to_string(g.launches) + ", " + t.what + ")";
                g_cv.notify_all();
                return false;
            }
            if (g.hang_at == 0 || g.launches != g.hang_at) return true;
        }
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // a kernel that never returns: no error, no end
    }
    int max_delay_us() const { return world().max_delay_us.load(std::memory_order_relaxed); }

    // A stream waits for a marker (an event record, possibly on another device).
    void wait_marker(const MarkerPtr& m) {
        std::unique_lock<std::mutex> lock(g_mu);
        g_cv.wait(lock, [&] { return m->done || dropping_locked(); });
    }
    // The host waits for a marker; throws the sticky error if the GPU fails meanwhile.
    void host_wait(const MarkerPtr& m, const char* what, int line) {
        ++work_.host_syncs;
        {
            std::unique_lock<std::mutex> lock(g_mu);
            g_cv.wait(lock, [&] { return m->done || dropping_locked(); });
            if (m->done || abandoned_) return;
        }
        api(what, line);  // throws the sticky error
    }
    MarkerPtr mark(Stream s) {
        auto m = std::make_shared<Marker>();
        enqueue(s, Task::Kind::other, "marker", [m] { complete(m); });
        return m;
    }

    // ---- memory --------------------------------------------------------------------------
    void* alloc_bytes(size_t bytes) override {
        SIM_API("alloc_bytes");
        void* p = alloc_poisoned(bytes);
        if (!p) throw DeviceError(name() + ": out of memory allocating " + std::to_string(bytes) + " bytes");
        note_alloc(p, bytes);
        std::lock_guard<std::mutex> lock(g_mu);
        world().device_mem[reinterpret_cast<uintptr_t>(p)] = bytes;
        return p;
    }
    void free_bytes(void* p) noexcept override {
        if (!p) return;
        drain_all();  // cudaFree waits for the device (after abandon(): for the task still running)
        note_free(p);
        {
            std::lock_guard<std::mutex> lock(g_mu);
            world().device_mem.erase(reinterpret_cast<uintptr_t>(p));
        }
        std::free(p);
    }
    void* alloc_host_bytes(size_t bytes) override {
        SIM_API("alloc_host_bytes");
        void* p = alloc_poisoned(bytes);
        if (!p)
            throw DeviceError(name() + ": out of pinned host memory allocating " + std::to_string(bytes) + " bytes");
        std::lock_guard<std::mutex> lock(g_mu);
        world().pinned_mem[reinterpret_cast<uintptr_t>(p)] = bytes;
        return p;
    }
    void free_host_bytes(void* p) noexcept override {
        if (!p) return;
        {
            std::lock_guard<std::mutex> lock(g_mu);
            world().pinned_mem.erase(reinterpret_cast<uintptr_t>(p));
        }
        std::free(p);
    }
    void check_memory(const void* device_ptr, const void* host_ptr, size_t bytes, const char* what) const {
        std::lock_guard<std::mutex> lock(g_mu);
        if (!in_registry(world().device_mem, device_ptr, bytes))
            throw DeviceError(name() + ": " + what + ": " + std::to_string(bytes) +
                              " bytes at the device address are not (all) device memory");
        if (host_ptr && in_registry(world().device_mem, host_ptr, 1))
            throw DeviceError(name() + ": " + what + ": the host address is device memory");
    }
    bool pinned(const void* p, size_t bytes) const {
        std::lock_guard<std::mutex> lock(g_mu);
        return in_registry(world().pinned_mem, p, bytes);
    }
    void copy_to_device(Stream s, void* dst, const void* src, size_t bytes) override {
        SIM_API("copy_to_device");
        if (!bytes) return;
        check_memory(dst, src, bytes, "copy_to_device");
        if (pinned(src, bytes)) {
            enqueue(s, Task::Kind::copy, "copy_to_device", [=] { std::memcpy(dst, src, bytes); });
            return;
        }
        refuse_in_capture(s, "copy_to_device from pageable host memory");
        // pageable: the source is staged before the call returns
        auto snapshot = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                                     static_cast<const unsigned char*>(src) + bytes);
        enqueue(s, Task::Kind::copy, "copy_to_device", [=] { std::memcpy(dst, snapshot->data(), bytes); });
    }
    void copy_to_host(Stream s, void* dst, const void* src, size_t bytes) override {
        SIM_API("copy_to_host");
        if (!bytes) return;
        check_memory(src, dst, bytes, "copy_to_host");
        if (!pinned(dst, bytes)) refuse_in_capture(s, "copy_to_host into pageable host memory");
        enqueue(s, Task::Kind::copy, "copy_to_host", [=] { std::memcpy(dst, src, bytes); });
        if (!pinned(dst, bytes)) host_wait(mark(s), "copy_to_host", __LINE__);  // pageable: returns once done
    }
    void copy_on_device(Stream s, void* dst, const void* src, size_t bytes) override {
        SIM_API("copy_on_device");
        if (!bytes || dst == src) return;
        check_memory(dst, nullptr, bytes, "copy_on_device");
        check_memory(src, nullptr, bytes, "copy_on_device");
        enqueue(s, Task::Kind::copy, "copy_on_device", [=] { std::memmove(dst, src, bytes); });
    }

    // ---- streams and events ----------------------------------------------------------------
    struct SimEvent {
        bool timing = false;
        MarkerPtr latest;     // guarded by g_mu
        CapturePtr captured;  // last recorded inside this capture (then latest is null)
        int captured_record = -1;
    };
    static SimEvent& ev(Event e) { return *static_cast<SimEvent*>(e.handle); }

    Event event_create(bool timing) override {
        SIM_API("event_create");
        auto* e = new SimEvent;
        e->timing = timing;
        return Event{e};
    }
    void event_destroy(Event e) noexcept override { delete static_cast<SimEvent*>(e.handle); }
    void event_record(Event e, Stream s) override {
        SIM_API("event_record");
        ++work_.event_records;
        auto m = std::make_shared<Marker>();
        {
            std::lock_guard<std::mutex> lock(g_mu);
            SimStream& st = stream(s);
            SimEvent& E = ev(e);
            if (st.capture) {  // a record node: each replay records afresh
                E.latest = nullptr;
                E.captured = st.capture;
                E.captured_record = st.capture->records++;
                st.capture->nodes.push_back(
                    {CaptureNode::Kind::record, st.capture->index_of(&st), {}, E.captured_record});
                return;
            }
            E.latest = m;
            E.captured = nullptr;
        }
        stream(s).push(Task{Task::Kind::other, "event_record", [m] { complete(m); }});
    }
    void stream_wait_event(Stream s, Event e) override {
        SIM_API("stream_wait_event");
        ++work_.stream_waits;
        MarkerPtr m;
        {
            std::lock_guard<std::mutex> lock(g_mu);
            SimStream& st = stream(s);
            SimEvent& E = ev(e);
            if (E.captured) {
                if (E.captured->ended)
                    throw DeviceError(
                        name() +
                        ": stream_wait_event: the event was last recorded inside a stream capture that has "
                        "ended; record it again outside before waiting on it");
                if (st.capture && st.capture != E.captured) {
                    st.capture->invalid = "a stream of this capture waited on an event of another capture";
                    throw DeviceError(name() + ": stream_wait_event: " + st.capture->invalid);
                }
                if (!st.capture) {  // the stream joins the capture, as CUDA's cross-stream capture does
                    st.capture = E.captured;
                    st.capture->streams.push_back(&st);
                }
                st.capture->nodes.push_back(
                    {CaptureNode::Kind::wait, st.capture->index_of(&st), {}, E.captured_record});
                return;
            }
            m = E.latest;           // the record that is the latest now, as CUDA captures it
            if (m && st.capture) {  // CUDA: cudaErrorStreamCaptureIsolation
                st.capture->invalid = "a captured stream waited on an event recorded outside the capture";
                throw DeviceError(name() + ": stream_wait_event: " + st.capture->invalid);
            }
        }
        if (!m) return;  // never recorded: nothing to wait for
        stream(s).push(Task{Task::Kind::other, "stream_wait_event", [this, m] { wait_marker(m); }});
    }
    bool event_query(Event e) override {
        SIM_API("event_query");
        std::lock_guard<std::mutex> lock(g_mu);
        if (ev(e).captured)
            throw DeviceError(name() + ": event_query: the event was last recorded inside a stream capture");
        return !ev(e).latest || ev(e).latest->done;
    }
    void event_synchronize(Event e) override {
        SIM_API("event_synchronize");
        MarkerPtr m;
        {
            std::lock_guard<std::mutex> lock(g_mu);
            if (ev(e).captured)
                throw DeviceError(name() + ": event_synchronize: the event was last recorded inside a stream capture");
            m = ev(e).latest;
        }
        if (m) host_wait(m, "event_synchronize", __LINE__);
    }
    void stream_synchronize(Stream s) override {
        SIM_API("stream_synchronize");
        refuse_in_capture(s, "stream_synchronize");
        host_wait(mark(s), "stream_synchronize", __LINE__);
    }
    void synchronize() override {
        SIM_API("synchronize");
        for (auto& st : streams_) refuse_in_capture(Stream{st.get()}, "synchronize");
        std::vector<MarkerPtr> marks;
        for (auto& st : streams_) marks.push_back(mark(Stream{st.get()}));
        for (auto& m : marks) host_wait(m, "synchronize", __LINE__);
    }
    bool query_idle() override {
        SIM_API("query_idle");
        for (auto& s : streams_)
            if (!s->idle()) return false;
        return true;
    }
    void abandon() noexcept override {
        abandoned_ = true;
        for (auto& s : streams_) s->discard();
        { std::lock_guard<std::mutex> lock(g_mu); }
        g_cv.notify_all();
    }
    float event_elapsed_ms(Event a, Event b) override {
        SIM_API("event_elapsed_ms");
        std::lock_guard<std::mutex> lock(g_mu);
        if (!ev(a).timing || !ev(b).timing)
            throw DeviceError(name() + ": event_elapsed_ms: events were created without timing");
        if (!ev(a).latest || !ev(b).latest || !ev(a).latest->done || !ev(b).latest->done)
            throw DeviceError(name() + ": event_elapsed_ms: device not ready (an event has not completed)");
        return float((ev(b).latest->time - ev(a).latest->time) * 1e3);
    }
    void host_callback(Stream s, void (*fn)(void*), void* arg) override {
        SIM_API("host_callback");
        ++work_.callbacks;
        stream(s).push(Task{Task::Kind::other, "host_callback", [fn, arg] { fn(arg); }});
    }

    // ---- graphs ------------------------------------------------------------------------------
    uint64_t capture_id(Stream s) const override {
        std::lock_guard<std::mutex> lock(g_mu);
        return stream(s).capture ? stream(s).capture->id : 0;
    }
    void capture_begin(Stream s) override {
        SIM_API("capture_begin");
        std::lock_guard<std::mutex> lock(g_mu);
        SimStream& st = stream(s);
        if (st.capture) throw DeviceError(name() + ": capture_begin: the stream is already being captured");
        static uint64_t captures = 0;  // guarded by g_mu
        st.capture = std::make_shared<Capture>();
        st.capture->id = ++captures;
        st.capture->streams.push_back(&st);
    }
    Graph capture_end(Stream s) override {
        SIM_API("capture_end");
        CapturePtr cap;
        {
            std::lock_guard<std::mutex> lock(g_mu);
            SimStream& st = stream(s);
            if (!st.capture || st.capture->streams[0] != &st)
                throw DeviceError(name() + ": capture_end: the stream is not the origin of a capture");
            cap = st.capture;
            for (SimStream* x : cap->streams) x->capture = nullptr;
            cap->ended = true;
        }
        if (!cap->invalid.empty())
            throw DeviceError(name() + ": capture_end: the capture was invalidated: " + cap->invalid);
        if (const int k = unjoined(*cap); k >= 0)
            throw DeviceError(name() + ": capture_end: a stream of " + cap->streams[size_t(k)]->device().name() +
                              " joined the capture and was not joined back (CUDA: cudaErrorStreamCaptureUnjoined)");
        auto g = std::make_unique<SimGraph>();
        for (SimStream* x : cap->streams)
            g->streams.push_back(
                std::make_unique<SimStream>(x->device(), reinterpret_cast<uintptr_t>(x) + g->streams.size()));
        g->nodes = std::move(cap->nodes);
        g->records = cap->records;
        return Graph{g.release()};
    }
    // Each captured stream replays on a stream of its own (on its device), so that only the
    // captured dependencies order the nodes, as in a CUDA graph; s waits for all of them.
    void graph_launch(Graph g, Stream s) override {
        SIM_API("graph_launch");
        ++work_.graph_launches;
        refuse_in_capture(s, "graph_launch");
        SimGraph& G = *static_cast<SimGraph*>(g.handle);
        const MarkerPtr start = mark(s);
        std::vector<MarkerPtr> records(size_t(G.records));
        for (auto& m : records) m = std::make_shared<Marker>();
        for (auto& st : G.streams)
            st->push(Task{Task::Kind::other, "graph start", [d = &st->device(), start] { d->wait_marker(start); }});
        for (const CaptureNode& n : G.nodes) {
            SimStream& st = *G.streams[size_t(n.stream)];
            switch (n.kind) {
                case CaptureNode::Kind::task:
                    st.push(n.task);
                    break;
                case CaptureNode::Kind::record:
                    st.push(Task{Task::Kind::other, "event_record", [m = records[size_t(n.record)]] { complete(m); }});
                    break;
                case CaptureNode::Kind::wait:
                    st.push(Task{Task::Kind::other, "stream_wait_event",
                                 [d = &st.device(), m = records[size_t(n.record)]] { d->wait_marker(m); }});
                    break;
            }
        }
        std::vector<MarkerPtr> ends;
        for (auto& st : G.streams) {
            ends.push_back(std::make_shared<Marker>());
            st->push(Task{Task::Kind::other, "graph end", [m = ends.back()] { complete(m); }});
        }
        stream(s).push(Task{Task::Kind::other, "graph end", [this, ends] {
                                for (const MarkerPtr& m : ends) wait_marker(m);
                            }});
    }
    void graph_destroy(Graph g) noexcept override { delete static_cast<SimGraph*>(g.handle); }

    void set_precision(Precision p) override {
        precision_ = p;
        cpu_->set_precision(p);
    }

    // ---- ops: the CPU reference, run on the stream's thread ---------------------------------
    // An op family's CPU loops (kernels/ops/), run on the stream's thread against the CPU reference.
    void launch_host(Stream s, const char* op, HostOp work) override {
        SIM_API(op);
        launch(s, op, [this, work = std::move(work)] { work(*cpu_); });
    }

    void reduce_from_peer(Stream s, void* dst, const Device& peer, const void* src, DType t, size_t n) override {
        SIM_API("reduce_from_peer");
        const int p = require_sim(peer);
        check_wire_dtype(*this, t);
        bool can_load = p == ordinal();
        {
            std::lock_guard<std::mutex> lock(g_mu);
            can_load = can_load || world().gpus[ordinal()].peer[p];
        }
        const PeerTransport transport = peer_transport();
        if (transport == PeerTransport::direct && !can_load)
            throw DeviceError(name() + ": direct peer loads from sim:" + std::to_string(p) + " need peer access");
        // One kernel loads the peer's memory and adds (always for a local add: staging's own).
        if (&peer == this || (can_load && transport != PeerTransport::staged)) {
            launch(s, "reduce_from_peer", [=] { host_peer_add(dst, src, t, n); });
            return;
        }
        staging_->reduce(s, dst, peer, src, t, n);
    }
    void copy_from_peer(Stream s, void* dst, const Device& peer, const void* src, size_t bytes) override {
        SIM_API("copy_from_peer");
        require_sim(peer);
        bool corrupt = false;
        if (&peer != this) {
            std::lock_guard<std::mutex> lock(g_mu);
            GpuState& g = world().gpus[ordinal()];
            corrupt = ++g.peer_copies == g.corrupt_at;
        }
        if (bytes)
            enqueue(s, Task::Kind::copy, "copy_from_peer", [=] {
                std::memcpy(dst, src, bytes);
                if (corrupt) static_cast<unsigned char*>(dst)[bytes - 1] ^= 0x10;  // one flipped bit
            });
    }
    bool can_load_from(const Device& peer) const override {
        if (peer.type() != DeviceType::sim) return false;
        if (peer.ordinal() == ordinal()) return true;
        std::lock_guard<std::mutex> lock(g_mu);
        return world().gpus[ordinal()].peer[peer.ordinal()];
    }
#undef SIM_API

private:
    static SimStream& stream(Stream s) { return *static_cast<SimStream*>(s.handle); }
    struct SimGraph {
        std::vector<std::unique_ptr<SimStream>> streams;  // one per captured stream, on its device
        std::vector<CaptureNode> nodes;
        int records = 0;
    };
    // The first joined stream whose last node the origin's last node does not depend on (-1: none).
    static int unjoined(const Capture& c) {
        const size_t n = c.nodes.size();
        std::vector<int> prev(n, -1), last(c.streams.size(), -1), record_at(size_t(c.records), -1);
        for (size_t i = 0; i < n; ++i) {
            const CaptureNode& x = c.nodes[i];
            prev[i] = last[size_t(x.stream)];
            last[size_t(x.stream)] = int(i);
            if (x.kind == CaptureNode::Kind::record) record_at[size_t(x.record)] = int(i);
        }
        std::vector<char> seen(n, 0);
        std::vector<int> todo{last[0]};
        while (!todo.empty()) {
            const int i = todo.back();
            todo.pop_back();
            if (i < 0 || seen[size_t(i)]) continue;
            seen[size_t(i)] = 1;
            todo.push_back(prev[size_t(i)]);
            if (c.nodes[size_t(i)].kind == CaptureNode::Kind::wait)
                todo.push_back(record_at[size_t(c.nodes[size_t(i)].record)]);
        }
        for (size_t k = 1; k < c.streams.size(); ++k)
            if (last[k] < 0 || !seen[size_t(last[k])]) return int(k);
        return -1;
    }
    int require_sim(const Device& peer) const {
        if (peer.type() != DeviceType::sim)
            throw DeviceError(name() + ": cannot exchange data with " + peer.name() +
                              " (replicas must all be of one kind)");
        return peer.ordinal();
    }
    void drain_all() noexcept {
        for (auto& s : streams_) s->drain();
    }

    std::unique_ptr<Device> cpu_;                      // computes every op
    std::vector<std::unique_ptr<SimStream>> streams_;  // compute, comm, copy, staging
    std::unique_ptr<PeerStaging> staging_;
};

void SimStream::push(Task t) {
    if (dev_.abandoned()) return;  // nothing runs on an abandoned device
    {
        std::lock_guard<std::mutex> lock(g_mu);
        if (capture) {  // recorded, not run
            capture->nodes.push_back({CaptureNode::Kind::task, capture->index_of(this), std::move(t), -1});
            return;
        }
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(std::move(t));
    }
    cv_.notify_all();
}

void SimStream::loop() {
    for (;;) {
        Task t;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return quit_ || !queue_.empty(); });
            if (queue_.empty()) return;  // quit_ and nothing left
            t = std::move(queue_.front());
            queue_.pop_front();
            busy_ = true;
        }
        if (dev_.admit(t)) {
            if (const int d = dev_.max_delay_us(); d > 0 && (rng_() & 1))
                std::this_thread::sleep_for(std::chrono::microseconds(rng_() % uint64_t(d)));
            t.fn();
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            busy_ = false;
            if (queue_.empty()) idle_cv_.notify_all();
        }
    }
}

}  // namespace

// ---- what the simulated NCCL (sim_nccl.cpp) needs ----------------------------------------
std::mutex& sim::world_mutex() { return g_mu; }
std::condition_variable& sim::world_wakeup() { return g_cv; }

void sim::launch_collective(Device& device, const char* api, CollectiveTask task) {
    auto& d = static_cast<SimDevice&>(device);
    d.api(api, __LINE__);
    // its rendezvous belongs to one call: a replay could not reuse it
    d.refuse_in_capture(d.comm_stream(), (std::string(api) + " (the simulated NCCL)").c_str());
    d.launch(d.comm_stream(), api, [&d, task = std::move(task)] { task([&d] { return d.dropping_locked(); }); });
}

std::unique_ptr<Device> make_sim_device(int ordinal) { return std::make_unique<SimDevice>(ordinal); }

std::vector<StagedPair> sim_enable_peer_access(const std::vector<int>& ordinals) {
    std::vector<StagedPair> staged;
    std::lock_guard<std::mutex> lock(g_mu);
    World& w = world();
    for (int a : ordinals)
        for (int b : ordinals) {
            if (a == b || a < 0 || b < 0 || a >= kMaxSimGpus || b >= kMaxSimGpus || w.gpus[a].peer[b]) continue;
            if (!w.peer_access) {
                staged.push_back({a, b, "peer access unsupported (simulated: MIRRORED_SIM_NO_PEER)"});
                continue;
            }
            w.gpus[a].peer[b] = true;
        }
    std::sort(staged.begin(), staged.end(),
              [](auto& x, auto& y) { return std::pair(x.from, x.to) < std::pair(y.from, y.to); });
    staged.erase(
        std::unique(staged.begin(), staged.end(), [](auto& x, auto& y) { return x.from == y.from && x.to == y.to; }),
        staged.end());
    return staged;
}

void sim_set_delays(int max_us) { world().max_delay_us = std::max(0, max_us); }

void sim_set_peer_access(bool available) { world().peer_access = available; }

void sim_inject_fault(int ordinal, uint64_t launch) {
    std::lock_guard<std::mutex> lock(g_mu);
    GpuState& g = world().gpus[ordinal];
    g.fault_at = g.launches + launch;
}

void sim_inject_corruption(int ordinal, uint64_t copy) {
    std::lock_guard<std::mutex> lock(g_mu);
    GpuState& g = world().gpus[ordinal];
    g.corrupt_at = g.peer_copies + copy;
}

void sim_inject_api_error(int ordinal, uint64_t call) {
    std::lock_guard<std::mutex> lock(g_mu);
    GpuState& g = world().gpus[ordinal];
    g.api_error_at = g.api_calls + call;
}

uint64_t sim_launches(int ordinal) {
    std::lock_guard<std::mutex> lock(g_mu);
    return world().gpus[ordinal].launches;
}

void sim_reset() {
    World& w = world();
    std::lock_guard<std::mutex> lock(g_mu);
    for (GpuState& g : w.gpus) g = GpuState{};
    w.max_delay_us = 0;
    w.peer_access = true;
    w.max_delay_us = int(env_integer("MIRRORED_SIM_DELAY_US", 0, 0, kMaxSimDelayUs));
    if (const char* p = std::getenv("MIRRORED_SIM_NO_PEER")) w.peer_access = !(*p && *p != '0');
}

}  // namespace mirrored
