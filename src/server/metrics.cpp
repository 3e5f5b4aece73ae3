#include "server/metrics.h"

#include <cstdio>

namespace clef {

namespace {
std::string num(double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.9g", v);
    return b;
}
const std::vector<double> kLatencyBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size(), 0) {}

void Histogram::observe(double v) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < bounds_.size(); ++i)
        if (v <= bounds_[i]) {
            ++counts_[i];
            break;
        }
    sum_ += v;
    ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string sep = labels.empty() ? "" : ",";
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
        cum += counts_[i];
        out += name + "_bucket{" + labels + sep + "le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
    }
    out += name + "_bucket{" + labels + sep + "le=\"+Inf\"} " + std::to_string(count_) + "\n";
    const std::string l = labels.empty() ? "" : "{" + labels + "}";
    out += name + "_sum" + l + " " + num(sum_) + "\n";
    out += name + "_count" + l + " " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics() : latency_(kLatencyBuckets), queue_wait_(kLatencyBuckets), compute_(kLatencyBuckets) {}

void ServerMetrics::count_request(const std::string& route, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_[{route, status}];
}

namespace {

// A Prometheus label value: backslash, double quote and newline escaped.
std::string label_value(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '\\' || c == '"') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out;
}

}  // namespace

std::string ServerMetrics::render() const {
    std::string out;
    out += "# HELP clef_requests_total HTTP requests by route and status.\n# TYPE clef_requests_total counter\n";
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [k, v] : requests_)
            out += "clef_requests_total{route=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"} " +
                   std::to_string(v) + "\n";
    }
    out += "# HELP clef_request_duration_seconds End-to-end latency of POST /v1/systemone.\n"
           "# TYPE clef_request_duration_seconds histogram\n";
    latency_.render(out, "clef_request_duration_seconds");
    out += "# HELP clef_queue_wait_seconds Time decisions waited for the inference worker.\n"
           "# TYPE clef_queue_wait_seconds histogram\n";
    queue_wait_.render(out, "clef_queue_wait_seconds");
    out += "# HELP clef_compute_seconds Prefill + head time per decision.\n# TYPE clef_compute_seconds histogram\n";
    compute_.render(out, "clef_compute_seconds");
    out += "# HELP clef_prompt_tokens_total Prompt tokens processed.\n# TYPE clef_prompt_tokens_total counter\n";
    out += "clef_prompt_tokens_total " + std::to_string(prompt_tokens_.load()) + "\n";
    {
        std::lock_guard<std::mutex> lock(mu_);
        const auto line = [&](const char* name, const char* type, const char* help, uint64_t v) {
            out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
                   name + " " + std::to_string(v) + "\n";
        };
        line("clef_state_cache_lookups_total", "counter", "Decisions that looked up the state cache.",
             cache_.lookups);
        line("clef_state_cache_hits_total", "counter", "Decisions that resumed a cached prompt prefix.",
             cache_.hits);
        line("clef_state_cache_tokens_reused_total", "counter", "Prompt tokens resumed from the state cache.",
             cache_.tokens_reused);
        line("clef_state_cache_bytes", "gauge", "Bytes the state cache holds.", cache_.bytes);
        line("clef_state_cache_budget_bytes", "gauge", "The state cache's budget (0: off).", cache_.budget);
        if (!device_.kind.empty()) {
            out += "# HELP clef_device_info The device the model runs on.\n# TYPE clef_device_info gauge\n";
            out += "clef_device_info{kind=\"" + label_value(device_.kind) + "\",name=\"" +
                   label_value(device_.name) + "\"} 1\n";
            line("clef_device_memory_bytes", "gauge", "The device's device-local memory (0: the CPU).",
                 device_.memory);
            line("clef_device_memory_used_bytes", "gauge",
                 "Device memory the model holds (weights, buffers).", device_.used);
        }
    }
    out += "# HELP clef_queue_depth Decisions waiting for the worker.\n# TYPE clef_queue_depth gauge\n";
    out += "clef_queue_depth " + std::to_string(queue_depth_.load()) + "\n";
    out += "# HELP clef_dropped_total Queued decisions dropped because the client went away or timed out.\n"
           "# TYPE clef_dropped_total counter\n";
    out += "clef_dropped_total " + std::to_string(dropped_.load()) + "\n";
    out += "# HELP clef_model_load_seconds Time to load and warm up the model.\n# TYPE clef_model_load_seconds gauge\n";
    out += "clef_model_load_seconds " + num(load_seconds_.load()) + "\n";
    out += "# HELP clef_ready Whether the model is loaded and warmed up.\n# TYPE clef_ready gauge\n";
    out += std::string("clef_ready ") + (ready_.load() ? "1" : "0") + "\n";
    return out;
}

}  // namespace clef
