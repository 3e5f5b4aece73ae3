// The worker's scheduler (docs/API.md, "Limits and hostile input"): a bounded queue of jobs (beyond it a
// submission is refused: the server answers 529), taken in arrival order while fewer than max_in_flight run
// and the memory their plans take together stays within the budget; the jobs in flight advance round-robin,
// one step (one prefill chunk) each per turn, so a short job behind a long one starts within one step. It
// knows nothing of HTTP or decisions: the server's jobs are server/routes.cpp's DecisionJob.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace clef {

// One unit of work. The scheduler calls admit() once when it takes the job from the queue, then step() once
// per turn until it returns true, then finish(); a job that is not admitted is finished without a step.
class ScheduledJob {
public:
    virtual ~ScheduledJob() = default;
    // Whether the job still wants to run (false: its client went away or its deadline passed in the queue).
    virtual bool admit() = 0;
    // One step; true once the job has its outcome (answered, failed or cancelled).
    virtual bool step() = 0;
    // Hands the outcome to whoever waits for it.
    virtual void finish() = 0;
    uint64_t memory = 0;         // what the job takes while it runs (its memory plan), against the budget
    uint64_t device_memory = 0;  // and on a GPU (its device plan), against the device budget
};

struct SchedulerLimits {
    size_t queue_size = 16;    // jobs waiting; a submission beyond them is refused
    size_t max_in_flight = 4;  // jobs advanced together (at least one)
};

class Scheduler {
public:
    // on_queue_depth: called with the number of waiting jobs whenever it changes (the metrics' gauge).
    explicit Scheduler(SchedulerLimits limits, std::function<void(size_t)> on_queue_depth = {});

    // The memory the jobs in flight may take together; without one (the default) only max_in_flight bounds
    // them. Set it before the first job is submitted.
    void set_memory_budget(uint64_t bytes);
    // The same for a GPU's memory (the jobs' device_memory), when the model runs on one.
    void set_device_memory_budget(uint64_t bytes);
    // Whether a job of this memory could ever run: within the budget alone (always, without a budget).
    bool admissible(uint64_t memory) const;
    // Queues the job; false (nothing queued) when queue_size jobs already wait.
    bool submit(std::shared_ptr<ScheduledJob> job);

    // The worker: takes jobs and runs turns until stop() was called and no job is left.
    void run();
    // Takes the jobs that may start (waits for one when none runs); false once stopped and nothing is left.
    bool take();
    // One round-robin turn: one step of each job in flight; the finished ones leave.
    void turn();
    // Thread-safe: run() returns once the queued and running jobs are done.
    void stop();

    size_t queued() const;
    size_t in_flight() const { return running_.size(); }  // the worker's thread only

private:
    bool fits_in_flight(const ScheduledJob& next) const;

    const SchedulerLimits limits_;
    const std::function<void(size_t)> on_queue_depth_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<ScheduledJob>> queue_;
    bool stopping_ = false;
    bool bounded_ = false, device_bounded_ = false;
    uint64_t budget_ = 0, device_budget_ = 0;
    // The worker's own state (its thread only).
    std::vector<std::shared_ptr<ScheduledJob>> running_;
    uint64_t memory_in_flight_ = 0, device_in_flight_ = 0;
};

}  // namespace clef
