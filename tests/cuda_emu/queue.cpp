// The emulated GPU's work queue for asynchronous streams (MIRRORED_CUDA_EMU_ASYNC): work issued
// to a stream waits here for what it depends on - the stream's earlier work and the events it
// waited for - and one executor thread, the GPU, runs it later and out of issue order, picking
// among the ready items the newest (or one at random). A missing event wait between two streams,
// a host read of memory a copy has not yet written, or a buffer reused before the work reading it
// has run then gives other results than the CPU reference: on the eager streams (the default)
// every item is done when issued, so those bugs cannot show. Host callbacks run on the executor
// thread, as the CUDA driver runs them on a thread of its own.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "tests/cuda_emu/emu_state.h"

namespace emu {

namespace {

thread_local bool t_executor = false;

struct Item {
    int device;
    std::function<void()> work;
    std::vector<uint64_t> deps;
};

// How long the executor lets issued work pile up before it runs any while no host thread waits:
// long enough for a replica thread to issue several calls, so there is an order to choose.
constexpr auto kQuiet = std::chrono::microseconds(200);

struct Queue {
    std::mutex mutex;
    std::condition_variable wake, finished;
    std::map<uint64_t, Item> items;  // issued and not finished, by id (ids grow with issue order)
    uint64_t next_id = 1;
    int waiters = 0;
    QueueOrder order = QueueOrder::eager;
    bool lazy = false;  // run only while a host thread waits
    std::mt19937_64 random{12345};
    std::chrono::steady_clock::time_point last_issue{};
    std::once_flag started;
    std::thread executor;

    Queue() {
        const char* v = std::getenv("MIRRORED_CUDA_EMU_ASYNC");
        const std::string mode = v ? v : "";
        if (mode == "newest") order = QueueOrder::newest;
        else if (mode.rfind("random", 0) == 0) {
            order = QueueOrder::random;
            if (mode.size() > 7 && mode[6] == ':') random.seed(std::strtoull(mode.c_str() + 7, nullptr, 10));
        } else if (!mode.empty() && mode != "0") {
            std::fprintf(stderr, "emulated GPU: MIRRORED_CUDA_EMU_ASYNC=%s is not newest, random[:SEED] or 0\n", v);
            std::exit(2);
        }
    }
    // The executor starts with the first queued item: a process that never queues one (eager
    // streams, or CPU replicas only) has no thread more than on a GPU.
    void start() {
        std::call_once(started, [this] {
            executor = std::thread([this] { run(); });
            executor.detach();  // never joined: it may be inside the process's own work at exit
        });
    }

    // Whether every item of ids has finished (items holds the unfinished ones). Caller holds mutex.
    bool done(const std::vector<uint64_t>& ids) const {
        for (uint64_t id : ids)
            if (items.count(id)) return false;
        return true;
    }
    void drop_done(std::vector<uint64_t>& ids) const {
        std::erase_if(ids, [&](uint64_t id) { return !items.count(id); });
    }
    // The item to run next, or items.end(): among the ready ones, per the order. Called only by
    // the executor between items, so none is running.
    std::map<uint64_t, Item>::iterator pick() {
        std::vector<std::map<uint64_t, Item>::iterator> ready_items;
        for (auto it = items.rbegin(); it != items.rend(); ++it)
            if (done(it->second.deps)) {
                if (order != QueueOrder::random) return std::prev(it.base());
                ready_items.push_back(std::prev(it.base()));
            }
        if (ready_items.empty()) return items.end();
        return ready_items[random() % ready_items.size()];
    }
    bool should_run(std::chrono::steady_clock::time_point now) const {
        if (items.empty()) return false;
        if (waiters > 0) return true;
        return !lazy && now - last_issue >= kQuiet;
    }
    void run() {
        t_executor = true;
        std::unique_lock<std::mutex> lock(mutex);
        for (;;) {
            const auto now = std::chrono::steady_clock::now();
            if (!should_run(now)) {
                if (items.empty() || lazy) wake.wait(lock);
                else wake.wait_until(lock, last_issue + kQuiet);
                continue;
            }
            // Never end(): the oldest unfinished item is ready (its dependencies are older, so finished).
            auto it = pick();
            std::function<void()> work = std::move(it->second.work);
            const int device = it->second.device;
            lock.unlock();
            set_current_device(device);
            work();
            lock.lock();
            items.erase(it);
            finished.notify_all();
        }
    }
    // Blocks the calling host thread until finished_now() holds; the executor runs meanwhile.
    template <class F>
    void wait_for(F finished_now) {
        std::unique_lock<std::mutex> lock(mutex);
        ++waiters;
        wake.notify_one();
        finished.wait(lock, finished_now);
        --waiters;
    }
};

Queue& queue() {
    static Queue* q = new Queue;  // never destroyed: its executor may outlive main
    return *q;
}

}  // namespace

QueueOrder queue_order() {
    Queue& q = queue();
    std::lock_guard<std::mutex> lock(q.mutex);
    return q.order;
}

bool on_queue_executor() { return t_executor; }

void queue_set_order(QueueOrder order, bool lazy) {
    Queue& q = queue();
    queue_wait_all();
    std::lock_guard<std::mutex> lock(q.mutex);
    q.order = order;
    q.lazy = lazy;
}

uint64_t queue_issue(int device, std::function<void()> work, std::vector<uint64_t> deps) {
    Queue& q = queue();
    q.start();
    std::lock_guard<std::mutex> lock(q.mutex);
    const uint64_t id = q.next_id++;
    q.drop_done(deps);
    q.items.emplace(id, Item{device, std::move(work), std::move(deps)});
    q.last_issue = std::chrono::steady_clock::now();
    q.wake.notify_one();
    return id;
}

void queue_join(std::vector<uint64_t>& into, const std::vector<uint64_t>& from) {
    Queue& q = queue();
    std::lock_guard<std::mutex> lock(q.mutex);
    into.insert(into.end(), from.begin(), from.end());
    std::sort(into.begin(), into.end());
    into.erase(std::unique(into.begin(), into.end()), into.end());
    q.drop_done(into);
}

bool queue_done(const std::vector<uint64_t>& ids) {
    Queue& q = queue();
    std::lock_guard<std::mutex> lock(q.mutex);
    return q.done(ids);
}

void queue_wait(const std::vector<uint64_t>& ids) {
    Queue& q = queue();
    q.wait_for([&] { return q.done(ids); });
}

void queue_wait_all() {
    Queue& q = queue();
    q.wait_for([&] { return q.items.empty(); });
}

}  // namespace emu
