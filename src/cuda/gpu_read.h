// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The device side of a planned read (docs/design.md §4 steps 6-8 on the GPU): the unique entry
// ranges of a read are gathered once into device memory, straight from the store's page-locked
// host memory by a kernel that reads it (one launch for any number of ranges, instead of one
// copy-engine transfer per range), then every target's pieces are filtered and rebased on the
// device into one output allocation. Like gpu_codec.h, this header needs no CUDA headers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "cuda/gpu_codec.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse::cuda {

/// The address through which kernels on `device` read the page-locked host memory at `host`
/// (registered with cudaHostRegister, or allocated pinned), or nullopt when that memory is not
/// page-locked or the device cannot address it. One driver query: call it once per allocation
/// or object, not per range.
std::optional<std::uintptr_t> DeviceAddressOfHost(const void* host, int device);

/// Whether kernels on `device` address page-locked host memory by its host address (true on
/// 64-bit Linux with unified addressing): then a store that knows its memory is page-locked
/// needs no DeviceAddressOfHost query. Cached per device.
bool HostPointersAreDeviceAddresses(int device);

/// One range of a gather: `bytes` bytes at `src` (a device address of page-locked host memory,
/// from DeviceAddressOfHost, or device memory) to `dst_offset` bytes into the destination.
/// Copies run fastest when dst_offset and src agree modulo 16.
struct GatherCopy {
    std::uintptr_t src = 0;
    std::uint64_t bytes = 0;
    std::uint64_t dst_offset = 0;
};

/// Copies every range into `dst` with one kernel launch, ordered on `stream` (not waited for).
/// Errors: InvalidArgument (a range that would wrap); Unavailable / Internal (CUDA errors).
Status GatherToDevice(std::span<const GatherCopy> copies, DevicePtr dst, std::uintptr_t stream);

/// One range of CopyRanges: `bytes` bytes from `src` to `dst`, each a device address (device
/// memory, or page-locked host memory by its device address).
struct RangeCopy {
    std::uintptr_t src = 0;
    std::uintptr_t dst = 0;
    std::uint64_t bytes = 0;
};

/// Copies every range with one kernel launch on `device`, ordered on `stream` (not waited for).
/// The kernel of GatherToDevice, for any direction: ranges written into page-locked host memory
/// cross PCIe as the SMs' stores, one launch for any number of ranges, where the copy engine
/// takes one transfer, and its fixed cost of microseconds, per range. Copies run fastest when
/// src and dst agree modulo 16.
/// Errors: InvalidArgument (a range that would wrap); Unavailable / Internal (CUDA errors).
Status CopyRanges(std::span<const RangeCopy> copies, int device, std::uintptr_t stream);

/// CopyRanges for ranges from page-locked host memory (by host address) into memory of
/// `device`, where the runs of at least `engine_min_bytes` (ranges adjacent in both source and
/// destination, merged) go to the copy engine: one batched transfer on a side stream while the
/// kernel copies the rest on `stream`, which then waits for both (nothing is waited for on the
/// host). The kernel's loads from host memory reach 0.6-0.9 of the copy engine's rate, and a
/// transfer's fixed cost of a few µs is small beside 256 KiB's 5 µs at the PCIe rate: large runs
/// go faster on the engine, small ones by the one launch. engine_min_bytes 0: all by the kernel.
/// Errors: those of CopyRanges and EnqueueCopiesToDevice.
Status CopyRangesToDevice(std::span<const RangeCopy> copies, int device, std::uintptr_t stream,
                          std::uint64_t engine_min_bytes);

/// The work queued on a stream so far, for the host to wait for (a CUDA event without timing).
/// Move-only; the event is destroyed with it.
class StreamPoint {
public:
    /// Errors: Unavailable / Internal (CUDA errors).
    static Result<StreamPoint> Record(std::uintptr_t stream);
    /// Returns once that work has run. Errors: Unavailable / Internal.
    Status Wait() const;

