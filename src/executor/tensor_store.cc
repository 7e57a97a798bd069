// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "executor/tensor_store.h"

#include "transport/host_copy.h"
#include "transport/pageable_cuda_copy.h"
#include "transport/pitched_copy.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mooncake::sparse {

TensorRef TensorRef::Host(DType dtype, Shape shape, std::span<std::byte> bytes) {
    TensorRef t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.memory = TensorMemory::kHost;
    t.host = bytes.data();
    t.host_bytes = bytes.size();
    t.writable = true;
    return t;
}

TensorRef TensorRef::ConstHost(DType dtype, Shape shape, std::span<const std::byte> bytes) {
    // The pointer is never written through: writable=false makes a destination use fail.
    TensorRef t = Host(dtype, std::move(shape),
                       {const_cast<std::byte*>(bytes.data()), bytes.size()});
    t.writable = false;
    return t;
}

TensorRef TensorRef::Cuda(DType dtype, Shape shape, DeviceMemory memory, CudaStream stream) {
    TensorRef t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.memory = TensorMemory::kCuda;
    t.device = memory;
    t.stream = stream;
    return t;
}

Status TensorStore::Put(std::string_view key, const TensorRef& tensor,
                        const TensorPutOptions& options) {
    const std::string k(key);
    return Put(std::span<const std::string>(&k, 1), std::span<const TensorRef>(&tensor, 1),
               options);
}

Status TensorStore::GetInto(std::string_view key, const TensorRef& destination) {
    const std::string k(key);
    return GetInto(std::span<const std::string>(&k, 1),
                   std::span<const TensorRef>(&destination, 1), {});
}

Status TensorStore::GetInto(std::string_view key, const TensorRef& destination,
                            const Shape& box_origin) {
    const std::string k(key);
    return GetInto(std::span<const std::string>(&k, 1),
                   std::span<const TensorRef>(&destination, 1),
                   std::span<const Shape>(&box_origin, 1));
}

Status TensorStore::GetInto(std::span<const std::string> keys,
                            std::span<const TensorRef> destinations) {
    return GetInto(keys, destinations, {});
}

