// The signals that ask a training run to stop (after a checkpoint when it trains): SIGINT, SIGTERM,
// SIGHUP (a closed terminal) and SIGUSR1 (what mpirun forwards). The trainer's handlers take them;
// a re-execution of the program holds them until the new image has its handlers again.
#pragma once

#include <csignal>

namespace mirrored {

inline constexpr int kInterruptSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

inline sigset_t interrupt_signal_set() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kInterruptSignals) sigaddset(&set, sig);
    return set;
}

}  // namespace mirrored