    StreamPoint() = default;
    ~StreamPoint();
    StreamPoint(StreamPoint&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
    StreamPoint& operator=(StreamPoint&& other) noexcept;
    StreamPoint(const StreamPoint&) = delete;
    StreamPoint& operator=(const StreamPoint&) = delete;

private:
    void* event_ = nullptr;
};

/// An event that another process (the node daemon) records on its stream once it has queued
/// copies into this process's memory, for this process's streams to wait on (CUDA IPC event):
/// the daemon then answers at once and the copies run while this process goes on. One per
/// device and thread: a wait then follows the record of the calling thread's own request,
/// whatever other threads ask meanwhile. Never destroyed (a daemon that opened one keeps it,
/// and a new event must never come with a handle the daemon has open for an old one).
class IpcReadyEvent {
public:
    /// This thread's event of `device`, made on first use. Errors: Unavailable / Internal.
    static Result<const IpcReadyEvent*> Of(int device);
    IpcReadyEvent(const IpcReadyEvent&) = delete;
    IpcReadyEvent& operator=(const IpcReadyEvent&) = delete;
    /// The event's cudaIpcEventHandle_t (64 bytes).
    std::span<const std::byte> handle() const { return handle_; }
    /// Work queued on `stream` from now on runs after the event's last record.
    /// Errors: Unavailable / Internal.
    Status WaitOn(std::uintptr_t stream) const;
    /// Returns once the work before the event's last record has run (a host wait).
    /// Errors: Unavailable / Internal.
    Status Synchronize() const;

private:
    IpcReadyEvent() = default;
    void* event_ = nullptr;
    std::array<std::byte, 64> handle_{};
};

/// Another process's IpcReadyEvent opened in this one (cudaIpcOpenEventHandle on `device`),
/// destroyed with the last reference. Errors: InvalidArgument (not 64 bytes, or a handle the
/// driver refuses); Unavailable / Internal.
Result<std::shared_ptr<void>> OpenIpcEvent(std::span<const std::byte> handle, int device);

/// Records an event from OpenIpcEvent on `stream` (after the work queued there so far).
/// Errors: Unavailable / Internal.
Status RecordIpcEvent(void* event, std::uintptr_t stream);

/// One piece of a target (PlannedRead::Piece on the device): `count` entries whose coordinates
/// ([count, rank] of `index_size`-byte unsigned integers) and values lie at the given byte
/// offsets of the staging memory.
struct RebasePiece {
    std::uint64_t indices_offset = 0;
    std::uint64_t values_offset = 0;
    std::uint64_t count = 0;
    std::uint32_t target = 0;
    std::uint32_t index_size = 2;  ///< 2, 4 or 8
    /// With `filter`: the entries kept lie in [lo, hi) in every dimension, read from the call's
    /// `bounds` at bounds[box], bounds[box + rank] (rank values each).
    bool filter = false;
    std::uint64_t box = 0;
};

/// One target of a planned read on the device: its entries are written at the given byte
/// offsets of the output memory (room for `capacity` entries), rebased by its origin
/// (bounds[origin], rank values), with `index_size`-byte coordinates.
struct RebaseTarget {
    std::uint64_t indices_offset = 0;
    std::uint64_t values_offset = 0;
    std::uint64_t capacity = 0;
    std::uint64_t origin = 0;
    std::uint32_t rank = 0;
    std::uint32_t index_size = 2;  ///< 2, 4 or 8
    std::uint32_t value_size = 2;  ///< 1, 2, 4 or 8
    std::size_t first_piece = 0;   ///< pieces[first_piece, end_piece), in order
    std::size_t end_piece = 0;
};

/// Filters and rebases every target's pieces from `staging` into `out` in a fixed number of
/// launches (a count of the filtered pieces' kept entries, one scan, one write) queued on
/// `stream`, without a host sync: the number of entries each target kept is written to `kept`
/// (device memory for targets.size() uint64 counts), which the caller copies and waits for
/// before it reads `out`. A target's entries are its pieces' kept entries in piece order, each
/// piece's in entry order.
/// Errors: InvalidArgument (a piece of another target inside a target's range, a rank above
/// kMaxRank, a size not listed above, no `kept` memory); ResourceExhausted; Unavailable /
/// Internal.
Status EnqueueFilterRebase(std::span<const RebasePiece> pieces, std::span<const RebaseTarget> targets,
                           std::span<const std::int64_t> bounds, DevicePtr staging, DevicePtr out,
                           DevicePtr kept, std::uintptr_t stream);

}  // namespace mooncake::sparse::cuda
