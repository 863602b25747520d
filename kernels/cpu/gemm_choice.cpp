#include "kernels/cpu/gemm_choice.h"

#include <cblas.h>
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <random>
#include <sstream>

#include "base/machine_cache.h"
#include "kernels/blas.h"
#include "kernels/cpu/few_rows_gemm.h"
#include "kernels/cpu/jit_gemm.h"
#include "kernels/cpu/scratch.h"
#include "kernels/device.h"

namespace mirrored {

namespace {
std::atomic<bool> g_rules_instead{false};  // cpu_gemm_use_rules(): measure -> rules
}  // namespace

void cpu_gemm_use_rules() { g_rules_instead.store(true, std::memory_order_relaxed); }

GemmKernelChoice gemm_kernel_choice() {
    const GemmKernelChoice chosen = gemm_kernel_choice_asked();
    return chosen == GemmKernelChoice::measure && g_rules_instead.load(std::memory_order_relaxed)
               ? GemmKernelChoice::rules
               : chosen;
}

std::span<const GemmKernelChoiceName> gemm_kernel_choice_names() {
    static constexpr GemmKernelChoiceName names[] = {{GemmKernelChoice::measure, "measure", ", measured per product"},
                                                     {GemmKernelChoice::rules, "rules", ""},
                                                     {GemmKernelChoice::all, "all", ", on every product"},
                                                     {GemmKernelChoice::off, "0", ""}};
    return names;
}

const GemmKernelChoiceName& gemm_kernel_choice_name(GemmKernelChoice c) {
    for (const GemmKernelChoiceName& n : gemm_kernel_choice_names())
        if (n.choice == c) return n;
    return gemm_kernel_choice_names().front();
}

GemmKernelChoice gemm_kernel_choice_asked() {
    static const GemmKernelChoice choice = [] {
        const char* e = std::getenv("MIRRORED_JIT_GEMM");
        if (!e || !*e) return GemmKernelChoice::measure;
        for (const GemmKernelChoiceName& n : gemm_kernel_choice_names())
            if (std::strcmp(e, n.env) == 0) return n.choice;
        std::fprintf(stderr, "warning: MIRRORED_JIT_GEMM=%s is not measure, rules, all or 0; measuring\n", e);
        return GemmKernelChoice::measure;
    }();
    return choice;
}

const char* gemm_kernel_name(GemmKernel k) {
    switch (k) {
        case GemmKernel::openblas:
            return "openblas";
        case GemmKernel::openblas_turned:
            return "openblas-turned";
        case GemmKernel::jit:
            return "jit";
        case GemmKernel::jit_turned:
            return "jit-turned";
        case GemmKernel::jit_weight_turned:
            return "jit-weight-turned";
        case GemmKernel::jit_k_blocked:
            return "jit-k-blocked";
        case GemmKernel::few_rows:
            return "few-rows";
    }
    return "?";
}

std::string product_text(const ProductShape& s) {
    char text[128];
    std::snprintf(text, sizeof text, "%c%c:%dx%dx%d:%d,%d,%d:%d", s.ta ? 't' : 'n', s.tb ? 't' : 'n', s.m, s.n, s.k,
                  s.lda, s.ldb, s.ldc, s.accumulate ? 1 : 0);
    return text;
}

std::string gemm_choice_cache_key(const ProductShape& s) { return blas_machine_key() + "|" + product_text(s); }

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The per-thread scratches of the turned kernels and of the JIT kernels' transposed operands are
// bounded so that they stay inside the CPU backend's workspace (kernels/backends.cpp): a turned
// product of at most kCpuTransposedGemmMaxRows rows, a JIT kernel's transposed A of at most
// kCpuJitTransposedMaxFloats, the JIT kernel's turned product of at most kCpuJitTurnedMaxCells
// (a first convolution's weight gradient, 32 x 9), and a weight turned for A B^T of at most
// kCpuJitSmallWeightFloats, or kCpuJitWeightMaxFloats past kCpuTransposedGemmMaxRows rows.

bool jit_fits(const ProductShape& s) {
    if (!jit_gemm_multiplies(s.ta, s.tb, s.m, s.n, s.k, s.accumulate)) return false;
    if (s.ta) return double(s.m) * double(s.k) <= double(kCpuJitTransposedMaxFloats);
    if (s.tb) return s.m <= kCpuTransposedGemmMaxRows;
    return true;
}

// C^T[n,m] = B A^T, P[n,m] = B^T A: the transposed products the turned kernels compute.
ProductShape jit_turned_product(const ProductShape& s) {
    return {true, false, s.n, s.m, s.k, s.ldb, s.lda, s.m, false};
}

// Asked for directly, OpenBLAS packs the whole of B with its transposing copy for every call;
// asked for C^T = B A^T it packs B with its plain copy, and turning the small result costs less
// than the difference: on the default MLP's 64-row layers 10-20% more GFLOP/s, on tiny products
// less (hence the size floor), on 256 rows and more nothing. The same micro-kernel sums every
// element over k in the same order, so the results equal the direct call's.
bool openblas_turned_pays(int m, int n, int k) {
    return m <= kCpuTransposedGemmMaxRows && m < n && double(m) * n * k >= double(1 << 19);
}

void openblas_turned(int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb, float* c,
                     int ldc) {
    thread_local std::vector<float> product;  // grows once per thread: no allocation per step
    const size_t cells = size_t(m) * size_t(n);
    grow_scratch(product, cells);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, alpha, b, ldb, a, lda, 0.0f, product.data(), m);
    cblas_somatcopy(CblasRowMajor, CblasTrans, n, m, 1.0f, product.data(), m, c, ldc);
}

