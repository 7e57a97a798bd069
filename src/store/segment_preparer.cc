// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Background pre-faulting and pinning of shared-memory segments; see segment_preparer.h.
#include "store/segment_preparer.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "store/shm_segment.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it.
#endif

namespace mooncake::sparse {
namespace {

/// Makes `[data, data + size)` (at `offset` in memfd `fd`) resident without changing a byte.
Status Populate(std::byte* data, int fd, std::uint64_t offset, std::uint64_t size) {
    for (;;) {
        if (::madvise(data, size, MADV_POPULATE_WRITE) == 0) return Status::Ok();
        const int err = errno;
        if (err == EINTR) continue;  // A signal: the pages done so far stay; redo is cheap.
        if (err != EINVAL) {
            return Unavailable("madvise(MADV_POPULATE_WRITE, " + std::to_string(size) +
                               " bytes): " + std::strerror(err));
        }
        break;  // Kernel before 5.14.
    }
    // Allocates the page-cache pages (zeroed once, here); a later touch is then a minor fault
    // that only maps the page. Mode 0 never changes existing data.
    for (;;) {
        if (::fallocate(fd, 0, static_cast<off_t>(offset), static_cast<off_t>(size)) == 0) {
            return Status::Ok();
        }
        const int err = errno;
        if (err == EINTR) continue;
        return Unavailable("fallocate(" + std::to_string(size) + " bytes): " +
                           std::strerror(err));
    }
}

}  // namespace

SegmentPreparer::SegmentPreparer(std::vector<PrepareSegment> segments,
                                 SegmentPreparerOptions options)
    : options_(std::move(options)),
      segments_(new Segment[segments.size()]),
      num_segments_(segments.size()) {
    const std::uint64_t page = PageSize();
    const std::uint64_t chunk =
        std::max<std::uint64_t>(page, options_.chunk_bytes / page * page);
    for (std::size_t i = 0; i < num_segments_; ++i) {
        Segment& s = segments_[i];
        s.desc = segments[i];
        s.first_chunk = chunks_.size();
        if (options_.prefault) {
            for (std::uint64_t off = 0; off < s.desc.size; off += chunk) {
                chunks_.push_back({static_cast<std::uint32_t>(i), off,
                                   std::min(chunk, s.desc.size - off)});
            }
            prefault_target_ += s.desc.size;
        }
        s.num_chunks = chunks_.size() - s.first_chunk;
        s.chunks_left.store(s.num_chunks, std::memory_order_relaxed);
        requested_pin_ += s.desc.pin_bytes;
    }
    pinned_target_ = requested_pin_;
    chunk_state_.reset(new std::atomic<std::uint8_t>[chunks_.size()]);
    for (std::size_t i = 0; i < chunks_.size(); ++i) chunk_state_[i].store(kPending);

    const std::uint32_t threads = std::max<std::uint32_t>(1, options_.threads);
    running_ = threads;
    threads_.reserve(threads);
    for (std::uint32_t t = 0; t < threads; ++t) threads_.emplace_back([this] { Work(); });
}

SegmentPreparer::~SegmentPreparer() { Stop(); }

void SegmentPreparer::Stop() {
    stop_.store(true, std::memory_order_relaxed);
    for (std::thread& t : threads_) {
        if (t.joinable()) t.join();
    }
}

void SegmentPreparer::RecordFailure(std::atomic<std::uint32_t>& counter, const Status& status) {
    counter.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lock(mu_);
    if (detail_.empty()) detail_ = status.ToString();
}

bool SegmentPreparer::RunChunk(std::size_t i) {
    std::uint8_t expected = kPending;
    if (!chunk_state_[i].compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel)) {
        return false;
    }
    const Chunk& c = chunks_[i];
    Segment& s = segments_[c.segment];
    // After one failure (e.g. out of memory) the rest is left to fault on first touch.
    if (prefault_failures_.load(std::memory_order_relaxed) == 0) {
        Status st = Populate(s.desc.data + c.offset, s.desc.fd, c.offset, c.size);
        if (st.ok()) {
            prefaulted_.fetch_add(c.size, std::memory_order_relaxed);
        } else {
            RecordFailure(prefault_failures_, st.WithContext("pre-faulting segment " +
                                                             std::to_string(c.segment)));
        }
    }
    chunk_state_[i].store(kDone, std::memory_order_release);
    s.chunks_left.fetch_sub(1, std::memory_order_acq_rel);
    return true;
}

