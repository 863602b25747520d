// What a run tells its user as it goes: the progress lines (a status line that rewrites itself on
// a terminal), metrics.jsonl (one JSON record per log step, evaluation, alert and resume, each
// stamped with the wall clock, flushed at once and never lost silently) and the same records as
// metrics.csv for other tools, and alerts (stderr and metrics.jsonl, each kind at most every five
// minutes). Node 0 of a multi-node run alone writes the files.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace mirrored {

class RunLog {
public:
    // out: where the progress goes (stdout, or a test's sink); leader: this process writes the
    // run folder; tty: out is a terminal, so a status line rewrites itself.
    RunLog(std::FILE* out, bool leader, bool tty) : out_(out), leader_(leader), tty_(tty) {}

    std::FILE* out() const { return out_; }
    bool tty() const { return tty_; }
    // A line of progress: final lines stay, others are overwritten by the next on a terminal.
    void status_line(const std::string& line, bool final_line);
    // metrics.jsonl and metrics.csv in `folder`: trunc for a fresh run, app to continue one.
    void open_metrics(const std::string& folder, std::ios::openmode mode);
    // One record, stamped with "time" (Unix seconds) unless it has one; a failed write is a
    // CheckpointError naming the file (and `context`, the last checkpoint, when given).
    void emit(const nlohmann::json& record);
    void set_context(std::function<std::string()> context) { context_ = std::move(context); }
    // An alert at `step`: stderr and a record, at most every five minutes per kind.
    void alert(const std::string& kind, const std::string& text, int64_t step);

private:
    std::FILE* out_;
    bool leader_, tty_;
    std::string path_, csv_path_;
    std::ofstream metrics_, csv_;
    std::map<std::string, double> last_alert_;
    std::function<std::string()> context_;
};

// metrics.csv: its header line, and one record as a row (every column of every record type; a
// column the record lacks is empty; alert messages stay in metrics.jsonl).
std::string metrics_csv_header();
std::string metrics_csv_row(const nlohmann::json& record);

// A run folder's summary.json, when it says the run completed (else null).
nlohmann::json completed_summary(const std::string& out_dir);

}  // namespace mirrored