// C[m,n] (+)= A^T B as P[n,m] = B^T A by the JIT kernel, then C (+)= P^T: where A^T is too large
// for the JIT kernels' transposing scratch but B^T is not, and C is small (a first convolution's
// weight gradient: 32 x 9 over 14k rows, where OpenBLAS ran at 48 GFLOP/s and this at 158). Each
// element still sums over k in one order.
bool jit_turned(const ProductShape& s, const float* a, const float* b, float* c) {
    thread_local std::vector<float> product;  // grows once per thread
    const size_t cells = size_t(s.m) * size_t(s.n);
    grow_scratch(product, cells);
    if (!jit_gemm_any_shape(true, false, s.n, s.m, s.k, b, s.ldb, a, s.lda, false, product.data(), s.m)) return false;
    for (int i = 0; i < s.m; ++i) {
        float* row = c + size_t(i) * s.ldc;
        for (int j = 0; j < s.n; ++j) row[j] = (s.accumulate ? row[j] : 0.0f) + product[size_t(j) * s.m + i];
    }
    return true;
}

}  // namespace

bool gemm_kernel_fits(GemmKernel k, const ProductShape& s) {
    if (s.m <= 0 || s.n <= 0 || s.k <= 0) return k == GemmKernel::openblas;
    switch (k) {
        case GemmKernel::openblas:
            return true;
        case GemmKernel::openblas_turned:
            return !s.ta && s.tb && !s.accumulate && s.m <= kCpuTransposedGemmMaxRows;
        case GemmKernel::jit:
            return jit_fits(s);
        case GemmKernel::jit_turned:
            return s.ta && !s.tb && size_t(s.m) * size_t(s.n) <= kCpuJitTurnedMaxCells &&
                   jit_fits(jit_turned_product(s));
        case GemmKernel::jit_weight_turned: {  // a small B at any rows; a larger one past A turned's rows
            const size_t weight = size_t(s.n) * size_t(s.k);
            return !s.ta && s.tb &&
                   (weight <= kCpuJitSmallWeightFloats ||
                    (s.m > kCpuTransposedGemmMaxRows && weight <= kCpuJitWeightMaxFloats)) &&
                   jit_gemm_multiplies(false, false, s.n, s.m, s.k, s.accumulate);
        }
        case GemmKernel::jit_k_blocked: {  // A^T B where A^T whole is past the transposing scratch
            const int block = jit_gemm_k_block(s.m, s.k);
            return s.ta && !s.tb && double(s.m) * double(s.k) > double(kCpuJitTransposedMaxFloats) && block > 0 &&
                   jit_gemm_multiplies(true, false, s.m, s.n, block, true);
        }
        case GemmKernel::few_rows:  // with the JIT kernels only: then the recorded BLAS kernel says that
                                    // products were measured (blas_kernel()), which a resume checks
            return jit_gemm_vector_floats() > 0 && few_rows_gemm_fits(s.ta, s.tb, s.m, s.n, s.k);
    }
    return false;
}

