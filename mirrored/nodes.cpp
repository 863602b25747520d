#include "mirrored/nodes.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/threads.h"

#if MIRRORED_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only (Open MPI's deprecated C++ bindings warn)
#include <mpi.h>
#endif

namespace mirrored {

namespace {

// How mpirun (Open MPI), or a PMI launcher (MPICH's hydra, Slurm's srun), tells its processes
// how many they are. Unset: not launched as part of a job (processes 1).
struct Launch {
    int processes = 1;
    const char* variable = "";
};
Launch launched() {
    for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
        const char* v = std::getenv(var);
        if (!v || !*v) continue;
        char* end = nullptr;
        errno = 0;
        const long n = std::strtol(v, &end, 10);
        if (errno || *end || n < 1 || n > (1 << 20))
            throw ConfigError(std::string(var) + "=" + v + ": expected the number of processes of the job (1 or more)");
        return {int(n), var};
    }
    return {};
}

}  // namespace

#if MIRRORED_MPI

namespace {

std::string host_name() {
    char b[256] = {};
    if (::gethostname(b, sizeof b - 1) != 0) return "?";
    return b;
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void check_mpi(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw DeviceError(std::string(call) + " failed: " + text + " (a node stopped, or its link failed)");
}
#define MPI_CHECK(call) check_mpi((call), #call)

int as_count(size_t n, const char* what) {
    if (n > size_t(INT_MAX))
        throw DeviceError(std::string(what) + ": " + std::to_string(n) + " elements exceed MPI's int counts");
    return int(n);
}

}  // namespace

// One watched slot per thread that makes collectives: the trainer's (0) and one per channel.
struct Nodes::Impl {
    struct Slot {
        std::atomic<int64_t> since_ns{0};  // 0: not in a collective
        std::atomic<const char*> what{""};
    };
    struct Channel {
        MPI_Comm comm = MPI_COMM_NULL;
        std::vector<float> scratch;  // this node's part of a reduce-scatter
        std::vector<int> counts, displs;
    };
    MPI_Comm main = MPI_COMM_NULL;
    std::vector<Channel> channels;
    std::unique_ptr<Slot[]> slots;  // [1 + channels]
    int slot_count = 1;
    std::atomic<int64_t> timeout_ns{int64_t(600) * 1000000000};
    std::thread watchdog;
    std::mutex mu;
    std::condition_variable cv;
    bool quit = false;
    int rank = 0;
    std::string host;

    // Marks slot s busy for the lifetime of the guard.
    struct Busy {
        Slot& slot;
        Busy(Slot& s, const char* what) : slot(s) {
            slot.what = what;
            slot.since_ns = now_ns();
        }
        ~Busy() { slot.since_ns = 0; }
    };

    void watch() {
        std::unique_lock<std::mutex> lock(mu);
        while (!quit) {
            cv.wait_for(lock, std::chrono::milliseconds(200));
            const int64_t now = now_ns(), limit = timeout_ns.load();
            for (int s = 0; s < slot_count; ++s) {
                const int64_t since = slots[size_t(s)].since_ns.load();
                if (since == 0 || now - since <= limit) continue;
                std::fprintf(stderr,
                             "\nerror: node %d (%s): waited %.0f s for the other nodes in %s: a node has stopped "
                             "or hangs; stopping the job (strategy.collective_timeout_s: %.0f)\n",
                             rank, host.c_str(), double(now - since) * 1e-9, slots[size_t(s)].what.load(),
                             double(limit) * 1e-9);
                std::fflush(nullptr);
                MPI_Abort(MPI_COMM_WORLD, kExitDevice);
                std::_Exit(kExitDevice);
            }
        }
    }
};

bool Nodes::available() { return true; }

std::unique_ptr<Nodes> Nodes::join(int* argc, char*** argv) {
    if (launched().processes <= 1) return nullptr;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        throw DeviceError("MPI_Init_thread failed: cannot join the other nodes of this mpirun job");
    if (provided < MPI_THREAD_MULTIPLE) {
        MPI_Finalize();
        throw DeviceError(
            "this MPI library does not support MPI_THREAD_MULTIPLE (the replica threads each "
            "exchange gradients): use Open MPI from the distribution (libopenmpi-dev)");
    }
    std::unique_ptr<Nodes> n(new Nodes());
    n->impl_ = std::make_unique<Impl>();
    Impl& I = *n->impl_;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &n->rank_));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &n->count_));
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &I.main));
    n->host_ = host_name();
    I.rank = n->rank_;
    I.host = n->host_;
    I.slots = std::make_unique<Impl::Slot[]>(1);
    I.watchdog = start_thread("the node watchdog thread", [&I] { I.watch(); });
    return n;
}

