// A hang detector for the training loop. A GPU that stops answering (a hung kernel, a peer copy
// over a failing link, NCCL waiting for a rank that will never arrive) leaves the host blocked
// inside a wait or a launch, where nothing can time out; the process would sit there, alive and
// idle, until someone looks. The watchdog's own thread ends the process instead: when nothing has
// ticked for `timeout_s`, it prints why to stderr and exits with kExitDevice. Nothing is lost
// that a checkpoint holds (they are written atomically), and a rerun resumes from the last one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace mirrored {

class Watchdog {
public:
    // phase: what is running, named in the message ("start-up (...)"); a string literal. on_hang:
    // what the message advises instead of resuming from the last checkpoint (a command that
    // writes none, such as eval); a string literal, or null. setting: where the timeout is set.
    Watchdog(double timeout_s, const char* phase, const char* on_hang = nullptr,
             const char* setting = "strategy.step_timeout_s");
    ~Watchdog();
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    void tick(int64_t step);                     // progress: a step finished
    void phase(const char* what, int64_t step);  // progress: `what` begins (each phase has the whole timeout)
    void checkpointed(int64_t step);             // a checkpoint of `step` is on disk
    // Runs on the watchdog's thread when the timeout passes, before the process ends (the run's
    // strategy.on_replica_failure: continue: it may replace the process). Null: none. The
    // handler must be cleared before what it uses goes.
    void set_hang_handler(std::function<void(double idle_s)> handler);

private:
    void watch();
    void run_hang_handler(double idle);

    const double timeout_s_;
    std::atomic<int64_t> last_tick_ns_, step_{0}, checkpoint_step_{-1};
    std::atomic<const char*> phase_;
    const char* const on_hang_;
    const char* const setting_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool stopping_ = false;
    std::function<void(double)> hang_handler_;  // guarded by mu_
    std::thread thread_;
};

// A watchdog of strategy.step_timeout_s, or none when it is 0 (off).
std::unique_ptr<Watchdog> step_timeout_watchdog(double timeout_s, const char* phase, const char* on_hang = nullptr);

}  // namespace mirrored