GemmKernel rules_gemm_kernel(const ProductShape& s) {
    if (jit_gemm_takes(s.ta, s.tb, s.m, s.n, s.k, s.accumulate) && gemm_kernel_fits(GemmKernel::jit, s))
        return GemmKernel::jit;
    // measured only, except where every product the kernels fit is theirs (MIRRORED_JIT_GEMM=all)
    if (gemm_kernel_choice() == GemmKernelChoice::all && gemm_kernel_fits(GemmKernel::jit_weight_turned, s))
        return GemmKernel::jit_weight_turned;
    const ProductShape p = jit_turned_product(s);
    if (gemm_kernel_fits(GemmKernel::jit_turned, s) && jit_gemm_takes(p.ta, p.tb, p.m, p.n, p.k, false))
        return GemmKernel::jit_turned;
    if (gemm_kernel_choice() == GemmKernelChoice::all && gemm_kernel_fits(GemmKernel::jit_k_blocked, s))
        return GemmKernel::jit_k_blocked;
    if (gemm_kernel_fits(GemmKernel::openblas_turned, s) && openblas_turned_pays(s.m, s.n, s.k))
        return GemmKernel::openblas_turned;
    return GemmKernel::openblas;
}

namespace {

// run_gemm_kernel for a kernel known to fit the shape (the hot path: chosen_sgemm's kernels fit).
bool run_fitting_gemm_kernel(GemmKernel k, const ProductShape& s, const float* a, const float* b, float* c) {
    switch (k) {
        case GemmKernel::openblas:
            cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.m, s.n,
                        s.k, 1.0f, a, s.lda, b, s.ldb, s.accumulate ? 1.0f : 0.0f, c, s.ldc);
            return true;
        case GemmKernel::openblas_turned:
            openblas_turned(s.m, s.n, s.k, 1.0f, a, s.lda, b, s.ldb, c, s.ldc);
            return true;
        case GemmKernel::jit:
            return jit_gemm_any_shape(s.ta, s.tb, s.m, s.n, s.k, a, s.lda, b, s.ldb, s.accumulate, c, s.ldc);
        case GemmKernel::jit_turned:
            return jit_turned(s, a, b, c);
        case GemmKernel::jit_weight_turned:
            return jit_gemm_weight_turned(s.m, s.n, s.k, a, s.lda, b, s.ldb, s.accumulate, c, s.ldc);
        case GemmKernel::jit_k_blocked:
            return jit_gemm_k_blocked(s.m, s.n, s.k, a, s.lda, b, s.ldb, s.accumulate, c, s.ldc);
        case GemmKernel::few_rows:
            return few_rows_gemm(s.ta, s.tb, s.m, s.n, s.k, a, s.lda, b, s.ldb, s.accumulate, c, s.ldc);
    }
    return false;
}

}  // namespace

bool run_gemm_kernel(GemmKernel k, const ProductShape& s, const float* a, const float* b, float* c) {
    return gemm_kernel_fits(k, s) && run_fitting_gemm_kernel(k, s, a, b, c);
}

std::vector<GemmKernelTime> time_gemm_kernels(const ProductShape& s, const float* a, const float* b, float* c,
                                              double seconds) {
    if (s.m <= 0 || s.n <= 0 || s.k <= 0) return {};
    // A product that adds to C is timed on a copy of C's rows as they lie (padding included, so
    // that it adds to C's values), freed afterwards: measuring leaves nothing resident.
    std::vector<float> copy;
    float* into = c;
    if (s.accumulate) {
        copy.assign(c, c + size_t(s.m - 1) * size_t(s.ldc) + size_t(s.n));
        into = copy.data();
    }
    std::vector<GemmKernelTime> times;
    for (GemmKernel k : kGemmKernels) {
        if (!run_gemm_kernel(k, s, a, b, into)) continue;  // untimed: JIT generation, first touch
        double best = std::numeric_limits<double>::infinity(), spent = 0;
        for (int calls = 0; calls < 10000 && (calls == 0 || spent < seconds); ++calls) {
            const double t0 = now_s();
            run_gemm_kernel(k, s, a, b, into);
            const double dt = now_s() - t0;
            best = std::min(best, dt);
            spent += dt;
        }
        times.push_back({k, best});
    }
    return times;
}