Nodes::~Nodes() {
    if (!impl_) return;
    {
        std::lock_guard<std::mutex> lock(impl_->mu);
        impl_->quit = true;
    }
    impl_->cv.notify_all();
    impl_->watchdog.join();
    for (auto& c : impl_->channels) MPI_Comm_free(&c.comm);
    MPI_Comm_free(&impl_->main);
    MPI_Finalize();
}

std::string Nodes::library() {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(version, &len);  // one of the calls allowed before MPI_Init
    std::string v(version, size_t(std::max(0, len)));
    return v.substr(0, v.find_first_of(",\n"));  // the first line, without its details
}

void Nodes::set_timeout(double seconds) { impl_->timeout_ns = int64_t(seconds * 1e9); }

void Nodes::abort(int code) {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
}

void Nodes::sum(double* values, int n, const char* what) {
    Impl::Busy busy(impl_->slots[0], what);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, impl_->main));
}

bool Nodes::any(bool flag, const char* what) {
    Impl::Busy busy(impl_->slots[0], what);
    int v = flag ? 1 : 0;
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MAX, impl_->main));
    return v != 0;
}

std::vector<std::string> Nodes::all_gather(const std::string& mine, const char* what) {
    Impl::Busy busy(impl_->slots[0], what);
    int len = as_count(mine.size(), what);
    std::vector<int> lens(static_cast<size_t>(count_)), displs(static_cast<size_t>(count_));
    MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, impl_->main));
    size_t total = 0;
    for (int i = 0; i < count_; ++i) {
        displs[size_t(i)] = as_count(total, what);
        total += size_t(lens[size_t(i)]);
    }
    std::string all(total, '\0');
    MPI_CHECK(
        MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, impl_->main));
    std::vector<std::string> out;
    for (int i = 0; i < count_; ++i) out.push_back(all.substr(size_t(displs[size_t(i)]), size_t(lens[size_t(i)])));
    return out;
}

std::vector<uint64_t> Nodes::all_gather(const std::vector<uint64_t>& mine, const char* what) {
    Impl::Busy busy(impl_->slots[0], what);
    std::vector<uint64_t> all(mine.size() * size_t(count_));
    MPI_CHECK(MPI_Allgather(mine.data(), as_count(mine.size(), what), MPI_UINT64_T, all.data(),
                            as_count(mine.size(), what), MPI_UINT64_T, impl_->main));
    return all;
}

std::string Nodes::broadcast(const std::string& from_leader, const char* what) {
    Impl::Busy busy(impl_->slots[0], what);
    int len = as_count(from_leader.size(), what);
    MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, 0, impl_->main));
    std::string s = leader() ? from_leader : std::string(size_t(len), '\0');
    MPI_CHECK(MPI_Bcast(s.data(), len, MPI_CHAR, 0, impl_->main));
    return s;
}

void Nodes::broadcast(float* data, size_t n, const char* what) {
    Impl::Busy busy(impl_->slots[0], what);
    for (size_t done = 0; done < n;) {
        const size_t part = std::min(n - done, size_t(INT_MAX));
        MPI_CHECK(MPI_Bcast(data + done, int(part), MPI_FLOAT, 0, impl_->main));
        done += part;
    }
}

