// The worker's scheduler (src/server/scheduler.h) driven directly, without HTTP or a model: jobs are fakes
// that log each step, so the order of steps (fair chunk scheduling), the queue limit, admission and the
// memory budget are checked by counts against sequences worked out by hand from the rules in scheduler.h.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "server/scheduler.h"

using namespace clef;

namespace {

// What the fakes did, in order: one entry per step ("A") and per finish ("A done").
struct Log {
    std::vector<std::string> steps;
    std::vector<std::string> finished;
};

// A job of `steps` steps; `admitted` false: refused when taken; stops early (cancelled) after `cancel_after`.
class FakeJob : public ScheduledJob {
public:
    FakeJob(Log& log, std::string name, int steps, uint64_t mem = 0, bool admitted = true,
            int cancel_after = -1)
        : log_(log),
          name_(std::move(name)),
          steps_left_(steps),
          admitted_(admitted),
          cancel_after_(cancel_after) {
        memory = mem;
    }
    bool admit() override { return admitted_; }
    bool step() override {
        log_.steps.push_back(name_);
        ++steps_done_;
        return --steps_left_ == 0 || steps_done_ == cancel_after_;
    }
    void finish() override { log_.finished.push_back(name_); }
    int steps_done() const { return steps_done_; }

private:
    Log& log_;
    std::string name_;
    int steps_left_;
    bool admitted_;
    int cancel_after_;
    int steps_done_ = 0;
};

using Strings = std::vector<std::string>;

// Submits the jobs, stops the scheduler and runs it on this thread until every job is done.
void run_all(Scheduler& s, const std::vector<std::shared_ptr<FakeJob>>& jobs) {
    for (const auto& j : jobs) ASSERT_TRUE(s.submit(j));
    s.stop();
    s.run();
    EXPECT_EQ(s.queued(), 0u);
    EXPECT_EQ(s.in_flight(), 0u);
}

struct Spec {
    const char* name;
    int steps;
    uint64_t memory = 0;
    bool admitted = true;
    int cancel_after = -1;
};

// Runs these jobs with `in_flight` at most and a memory budget (0: none); returns what they did.
Log run_jobs(const std::vector<Spec>& specs, size_t in_flight, uint64_t budget = 0) {
    Log log;
    Scheduler s({8, in_flight});
    if (budget) s.set_memory_budget(budget);
    std::vector<std::shared_ptr<FakeJob>> jobs;
    for (const Spec& j : specs)
        jobs.push_back(std::make_shared<FakeJob>(log, j.name, j.steps, j.memory, j.admitted, j.cancel_after));
    run_all(s, jobs);
    return log;
}

}  // namespace

// Two in flight: A (3 steps) and B (1) start together; B leaves after the first turn and C takes its place.
// Turns: [A B] [A C] [A C].
TEST(Scheduler, RoundRobinOneStepEachTurn) {
    const Log log = run_jobs({{"A", 3}, {"B", 1}, {"C", 2}}, 2);
    EXPECT_EQ(log.steps, (Strings{"A", "B", "A", "C", "A", "C"}));
    EXPECT_EQ(log.finished, (Strings{"B", "A", "C"}));
}

// A short job behind a long one finishes after its own two steps, having waited for two of the long one's.
TEST(Scheduler, ShortJobDoesNotWaitForALongOne) {
    const Log log = run_jobs({{"long", 10}, {"short", 2}}, 4);
    EXPECT_EQ(log.finished, (Strings{"short", "long"}));
    Strings expected = {"long", "short", "long", "short"};
    expected.resize(12, "long");
    EXPECT_EQ(log.steps, expected);
}

// One in flight: the jobs run one after the other, in arrival order.
TEST(Scheduler, OneInFlightRunsInArrivalOrder) {
    const Log log = run_jobs({{"A", 2}, {"B", 1}, {"C", 2}}, 1);
    EXPECT_EQ(log.steps, (Strings{"A", "A", "B", "C", "C"}));
}

// A full queue refuses the submission (the server's 529) and the refused job never runs.
TEST(Scheduler, QueueLimitRefusesBeyondIt) {
    Log log;
    Scheduler s({2, 4});
    EXPECT_TRUE(s.submit(std::make_shared<FakeJob>(log, "A", 1)));
    EXPECT_TRUE(s.submit(std::make_shared<FakeJob>(log, "B", 1)));
    EXPECT_FALSE(s.submit(std::make_shared<FakeJob>(log, "C", 1)));
    EXPECT_EQ(s.queued(), 2u);
    ASSERT_TRUE(s.take());  // both start: the queue is free again
    EXPECT_EQ(s.queued(), 0u);
    EXPECT_TRUE(s.submit(std::make_shared<FakeJob>(log, "D", 1)));
    s.stop();
    s.run();
    EXPECT_EQ(log.steps, (Strings{"A", "B", "D"}));
    EXPECT_EQ(log.finished, (Strings{"A", "B", "D"}));
}

