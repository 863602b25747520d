// The tool commands on the command line (benchmarks, scale, plan, report): registered on the app, run
// once it has parsed. mirrored/main.cpp keeps train, eval, export and devices.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "mirrored/tools/tools.h"

namespace mirrored {

class ToolCommands {
public:
    explicit ToolCommands(CLI::App& app);
    // The exit code of the tool command given, or -1 when the command was not one of these.
    // Errors are thrown as mirrored::Error (bad arguments: ConfigError, exit 2).
    int run();

private:
    // one per command: its options, bound to the members below
    void add_bench_loader(CLI::App& app);
    void add_bench_allreduce(CLI::App& app);
    void add_bench_step(CLI::App& app);
    void add_bench_gemm(CLI::App& app);
    void add_bench_conv_layout(CLI::App& app);
    void add_scale(CLI::App& app);
    void add_plan(CLI::App& app);
    void add_report(CLI::App& app);
    void add_generate(CLI::App& app);
    void add_tokenize(CLI::App& app);

    LoaderBenchOptions lb_;
    AllReduceBenchOptions ab_;
    StepBenchOptions sb_;
    GemmBenchOptions gb_;
    ConvLayoutBenchOptions cl_;
    ScaleOptions sc_;
    PlanOptions pl_;
    ReportOptions rp_;
    GenerateOptions gn_;
    TokenizeOptions tk_;
    std::string lb_threads_ = "1,2", min_bytes_ = "4K", max_bytes_ = "64M", duration_, timeout_, sb_devices_,
                gb_sizes_ = "128,512,1024,2048", gb_shapes_, gb_precision_ = "fp32", sc_replicas_, pl_gpus_ = "1,2,4,8",
                gn_seed_ = "1";
    CLI::App *bl_, *ba_, *bs_, *bg_, *bc_, *sc_cmd_, *pl_cmd_, *rp_cmd_, *gn_cmd_, *tk_cmd_;
};

}  // namespace mirrored
