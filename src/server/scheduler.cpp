#include "server/scheduler.h"

#include <algorithm>
#include <utility>

namespace clef {

Scheduler::Scheduler(SchedulerLimits limits, std::function<void(size_t)> on_queue_depth)
    : limits_(limits), on_queue_depth_(std::move(on_queue_depth)) {}

void Scheduler::set_memory_budget(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    bounded_ = true;
    budget_ = bytes;
}

void Scheduler::set_device_memory_budget(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    device_bounded_ = true;
    device_budget_ = bytes;
}

bool Scheduler::admissible(uint64_t memory) const {
    std::lock_guard<std::mutex> lock(mu_);
    return !bounded_ || memory <= budget_;
}

bool Scheduler::submit(std::shared_ptr<ScheduledJob> job) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.size() >= limits_.queue_size) return false;
        queue_.push_back(std::move(job));
        if (on_queue_depth_) on_queue_depth_(queue_.size());
    }
    cv_.notify_one();
    return true;
}

size_t Scheduler::queued() const {
    std::lock_guard<std::mutex> lock(mu_);
    return queue_.size();
}

// Jobs in flight together stay within the memory budgets (each alone fits: admissible); the first always
// runs.
bool Scheduler::fits_in_flight(const ScheduledJob& next) const {
    if (running_.empty()) return true;
    return (!bounded_ || memory_in_flight_ + next.memory <= budget_) &&
           (!device_bounded_ || device_in_flight_ + next.device_memory <= device_budget_);
}

bool Scheduler::take() {
    std::unique_lock<std::mutex> lock(mu_);
    if (running_.empty()) cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (running_.empty() && queue_.empty()) return false;  // stopped and nothing left
    while (!queue_.empty() && running_.size() < std::max<size_t>(limits_.max_in_flight, 1)) {
        if (!fits_in_flight(*queue_.front())) break;  // arrival order: nothing overtakes the front job
        std::shared_ptr<ScheduledJob> job = std::move(queue_.front());
        queue_.pop_front();
        if (on_queue_depth_) on_queue_depth_(queue_.size());
        if (job->admit()) {
            memory_in_flight_ += job->memory;
            device_in_flight_ += job->device_memory;
            running_.push_back(std::move(job));
        } else {
            job->finish();
        }
    }
    return true;
}

void Scheduler::turn() {
    for (size_t i = 0; i < running_.size();) {
        if (!running_[i]->step()) {
            ++i;
            continue;
        }
        memory_in_flight_ -= running_[i]->memory;
        device_in_flight_ -= running_[i]->device_memory;
        running_[i]->finish();
        running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    }
}

void Scheduler::run() {
    while (take()) turn();
}

void Scheduler::stop() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
}

}  // namespace clef
