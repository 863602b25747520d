// The signals that ask a training run to stop (after a checkpoint when it trains): SIGINT, SIGTERM,
// SIGHUP (a closed terminal) and SIGUSR1 (what mpirun forwards). The trainer's handlers take them;
// a re-execution of the program holds them until the new image has its handlers again.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <csignal>

namespace mirrored {

inline constexpr int kInterruptSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

inline sigset_t interrupt_signal_set() {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : kInterruptSignals) sigaddset(&set, sig);
    return set;
}

// This program again, in place (the BLAS kernel's choice, a run continuing without a failed
// device). The interrupt signals are blocked across the exec: one that arrives then stays pending
// until the new image has its handlers (a run interrupted while it starts ends with exit 130,
// never by the signal). Returns only when the exec failed, with errno set.
inline void exec_self(char** argv) {
    const sigset_t stop = interrupt_signal_set();
    sigset_t before;
    ::sigprocmask(SIG_BLOCK, &stop, &before);
    ::execv("/proc/self/exe", argv);
    const int e = errno;
    ::sigprocmask(SIG_SETMASK, &before, nullptr);
    errno = e;
}

}  // namespace mirrored
