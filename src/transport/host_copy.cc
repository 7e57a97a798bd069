// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "transport/host_copy.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

namespace mooncake::sparse {

void ParallelMemcpy(std::byte* dst, const std::byte* src, std::uint64_t bytes, unsigned threads) {
    constexpr std::uint64_t kMinChunk = std::uint64_t{8} << 20;
    if (bytes == 0) return;
    const std::uint64_t parts =
        std::max<std::uint64_t>(1, std::min<std::uint64_t>(threads, bytes / kMinChunk));
    if (parts <= 1) {
        std::memcpy(dst, src, bytes);
        return;
    }
    const std::uint64_t chunk = (bytes + parts - 1) / parts;
    std::vector<std::thread> workers;
    workers.reserve(parts - 1);
    for (std::uint64_t p = 1; p < parts; ++p) {
        const std::uint64_t begin = p * chunk;
        if (begin >= bytes) break;
        const std::uint64_t n = std::min(chunk, bytes - begin);
        workers.emplace_back([=] { std::memcpy(dst + begin, src + begin, n); });
    }
    std::memcpy(dst, src, std::min(chunk, bytes));
    for (auto& w : workers) w.join();
}

void ParallelCopies(std::span<const HostCopy> copies, unsigned threads) {
    std::uint64_t total = 0;
    for (const HostCopy& c : copies) total += c.bytes;
    if (copies.size() == 1 || total < (std::uint64_t{16} << 20) || threads <= 1) {
        for (const HostCopy& c : copies) ParallelMemcpy(c.dst, c.src, c.bytes, threads);
        return;
    }
    const std::uint64_t piece =
        std::clamp<std::uint64_t>(total / (std::uint64_t{threads} * 4), 1 << 20, 8 << 20);
    std::vector<HostCopy> pieces;
    for (const HostCopy& c : copies) {
        for (std::uint64_t off = 0; off < c.bytes; off += piece) {
            pieces.push_back({c.dst + off, c.src + off, std::min(piece, c.bytes - off)});
        }
    }
    std::atomic<std::size_t> next{0};
    auto work = [&] {
        for (std::size_t i = next.fetch_add(1); i < pieces.size(); i = next.fetch_add(1)) {
            std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].bytes);
        }
    };
    std::vector<std::thread> workers;
    for (unsigned t = 1; t < threads; ++t) workers.emplace_back(work);
    work();
    for (auto& w : workers) w.join();
}

unsigned DefaultCopyThreads() { return std::clamp(std::thread::hardware_concurrency(), 1u, 8u); }

}  // namespace mooncake::sparse
