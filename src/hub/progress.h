// A one-line progress bar on stderr for a download: file, bytes, percentage, rate and time left.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace clef::hub {

class ProgressBar {
public:
    // `total`: the file's size (0: unknown); `start`: bytes already there (a resumed download). Draws nothing
    // when `enabled` is false.
    ProgressBar(std::string label, uint64_t total, uint64_t start, bool enabled);
    // Redraws (at most ten times a second) with `done` bytes of the file present.
    void update(uint64_t done);
    // The final line, ended with a newline.
    void finish(uint64_t done);

private:
    void draw(uint64_t done, bool final);

    std::string label_;
    uint64_t total_, start_;
    bool enabled_;
    std::chrono::steady_clock::time_point began_, last_;
};

// 1536 -> "1.5 KiB".
std::string format_bytes(uint64_t n);

}  // namespace clef::hub
