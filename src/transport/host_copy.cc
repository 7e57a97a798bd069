// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "transport/host_copy.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "transport/parallel_for.h"

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
    internal::ParallelFor(static_cast<int>(parts), static_cast<std::size_t>(parts), [&](std::size_t p) {
        const std::uint64_t begin = p * chunk;
        if (begin < bytes) std::memcpy(dst + begin, src + begin, std::min(chunk, bytes - begin));
    });
}

namespace {

constexpr std::uint64_t kSplitBatchBytes = std::uint64_t{16} << 20;

/// The pieces the threads of a batch take in turn: 1-8 MiB, about four per thread.
void CutPieces(std::span<const HostCopy> copies, std::uint64_t total, unsigned threads,
               std::vector<HostCopy>& pieces) {
    const std::uint64_t piece =
        std::clamp<std::uint64_t>(total / (std::uint64_t{threads} * 4), 1 << 20, 8 << 20);
    pieces.clear();
    for (const HostCopy& c : copies) {
        for (std::uint64_t off = 0; off < c.bytes; off += piece) {
            pieces.push_back({c.dst + off, c.src + off, std::min(piece, c.bytes - off)});
        }
    }
}

std::uint64_t TotalBytes(std::span<const HostCopy> copies) {
    std::uint64_t total = 0;
    for (const HostCopy& c : copies) total += c.bytes;
    return total;
}

}  // namespace

void ParallelCopies(std::span<const HostCopy> copies, unsigned threads) {
    const std::uint64_t total = TotalBytes(copies);
    if (copies.size() == 1 || total < kSplitBatchBytes || threads <= 1) {
        for (const HostCopy& c : copies) ParallelMemcpy(c.dst, c.src, c.bytes, threads);
        return;
    }
    std::vector<HostCopy> pieces;
    CutPieces(copies, total, threads, pieces);
    internal::ParallelFor(static_cast<int>(threads), pieces.size(), [&](std::size_t i) {
        std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].bytes);
    });
}

unsigned DefaultCopyThreads() { return std::min(internal::HardwareThreads(), 8u); }

HostCopyPool::HostCopyPool(unsigned threads) : threads_(std::max(1u, threads)) {}

HostCopyPool::~HostCopyPool() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
}

void HostCopyPool::Work(std::uint64_t /*job*/) {
    for (std::size_t i = next_.fetch_add(1); i < pieces_.size(); i = next_.fetch_add(1)) {
        std::memcpy(pieces_[i].dst, pieces_[i].src, pieces_[i].bytes);
    }
}

void HostCopyPool::WorkerLoop() {
    std::uint64_t seen = 0;
    for (;;) {
        std::uint64_t job;
        {
            std::unique_lock lock(mu_);
            wake_.wait(lock, [&] { return stop_ || job_ != seen; });
            if (stop_) return;
            job = seen = job_;
        }
        Work(job);
        {
            std::lock_guard lock(mu_);
            --busy_;
        }
        done_.notify_one();
    }
}

void HostCopyPool::Run(std::span<const HostCopy> copies) {
    const std::uint64_t total = TotalBytes(copies);
    if (total == 0) return;
    if (threads_ <= 1 || total < kSplitBatchBytes) {
        for (const HostCopy& c : copies) std::memcpy(c.dst, c.src, c.bytes);
        return;
    }
    std::lock_guard run(run_mu_);
    std::uint64_t job;
    {
        std::lock_guard lock(mu_);
        if (workers_.empty()) {
            workers_.reserve(threads_ - 1);
            for (unsigned t = 1; t < threads_; ++t) workers_.emplace_back([this] { WorkerLoop(); });
        }
        CutPieces(copies, total, threads_, pieces_);
        next_.store(0);
        busy_ = static_cast<unsigned>(workers_.size());
        job = ++job_;
    }
    wake_.notify_all();
    Work(job);
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return busy_ == 0; });
}

namespace {

std::vector<std::int64_t> StridesOrC(std::span<const std::int64_t> shape,
                                     std::span<const std::int64_t> strides) {
    if (!strides.empty()) return {strides.begin(), strides.end()};
    std::vector<std::int64_t> out(shape.size());
    std::int64_t s = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
        out[d] = s;
        s *= shape[d];
    }
    return out;
}

bool AnyEmpty(std::span<const std::int64_t> shape) {
    return std::any_of(shape.begin(), shape.end(), [](std::int64_t e) { return e <= 0; });
}

struct CopyDim {
    std::int64_t extent;
    std::int64_t dst;  // strides in bytes
    std::int64_t src;
};

