// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// One parallel loop for the executor's per-item work (materializing targets, merging folds,
// encoding a batch of commits).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace mooncake::sparse::internal {

/// Runs fn(i) for every i in [0, n) on up to `threads` threads (0: the hardware's), the calling
/// thread included. Items are claimed in chunks from a shared counter, so uneven items even out.
template <typename Fn>
void ParallelFor(std::size_t n, int threads, Fn&& fn) {
    std::size_t t = threads > 0 ? std::size_t(threads)
                                : std::max(1u, std::thread::hardware_concurrency());
    t = std::min(t, n);
    if (t <= 1) {
        for (std::size_t i = 0; i < n; ++i) fn(i);
        return;
    }
    const std::size_t chunk = std::max<std::size_t>(1, n / (t * 8));
    std::atomic<std::size_t> next{0};
    const auto work = [&] {
        for (std::size_t lo = next.fetch_add(chunk); lo < n; lo = next.fetch_add(chunk)) {
            const std::size_t hi = std::min(n, lo + chunk);
            for (std::size_t i = lo; i < hi; ++i) fn(i);
        }
    };
    std::vector<std::thread> pool;
    pool.reserve(t - 1);
    for (std::size_t k = 1; k < t; ++k) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
}

}  // namespace mooncake::sparse::internal