namespace internal {

Status ValidateTensorKey(std::string_view key, std::string_view what) {
    MCS_RETURN_IF_ERROR(ValidateId(std::string(what) + " key", key));
    if (key.starts_with(kReservedKeyPrefix)) {
        return InvalidArgument(std::string(what) + " key '" + std::string(key) + "' is under '" +
                               std::string(kReservedKeyPrefix) +
                               "', which the sparse object layer reserves for its own objects");
    }
    return Status::Ok();
}

Status CheckPerKey(std::size_t keys, std::size_t items, std::string_view what, bool optional) {
    if (items == keys || (optional && items == 0)) return Status::Ok();
    return InvalidArgument(std::to_string(keys) + " keys but " + std::to_string(items) + " " +
                           std::string(what));
}

namespace {

std::string Quote(std::string_view s) {
    constexpr std::size_t kMaxShown = 200;
    std::string out = "'";
    out.append(s.substr(0, kMaxShown));
    if (s.size() > kMaxShown) out += "...";
    return out + "'";
}

std::string StridesString(const std::vector<std::int64_t>& strides) {
    std::string s = "[";
    for (std::size_t i = 0; i < strides.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(strides[i]);
    }
    return s + "]";
}

std::string Describe(DType dtype, const Shape& shape) {
    return std::string(DTypeName(dtype)) + " " + ShapeString(shape);
}

}  // namespace

Result<TensorHeader> ValidateTensorRef(const TensorRef& t, bool destination,
                                       std::string_view what) {
    auto header = MakeFullTensorHeader(t.dtype, t.shape);
    if (!header.ok()) return header.status().WithContext(what);
    if (!t.strides.empty()) {
        if (t.strides.size() != t.shape.size()) {
            return InvalidArgument(std::string(what) + ": " + std::to_string(t.strides.size()) +
                                   " strides for a tensor of rank " +
                                   std::to_string(t.shape.size()));
        }
        // Host views are copied through their strides and CUDA destinations through 2-D
        // copies (transport/pitched_copy.h); a CUDA source is read by one flat copy (callers
        // make a strided one contiguous on its stream: its bytes move anyway).
        if (t.memory != TensorMemory::kHost && !destination && !IsCContiguous(t.shape, t.strides)) {
            return InvalidArgument(std::string(what) + " must be C-contiguous: shape " +
                                   ShapeString(t.shape) + " has strides " +
                                   StridesString(t.strides) +
                                   " (elements); call .contiguous() first");
        }
        if (destination && !IsNonOverlapping(t.shape, t.strides)) {
            return InvalidArgument(std::string(what) + ": shape " + ShapeString(t.shape) +
                                   " with strides " + StridesString(t.strides) +
                                   " has overlapping elements (a broadcast or expanded view)");
        }
    }
    const std::uint64_t bytes = header->data_bytes;
    switch (t.memory) {
        case TensorMemory::kHost:
            if (t.host_bytes != bytes) {
                return InvalidArgument(std::string(what) + ": " + std::to_string(t.host_bytes) +
                                       " bytes given, " + Describe(t.dtype, t.shape) +
                                       " needs " + std::to_string(bytes));
            }
            if (t.host == nullptr && bytes > 0) {
                return InvalidArgument(std::string(what) + ": null data pointer");
            }
            if (destination && !t.writable) {
                return InvalidArgument(std::string(what) + " is read-only");
            }
            break;
        case TensorMemory::kCuda: {
            MCS_RETURN_IF_ERROR(cuda::RequireCuda(what));
            if (t.device.bytes != bytes) {
                return InvalidArgument(std::string(what) + ": " +
                                       std::to_string(t.device.bytes) + " device bytes given, " +
                                       Describe(t.dtype, t.shape) + " needs " +
                                       std::to_string(bytes));
            }
            if (t.device.address == 0 || t.device.device < 0) {
                return InvalidArgument(std::string(what) + ": null device pointer or device < 0");
            }
            auto info = cuda::DescribePointer(reinterpret_cast<const void*>(t.device.address));
            if (!info.ok()) return info.status().WithContext(what);
            const bool device_memory = info->type == cuda::MemoryType::kDevice ||
                                       info->type == cuda::MemoryType::kManaged;
            if (!device_memory || info->device != t.device.device) {
                return InvalidArgument(std::string(what) + ": address " +
                                       std::to_string(t.device.address) +
                                       " is not device memory of cuda:" +
                                       std::to_string(t.device.device));
            }
            break;
        }
        default:
            return InvalidArgument(std::string(what) + ": unknown memory kind " +
                                   std::to_string(static_cast<int>(t.memory)));
    }
    return header;
}

Result<TensorHeader> ReadTensorObjectHeader(const ObjectView& view, std::string_view key) {
    const ObjectInfo& info = *view.info;
    if (info.members.size() != 1 || info.members[0].name != kTensorMemberName) {
        return InvalidArgument("object " + Quote(key) + " is not a tensor object (a tensor " +
                               "object has exactly one member, '" +
                               std::string(kTensorMemberName) + "')");
    }
    const std::span<const std::byte> bytes = view.members[0];
    auto header = DecodeTensorHeader(bytes, bytes.size());
    if (!header.ok()) return header.status().WithContext("object " + Quote(key));
    return header;
}

Status CheckTensorMatch(const TensorHeader& stored, const TensorHeader& expected,
                        std::string_view key) {
    if (stored.dtype != expected.dtype || stored.local_shape != expected.local_shape) {
        return InvalidArgument("tensor " + Quote(key) + " is " +
                               Describe(stored.dtype, stored.local_shape) +
                               ", the destination is " +
                               Describe(expected.dtype, expected.local_shape));
    }
    return Status::Ok();
}

Status ValidateBoxOrigin(const Shape& origin, const Shape& shape, std::string_view what) {
    if (origin.size() != shape.size()) {
        return InvalidArgument(std::string(what) + ": box origin " + ShapeString(origin) +
                               " has rank " + std::to_string(origin.size()) +
                               ", the destination has rank " + std::to_string(shape.size()));
    }
    for (std::size_t d = 0; d < origin.size(); ++d) {
        if (origin[d] < 0) {
            return InvalidArgument(std::string(what) + ": box origin " + ShapeString(origin) +
                                   " has a negative coordinate");
        }
    }
    return Status::Ok();
}

Status CheckTensorBox(const TensorHeader& stored, const TensorHeader& expected,
                      const Shape& origin, std::string_view key) {
    const Shape& full = stored.local_shape;
    const Shape& box = expected.local_shape;
    if (stored.dtype != expected.dtype || full.size() != box.size() ||
        origin.size() != box.size()) {
        return InvalidArgument("tensor " + Quote(key) + " is " + Describe(stored.dtype, full) +
                               ", the destination box is " + Describe(expected.dtype, box) +
                               " (a box has the stored rank and dtype)");
    }
    for (std::size_t d = 0; d < box.size(); ++d) {
        // Extents are >= 1 and origins >= 0 (validated), so neither side overflows.
        if (origin[d] < 0 || box[d] > full[d] || origin[d] > full[d] - box[d]) {
            return InvalidArgument("the box at " + ShapeString(origin) + " of shape " +
                                   ShapeString(box) + " lies outside tensor " + Quote(key) +
                                   " of shape " + ShapeString(full) + " (dimension " +
                                   std::to_string(d) + ")");
        }
    }
    return Status::Ok();
}

}  // namespace internal

