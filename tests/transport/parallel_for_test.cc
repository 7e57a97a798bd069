// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// ParallelFor on the process's worker pool: every task runs exactly once, whatever the thread
// count, chunk and nesting; callers on many threads at once each get all their tasks done; pool
// threads join a loop while they are idle; a forked child has a pool of its own.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

#include "transport/parallel_for.h"

namespace mooncake::sparse::internal {
namespace {

bool EveryTaskOnce(int threads, std::size_t tasks, std::size_t chunk) {
    std::vector<std::atomic<int>> runs(tasks);
    ParallelFor(threads, tasks, [&](std::size_t i) { runs[i].fetch_add(1); }, chunk);
    for (const auto& r : runs) {
        if (r.load() != 1) return false;
    }
    return true;
}

TEST(ParallelForTest, RunsEveryTaskExactlyOnce) {
    for (int threads : {0, 1, 2, 3, 16, 64}) {
        for (std::size_t tasks : {0, 1, 2, 7, 100, 10000}) {
            for (std::size_t chunk : {0, 1, 3, 1000}) {
                EXPECT_TRUE(EveryTaskOnce(threads, tasks, chunk))
                    << threads << " threads, " << tasks << " tasks, chunk " << chunk;
            }
        }
    }
}

TEST(ParallelForTest, NestedLoopsFinish) {
    std::atomic<std::size_t> sum{0};
    ParallelFor(0, 16, [&](std::size_t i) {
        ParallelFor(0, 100, [&](std::size_t j) { sum.fetch_add(i * 100 + j); });
    });
    EXPECT_EQ(sum.load(), std::size_t{1600} * 1599 / 2);
}

TEST(ParallelForTest, CallersOnManyThreadsEachGetTheirTasksDone) {
    constexpr int kCallers = 8;
    std::vector<std::thread> callers;
    std::atomic<int> good{0};
    for (int c = 0; c < kCallers; ++c) {
        callers.emplace_back([&] {
            bool all = true;
            for (int round = 0; round < 200; ++round) all = all && EveryTaskOnce(0, 64, 1);
            if (all) good.fetch_add(1);
        });
    }
    for (auto& t : callers) t.join();
    EXPECT_EQ(good.load(), kCallers);
}

TEST(ParallelForTest, IdlePoolThreadsJoinTheLoop) {
    if (HardwareThreads() < 2) GTEST_SKIP() << "one hardware thread: the caller works alone";
    ParallelFor(0, 2, [](std::size_t) {});  // the pool is started
    // Task 0 waits (bounded) for a thread other than the caller to take a task; a helper from the
    // pool does. The caller itself may run no task at all: a helper that wakes first can take
    // every task, task 0 included, before the caller claims one.
    std::atomic<bool> other{false};
    const auto caller = std::this_thread::get_id();
    ParallelFor(0, 64, [&](std::size_t i) {
        if (std::this_thread::get_id() != caller) other = true;
        if (i == 0) {
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (!other && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        }
    });
    EXPECT_TRUE(other.load());
}

TEST(ParallelForTest, AForkedChildRunsLoopsOnAPoolOfItsOwn) {
#if defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "ThreadSanitizer does not start threads in the child of a threaded process";
#endif
    ParallelFor(0, 100, [](std::size_t) {});  // the parent's pool is started
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        bool ok = true;
        for (int round = 0; round < 50; ++round) ok = ok && EveryTaskOnce(0, 1000, 1);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_TRUE(EveryTaskOnce(0, 1000, 1));  // and the parent's still works
}

}  // namespace
}  // namespace mooncake::sparse::internal
