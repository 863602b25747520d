#include "mirrored/run_log.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "base/io.h"
#include "mirrored/util.h"

namespace mirrored {

namespace fs = std::filesystem;
using json = nlohmann::json;

void RunLog::status_line(const std::string& line, bool final_line) {
    if (tty_) std::fprintf(out_, "\r\033[K%s%s", line.c_str(), final_line ? "\n" : "");
    else std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
}

namespace {

// The columns of metrics.csv: every field of a train, eval, alert or resume record (time_split's
// fractions flattened), in this order.
const char* const kCsvColumns[] = {"type",
                                   "time",
                                   "step",
                                   "epoch",
                                   "loss",
                                   "accuracy",
                                   "lr",
                                   "samples_per_sec",
                                   "data_wait",
                                   "compute",
                                   "comm",
                                   "loss_scale",
                                   "test_loss",
                                   "test_accuracy",
                                   "samples",
                                   "kind",
                                   "redone_steps",
                                   "test_bits_per_token",
                                   "tokens_per_sec",
                                   "test_bits_per_byte"};

std::string csv_cell(const json& v) {
    if (v.is_null()) return "";
    if (v.is_string()) return v.get<std::string>();  // record types and alert kinds: no commas or quotes
    if (v.is_number_float()) {
        char s[40];
        std::snprintf(s, sizeof s, "%.17g", v.get<double>());
        return s;
    }
    return v.dump();
}

}  // namespace

std::string metrics_csv_header() {
    std::string line;
    for (const char* c : kCsvColumns) line += (line.empty() ? "" : ",") + std::string(c);
    return line + "\n";
}

std::string metrics_csv_row(const json& record) {
    std::string line;
    bool first = true;
    for (const char* c : kCsvColumns) {
        json v = record.contains(c) ? record[c] : json(nullptr);
        if (v.is_null() && record.contains("time_split") && record["time_split"].contains(c))
            v = record["time_split"][c];
        line += (first ? "" : ",") + csv_cell(v);
        first = false;
    }
    return line + "\n";
}

void RunLog::open_metrics(const std::string& folder, std::ios::openmode mode) {
    if (!leader_) return;
    path_ = (fs::path(folder) / "metrics.jsonl").string();
    metrics_.open(path_, mode);
    if (!metrics_.is_open()) throw CheckpointError(path_ + ": cannot open for writing: " + std::strerror(errno));
    csv_path_ = (fs::path(folder) / "metrics.csv").string();
    std::error_code ec;
    const bool fresh = mode & std::ios::trunc || !fs::exists(csv_path_, ec);
    csv_.open(csv_path_, fresh ? std::ios::trunc : std::ios::app);
    if (!csv_.is_open()) throw CheckpointError(csv_path_ + ": cannot open for writing: " + std::strerror(errno));
    if (fresh) csv_ << metrics_csv_header();
}

void RunLog::emit(const json& given) {
    if (!leader_) return;
    json record = given;
    if (!record.contains("time")) record["time"] = unix_time_s();
    errno = 0;
    metrics_ << record.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    metrics_.flush();
    csv_ << metrics_csv_row(record);
    csv_.flush();
    if (!metrics_ || !csv_) {  // never lose metrics silently (a full disk, a removed folder)
        const std::string context = context_ ? context_() : std::string();
        throw CheckpointError((metrics_ ? csv_path_ : path_) + ": cannot write" +
                              (errno ? std::string(": ") + std::strerror(errno) : std::string()) +
                              (context.empty() ? "" : "; " + context));
    }
}

void RunLog::alert(const std::string& kind, const std::string& text, int64_t step) {
    if (!leader_) return;
    const double t = now_s();
    auto it = last_alert_.find(kind);
    if (it != last_alert_.end() && t - it->second < 300.0) return;  // at most every 5 minutes
    last_alert_[kind] = t;
    if (tty_) std::fprintf(out_, "\r\033[K");
    std::fprintf(stderr, "alert: %s: %s\n", kind.c_str(), text.c_str());
    emit({{"type", "alert"}, {"step", step}, {"kind", kind}, {"message", text}});
}

json completed_summary(const std::string& out_dir) {
    try {
        const std::string text = read_regular_file((fs::path(out_dir) / "summary.json").string(), 64 << 20);
        json j = json::parse(text);
        if (j.is_object() && j.value("status", "") == "completed") return j;
    } catch (const std::exception&) {}
    return nullptr;
}

}  // namespace mirrored
