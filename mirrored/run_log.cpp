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

void RunLog::open_metrics(const std::string& folder, std::ios::openmode mode) {
    if (!leader_) return;
    path_ = (fs::path(folder) / "metrics.jsonl").string();
    metrics_.open(path_, mode);
    if (!metrics_.is_open()) throw CheckpointError(path_ + ": cannot open for writing: " + std::strerror(errno));
}

void RunLog::emit(const json& record) {
    if (!leader_) return;
    errno = 0;
    metrics_ << record.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    metrics_.flush();
    if (!metrics_) {  // never lose metrics silently (a full disk, a removed folder)
        const std::string context = context_ ? context_() : std::string();
        throw CheckpointError(path_ + ": cannot write" +
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
