// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The library's one parallel loop: the codec's blocks (encode, apply), the executor's items
// (targets to materialize, folds to merge, a batch's commits to encode).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <system_error>
#include <thread>
#include <vector>

namespace mooncake::sparse::internal {

/// The hardware's threads, at least 1, asked once per process: glibc's
/// std::thread::hardware_concurrency opens and reads a sysfs file on every call, which cost a
/// batch commit of small objects (one call per object) a tenth of its time.
inline unsigned HardwareThreads() {
    static const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    return hw;
}

/// 0 (or less) -> all hardware threads; never less than 1.
inline int ResolveThreads(int requested) {
    if (requested > 0) return requested;
    return static_cast<int>(HardwareThreads());
}

/// Runs fn(task) for every task in [0, num_tasks) on up to `num_threads` threads (0: all the
/// hardware's; the caller's thread included), handing tasks out dynamically, `chunk` at a time
/// (0: about eight chunks per thread, for many small tasks). If a thread cannot be started the
/// remaining work runs on the threads that did start, so this never fails.
template <typename Fn>
void ParallelFor(int num_threads, std::size_t num_tasks, Fn&& fn, std::size_t chunk = 1) {
    const std::size_t workers =
        std::min<std::size_t>(static_cast<std::size_t>(ResolveThreads(num_threads)), num_tasks);
    if (workers <= 1) {
        for (std::size_t i = 0; i < num_tasks; ++i) fn(i);
        return;
    }
    if (chunk == 0) chunk = std::max<std::size_t>(1, num_tasks / (workers * 8));
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
        for (std::size_t lo; (lo = next.fetch_add(chunk, std::memory_order_relaxed)) < num_tasks;) {
            const std::size_t hi = std::min(num_tasks, lo + chunk);
            for (std::size_t i = lo; i < hi; ++i) fn(i);
        }
    };
    std::vector<std::thread> threads;
    threads.reserve(workers - 1);
    for (std::size_t t = 1; t < workers; ++t) {
        try {
            threads.emplace_back(worker);
        } catch (const std::system_error&) {
            break;  // Out of threads: the ones we have finish the work.
        }
    }
    worker();
    for (std::thread& th : threads) th.join();
}

}  // namespace mooncake::sparse::internal
