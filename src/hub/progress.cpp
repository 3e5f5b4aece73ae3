#include "hub/progress.h"

#include <cstdio>
#include <utility>

namespace clef::hub {

namespace {

std::string format_duration(double s) {
    const auto t = static_cast<uint64_t>(s + 0.5);
    char buf[32];
    if (t >= 3600)
        std::snprintf(buf, sizeof buf, "%lluh%02llum", static_cast<unsigned long long>(t / 3600),
                      static_cast<unsigned long long>(t / 60 % 60));
    else
        std::snprintf(buf, sizeof buf, "%llum%02llus", static_cast<unsigned long long>(t / 60),
                      static_cast<unsigned long long>(t % 60));
    return buf;
}

}  // namespace

std::string format_bytes(uint64_t n) {
    static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(n);
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
    return buf;
}

ProgressBar::ProgressBar(std::string label, uint64_t total, uint64_t start, bool enabled)
    : label_(std::move(label)), total_(total), start_(start), enabled_(enabled) {
    began_ = last_ = std::chrono::steady_clock::now();
}

void ProgressBar::update(uint64_t done) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    draw(done, false);
}

void ProgressBar::finish(uint64_t done) {
    if (enabled_) draw(done, true);
}

void ProgressBar::draw(uint64_t done, bool final) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - began_).count();
    const uint64_t fetched = done >= start_ ? done - start_ : done;  // less: the server sent the whole file
    const double rate = secs > 0 ? static_cast<double>(fetched) / secs : 0;
    std::string line = label_ + "  " + format_bytes(done);
    if (total_ > 0) {
        char pct[16];
        std::snprintf(pct, sizeof pct, "%5.1f%%",
                      100.0 * static_cast<double>(done) / static_cast<double>(total_));
        line += " / " + format_bytes(total_) + "  " + pct;
    }
    line += "  " + format_bytes(static_cast<uint64_t>(rate)) + "/s";
    if (!final && total_ > done && rate > 0)
        line += "  ETA " + format_duration(static_cast<double>(total_ - done) / rate);
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
    std::fflush(stderr);
}

}  // namespace clef::hub