void SegmentPreparer::TryPin(Segment& s) {
    if (s.desc.pin_bytes == 0 || pin_disabled_.load(std::memory_order_relaxed)) return;
    if (s.chunks_left.load(std::memory_order_acquire) != 0) return;
    if (s.pin_claimed.exchange(true, std::memory_order_acq_rel)) return;
    Result<PinnedRegion> region = options_.register_pinned
                                      ? options_.register_pinned(s.desc.data, s.desc.pin_bytes)
                                      : PinnedRegion::Register(s.desc.data, s.desc.pin_bytes);
    if (!region.ok()) {
        // Over what the driver grants: this and the later segments stay pageable.
        pin_disabled_.store(true, std::memory_order_relaxed);
        RecordFailure(pin_failures_, region.status());
        return;
    }
    s.region = std::move(region).value();
    s.pinned.store(s.desc.pin_bytes, std::memory_order_release);
}

void SegmentPreparer::Work() {
    // Probing the CUDA runtime loads libcudart and initializes the driver (up to a second on a
    // GPU node): here, not on the path to listening.
    if (!options_.register_pinned && requested_pin_ > 0) {
        const PinningSupport& support = GetPinningSupport();
        if (!support.available) {
            pin_disabled_.store(true, std::memory_order_relaxed);
            std::lock_guard lock(mu_);
            pinned_target_ = 0;
            if (detail_.empty()) detail_ = "cannot pin: " + support.detail;
        }
    }
    // Chunks in order; a segment whose last chunk this thread finished is pinned right away,
    // while the other threads go on pre-faulting.
    bool cancelled = false;
    for (;;) {
        if (stop_.load(std::memory_order_relaxed)) {
            cancelled = true;
            break;
        }
        const std::size_t i = next_chunk_.fetch_add(1, std::memory_order_relaxed);
        if (i >= chunks_.size()) break;
        if (RunChunk(i)) TryPin(segments_[chunks_[i].segment]);
    }
    // Segments without chunks (pre-faulting off), or whose last chunk the put path ran.
    for (std::size_t i = 0; i < num_segments_ && !cancelled; ++i) {
        // A chunk another thread (or a put) still runs: wait for it, so that the segment is
        // pinned before this thread reports completion.
        const Segment& s = segments_[i];
        for (std::size_t c = s.first_chunk; c < s.first_chunk + s.num_chunks && !cancelled; ++c) {
            while (chunk_state_[c].load(std::memory_order_acquire) != kDone) {
                if (stop_.load(std::memory_order_relaxed)) {
                    cancelled = true;
                    break;
                }
                RunChunk(c);
                std::this_thread::sleep_for(std::chrono::microseconds(200));
            }
        }
        if (!cancelled) TryPin(segments_[i]);
    }
    std::lock_guard lock(mu_);
    if (cancelled) cancelled_ = true;
    if (--running_ == 0) done_cv_.notify_all();
}

void SegmentPreparer::PrefaultRange(std::uint32_t segment, std::uint64_t offset,
                                    std::uint64_t size) {
    if (chunks_.empty() || size == 0 || segment >= num_segments_) return;
    const Segment& s = segments_[segment];
    if (s.num_chunks == 0) return;
    const std::uint64_t chunk = chunks_[s.first_chunk].size;
    const std::size_t first = s.first_chunk + offset / chunk;
    const std::size_t last = s.first_chunk + std::min<std::uint64_t>(
                                                 (offset + size - 1) / chunk, s.num_chunks - 1);
    for (std::size_t c = first; c <= last; ++c) RunChunk(c);
}

SegmentPreparation SegmentPreparer::Progress() const {
    SegmentPreparation p;
    for (std::size_t i = 0; i < num_segments_; ++i) p.pinned_bytes += PinnedBytes(i);
    p.prefault_target_bytes = prefault_target_;
    p.prefaulted_bytes = prefaulted_.load(std::memory_order_relaxed);
    p.pin_failures = pin_failures_.load(std::memory_order_relaxed);
    p.prefault_failures = prefault_failures_.load(std::memory_order_relaxed);
    std::lock_guard lock(mu_);
    p.pinned_target_bytes = pinned_target_;
    p.complete = running_ == 0 && !cancelled_;
    p.detail = detail_;
    return p;
}

bool SegmentPreparer::Wait(std::chrono::milliseconds timeout) const {
    std::unique_lock lock(mu_);
    const auto done = [&] { return running_ == 0; };
    if (timeout >= std::chrono::hours(24 * 365)) {
        done_cv_.wait(lock, done);  // wait_for would overflow the clock
    } else {
        done_cv_.wait_for(lock, timeout, done);
    }
    return running_ == 0 && !cancelled_;
}

}  // namespace mooncake::sparse