void Nodes::open_channels(int channels, size_t elements) {
    Impl& I = *impl_;
    // The slots are read by the watchdog: replaced only here, before any channel is in use.
    {
        std::lock_guard<std::mutex> lock(I.mu);
        I.slot_count = 1;
        I.slots = std::make_unique<Impl::Slot[]>(size_t(1 + channels));
        I.slot_count = 1 + channels;
    }
    for (auto& c : I.channels) MPI_Comm_free(&c.comm);
    I.channels.assign(size_t(channels), {});
    const size_t part = elements / size_t(count_) + 1;
    as_count(part, "a node's share of the gradients");
    for (auto& c : I.channels) {
        MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c.comm));
        c.scratch.assign(part, 0.0f);
        c.counts.assign(size_t(count_), 0);
        c.displs.assign(size_t(count_), 0);
    }
}

void Nodes::sum_channel(int channel, float* data, size_t n) {
    if (n == 0) return;
    Impl::Channel& c = impl_->channels[size_t(channel)];
    Impl::Busy busy(impl_->slots[size_t(1 + channel)], "the all-reduce of gradients");
    // Node i reduces elements [displs[i], displs[i] + counts[i]) and everyone gathers them: each
    // sum is computed once, so every node holds the same bits.
    const size_t base = n / size_t(count_), extra = n % size_t(count_);
    size_t at = 0;
    for (int i = 0; i < count_; ++i) {
        const size_t len = base + (size_t(i) < extra ? 1 : 0);
        c.counts[size_t(i)] = as_count(len, "a node's share of the gradients");
        c.displs[size_t(i)] = as_count(at, "a gradient range");
        at += len;
    }
    MPI_CHECK(MPI_Reduce_scatter(data, c.scratch.data(), c.counts.data(), MPI_FLOAT, MPI_SUM, c.comm));
    MPI_CHECK(MPI_Allgatherv(c.scratch.data(), c.counts[size_t(rank_)], MPI_FLOAT, data, c.counts.data(),
                             c.displs.data(), MPI_FLOAT, c.comm));
}

#else  // built without MPI

struct Nodes::Impl {};

bool Nodes::available() { return false; }

std::unique_ptr<Nodes> Nodes::join(int*, char***) {
    // `sbatch -n 4` runs a plain command once with SLURM_NTASKS=4; srun or mpirun start it several
    // times. Without MPI this process cannot tell which, nor join the others: it trains alone.
    const Launch l = launched();
    if (l.processes > 1)
        std::fprintf(stderr,
                     "warning: %s=%d: started as one of %d processes of a job, but this build has no MPI, so it "
                     "cannot join the others: it trains alone, on this node's devices, as a run of its own (a second "
                     "process on the same run folder is refused). To train across nodes, install libopenmpi-dev "
                     "(scripts/install_deps.sh does), rebuild, and start the job with mpirun or srun\n",
                     l.variable, l.processes, l.processes);
    return nullptr;
}

Nodes::~Nodes() = default;
std::string Nodes::library() { return "none"; }
void Nodes::set_timeout(double) {}
void Nodes::abort(int code) { std::_Exit(code); }
void Nodes::sum(double*, int, const char*) {}
bool Nodes::any(bool flag, const char*) { return flag; }
std::vector<std::string> Nodes::all_gather(const std::string& mine, const char*) { return {mine}; }
std::vector<uint64_t> Nodes::all_gather(const std::vector<uint64_t>& mine, const char*) { return mine; }
std::string Nodes::broadcast(const std::string& s, const char*) { return s; }
void Nodes::broadcast(float*, size_t, const char*) {}
void Nodes::open_channels(int, size_t) {}
void Nodes::sum_channel(int, float*, size_t) {}

#endif

}  // namespace mirrored