namespace {

using internal::Quote;

/// Where the elements of a box of a stored (C-contiguous) tensor lie.
struct BoxSource {
    std::uint64_t offset = 0;           ///< Bytes from the data's first byte to the box origin.
    std::vector<std::int64_t> strides;  ///< Element strides; empty when the box is contiguous.
};

BoxSource LocateBox(const Shape& full, const Shape& box, const Shape& origin, std::size_t item) {
    BoxSource out;
    std::vector<std::int64_t> strides(full.size());
    std::int64_t stride = 1;
    std::uint64_t offset = 0;
    for (std::size_t d = full.size(); d-- > 0;) {
        strides[d] = stride;
        offset += std::uint64_t(origin[d]) * std::uint64_t(stride);
        stride *= full[d];
    }
    out.offset = offset * item;
    if (!IsCContiguous(box, strides)) out.strides = std::move(strides);
    return out;
}

/// The contiguous byte runs of a box of a stored (C-contiguous) tensor, in the box's C order:
/// (offset from the data's first byte, bytes). A box whole along every dimension after the
/// first it cuts is one run per index of the dimensions before.
std::vector<std::pair<std::uint64_t, std::uint64_t>> BoxRuns(const Shape& full, const Shape& box,
                                                            const Shape& origin,
                                                            std::size_t item) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;
    const std::size_t rank = full.size();
    for (std::size_t d = 0; d < rank; ++d) {
        if (box[d] == 0) return runs;
    }
    std::vector<std::uint64_t> strides(rank);  // bytes
    std::uint64_t stride = item;
    for (std::size_t d = rank; d-- > 0;) {
        strides[d] = stride;
        stride *= std::uint64_t(full[d]);
    }
    std::size_t cut = 0;  // the last dimension the box does not span whole
    for (std::size_t d = 0; d < rank; ++d) {
        if (box[d] != full[d]) cut = d;
    }
    const std::uint64_t run = rank == 0 ? item : std::uint64_t(box[cut]) * strides[cut];
    std::vector<std::int64_t> at(cut, 0);  // index over the box's dimensions before `cut`
    for (;;) {
        std::uint64_t offset = 0;
        for (std::size_t d = 0; d < rank; ++d) {
            offset += std::uint64_t(origin[d] + (d < cut ? at[d] : 0)) * strides[d];
        }
        runs.emplace_back(offset, run);
        std::size_t d = cut;
        while (d > 0 && ++at[d - 1] == box[d - 1]) at[--d] = 0;
        if (d == 0) break;
    }
    return runs;
}

/// The (device, stream) pairs a call issued copies on; synchronized before it returns.
class StreamSet {
public:
    void Add(int device, CudaStream stream) {
        for (const auto& [d, s] : streams_) {
            if (d == device && s == stream) return;
        }
        streams_.emplace_back(device, stream);
    }
    /// Synchronizes every stream (all of them even after a failure); the first error.
    Status SyncAll() {
        Status first;
        for (const auto& [d, s] : streams_) {
            Status st = cuda::StreamSynchronize(s, d);
            if (!st.ok() && first.ok()) first = st;
        }
        streams_.clear();
        return first;
    }

private:
    std::vector<std::pair<int, CudaStream>> streams_;
};

class LocalTensorStore final : public TensorStore {
public:
    LocalTensorStore(std::shared_ptr<ObjectStore> store, const LocalTensorStoreOptions& options)
        : store_(std::move(store)),
          options_(options),
          pool_(PinnedHostPool::Make(options.pinned_quota_bytes)),
          threads_(options.copy_threads != 0 ? options.copy_threads : DefaultCopyThreads()),
          copier_(threads_) {}
    LocalTensorStore(const LocalTensorStore&) = delete;
    LocalTensorStore& operator=(const LocalTensorStore&) = delete;