namespace {

// How long each kernel is timed when a replica meets a product: long enough for the fastest of
// a few hundred calls of a small product, short enough that a first step with a dozen shapes
// takes a tenth of a second more (a large product is timed once, after its untimed call).
constexpr double kTimingSeconds = 0.003;
// How much faster than the rules' kernel another must be to replace it.
constexpr double kClearlyFaster = 1.05;

// The choices of this process, one per product shape, the same for every replica. Replicas look
// them up in a copy of their own; `generation` tells them when the table changed (adopted
// or forgotten), which happens only before training.
struct ChoiceTable {
    std::mutex mutex;
    std::map<ProductShape, GemmKernel> chosen;
    std::atomic<uint64_t> generation{1};
};
ChoiceTable& table() {
    static ChoiceTable t;
    return t;
}

const char* kCacheFile = "gemm-kernels.txt";

std::optional<GemmKernel> kernel_named(const std::string& name) {
    for (GemmKernel k : kGemmKernels)
        if (name == gemm_kernel_name(k)) return k;
    return std::nullopt;
}

// "jit 245.1 openblas 210.3": the kernels measured, the chosen one first with its GFLOP/s.
std::string cache_value(const std::vector<GemmKernelTime>& times, GemmKernel chosen, const ProductShape& s) {
    const double flop = 2.0 * s.m * double(s.n) * s.k;
    std::string v;
    auto add = [&](const GemmKernelTime& t) {
        char part[64];
        std::snprintf(part, sizeof part, "%s%s %.4g", v.empty() ? "" : " ", gemm_kernel_name(t.kernel),
                      flop / t.seconds / 1e9);
        v += part;
    };
    for (const auto& t : times)
        if (t.kernel == chosen) add(t);
    for (const auto& t : times)
        if (t.kernel != chosen) add(t);
    return v;
}

// A cache entry as cache_value wrote it, for a kernel that multiplies this shape here and that
// was the fastest measured: anything else (edited, truncated, a NaN) is measured again, and so is
// an entry that lacks a kernel fitting the shape (written before that kernel was added).
std::optional<GemmKernel> cached_choice(const ProductShape& s) {
    const auto v = cache_lookup(kCacheFile, gemm_choice_cache_key(s));
    if (!v) return std::nullopt;
    std::istringstream in(*v);
    std::string name;
    double gflops = 0, first = -1;
    std::optional<GemmKernel> chosen;
    std::set<GemmKernel> listed;
    while (in >> name) {
        const auto k = kernel_named(name);
        if (!k || !(in >> gflops) || !std::isfinite(gflops) || gflops <= 0 || gflops > 1e7) return std::nullopt;
        listed.insert(*k);
        if (!chosen) chosen = k, first = gflops;
        else if (gflops > first * kClearlyFaster) return std::nullopt;  // the rules' kernel stays within it
    }
    if (!chosen || !gemm_kernel_fits(*chosen, s)) return std::nullopt;
    for (GemmKernel k : kGemmKernels)
        if (!listed.count(k) && gemm_kernel_fits(k, s)) return std::nullopt;
    return chosen;
}

// The kernel for a product met for the first time: adopted or chosen earlier in this process,
// else from the machine cache, else measured (and then cached). Holds the table's lock, so the
// replicas meeting the same product wait for one measurement and run the same kernel.
GemmKernel choose(const ProductShape& s, const float* a, const float* b, float* c) {
    ChoiceTable& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    if (auto it = t.chosen.find(s); it != t.chosen.end()) return it->second;
    if (const auto k = cached_choice(s)) return t.chosen[s] = *k;
    const std::vector<GemmKernelTime> times = time_gemm_kernels(s, a, b, c, kTimingSeconds);
    // The rules' kernel stays unless another is clearly faster: two kernels within the noise of a
    // 3 ms measurement would otherwise be picked by chance, differently from run to run.
    const GemmKernel rules = rules_gemm_kernel(s);
    GemmKernel best = GemmKernel::openblas;
    double best_s = std::numeric_limits<double>::infinity(), rules_s = best_s;
    for (const auto& k : times) {
        if (k.seconds < best_s) best = k.kernel, best_s = k.seconds;
        if (k.kernel == rules) rules_s = k.seconds;
    }
    if (rules_s <= best_s * kClearlyFaster) best = rules;
    if (times.size() > 1) cache_store(kCacheFile, gemm_choice_cache_key(s), cache_value(times, best, s));
    return t.chosen[s] = best;
}

}  // namespace

