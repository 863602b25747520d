// The emulated GPU's kernel launches: every thread of a block is a fiber on the launching host
// thread, switched at __syncthreads and warp shuffles, so the kernels' own source runs with a
// block's real interleaving constraints. Blocks run one after another; launches are serialised.
// A barrier or shuffle that not every thread of the block (warp) reaches - which deadlocks or is
// undefined on a GPU - fails the launch, as a launch with a bad configuration does.
#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "tests/cuda_emu/emu_state.h"
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif
#include "tests/cuda_emu/kernel_emu.h"

#if !defined(__x86_64__)
#error "the emulated GPU's fibers switch stacks in x86-64 assembly"
#endif

// emu_switch(save, next): saves the callee-saved registers and the stack pointer into *save,
// continues on the stack `next` (the System V ABI's callee-saved set; SSE state is caller-saved).
extern "C" void emu_switch(void** save, void* next);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

namespace emu {

namespace {

constexpr size_t kStackBytes = 64 * 1024;
constexpr int kMaxThreads = 1024;

enum class Wait { none, barrier, warp };

struct Fiber {
    void* sp = nullptr;
    uint3 idx{};
    int linear = 0;  // x + y * X + z * X * Y: warps are 32 consecutive linear ids
    bool done = false;
    Wait wait = Wait::none;
    uint64_t wait_gen = 0;
};

struct WarpState {
    uint64_t gen = 0;
    int arrived = 0;
    unsigned mask = 0;
    unsigned char slots[2][32][16] = {};
};

struct Block {
    dim3 grid, block;
    uint3 block_idx{};
    int threads = 0;
    std::vector<Fiber> fibers;
    std::vector<WarpState> warps;
    uint64_t barrier_gen = 0;
    int barrier_arrived = 0;
    int finished = 0;
    std::vector<void*> shared_arrays;  // the __shared__ arrays this block has filled with NaN
    Fiber* current = nullptr;
    void* scheduler_sp = nullptr;
    void (*body)(void*) = nullptr;
    void* arg = nullptr;
    std::string error;  // why the launch failed, once
};

std::mutex g_launch_mutex;
Block* g_block = nullptr;  // the launch running (under g_launch_mutex)
char* g_stacks = nullptr;

Block& block() { return *g_block; }

void fail(const std::string& why) {
    if (block().error.empty()) block().error = why;
}

void yield_to_scheduler() {
    Block& b = block();
    emu_switch(&b.current->sp, b.scheduler_sp);
}

[[noreturn]] void fiber_entry() {
    Block& b = block();
    b.body(b.arg);
    b.current->done = true;
    ++b.finished;
    if (b.barrier_arrived > 0) fail("a thread exited while others of its block wait at __syncthreads");
    const WarpState& w = b.warps[size_t(b.current->linear / 32)];
    if (w.arrived > 0 && (w.mask >> (b.current->linear % 32) & 1u))
        fail("a thread exited while its warp waits at a shuffle that names it");
    emu_switch(&b.current->sp, b.scheduler_sp);
    std::abort();  // a finished fiber is never resumed
}

void* fresh_stack(int i) {
    // The stack grows down from its top: six saved registers, then fiber_entry as the address
    // `ret` continues at, then a slot standing for fiber_entry's own return address (rsp % 16 == 8
    // on entry, as after a call).
    char* top = g_stacks + size_t(i + 1) * kStackBytes;
#if defined(__SANITIZE_ADDRESS__)
    // A finished fiber never returns from fiber_entry, an abandoned one from anything: their
    // frames' redzones stay poisoned unless the stack is cleared for the next fiber.
    ASAN_UNPOISON_MEMORY_REGION(top - kStackBytes, kStackBytes);
#endif
    void** sp = reinterpret_cast<void**>(top - 64);
    for (int r = 0; r < 6; ++r) sp[r] = nullptr;
    sp[6] = reinterpret_cast<void*>(&fiber_entry);
    sp[7] = nullptr;
    return sp;
}

bool ready(const Block& b, const Fiber& f) {
    if (f.done) return false;
    switch (f.wait) {
        case Wait::none:
            return true;
        case Wait::barrier:
            return b.barrier_gen > f.wait_gen;
        case Wait::warp:
            return b.warps[size_t(f.linear / 32)].gen > f.wait_gen;
    }
    return false;
}

void run_block(Block& b) {
    for (int i = 0; i < b.threads; ++i) {
        Fiber& f = b.fibers[size_t(i)];
        f = Fiber{};
        f.idx =
            uint3{unsigned(i) % b.block.x, unsigned(i) / b.block.x % b.block.y, unsigned(i) / (b.block.x * b.block.y)};
        f.linear = i;
        f.sp = fresh_stack(i);
    }
    for (WarpState& w : b.warps) w = WarpState{};
    b.barrier_gen = 0;
    b.barrier_arrived = 0;
    b.finished = 0;
    b.shared_arrays.clear();
    // Passes alternate between ascending and descending thread order, so that two threads racing
    // between barriers (one reading what the other writes in the same phase) meet in both orders
    // and a result that depends on the order differs from the CPU's.
    for (int pass = 0; b.finished < b.threads && b.error.empty(); ++pass) {
        bool progress = false;
        for (int k = 0; k < b.threads; ++k) {
            Fiber& f = b.fibers[size_t(pass % 2 ? b.threads - 1 - k : k)];
            if (!ready(b, f)) continue;
            f.wait = Wait::none;
            b.current = &f;
            g_thread_idx = f.idx;
            g_lane = f.linear % 32;
            emu_switch(&b.scheduler_sp, f.sp);
            progress = true;
            if (!b.error.empty()) return;
        }
        if (!progress) {
            fail("deadlock: threads wait at __syncthreads or a warp shuffle that others of their block never reach");
            return;
        }
    }
}

}  // namespace

uint3 g_thread_idx{};
int g_lane = 0;
void kernel_fail(const char* why) { fail(why); }
uint64_t barrier_generation() { return block().barrier_gen; }
uint3 block_idx() { return block().block_idx; }
dim3 block_dim() { return block().block; }
dim3 grid_dim() { return block().grid; }

void syncthreads() {
    Block& b = block();
    if (b.finished > 0) fail("__syncthreads after some threads of the block exited");
    Fiber& f = *b.current;
    if (++b.barrier_arrived == b.threads) {
        b.barrier_arrived = 0;
        ++b.barrier_gen;  // every waiting thread may go on; this one goes on at once
        return;
    }
    f.wait = Wait::barrier;
    f.wait_gen = b.barrier_gen;
    yield_to_scheduler();
}

void shared_memory(void* array, size_t bytes) {
    Block& b = block();
    if (std::find(b.shared_arrays.begin(), b.shared_arrays.end(), array) != b.shared_arrays.end()) return;
    b.shared_arrays.push_back(array);
    std::memset(array, 0xff, bytes);
}

void warp_exchange(unsigned mask, const void* value, void* out, size_t bytes, int src_lane) {
    Block& b = block();
    Fiber& f = *b.current;
    const int lane = f.linear % 32;
    WarpState& w = b.warps[size_t(f.linear / 32)];
    const int warp_first = f.linear / 32 * 32;
    const int lanes_in_warp = std::min(32, b.threads - warp_first);
    const unsigned present = lanes_in_warp == 32 ? 0xffffffffu : (1u << lanes_in_warp) - 1u;
    if (bytes > sizeof w.slots[0][0]) fail("a shuffled value wider than 16 bytes");
    if ((mask & ~present) != 0) fail("a shuffle's mask names lanes the block does not have");
    if (!(mask >> lane & 1u)) fail("a shuffle called by a lane its mask does not name");
    if (w.arrived == 0) w.mask = mask;
    else if (w.mask != mask) fail("lanes of one warp shuffle with different masks");
    const uint64_t gen = w.gen;
    std::memcpy(w.slots[gen % 2][lane], value, bytes);
    if (++w.arrived == std::popcount(mask)) {
        w.arrived = 0;
        ++w.gen;
    } else {
        f.wait = Wait::warp;
        f.wait_gen = gen;
        yield_to_scheduler();
    }
    // Every lane named has written generation gen's slot; none can overwrite it before all have
    // read it (the next exchange writes the other slot, and the one after waits for this one's).
    const bool valid = src_lane >= 0 && src_lane < 32 && (mask >> src_lane & 1u);
    std::memcpy(out, valid ? w.slots[gen % 2][src_lane] : w.slots[gen % 2][lane], bytes);
}

bool begin_launch(const LaunchConfig& c) {
    const unsigned long long threads = 1ull * c.block.x * c.block.y * c.block.z;
    std::string why;
    if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || threads == 0) why = "a grid or block with a zero dimension";
    else if (threads > unsigned(kMaxThreads) || c.block.z > 64) why = "more than 1024 threads in a block";
    else if (c.grid.x > 2147483647u || c.grid.y > 65535 || c.grid.z > 65535) why = "a grid dimension over the limit";
    else if (c.shared_bytes > 48 * 1024) why = "more than 48 KiB of dynamic shared memory";
    if (!why.empty()) {
        record_launch_error(cudaErrorInvalidConfiguration, why);
        return false;
    }
    return check_launch_stream(c.stream);
}

