#include "mirrored/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstddef>
#include <future>
#include <system_error>
#include <thread>
#include <utility>

#include "base/error.h"
#include "base/threads.h"

namespace mirrored {

namespace {

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

Watchdog::Watchdog(double timeout_s, const char* phase, const char* on_hang, const char* setting)
    : timeout_s_(timeout_s),
      last_tick_ns_(now_ns()),
      phase_(phase),
      on_hang_(on_hang),
      setting_(setting),
      thread_(start_thread(std::string("the watchdog thread (") + setting + ")", [this] { watch(); })) {}

Watchdog::~Watchdog() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void Watchdog::tick(int64_t step) {
    step_.store(step, std::memory_order_relaxed);
    last_tick_ns_.store(now_ns(), std::memory_order_release);
}

void Watchdog::phase(const char* what, int64_t step) {
    phase_.store(what, std::memory_order_relaxed);
    tick(step);
}

std::unique_ptr<Watchdog> step_timeout_watchdog(double timeout_s, const char* phase, const char* on_hang) {
    if (timeout_s <= 0) return nullptr;
    return std::make_unique<Watchdog>(timeout_s, phase, on_hang);
}

void Watchdog::checkpointed(int64_t step) { checkpoint_step_.store(step, std::memory_order_relaxed); }

void Watchdog::set_hang_handler(std::function<void(double)> handler) {
    std::lock_guard<std::mutex> lock(mu_);
    hang_handler_ = std::move(handler);
}

// On a thread of its own, waited for at most 30 s: a handler stuck in a driver call must not keep
// the watchdog from ending the process. mu_ stays held, so the handler's owner cannot clear it
// (and go) while it runs.
void Watchdog::run_hang_handler(double idle) {
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> finished = done->get_future();
    try {
        std::thread([handler = hang_handler_, idle, done] {
            try {
                handler(idle);
            } catch (...) {  // the process ends from the watchdog's thread as it would have
            }
            done->set_value();
        }).detach();
    } catch (const std::system_error&) {  // no thread to be had: the process ends as it would have
        return;
    }
    (void)finished.wait_for(std::chrono::seconds(30));
}

void Watchdog::watch() {
    // checks ten times per timeout, at most once a second: the exit comes within 10% of it
    const auto period = std::chrono::duration<double>(std::clamp(timeout_s_ / 10.0, 0.01, 1.0));
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, period, [&] { return stopping_; })) {
        const double idle = double(now_ns() - last_tick_ns_.load(std::memory_order_acquire)) * 1e-9;
        if (idle < timeout_s_) continue;
        if (hang_handler_) run_hang_handler(idle);  // returns when the run cannot go on without the hung device
        const long long step = step_.load(), ckpt = checkpoint_step_.load();
        char resume[160];
        if (on_hang_) std::snprintf(resume, sizeof resume, "%s", on_hang_);
        else if (ckpt >= 0)
            std::snprintf(resume, sizeof resume, "the last checkpoint is at step %lld: run again to resume from it",
                          ckpt);
        else
            std::snprintf(resume, sizeof resume,
                          "no checkpoint was written yet in this run: run again (it resumes "
                          "from an earlier run's newest checkpoint, if there is one)");
        // One write(2), no stdio lock (a stuck thread might hold one); the host threads are stuck,
        // so the process ends from here.
        char after[48] = "";
        if (step > 0) std::snprintf(after, sizeof after, ", after step %lld", step);
        char text[640];
        const int n = std::snprintf(text, sizeof text,
                                    "\nerror: no progress for %.0f s in %s%s "
                                    "(%s): a GPU, a copy between GPUs or the input pipeline stopped "
                                    "answering (a hung kernel, a failing link, NCCL waiting for a GPU that does not "
                                    "answer); stopping rather than hanging; %s\n",
                                    idle, phase_.load(), after, setting_, resume);
        if (n > 0) (void)!::write(2, text, std::min(size_t(n), sizeof text - 1));
        ::_exit(kExitDevice);
    }
}

}  // namespace mirrored
