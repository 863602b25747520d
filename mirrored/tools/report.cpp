// `mirrored report RUN [RUN...]`: the runs' curves (scripts/report.py draws them with matplotlib):
// loss, accuracy, learning rate, samples/s and the step-time split against steps, the loss against
// wall time with resumes and alerts marked, several runs overlaid; one HTML page with a table.
#include <filesystem>
#include <string>

#include "base/error.h"
#include "mirrored/tools/tools.h"

namespace mirrored {

namespace fs = std::filesystem;

int report(const ReportOptions& o) {
    if (o.runs.empty()) throw ConfigError("report: name at least one run folder (runs/NAME)");
    for (const std::string& run : o.runs) {
        std::error_code ec;
        if (!fs::is_regular_file(fs::path(run) / "metrics.jsonl", ec))
            throw ConfigError("report: " + run + ": no metrics.jsonl; expected a run folder such as runs/NAME");
    }
    const std::string out = o.out_dir.empty() ? (fs::path(o.runs.front()) / "report").string() : o.out_dir;
    // A folder the report did not write is not written into: its files stay the user's.
    std::error_code ec;
    if (fs::exists(out, ec)) {
        if (!fs::is_directory(out, ec)) throw ConfigError("report: --out " + out + " is a file, not a folder");
        if (!fs::is_empty(out, ec) && !fs::exists(fs::path(out) / "report.json", ec))
            throw ConfigError("report: " + out + " holds files a report did not write; name another folder with --out");
    }
    // "--": a run folder named like an option ("-h", "--out=..") is still a folder
    std::vector<std::string> args{"--out", out, "--"};
    args.insert(args.end(), o.runs.begin(), o.runs.end());
    const int rc = run_project_script("report.py", args);
    if (rc == 0) return kExitOk;
    if (rc == kScriptMissing) throw Error(kExitFailure, "report: scripts/report.py not found beside the build folder");
    if (rc == kNoPython) throw Error(kExitFailure, "report: python3 is not installed");
    if (rc == 3)
        throw Error(kExitFailure,
                    "report: python3-matplotlib is not installed (scripts/install_deps.sh installs it); "
                    "metrics.jsonl and metrics.csv hold every number");
    if (rc == 2) throw ConfigError("report: scripts/report.py refused the run folders (its message above)");
    if (rc == 4)
        throw CheckpointError("report: " + out +
                              " could not be written (its message above); a rerun writes over what is there");
    throw Error(kExitFailure, "report: scripts/report.py failed (exit " + std::to_string(rc) + ")");
}

}  // namespace mirrored