    Status Put(std::span<const std::string> keys, std::span<const TensorRef> tensors,
               const TensorPutOptions& options) override;
    Result<HostTensor> Get(std::string_view key) override;
    using TensorStore::GetInto;
    Status GetInto(std::span<const std::string> keys, std::span<const TensorRef> destinations,
                   std::span<const Shape> box_origins) override;
    Result<TensorInfo> Stat(std::string_view key) override;
    TensorCapabilities Capabilities() const override;
    TensorStoreStats Stats() const override;

private:
    /// Issues the copies of `plan` from the contiguous `src` into the CUDA view `dst` on its
    /// stream. A plan that gathers first stages the source in `staging` (pinned when the pool
    /// has room; `pinned` then says whether the device copies read pinned memory).
    Status CopyIntoCudaView(const TensorRef& dst, const PitchedCopyPlan& plan, const std::byte* src,
                            std::uint64_t bytes, std::vector<HostBuffer>& staging, bool& pinned);

    /// Reads the boxes of items `items` (their keys, box origins and expected box headers) from
    /// a store that would copy whole objects to view them: each box's bytes, in the box's C
    /// order, into pool memory (`out[k]` for items[k]), by range reads of only those bytes.
    /// Every object is checked against its header, and read from one version of it.
    Status ReadBoxesByRange(std::span<const std::string> keys, std::span<const std::size_t> items,
                            std::span<const Shape> origins, std::span<const TensorHeader> expected,
                            std::vector<HostBuffer>& out);

    void CountCopy(bool cuda, bool pinned) {
        if (!cuda) return;
        cuda_copies_.fetch_add(1, std::memory_order_relaxed);
        (pinned ? pinned_copies_ : pageable_copies_).fetch_add(1, std::memory_order_relaxed);
    }

    const std::shared_ptr<ObjectStore> store_;
    const LocalTensorStoreOptions options_;
    const std::shared_ptr<PinnedHostPool> pool_;
    const unsigned threads_;

    /// CUDA copies to and from pageable store memory, one pipeline per batch.
    PageableCudaCopier copier_;

    std::atomic<std::uint64_t> tensors_put_{0};
    std::atomic<std::uint64_t> bytes_put_{0};
    std::atomic<std::uint64_t> tensors_read_{0};
    std::atomic<std::uint64_t> bytes_read_{0};
    std::atomic<std::uint64_t> cuda_copies_{0};
    std::atomic<std::uint64_t> pinned_copies_{0};
    std::atomic<std::uint64_t> pageable_copies_{0};
};

std::string ItemName(std::size_t i, std::size_t n, std::string_view key) {
    return (n == 1 ? std::string("tensor ") : "tensor " + std::to_string(i) + " ") + Quote(key);
}

Status LocalTensorStore::Put(std::span<const std::string> keys, std::span<const TensorRef> tensors,
                             const TensorPutOptions& options) {
    MCS_RETURN_IF_ERROR(internal::CheckPerKey(keys.size(), tensors.size(), "tensors"));
    if (keys.empty()) return Status::Ok();
    std::vector<TensorHeader> headers;
    headers.reserve(keys.size());
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
        MCS_RETURN_IF_ERROR(internal::ValidateTensorKey(keys[i], ItemName(i, keys.size(), keys[i])));
        MCS_ASSIGN_OR_RETURN(TensorHeader h,
                             internal::ValidateTensorRef(tensors[i], /*destination=*/false,
                                                         ItemName(i, keys.size(), keys[i])));
        total += h.data_bytes;
        headers.push_back(std::move(h));
    }
    std::vector<MemberSpec> specs(keys.size());
    std::vector<FilledPut> puts(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
        specs[i] = {std::string(kTensorMemberName), DType::kUInt8,
                    {static_cast<Index>(kTensorHeaderBytes + headers[i].data_bytes)}, 0};
        puts[i] = {keys[i], {}, std::span<const MemberSpec>(&specs[i], 1)};
    }
    auto fill = [&](std::span<const FillTarget> targets) -> Status {
        StreamSet streams;
        std::vector<HostCopy> host_copies;
        std::vector<PageableCudaCopy> pageable;  // one pipeline for the whole batch
        std::vector<std::size_t> pageable_items;
        Status status;
        for (const FillTarget& t : targets) {
            const TensorHeader& h = headers[t.index];
            const TensorRef& src = tensors[t.index];
            std::span<std::byte> member = t.members[0];
            EncodeTensorHeader(h, member.first<kTensorHeaderBytes>());
            std::byte* dst = member.data() + kTensorHeaderBytes;
            if (src.memory == TensorMemory::kHost && !IsCContiguous(src.shape, src.strides)) {
                // A view is gathered straight into the object.
                StridedCopy(dst, {}, src.host, src.strides, src.shape, DTypeSize(src.dtype));
            } else if (src.memory == TensorMemory::kHost) {
                host_copies.push_back({dst, src.host, h.data_bytes});
            } else if (!t.pinned) {
                pageable.push_back(
                    {dst, src.device.address, h.data_bytes, src.stream, src.device.device});
                pageable_items.push_back(t.index);
                CountCopy(true, false);
            } else {
                status = cuda::MemcpyAsync(dst, reinterpret_cast<const void*>(src.device.address),
                                           h.data_bytes, cuda::CopyKind::kDeviceToHost, src.stream,
                                           src.device.device);
                if (!status.ok()) {
                    status = status.WithContext(ItemName(t.index, keys.size(), keys[t.index]));
                    break;
                }
                streams.Add(src.device.device, src.stream);
                CountCopy(true, t.pinned);
            }
        }
        if (status.ok()) ParallelCopies(host_copies, threads_);
        if (status.ok() && !pageable.empty()) {
            std::size_t failed = 0;
            status = copier_.Run(pageable, CopyDirection::kDeviceToHost, &failed);
            if (!status.ok()) {
                const std::size_t i = pageable_items[failed];
                status = status.WithContext(ItemName(i, keys.size(), keys[i]));
            }
        }
        // Always wait for what was issued: the object memory must not go while DMA writes it.
        Status synced = streams.SyncAll();
        return status.ok() ? synced : status;
    };
    MCS_RETURN_IF_ERROR(
        store_->PutFilled(puts, {options.mode, options.hard_pin}, fill, pool_.get()));
    tensors_put_.fetch_add(keys.size(), std::memory_order_relaxed);
    bytes_put_.fetch_add(total, std::memory_order_relaxed);
    return Status::Ok();
}