GemmKernel measured_gemm_kernel(const ProductShape& s, const float* a, const float* b, float* c) {
    // Each thread's own copy of the choices it has met: after a replica's first step every product
    // is found here, without the table's lock. It grows only when a shape is met for the first
    // time; past kListed shapes (shapes that change every step) the table is asked under its lock.
    struct Seen {
        uint64_t generation = 0;
        std::map<ProductShape, GemmKernel> shapes;
    };
    constexpr size_t kListed = 4096;
    thread_local Seen seen;
    const uint64_t generation = table().generation.load(std::memory_order_acquire);
    if (seen.generation != generation) seen = {generation, {}};
    if (const auto it = seen.shapes.find(s); it != seen.shapes.end()) return it->second;
    int fitting = 0;
    GemmKernel only = GemmKernel::openblas;
    for (GemmKernel k : kGemmKernels)
        if (gemm_kernel_fits(k, s)) ++fitting, only = k;
    const GemmKernel k = fitting == 1 ? only : choose(s, a, b, c);
    if (seen.shapes.size() < kListed) seen.shapes.emplace(s, k);
    return k;
}

void chosen_sgemm(const ProductShape& s, const float* a, const float* b, float* c) {
    // Both choices fit the shape (the rules check, and measured choices are of fitting kernels);
    // a JIT kernel that cannot be generated falls back to OpenBLAS.
    const GemmKernel k =
        gemm_kernel_choice() == GemmKernelChoice::measure ? measured_gemm_kernel(s, a, b, c) : rules_gemm_kernel(s);
    if (!run_fitting_gemm_kernel(k, s, a, b, c)) run_gemm_kernel(GemmKernel::openblas, s, a, b, c);
}

std::string gemm_choices_text() {
    ChoiceTable& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    std::string text;
    for (const auto& [shape, kernel] : t.chosen)
        text.append(text.empty() ? "" : ";").append(product_text(shape)).append("=").append(gemm_kernel_name(kernel));
    return text;
}

namespace {

// One entry of gemm_choices_text: "nt:64x512x784:784,784,512:0=jit".
std::optional<std::pair<ProductShape, GemmKernel>> parse_choice(const std::string& entry) {
    ProductShape s;
    char ta = 0, tb = 0, name[32] = {};
    int acc = -1, used = 0;
    // widths of 9 digits at most: no number read can overflow an int
    if (std::sscanf(entry.c_str(), "%c%c:%9dx%9dx%9d:%9d,%9d,%9d:%1d=%31[a-z-]%n", &ta, &tb, &s.m, &s.n, &s.k, &s.lda,
                    &s.ldb, &s.ldc, &acc, name, &used) != 10 ||
        size_t(used) != entry.size())
        return std::nullopt;
    if ((ta != 'n' && ta != 't') || (tb != 'n' && tb != 't') || (acc != 0 && acc != 1) || s.m <= 0 || s.n <= 0 ||
        s.k <= 0 || s.lda <= 0 || s.ldb <= 0 || s.ldc <= 0)
        return std::nullopt;
    s.ta = ta == 't';
    s.tb = tb == 't';
    s.accumulate = acc == 1;
    const auto k = kernel_named(name);
    if (!k || !gemm_kernel_fits(*k, s)) return std::nullopt;
    return std::make_pair(s, *k);
}

}  // namespace

size_t adopt_gemm_choices(const std::string& text, size_t* recorded) {
    ChoiceTable& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    size_t adopted = 0, entries = 0, start = 0;
    while (start < text.size()) {
        const size_t end = std::min(text.find(';', start), text.size());
        entries += end > start;
        if (const auto c = parse_choice(text.substr(start, end - start))) {
            t.chosen[c->first] = c->second;
            ++adopted;
        }
        start = end + 1;
    }
    t.generation.fetch_add(1, std::memory_order_release);
    if (recorded) *recorded = entries;
    return adopted;
}

