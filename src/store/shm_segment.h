// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Shared-memory segments for the node daemon (docs/design.md §5-6): anonymous memfd files, sealed so
// that nobody can shrink them under a mapping (which would turn a read into SIGBUS), mapped
// read-write by their creator and handed to other processes as read-only file descriptors.
//
// Why memfd and seals:
// - memfd_create gives an unnamed file that lives exactly as long as some fd or mapping refers
//   to it: nothing to clean up in /dev/shm when a process dies.
// - F_SEAL_SHRINK | F_SEAL_GROW fix the size, so a peer that maps it can never fault past the
//   end. The daemon refuses a client buffer that lacks F_SEAL_SHRINK for the same reason.
// - F_SEAL_FUTURE_WRITE (Linux >= 5.1) forbids every NEW writable mapping or write(2) while the
//   creator's own writable mapping keeps working. A read-only fd alone is not enough: anyone can
//   reopen /proc/<pid>/fd/N with O_RDWR, since a memfd inode is mode 0777. With the seal a
//   client can map published objects but never write store memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

struct ShmSegmentOptions {
    /// Seal against new writable mappings once the creator has mapped it (see above). Segments
    /// of the daemon set it; a client buffer, which the daemon must map writable, does not.
    bool seal_future_write = true;
    /// Ask the kernel for transparent huge pages (madvise MADV_HUGEPAGE): 2 MiB pages where
    /// it has them, fewer translations for the CPU and for a GPU that copies the segment by DMA
    /// once it is registered. The kernel grants them to shared memory only when its shmem
    /// setting allows (/sys/kernel/mm/transparent_hugepage/shmem_enabled: advise, always or
    /// within_size); a refused request leaves 4 KiB pages (huge_pages_advised() false).
    bool huge_pages = false;
};

/// A memfd segment of fixed size, mapped read-write in this process. Move-only; the mapping
/// and the fds are released by the destructor.
class ShmSegment {
public:
    /// Creates, sizes, seals and maps a segment. `name` shows in /proc/<pid>/maps.
    /// Errors: InvalidArgument (size 0 or not a multiple of the page size); Unavailable
    /// (memfd_create, ftruncate, fcntl or mmap failed: the message has errno's text).
    static Result<ShmSegment> Create(std::string_view name, std::uint64_t size,
                                     const ShmSegmentOptions& options = {});

    ShmSegment() = default;
    ~ShmSegment();
    ShmSegment(ShmSegment&& other) noexcept;
    ShmSegment& operator=(ShmSegment&& other) noexcept;
    ShmSegment(const ShmSegment&) = delete;
    ShmSegment& operator=(const ShmSegment&) = delete;

    bool valid() const { return data_ != nullptr; }
    std::byte* data() const { return data_; }
    std::uint64_t size() const { return size_; }
    std::span<std::byte> bytes() const { return {data_, static_cast<std::size_t>(size_)}; }
    /// The read-write fd (stays in this process).
    int fd() const { return fd_; }
    /// A read-only fd of the same file, opened once at creation; owned by the segment. This is
    /// the one to send to other processes.
    int read_only_fd() const { return ro_fd_; }
    /// Whether the kernel took the huge page request (ShmSegmentOptions::huge_pages); its
    /// shmem setting may still give 4 KiB pages.
    bool huge_pages_advised() const { return huge_pages_advised_; }
    /// Bytes of this process's mapping of the segment that huge pages back now (/proc/self/smaps:
    /// ShmemPmdMapped). Errors: Unavailable (smaps unreadable or the mapping not in it).
    Result<std::uint64_t> HugePageBytes() const;
    /// Whether F_SEAL_FUTURE_WRITE was applied (false on kernels older than 5.1).
    bool write_sealed() const { return write_sealed_; }

private:
    void Reset();

    int fd_ = -1;
    int ro_fd_ = -1;
    std::byte* data_ = nullptr;
    std::uint64_t size_ = 0;
    bool write_sealed_ = false;
    bool huge_pages_advised_ = false;
};

/// A mapping of a memfd received from another process. Move-only; unmapped by the destructor.
/// The fd itself is not kept: the mapping holds the file alive.
class ShmMapping {
public:
    /// Maps `fd` (which the caller keeps owning) MAP_SHARED, read-only or read-write. The file
    /// must be a memfd sealed against shrinking (F_SEAL_SHRINK), so that no access within
    /// `size` can fault, and at least `size` bytes long.
    /// Errors: InvalidArgument (not a memfd, not sealed, smaller than `size`, size 0);
    /// Unavailable (mmap failed).
    static Result<ShmMapping> Map(int fd, std::uint64_t size, bool writable);

    ShmMapping() = default;
    ~ShmMapping();
    ShmMapping(ShmMapping&& other) noexcept;
    ShmMapping& operator=(ShmMapping&& other) noexcept;
    ShmMapping(const ShmMapping&) = delete;
    ShmMapping& operator=(const ShmMapping&) = delete;

    bool valid() const { return data_ != nullptr; }
    std::byte* data() const { return data_; }
    std::uint64_t size() const { return size_; }
    bool writable() const { return writable_; }

    /// `[offset, offset + length)` of the mapping, or OutOfRange (overflow-checked).
    Result<std::span<std::byte>> Slice(std::uint64_t offset, std::uint64_t length) const;

private:
    void Reset();

    std::byte* data_ = nullptr;
    std::uint64_t size_ = 0;
    bool writable_ = false;
};

/// The system page size.
std::uint64_t PageSize();

/// `[offset, offset + length)` lies within `[0, size)`, without overflow.
inline bool RangeWithin(std::uint64_t offset, std::uint64_t length, std::uint64_t size) {
    return offset <= size && length <= size - offset;
}

}  // namespace mooncake::sparse