template <std::size_t kItem>
void CopyElements(std::byte* dst, std::int64_t dst_step, const std::byte* src,
                  std::int64_t src_step, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
        std::memcpy(dst + i * dst_step, src + i * src_step, kItem);
    }
}

}  // namespace

bool IsCContiguous(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides) {
    if (strides.empty() || AnyEmpty(shape)) return true;
    if (strides.size() != shape.size()) return false;
    std::int64_t expected = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
        if (shape[d] != 1 && strides[d] != expected) return false;
        expected *= shape[d];
    }
    return true;
}

bool IsNonOverlapping(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides) {
    if (strides.empty() || AnyEmpty(shape)) return true;
    if (strides.size() != shape.size()) return false;
    std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (|stride|, extent)
    for (std::size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] > 1) dims.emplace_back(strides[d] < 0 ? -strides[d] : strides[d], shape[d]);
    }
    std::sort(dims.begin(), dims.end());
    std::int64_t span = 1;  // elements covered by the dimensions so far
    for (const auto& [stride, extent] : dims) {
        if (stride < span) return false;
        span = stride * (extent - 1) + span;
    }
    return true;
}

std::pair<std::int64_t, std::int64_t> StridedExtent(std::span<const std::int64_t> shape,
                                                    std::span<const std::int64_t> strides) {
    if (AnyEmpty(shape)) return {0, 0};
    const std::vector<std::int64_t> st = StridesOrC(shape, strides);
    std::int64_t lo = 0, hi = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) {
        const std::int64_t reach = st[d] * (shape[d] - 1);
        (reach < 0 ? lo : hi) += reach;
    }
    return {lo, hi};
}

void StridedCopy(std::byte* dst, std::span<const std::int64_t> dst_strides, const std::byte* src,
                 std::span<const std::int64_t> src_strides, std::span<const std::int64_t> shape,
                 std::size_t item) {
    if (AnyEmpty(shape)) return;
    const std::vector<std::int64_t> ds = StridesOrC(shape, dst_strides);
    const std::vector<std::int64_t> ss = StridesOrC(shape, src_strides);
    const auto bytes = static_cast<std::int64_t>(item);
    // Innermost first, extent-1 dimensions dropped, neighbours that are contiguous on both
    // sides merged: a slice of rows becomes one dimension of row-long runs.
    std::vector<CopyDim> dims;
    for (std::size_t d = shape.size(); d-- > 0;) {
        if (shape[d] == 1) continue;
        const CopyDim next{shape[d], ds[d] * bytes, ss[d] * bytes};
        if (!dims.empty()) {
            CopyDim& inner = dims.back();
            if (next.dst == inner.dst * inner.extent && next.src == inner.src * inner.extent) {
                inner.extent *= next.extent;
                continue;
            }
        }
        dims.push_back(next);
    }
    if (dims.empty()) {
        std::memcpy(dst, src, item);
        return;
    }
    // The innermost dimension is one memcpy when it is contiguous on both sides.
    const CopyDim inner = dims.front();
    const bool run = inner.dst == bytes && inner.src == bytes;
    auto copy_inner = [&](std::byte* d, const std::byte* s) {
        if (run) {
            std::memcpy(d, s, static_cast<std::size_t>(inner.extent * bytes));
            return;
        }
        switch (item) {
            case 1: CopyElements<1>(d, inner.dst, s, inner.src, inner.extent); break;
            case 2: CopyElements<2>(d, inner.dst, s, inner.src, inner.extent); break;
            case 4: CopyElements<4>(d, inner.dst, s, inner.src, inner.extent); break;
            case 8: CopyElements<8>(d, inner.dst, s, inner.src, inner.extent); break;
            default:
                for (std::int64_t i = 0; i < inner.extent; ++i) {
                    std::memcpy(d + i * inner.dst, s + i * inner.src, item);
                }
        }
    };
    // Odometer over the outer dimensions.
    std::vector<std::int64_t> counter(dims.size(), 0);
    std::byte* d = dst;
    const std::byte* s = src;
    while (true) {
        copy_inner(d, s);
        std::size_t k = 1;
        for (; k < dims.size(); ++k) {
            d += dims[k].dst;
            s += dims[k].src;
            if (++counter[k] < dims[k].extent) break;
            d -= dims[k].dst * dims[k].extent;
            s -= dims[k].src * dims[k].extent;
            counter[k] = 0;
        }
        if (k == dims.size()) return;
    }
}

}  // namespace mooncake::sparse