void forget_gemm_choices() {
    ChoiceTable& t = table();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.chosen.clear();
    t.generation.fetch_add(1, std::memory_order_release);
}

std::vector<std::string> cpu_gemm_kernel_names() {
    std::vector<std::string> names;
    for (GemmKernel k : kGemmKernels) names.emplace_back(gemm_kernel_name(k));
    return names;
}

GemmSweepPoint sweep_cpu_gemm(bool ta, bool tb, int m, int n, int k, double seconds) {
    const ProductShape s{ta, tb, m, n, k, ta ? m : k, tb ? k : n, n, false};
    std::mt19937 rng(uint32_t(m) * 31u + uint32_t(n) * 17u + uint32_t(k));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> a(size_t(m) * size_t(k)), b(size_t(k) * size_t(n)), c(size_t(m) * size_t(n));
    for (float& x : a) x = u(rng);
    for (float& x : b) x = u(rng);
    GemmSweepPoint p;
    const double flop = 2.0 * m * double(n) * k;
    double best = 0;
    for (const GemmKernelTime& t : time_gemm_kernels(s, a.data(), b.data(), c.data(), seconds)) {
        p.rates.push_back({gemm_kernel_name(t.kernel), flop / t.seconds / 1e9});
        if (p.rates.back().gflops > best) best = p.rates.back().gflops, p.fastest = p.rates.back().kernel;
    }
    p.rules = gemm_kernel_name(rules_gemm_kernel(s));
    return p;
}

namespace {

// Independent multiply-adds on registers, enough chains to cover the FMA units' latency: the
// loop's rate is the core's peak, as no product can exceed it. One loop per vector width, each
// compiled for its instructions.
constexpr int kChains = 12;
constexpr long kBatch = 1 << 18;
// read at run time, so that the compiler cannot fold the loops into their result
volatile float g_factor = 0.999999f, g_term = 1e-7f;

template <typename Loop>
double peak_of(double seconds, int lanes, Loop loop) {
    long batches = 0;
    const double t0 = now_s();
    double elapsed = 0, sink = 0;
    do {
        sink += loop();
        ++batches;
        elapsed = now_s() - t0;
    } while (elapsed < seconds);
    volatile double keep = sink;  // the sums are used: the loop is not optimised away
    (void)keep;
    return 2.0 * lanes * kChains * double(kBatch) * double(batches) / elapsed / 1e9;
}

__attribute__((target("avx512f"))) float avx512_batch() {
    __m512 acc[kChains];
    const __m512 a = _mm512_set1_ps(g_factor), b = _mm512_set1_ps(g_term);
    for (__m512& x : acc) x = b;
    for (long i = 0; i < kBatch; ++i)
        for (__m512& x : acc) x = _mm512_fmadd_ps(x, a, b);
    __m512 sum = acc[0];
    for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);
    return lanes[0];
}
__attribute__((target("avx2,fma"))) float avx2_batch() {
    __m256 acc[kChains];
    const __m256 a = _mm256_set1_ps(g_factor), b = _mm256_set1_ps(g_term);
    for (__m256& x : acc) x = b;
    for (long i = 0; i < kBatch; ++i)
        for (__m256& x : acc) x = _mm256_fmadd_ps(x, a, b);
    __m256 sum = acc[0];
    for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, sum);
    return lanes[0];
}
float sse_batch() {  // no FMA: a multiply and an add
    __m128 acc[kChains];
    const __m128 a = _mm_set1_ps(g_factor), b = _mm_set1_ps(g_term);
    for (__m128& x : acc) x = b;
    for (long i = 0; i < kBatch; ++i)
        for (__m128& x : acc) x = _mm_add_ps(_mm_mul_ps(x, a), b);
    __m128 sum = acc[0];
    for (int i = 1; i < kChains; ++i) sum = _mm_add_ps(sum, acc[i]);
    return _mm_cvtss_f32(sum);
}

}  // namespace

double cpu_fma_peak_gflops(double seconds) {
    if (__builtin_cpu_supports("avx512f")) return peak_of(seconds, 16, avx512_batch);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return peak_of(seconds, 8, avx2_batch);
    return peak_of(seconds, 4, sse_batch);
}

}  // namespace mirrored
