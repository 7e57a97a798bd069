// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "store/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

namespace mooncake::sparse {
namespace {

std::string Errno(std::string_view what) {
    const int err = errno;
    return std::string(what) + ": " + std::strerror(err);
}

void CloseFd(int& fd) {
    if (fd >= 0) {
        // A failed close of a memfd loses nothing; it is not worth more than a note.
        if (::close(fd) != 0) std::perror("mooncake_sparse: close(shm fd)");
        fd = -1;
    }
}

void Unmap(std::byte*& data, std::uint64_t size) {
    if (data != nullptr) {
        if (::munmap(data, size) != 0) std::perror("mooncake_sparse: munmap(shm)");
        data = nullptr;
    }
}

}  // namespace

std::uint64_t PageSize() {
    static const std::uint64_t page = [] {
        const long p = ::sysconf(_SC_PAGESIZE);
        return p > 0 ? static_cast<std::uint64_t>(p) : std::uint64_t{4096};
    }();
    return page;
}

// ---------------------------------------------------------------------------------------------
// ShmSegment
// ---------------------------------------------------------------------------------------------
Result<ShmSegment> ShmSegment::Create(std::string_view name, std::uint64_t size,
                                      const ShmSegmentOptions& options) {
    if (size == 0 || size % PageSize() != 0) {
        return InvalidArgument("shared-memory segment size " + std::to_string(size) +
                               " must be a positive multiple of the page size " +
                               std::to_string(PageSize()));
    }
    if (size > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
        return InvalidArgument("shared-memory segment size " + std::to_string(size) +
                               " is too large");
    }
    ShmSegment seg;
    const std::string label(name.empty() ? std::string_view("mooncake_sparse") : name);
    seg.fd_ = ::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (seg.fd_ < 0) return Unavailable(Errno("memfd_create"));
    if (::ftruncate(seg.fd_, static_cast<off_t>(size)) != 0) {
        return Unavailable(Errno("ftruncate(" + std::to_string(size) + ")"));
    }
    if (::fcntl(seg.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
        return Unavailable(Errno("fcntl(F_ADD_SEALS, SHRINK|GROW)"));
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, seg.fd_, 0);
    if (p == MAP_FAILED) return Unavailable(Errno("mmap(" + std::to_string(size) + ")"));
    seg.data_ = static_cast<std::byte*>(p);
    seg.size_ = size;
    // Before any page is touched: the pages are allocated huge from the first fault on.
    if (options.huge_pages) seg.huge_pages_advised_ = ::madvise(p, size, MADV_HUGEPAGE) == 0;
    if (options.seal_future_write) {
        // After our own writable mapping exists: it keeps working, every later one is refused.
        if (::fcntl(seg.fd_, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0) {
            seg.write_sealed_ = true;
        } else if (errno != EINVAL) {
            return Unavailable(Errno("fcntl(F_ADD_SEALS, FUTURE_WRITE)"));
        }
    }
    if (::fcntl(seg.fd_, F_ADD_SEALS, F_SEAL_SEAL) != 0) {
        return Unavailable(Errno("fcntl(F_ADD_SEALS, SEAL)"));
    }
    const std::string self = "/proc/self/fd/" + std::to_string(seg.fd_);
    seg.ro_fd_ = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
    if (seg.ro_fd_ < 0) return Unavailable(Errno("open(" + self + ", O_RDONLY)"));
    return seg;
}

Result<std::uint64_t> ShmSegment::HugePageBytes() const {
    std::FILE* f = std::fopen("/proc/self/smaps", "re");
    if (f == nullptr) return Unavailable(Errno("fopen(/proc/self/smaps)"));
    const auto begin = reinterpret_cast<std::uintptr_t>(data_);
    const std::uintptr_t end = begin + size_;
    std::uint64_t kib = 0;
    bool inside = false, found = false;
    char line[512];
    while (std::fgets(line, sizeof line, f) != nullptr) {
        unsigned long lo = 0, hi = 0;
        unsigned long long n = 0;
        // A mapping's header line starts "lo-hi perms ...", its fields "Name:   N kB".
        if (std::sscanf(line, "%lx-%lx ", &lo, &hi) == 2) {
            inside = lo < end && hi > begin;
            found = found || inside;
        } else if (inside && std::sscanf(line, "ShmemPmdMapped: %llu kB", &n) == 1) {
            kib += n;
        }
    }
    std::fclose(f);
    if (!found) return Unavailable("the segment's mapping is not in /proc/self/smaps");
    return kib * 1024;
}

ShmSegment::~ShmSegment() { Reset(); }

void ShmSegment::Reset() {
    Unmap(data_, size_);
    CloseFd(ro_fd_);
    CloseFd(fd_);
    size_ = 0;
    write_sealed_ = false;
    huge_pages_advised_ = false;
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      ro_fd_(std::exchange(other.ro_fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      write_sealed_(std::exchange(other.write_sealed_, false)),
      huge_pages_advised_(std::exchange(other.huge_pages_advised_, false)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
    if (this != &other) {
        Reset();
        fd_ = std::exchange(other.fd_, -1);
        ro_fd_ = std::exchange(other.ro_fd_, -1);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        write_sealed_ = std::exchange(other.write_sealed_, false);
        huge_pages_advised_ = std::exchange(other.huge_pages_advised_, false);
    }
    return *this;
}

// ---------------------------------------------------------------------------------------------
// ShmMapping
// ---------------------------------------------------------------------------------------------
Result<ShmMapping> ShmMapping::Map(int fd, std::uint64_t size, bool writable) {
    if (size == 0) return InvalidArgument("cannot map 0 bytes of shared memory");
    const int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
        return InvalidArgument(Errno("the shared-memory fd is not a sealable memfd (F_GET_SEALS)"));
    }
    if ((seals & F_SEAL_SHRINK) == 0) {
        return InvalidArgument("the shared-memory fd is not sealed against shrinking "
                               "(F_SEAL_SHRINK)");
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) return InvalidArgument(Errno("fstat(shared-memory fd)"));
    if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) < size) {
        return InvalidArgument("the shared-memory file has " + std::to_string(st.st_size) +
                               " bytes, fewer than the " + std::to_string(size) + " announced");
    }
    const int prot = writable ? (PROT_READ | PROT_WRITE) : PROT_READ;
    void* p = ::mmap(nullptr, size, prot, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return Unavailable(Errno("mmap(" + std::to_string(size) + ")"));
    ShmMapping m;
    m.data_ = static_cast<std::byte*>(p);
    m.size_ = size;
    m.writable_ = writable;
    return m;
}

ShmMapping::~ShmMapping() { Reset(); }

void ShmMapping::Reset() {
    Unmap(data_, size_);
    size_ = 0;
    writable_ = false;
}

ShmMapping::ShmMapping(ShmMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      writable_(std::exchange(other.writable_, false)) {}

ShmMapping& ShmMapping::operator=(ShmMapping&& other) noexcept {
    if (this != &other) {
        Reset();
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        writable_ = std::exchange(other.writable_, false);
    }
    return *this;
}

Result<std::span<std::byte>> ShmMapping::Slice(std::uint64_t offset, std::uint64_t length) const {
    if (!RangeWithin(offset, length, size_)) {
        return OutOfRange("bytes [" + std::to_string(offset) + ", +" + std::to_string(length) +
                          ") are not within the " + std::to_string(size_) + "-byte mapping");
    }
    return std::span<std::byte>(data_ + offset, static_cast<std::size_t>(length));
}

}  // namespace mooncake::sparse