Result<HostTensor> LocalTensorStore::Get(std::string_view key) {
    MCS_RETURN_IF_ERROR(internal::ValidateTensorKey(key, "tensor"));
    HostTensor out;
    const std::string_view keys[] = {key};
    MCS_RETURN_IF_ERROR(store_->ViewObjects(keys, [&](std::span<const ObjectView> views) -> Status {
        MCS_ASSIGN_OR_RETURN(TensorHeader h, internal::ReadTensorObjectHeader(views[0], key));
        MCS_ASSIGN_OR_RETURN(out.data, HostBuffer::Pageable(h.data_bytes));
        const HostCopy copy{out.data.data(), views[0].members[0].data() + h.data_offset,
                            h.data_bytes};
        ParallelCopies({&copy, 1}, threads_);
        out.dtype = h.dtype;
        out.shape = h.local_shape;
        return Status::Ok();
    }));
    tensors_read_.fetch_add(1, std::memory_order_relaxed);
    bytes_read_.fetch_add(out.data.size(), std::memory_order_relaxed);
    return out;
}

Status LocalTensorStore::GetInto(std::span<const std::string> keys,
                                 std::span<const TensorRef> destinations,
                                 std::span<const Shape> box_origins) {
    MCS_RETURN_IF_ERROR(
        internal::CheckPerKey(keys.size(), destinations.size(), "destination tensors"));
    MCS_RETURN_IF_ERROR(internal::CheckPerKey(keys.size(), box_origins.size(), "box origins",
                                              /*optional=*/true));
    if (keys.empty()) return Status::Ok();
    auto box_of = [&](std::size_t i) -> const Shape* {
        return box_origins.empty() || box_origins[i].empty() ? nullptr : &box_origins[i];
    };
    std::vector<TensorHeader> expected;
    expected.reserve(keys.size());
    // CUDA views are planned up front, so that a view the copies cannot take fails the call
    // before any byte moves (a strided box is planned once its stored shape is known, still
    // before any byte moves).
    std::vector<std::optional<PitchedCopyPlan>> plans(keys.size());
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < keys.size(); ++i) {
        MCS_RETURN_IF_ERROR(internal::ValidateTensorKey(keys[i], ItemName(i, keys.size(), keys[i])));
        const TensorRef& dst = destinations[i];
        const std::string what = "destination " + ItemName(i, keys.size(), keys[i]);
        MCS_ASSIGN_OR_RETURN(TensorHeader h,
                             internal::ValidateTensorRef(dst, /*destination=*/true, what));
        if (const Shape* origin = box_of(i)) {
            MCS_RETURN_IF_ERROR(internal::ValidateBoxOrigin(*origin, dst.shape, what));
        }
        if (dst.memory == TensorMemory::kCuda && !IsCContiguous(dst.shape, dst.strides)) {
            auto plan = PlanPitchedCopies(dst.shape, dst.strides, DTypeSize(dst.dtype));
            if (!plan.ok()) return plan.status().WithContext(what);
            plans[i] = std::move(plan).value();
        }
        total += h.data_bytes;
        expected.push_back(std::move(h));
    }
    // A store that would copy whole objects to view them gives the boxes by range reads of
    // only their bytes (`ranged`, into pool memory); the rest of the items are viewed.
    std::vector<std::size_t> ranged_items;
    std::vector<Shape> ranged_origins;
    std::vector<TensorHeader> ranged_expected;
    std::vector<std::string_view> views_of;
    std::vector<std::size_t> view_index(keys.size(), 0);  // item -> its view (not ranged)
    for (std::size_t i = 0; i < keys.size(); ++i) {
        if (box_of(i) != nullptr && !store_->ViewsInPlace()) {
            ranged_items.push_back(i);
            ranged_origins.push_back(*box_of(i));
            ranged_expected.push_back(expected[i]);
        } else {
            view_index[i] = views_of.size();
            views_of.push_back(keys[i]);
        }
    }
    std::vector<HostBuffer> ranged;
    std::vector<std::size_t> ranged_slot(keys.size(), SIZE_MAX);
    if (!ranged_items.empty()) {
        MCS_RETURN_IF_ERROR(
            ReadBoxesByRange(keys, ranged_items, ranged_origins, ranged_expected, ranged));
        for (std::size_t k = 0; k < ranged_items.size(); ++k) ranged_slot[ranged_items[k]] = k;
    }
    auto copy_all = [&](std::span<const ObjectView> views) -> Status {
        // Every item is checked, planned and given its staging before any byte moves.
        struct Source {
            const std::byte* data = nullptr;    ///< The first element read (a box's origin).
            std::vector<std::int64_t> strides;  ///< Empty: the elements are contiguous.
            bool pinned = false;
        };
        std::vector<Source> sources(keys.size());
        std::vector<HostBuffer> staging;  // gathered sources; alive until the streams are synced
        for (std::size_t i = 0; i < keys.size(); ++i) {
            const TensorRef& dst = destinations[i];
            Source& src = sources[i];
            if (ranged_slot[i] != SIZE_MAX) {  // checked, and read in the box's order already
                const HostBuffer& box = ranged[ranged_slot[i]];
                src.data = box.data();
                src.pinned = box.pinned();
                continue;
            }
            const ObjectView& view = views[view_index[i]];
            MCS_ASSIGN_OR_RETURN(TensorHeader h, internal::ReadTensorObjectHeader(view, keys[i]));
            src.data = view.members[0].data() + h.data_offset;
            src.pinned = view.pinned;
            const Shape* origin = box_of(i);
            if (origin == nullptr) {
                MCS_RETURN_IF_ERROR(internal::CheckTensorMatch(h, expected[i], keys[i]));
                continue;
            }
            MCS_RETURN_IF_ERROR(internal::CheckTensorBox(h, expected[i], *origin, keys[i]));
            const std::size_t item = DTypeSize(dst.dtype);
            BoxSource box = LocateBox(h.local_shape, dst.shape, *origin, item);
            src.data += box.offset;
            src.strides = std::move(box.strides);
            if (dst.memory != TensorMemory::kCuda || src.strides.empty()) continue;
            if (src.pinned) {
                // 2-D copies straight from the box's rows in the store.
                auto plan = PlanStridedCopies(dst.shape, dst.strides, src.strides, item);
                if (!plan.ok()) {
                    return plan.status().WithContext("destination " +
                                                     ItemName(i, keys.size(), keys[i]));
                }
                plans[i] = std::move(plan).value();
                continue;
            }
            // Pageable store memory: the driver would stage every 2-D row itself, so the box is
            // gathered into pool memory (pinned while the quota has room) and copied from there
            // as a contiguous tensor. This costs one host pass over the box.
            MCS_ASSIGN_OR_RETURN(HostBuffer buffer, pool_->Allocate(expected[i].data_bytes));
            StridedCopy(buffer.data(), {}, src.data, src.strides, dst.shape, item);
            src.data = buffer.data();
            src.strides.clear();
            src.pinned = buffer.pinned();
            staging.push_back(std::move(buffer));
        }
        StreamSet streams;
        std::vector<HostCopy> host_copies;
        std::vector<PageableCudaCopy> pageable;  // one pipeline for the whole batch
        std::vector<std::size_t> pageable_items;
        Status status;
        for (std::size_t i = 0; i < keys.size(); ++i) {
            const TensorRef& dst = destinations[i];
            const Source& src = sources[i];
            const std::uint64_t bytes = expected[i].data_bytes;
            if (plans[i]) {
                bool pinned = src.pinned;
                status = CopyIntoCudaView(dst, *plans[i], src.data, bytes, staging, pinned);
                if (!status.ok()) {
                    status = status.WithContext(ItemName(i, keys.size(), keys[i]));
                    break;
                }
                streams.Add(dst.device.device, dst.stream);
                CountCopy(true, pinned);
            } else if (dst.memory == TensorMemory::kHost &&
                       (!src.strides.empty() || !IsCContiguous(dst.shape, dst.strides))) {
                // A view or a box is copied in place, straight from the snapshot.
                StridedCopy(dst.host, dst.strides, src.data, src.strides, dst.shape,
                            DTypeSize(dst.dtype));
            } else if (dst.memory == TensorMemory::kHost) {
                host_copies.push_back({dst.host, src.data, bytes});
            } else if (!src.pinned) {
                pageable.push_back({const_cast<std::byte*>(src.data), dst.device.address, bytes,
                                    dst.stream, dst.device.device});
                pageable_items.push_back(i);
                CountCopy(true, false);
            } else {
                status = cuda::MemcpyAsync(reinterpret_cast<void*>(dst.device.address), src.data,
                                           bytes, cuda::CopyKind::kHostToDevice, dst.stream,
                                           dst.device.device);
                if (!status.ok()) {
                    status = status.WithContext(ItemName(i, keys.size(), keys[i]));
                    break;
                }
                streams.Add(dst.device.device, dst.stream);
                CountCopy(true, true);
            }
        }
        if (status.ok()) ParallelCopies(host_copies, threads_);
        if (status.ok() && !pageable.empty()) {
            std::size_t failed = 0;
            status = copier_.Run(pageable, CopyDirection::kHostToDevice, &failed);
            if (!status.ok()) {
                const std::size_t i = pageable_items[failed];
                status = status.WithContext(ItemName(i, keys.size(), keys[i]));
            }
        }
        // The snapshot must outlive every copy that reads it.
        Status synced = streams.SyncAll();
        return status.ok() ? synced : status;
    };
    if (views_of.empty()) {
        MCS_RETURN_IF_ERROR(copy_all({}));
    } else {
        MCS_RETURN_IF_ERROR(store_->ViewObjects(views_of, copy_all, pool_.get()));
    }
    tensors_read_.fetch_add(keys.size(), std::memory_order_relaxed);
    bytes_read_.fetch_add(total, std::memory_order_relaxed);
    return Status::Ok();
}

