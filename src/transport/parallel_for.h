// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The library's one parallel loop: the codec's blocks (encode, apply), the executor's items
// (targets to materialize, folds to merge, a batch's commits to encode), on a worker pool kept
// for the process (starting threads per loop cost a step's read on 16 cores a sixth of its host
// time).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>

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

/// Runs body(ctx) on the calling thread and on up to `helpers` threads of the process's worker
/// pool at once, and returns once the caller's call and every helper's have returned. Helpers
/// join while they are idle: the caller never waits for one to start, so a body must finish the
/// whole job by itself when none joins (ParallelFor's loop does), and nested calls cannot
/// deadlock. The pool's threads (the hardware's, less one) start on the first call and live as
/// long as the process; a forked child starts a pool of its own.
void RunWithHelpers(unsigned helpers, void (*body)(void*), void* ctx);

/// Runs fn(task) for every task in [0, num_tasks) on up to `num_threads` threads (0: all the
/// hardware's; the caller's thread included, the others from the worker pool, never more than
/// the hardware has), handing tasks out dynamically, `chunk` at a time (0: about eight chunks
/// per thread, for many small tasks). Tasks must not wait for each other. Never fails.
template <typename Fn>
void ParallelFor(int num_threads, std::size_t num_tasks, Fn&& fn, std::size_t chunk = 1) {
    const std::size_t workers =
        std::min<std::size_t>(static_cast<std::size_t>(ResolveThreads(num_threads)), num_tasks);
    if (workers <= 1) {
        for (std::size_t i = 0; i < num_tasks; ++i) fn(i);
        return;
    }
    if (chunk == 0) chunk = std::max<std::size_t>(1, num_tasks / (workers * 8));
    struct Job {
        Fn& fn;
        std::size_t num_tasks, chunk;
        std::atomic<std::size_t> next{0};
    } job{fn, num_tasks, chunk};
    RunWithHelpers(
        static_cast<unsigned>(workers - 1),
        [](void* ctx) {
            Job& j = *static_cast<Job*>(ctx);
            for (std::size_t lo; (lo = j.next.fetch_add(j.chunk, std::memory_order_relaxed)) < j.num_tasks;) {
                const std::size_t hi = std::min(j.num_tasks, lo + j.chunk);
                for (std::size_t i = lo; i < hi; ++i) j.fn(i);
            }
        },
        &job);
}

}  // namespace mooncake::sparse::internal
