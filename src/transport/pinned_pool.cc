// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "transport/pinned_pool.h"

#include <cstdio>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "transport/cuda_runtime.h"
#include "transport/host_blocks.h"

namespace mooncake::sparse {
namespace internal {

struct PinnedPoolState {
    explicit PinnedPoolState(std::uint64_t quota) : quota(quota) {}

    ~PinnedPoolState() {
        for (auto& [capacity, ptr] : free_blocks) FreeBlock(ptr);
    }

    static void FreeBlock(std::byte* ptr) {
        if (Status s = cuda::FreeHost(ptr); !s.ok()) {
            std::fprintf(stderr, "mooncake_sparse: %s\n", s.ToString().c_str());
        }
    }

    const std::uint64_t quota;
    std::mutex mu;
    std::multimap<std::uint64_t, std::byte*> free_blocks;  // capacity -> block. Guarded by mu.
    HostMemoryStats stats;                                 // Guarded by mu.
};

}  // namespace internal

namespace {

/// Pinned blocks are whole 2 MiB pages' worth, so that similar sizes share blocks.
constexpr std::uint64_t kPinnedGranule = std::uint64_t{2} << 20;

}  // namespace

Result<HostBuffer> HostBuffer::Pageable(std::uint64_t bytes) {
    HostBuffer b;
    if (bytes == 0) return b;
    b.data_ = static_cast<std::byte*>(AllocateHostBlock(bytes));
    if (b.data_ == nullptr) {
        return ResourceExhausted("cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    }
    b.size_ = bytes;
    return b;
}

HostBuffer::~HostBuffer() { Reset(); }

void HostBuffer::Reset() {
    if (data_ == nullptr) return;
    if (pinned_) {
        {
            std::lock_guard lock(pool_->mu);
            pool_->stats.pinned_bytes -= capacity_;
            pool_->stats.pinned_cached_bytes += capacity_;
            pool_->free_blocks.emplace(capacity_, data_);
        }
    } else {
        FreeHostBlock(data_, size_);
        if (pool_) {
            std::lock_guard lock(pool_->mu);
            pool_->stats.pageable_bytes -= size_;
        }
    }
    data_ = nullptr;
    size_ = capacity_ = 0;
    pinned_ = false;
    pool_.reset();
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      pinned_(std::exchange(other.pinned_, false)),
      pool_(std::move(other.pool_)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
    if (this != &other) {
        Reset();
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        capacity_ = std::exchange(other.capacity_, 0);
        pinned_ = std::exchange(other.pinned_, false);
        pool_ = std::move(other.pool_);
    }
    return *this;
}

std::shared_ptr<PinnedHostPool> PinnedHostPool::Make(std::uint64_t quota_bytes) {
    return std::make_shared<PinnedHostPool>(
        std::make_shared<internal::PinnedPoolState>(quota_bytes));
}

Result<HostBuffer> PinnedHostPool::Allocate(std::uint64_t bytes) {
    auto& s = *state_;
    if (bytes == 0) return HostBuffer();
    const bool may_pin = s.quota > 0 && bytes <= s.quota && cuda::GetSupport().available;
    if (may_pin) {
        const std::uint64_t capacity = (bytes + kPinnedGranule - 1) / kPinnedGranule * kPinnedGranule;
        std::byte* reused = nullptr;
        std::uint64_t reused_capacity = 0;
        bool reserve_new = false;
        std::vector<std::byte*> to_free;
        {
            std::lock_guard lock(s.mu);
            auto it = s.free_blocks.lower_bound(capacity);
            if (it != s.free_blocks.end() && it->first <= capacity + capacity / 4) {
                reused_capacity = it->first;
                reused = it->second;
                s.free_blocks.erase(it);
                s.stats.pinned_cached_bytes -= reused_capacity;
                s.stats.pinned_bytes += reused_capacity;
                ++s.stats.pinned_allocations;
                ++s.stats.pinned_reuses;
            } else if (s.stats.pinned_bytes + capacity <= s.quota) {
                // Make room by releasing cached blocks, largest first.
                while (s.stats.pinned_bytes + s.stats.pinned_cached_bytes + capacity > s.quota &&
                       !s.free_blocks.empty()) {
                    auto last = std::prev(s.free_blocks.end());
                    s.stats.pinned_cached_bytes -= last->first;
                    to_free.push_back(last->second);
                    s.free_blocks.erase(last);
                }
                s.stats.pinned_bytes += capacity;  // Reserved while cudaHostAlloc runs.
                reserve_new = true;
            }
        }
        for (std::byte* p : to_free) internal::PinnedPoolState::FreeBlock(p);
        if (reused != nullptr || reserve_new) {
            HostBuffer b;
            b.size_ = bytes;
            b.pinned_ = true;
            b.pool_ = state_;
            if (reused != nullptr) {
                b.data_ = reused;
                b.capacity_ = reused_capacity;
                return b;
            }
            auto block = cuda::HostAlloc(capacity);  // Slow: outside the lock.
            std::lock_guard lock(s.mu);
            if (block.ok()) {
                b.data_ = static_cast<std::byte*>(*block);
                b.capacity_ = capacity;
                ++s.stats.pinned_allocations;
                return b;
            }
            s.stats.pinned_bytes -= capacity;
            ++s.stats.pin_failures;
            b.pinned_ = false;
            b.pool_.reset();
        }
    }
    MCS_ASSIGN_OR_RETURN(HostBuffer b, HostBuffer::Pageable(bytes));
    b.pool_ = state_;
    std::lock_guard lock(s.mu);
    s.stats.pageable_bytes += bytes;
    ++s.stats.pageable_allocations;
    return b;
}

void PinnedHostPool::Trim() {
    std::multimap<std::uint64_t, std::byte*> blocks;
    {
        std::lock_guard lock(state_->mu);
        blocks.swap(state_->free_blocks);
        state_->stats.pinned_cached_bytes = 0;
    }
    for (auto& [capacity, ptr] : blocks) internal::PinnedPoolState::FreeBlock(ptr);
}

HostMemoryStats PinnedHostPool::Stats() const {
    std::lock_guard lock(state_->mu);
    HostMemoryStats s = state_->stats;
    s.pinned_quota_bytes = state_->quota;
    return s;
}

}  // namespace mooncake::sparse