Status LocalTensorStore::ReadBoxesByRange(std::span<const std::string> keys,
                                          std::span<const std::size_t> items,
                                          std::span<const Shape> origins,
                                          std::span<const TensorHeader> expected,
                                          std::vector<HostBuffer>& out) {
    const std::string member(kTensorMemberName);
    std::vector<std::uint64_t> sizes(items.size());
    for (std::size_t k = 0; k < items.size(); ++k) {
        const std::string& key = keys[items[k]];
        MCS_ASSIGN_OR_RETURN(ObjectInfo info, store_->Stat(key));
        if (info.members.size() != 1 || info.members[0].name != kTensorMemberName) {
            return InvalidArgument("object " + Quote(key) + " is not a tensor object (a tensor " +
                                   "object has exactly one member, '" + member + "')");
        }
        sizes[k] = info.members[0].size_bytes;
    }
    // The headers, then the boxes with the headers again: a box is taken from the version whose
    // header was checked, or the read starts over (an upsert landed in between).
    constexpr int kAttempts = 3;
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
        std::vector<std::array<std::byte, kTensorHeaderBytes>> heads(items.size());
        std::vector<RangeRead> reads;
        for (std::size_t k = 0; k < items.size(); ++k) {
            const std::uint64_t n = std::min<std::uint64_t>(sizes[k], kTensorHeaderBytes);
            reads.push_back({keys[items[k]], member, 0, n, {heads[k].data(), n}});
        }
        MCS_RETURN_IF_ERROR(store_->ReadRanges(reads));
        reads.clear();
        std::vector<std::array<std::byte, kTensorHeaderBytes>> again(items.size());
        out.clear();
        for (std::size_t k = 0; k < items.size(); ++k) {
            const std::size_t i = items[k];
            const std::uint64_t n = std::min<std::uint64_t>(sizes[k], kTensorHeaderBytes);
            auto h = DecodeTensorHeader({heads[k].data(), n}, sizes[k]);
            if (!h.ok()) return h.status().WithContext("object " + Quote(keys[i]));
            MCS_RETURN_IF_ERROR(internal::CheckTensorBox(*h, expected[k], origins[k], keys[i]));
            MCS_ASSIGN_OR_RETURN(HostBuffer buffer, pool_->Allocate(expected[k].data_bytes));
            std::uint64_t at = 0;
            for (const auto& [offset, bytes] :
                 BoxRuns(h->local_shape, expected[k].local_shape, origins[k],
                         DTypeSize(h->dtype))) {
                const std::uint64_t row = h->data_offset + offset;
                reads.push_back({keys[i], member, row, row + bytes, {buffer.data() + at, bytes}});
                at += bytes;
            }
            reads.push_back({keys[i], member, 0, n, {again[k].data(), n}});
            out.push_back(std::move(buffer));
        }
        MCS_RETURN_IF_ERROR(store_->ReadRanges(reads));
        if (heads == again) return Status::Ok();
    }
    return Unavailable("tensors were rewritten " + std::to_string(kAttempts) +
                       " times while their boxes were read");
}

