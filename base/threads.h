// Starting a thread the system may refuse (a user's `ulimit -u`, a container's pids limit): the
// refusal becomes a DeviceError naming the thread and the limit, instead of an "internal" error
// or, with other threads of the set already running, std::terminate.
#pragma once

#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "base/error.h"

namespace mirrored {

template <typename F>
std::thread start_thread(const std::string& what, F&& body) {
    try {
        return std::thread(std::forward<F>(body));
    } catch (const std::system_error& e) {
        throw DeviceError("cannot start " + what + " (" + e.what() +
                          "): the system's limit on threads is too low for this run (`ulimit -u`, a container's "
                          "pids limit)");
    }
}

}  // namespace mirrored