void run_launch(const LaunchConfig& c, void (*thread_body)(void*), void* arg) {
    if (kernel_faults()) return;  // a failed GPU runs no kernel
    std::lock_guard<std::mutex> lock(g_launch_mutex);
    if (!g_stacks) {
        void* m =
            ::mmap(nullptr, kStackBytes * kMaxThreads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            std::fprintf(stderr, "emulated GPU: no memory for fiber stacks\n");
            std::abort();
        }
        g_stacks = static_cast<char*>(m);
    }
    Block b;
    b.grid = c.grid;
    b.block = c.block;
    b.threads = int(c.block.x * c.block.y * c.block.z);
    b.fibers.resize(size_t(b.threads));
    b.warps.resize(size_t((b.threads + 31) / 32));
    b.body = thread_body;
    b.arg = arg;
    g_block = &b;
    // Blocks run last to first: a kernel whose blocks read what earlier blocks write (an order a
    // GPU does not promise) sees the data missing.
    for (unsigned z = c.grid.z; z-- > 0 && b.error.empty();)
        for (unsigned y = c.grid.y; y-- > 0 && b.error.empty();)
            for (unsigned x = c.grid.x; x-- > 0 && b.error.empty();) {
                b.block_idx = uint3{x, y, z};
                run_block(b);
            }
    g_block = nullptr;
    if (!b.error.empty()) record_launch_error(cudaErrorLaunchFailure, b.error);
}

}  // namespace emu