Status LocalTensorStore::CopyIntoCudaView(const TensorRef& dst, const PitchedCopyPlan& plan,
                                          const std::byte* src, std::uint64_t bytes,
                                          std::vector<HostBuffer>& staging, bool& pinned) {
    if (plan.gather) {
        MCS_ASSIGN_OR_RETURN(HostBuffer buffer, pool_->Allocate(bytes));
        StridedCopy(buffer.data(), {}, src + plan.gather_src_offset, plan.gather_strides,
                    plan.gather_shape, DTypeSize(dst.dtype));
        pinned = buffer.pinned();
        src = buffer.data();
        staging.push_back(std::move(buffer));
    }
    auto* base = reinterpret_cast<std::byte*>(dst.device.address);
    for (const PitchedCopy& c : plan.copies) {
        void* to = base + c.dst_offset;
        const std::byte* from = src + c.src_offset;
        if (c.height == 1) {
            MCS_RETURN_IF_ERROR(cuda::MemcpyAsync(to, from, c.width, cuda::CopyKind::kHostToDevice,
                                                  dst.stream, dst.device.device));
        } else {
            MCS_RETURN_IF_ERROR(cuda::Memcpy2DAsync(to, c.dst_pitch, from, c.src_pitch, c.width,
                                                    c.height, cuda::CopyKind::kHostToDevice,
                                                    dst.stream, dst.device.device));
        }
    }
    return Status::Ok();
}