// A job that is not admitted when taken (client gone, deadline passed) is finished without a step, and its
// memory does not count: A (30) and C (60) fit a budget of 100 together.
TEST(Scheduler, RefusedJobFinishesWithoutRunning) {
    const Log log = run_jobs({{"A", 2, 30}, {"R", 5, 60, false}, {"C", 1, 60}}, 4, 100);
    EXPECT_EQ(log.steps, (Strings{"A", "C", "A"}));
    EXPECT_EQ(log.finished, (Strings{"R", "C", "A"}));
}

// Jobs in flight together stay within the budget: B (60) waits for A (60) to finish, and C (30), which would
// fit beside A, does not overtake B; then B and C run together (90). Without a budget only max_in_flight
// bounds them: the three run together.
TEST(Scheduler, MemoryBudgetHoldsBackInArrivalOrder) {
    const std::vector<Spec> jobs = {{"A", 2, 60}, {"B", 1, 60}, {"C", 1, 30}};
    EXPECT_EQ(run_jobs(jobs, 4, 100).steps, (Strings{"A", "A", "B", "C"}));
    EXPECT_EQ(run_jobs(jobs, 4).steps, (Strings{"A", "B", "C", "A"}));
}

// The device budget (a model on a GPU) holds jobs back the same way, whatever the host budget: A and B do not
// fit on the device together, so B waits for A; C fits beside B.
TEST(Scheduler, DeviceMemoryBudgetHoldsBackInArrivalOrder) {
    Log log;
    Scheduler s({8, 4});
    s.set_memory_budget(1000);
    s.set_device_memory_budget(100);
    std::vector<std::shared_ptr<FakeJob>> jobs;
    for (auto [name, steps, device] :
         {std::tuple{"A", 2, 60}, std::tuple{"B", 1, 60}, std::tuple{"C", 1, 30}}) {
        jobs.push_back(std::make_shared<FakeJob>(log, name, steps, 10));
        jobs.back()->device_memory = static_cast<uint64_t>(device);
    }
    run_all(s, jobs);
    EXPECT_EQ(log.steps, (Strings{"A", "A", "B", "C"}));
}

// The admission check of one job: within the budget alone, or anything without a budget.
TEST(Scheduler, Admissible) {
    Scheduler s({8, 4});
    EXPECT_TRUE(s.admissible(uint64_t{1} << 60));
    s.set_memory_budget(100);
    EXPECT_TRUE(s.admissible(0));
    EXPECT_TRUE(s.admissible(100));
    EXPECT_FALSE(s.admissible(101));
}

// A job cancelled in flight (its step reports it done: the client went away) leaves at once and frees its
// memory for the next one: A would take 10 steps, stops after 2, and B starts in the next turn.
TEST(Scheduler, CancelledJobLeavesAndFreesItsMemory) {
    const Log log = run_jobs({{"A", 10, 100, true, 2}, {"B", 1, 100}}, 4, 100);
    EXPECT_EQ(log.steps, (Strings{"A", "A", "B"}));
    EXPECT_EQ(log.finished, (Strings{"A", "B"}));
}

// The queue-depth gauge follows every submission and every take.
TEST(Scheduler, ReportsQueueDepth) {
    Log log;
    std::vector<size_t> depths;
    Scheduler s({8, 1}, [&](size_t d) { depths.push_back(d); });
    run_all(s, {std::make_shared<FakeJob>(log, "A", 1), std::make_shared<FakeJob>(log, "B", 1),
                std::make_shared<FakeJob>(log, "C", 1)});
    EXPECT_EQ(depths, (std::vector<size_t>{1, 2, 3, 2, 1, 0}));
}

// On its own thread: the worker waits for jobs, runs every job submitted before stop() exactly once, and
// returns.
TEST(Scheduler, WorkerThreadRunsEverySubmittedJob) {
    Log log;
    Scheduler s({64, 3});
    std::thread worker([&] { s.run(); });
    std::vector<std::shared_ptr<FakeJob>> jobs;
    for (int i = 0; i < 40; ++i) {
        jobs.push_back(std::make_shared<FakeJob>(log, std::to_string(i), 1 + i % 4));
        ASSERT_TRUE(s.submit(jobs.back()));
    }
    s.stop();
    worker.join();
    ASSERT_EQ(log.finished.size(), jobs.size());
    size_t steps = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
        EXPECT_EQ(jobs[i]->steps_done(), 1 + static_cast<int>(i) % 4) << i;
        steps += static_cast<size_t>(1 + i % 4);
    }
    EXPECT_EQ(log.steps.size(), steps);
}
