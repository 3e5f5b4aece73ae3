// Server metrics in the Prometheus text exposition format (hand-written: counters, gauges, histograms).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "decision/state_cache.h"

namespace clef {

class Histogram {
public:
    explicit Histogram(std::vector<double> upper_bounds);
    void observe(double v);
    // Appends the _bucket/_sum/_count lines for `name` with an optional extra label set ("a=\"b\"").
    void render(std::string& out, const std::string& name, const std::string& labels = "") const;

private:
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  // cumulative at render time
    double sum_ = 0;
    uint64_t count_ = 0;
    mutable std::mutex mu_;
};

class ServerMetrics {
public:
    ServerMetrics();
    void count_request(const std::string& route, int status);
    void observe_latency(double seconds) { latency_.observe(seconds); }
    void observe_queue_wait(double seconds) { queue_wait_.observe(seconds); }
    void observe_compute(double seconds) { compute_.observe(seconds); }
    void add_prompt_tokens(int64_t n) { prompt_tokens_ += n; }
    void set_queue_depth(int64_t n) { queue_depth_ = n; }
    void count_dropped() { dropped_ += 1; }
    void set_model_load_seconds(double s) { load_seconds_ = s; }
    void set_ready(bool r) { ready_ = r; }
    void set_state_cache(const StateCacheStats& s) {
        std::lock_guard<std::mutex> lock(mu_);
        cache_ = s;
    }
    // The device the model runs on: kind "cpu" or "vulkan", its name, its device-local memory and what the
    // model holds there (bytes).
    struct Device {
        std::string kind, name;
        uint64_t memory = 0, used = 0;
    };
    void set_device(Device d) {
        std::lock_guard<std::mutex> lock(mu_);
        device_ = std::move(d);
    }

    std::string render() const;

private:
    mutable std::mutex mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;
    Histogram latency_, queue_wait_, compute_;
    std::atomic<int64_t> prompt_tokens_{0}, queue_depth_{0}, dropped_{0};
    std::atomic<double> load_seconds_{0};
    std::atomic<bool> ready_{false};
    StateCacheStats cache_;  // under mu_
    Device device_;          // under mu_
};

}  // namespace clef