Result<TensorInfo> LocalTensorStore::Stat(std::string_view key) {
    MCS_RETURN_IF_ERROR(internal::ValidateTensorKey(key, "tensor"));
    TensorInfo out;
    const std::string_view keys[] = {key};
    MCS_RETURN_IF_ERROR(store_->ViewObjects(keys, [&](std::span<const ObjectView> views) -> Status {
        MCS_ASSIGN_OR_RETURN(out.header, internal::ReadTensorObjectHeader(views[0], key));
        out.version = views[0].info->version;
        out.hard_pinned = views[0].info->hard_pinned;
        return Status::Ok();
    }));
    return out;
}

TensorCapabilities LocalTensorStore::Capabilities() const {
    const cuda::Support& s = cuda::GetSupport();
    TensorCapabilities c;
    c.backend = options_.backend;
    c.cuda_available = s.available;
    c.cuda_ipc_available = s.ipc_available;
    c.cuda_devices = s.device_count;
    c.cuda_detail = s.detail;
    c.host = pool_->Stats();
    return c;
}

TensorStoreStats LocalTensorStore::Stats() const {
    TensorStoreStats s;
    s.tensors_put = tensors_put_.load(std::memory_order_relaxed);
    s.bytes_put = bytes_put_.load(std::memory_order_relaxed);
    s.tensors_read = tensors_read_.load(std::memory_order_relaxed);
    s.bytes_read = bytes_read_.load(std::memory_order_relaxed);
    s.cuda_copies = cuda_copies_.load(std::memory_order_relaxed);
    s.pinned_copies = pinned_copies_.load(std::memory_order_relaxed);
    s.pageable_chunks = copier_.chunks_moved();
    s.pageable_copies = pageable_copies_.load(std::memory_order_relaxed);
    return s;
}

}  // namespace

std::unique_ptr<TensorStore> MakeLocalTensorStore(std::shared_ptr<ObjectStore> store,
                                                  const LocalTensorStoreOptions& options) {
    return std::make_unique<LocalTensorStore>(std::move(store), options);
}

}  // namespace mooncake::sparse
