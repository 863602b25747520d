// Test runner: doctest plus a listener that counts passed, failed and skipped test cases and
// ends the output with one line "N passed, N failed[, N skipped]".
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "kernels/blas.h"
#include "kernels/device.h"
#include "tests/helpers.h"

namespace {

int g_passed = 0, g_failed = 0, g_skipped = 0;
bool g_current_skipped = false;
std::string g_current_reason;

struct SummaryListener : doctest::IReporter {
    explicit SummaryListener(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_start(const doctest::TestCaseData&) override {
        g_current_skipped = false;
        g_current_reason.clear();
    }
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_end(const doctest::CurrentTestCaseStats& st) override {
        if (!st.testCaseSuccess) ++g_failed;
        else if (g_current_skipped) ++g_skipped;
        else ++g_passed;
    }
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace

REGISTER_LISTENER("mirrored-summary", 1, SummaryListener);

namespace mirrored::test {

void mark_skipped(const std::string& reason) {
    if (!g_current_skipped) {
        std::printf("SKIPPED: %s: %s\n", doctest::detail::g_cs->currentTest->m_name, reason.c_str());
        std::fflush(stdout);
    }
    g_current_skipped = true;
    g_current_reason = reason;
}

void mark_runs_elsewhere(const std::string& reason) { mark_skipped("runs elsewhere: " + reason); }

}  // namespace mirrored::test

int main(int argc, char** argv) {
    // GEMM kernels by the static rules unless a test asks for measuring (MIRRORED_JIT_GEMM=measure):
    // the suite bit-compares runs of separate processes, each with a fresh machine cache, and two
    // measurements may pick different kernels for a shape where two are close.
    ::setenv("MIRRORED_JIT_GEMM", "rules", 0);
    // The same BLAS kernel as the CLI the tests start (results are bit-compared across the two).
    mirrored::choose_blas_kernel(argv);
    mirrored::cpu_set_blas_threads(1);
    std::printf("test seed %llu (set MIRRORED_TEST_SEED to repeat)\n",
                static_cast<unsigned long long>(mirrored::test::base_seed()));
    if (mirrored::cuda_device_count() == 0)
        std::printf("CUDA tests will be skipped: %s\n", mirrored::cuda_unavailable_reason().c_str());
    doctest::Context context(argc, argv);
    const int rc = context.run();
    if (context.shouldExit()) return rc;
    std::printf("%d passed, %d failed", g_passed, g_failed);
    if (g_skipped) std::printf(", %d skipped", g_skipped);
    std::printf("\n");
    return rc != 0 || g_failed != 0 ? 1 : 0;
}
