// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon's message codec; see wire.h for the format.
//
// Decoding is written against hostile input: every read goes through WireReader's bounds check,
// every count is checked against the bytes left before anything is reserved (so a 4-byte count
// cannot make us allocate gigabytes), and recursion depth is fixed by the message grammar (no
// self-nested types), so decode time is linear in the input.
#include "store/wire.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <utility>

namespace mooncake::sparse::wire {
namespace {

// Lower bounds of encoded element sizes, for ReadCount. They only need to be <= the real
// minimum; they bound how much a count may make a decoder reserve.
constexpr std::size_t kMinStringBytes = 4;
constexpr std::size_t kMinBufferRefBytes = 1 + 8 + 8;
constexpr std::size_t kMinSegmentSliceBytes = 4 + 8 + 8;
constexpr std::size_t kMinSegmentInfoBytes = 4 + 8 + 1;
constexpr std::size_t kMinAxisBytes = kMinStringBytes + 8;
constexpr std::size_t kMinMemberInfoBytes = kMinStringBytes + 1 + 4 + 8 + 8;
constexpr std::size_t kMinPutMemberBytes = kMinStringBytes + 1 + 4 + 8 + kMinBufferRefBytes;
constexpr std::size_t kMinRangeItemBytes = 2 * kMinStringBytes + 16 + kMinBufferRefBytes;
constexpr std::size_t kMinBoxBytes = 4 + 4;
constexpr std::size_t kMinSourceDescriptorBytes =
    2 * kMinStringBytes + 4 + kMinBoxBytes + 16 + 4 + 1 + kMinStringBytes + 4 + 16 + 3;
constexpr std::size_t kMinTargetDescriptorBytes = 3 * kMinStringBytes + 4 + kMinBoxBytes;
constexpr std::size_t kMinSegmentMemberBytes = kMinSegmentSliceBytes + 8;
constexpr std::size_t kMinTargetObjectBytes = 2 * kMinStringBytes + kMinBoxBytes +
                                              kMinSourceDescriptorBytes + kMinStringBytes +
                                              4 * kMinSegmentMemberBytes + 8;
constexpr std::size_t kMinMetricBytes = kMinStringBytes + 8;
constexpr std::size_t kMinTensorLocationBytes = kMinBufferRefBytes + 8 + 8 + kMinStringBytes;
constexpr std::size_t kMinTensorItemBytes = kMinStringBytes + 1 + 4 + 4 + kMinTensorLocationBytes;

/// Vectors of structs reserve at most this many elements up front; beyond it they grow with the
/// elements actually decoded.
constexpr std::size_t kMaxReserve = 1024;

std::string Num(std::uint64_t v) { return std::to_string(v); }

template <typename T, typename DecodeOne>
Result<std::vector<T>> ReadVector(WireReader& r, std::size_t max_count,
                                  std::size_t min_element_bytes, std::string_view what,
                                  DecodeOne&& decode_one) {
    MCS_ASSIGN_OR_RETURN(std::size_t count, r.ReadCount(max_count, min_element_bytes, what));
    std::vector<T> out;
    out.reserve(std::min(count, kMaxReserve));
    for (std::size_t i = 0; i < count; ++i) {
        auto item = decode_one(r);
        if (!item.ok()) {
            return item.status().WithContext(std::string(what) + "[" + Num(i) + "]");
        }
        out.push_back(std::move(item).value());
    }
    return out;
}

template <typename T>
Result<std::vector<T>> ReadStructVector(WireReader& r, std::size_t max_count,
                                        std::size_t min_element_bytes, std::string_view what) {
    return ReadVector<T>(r, max_count, min_element_bytes, what,
                         [](WireReader& rr) { return T::Decode(rr); });
}

template <typename T>
void WriteStructVector(WireWriter& w, const std::vector<T>& v, std::size_t max_count,
                       std::string_view what) {
    w.WriteCount(v.size(), max_count, what);
    for (const T& item : v) item.Encode(w);
}

Status CheckNoOverflow(std::uint64_t offset, std::uint64_t size, std::string_view what) {
    if (size > UINT64_MAX - offset) {
        return InvalidArgument(std::string(what) + " offset " + Num(offset) + " + size " +
                               Num(size) + " overflows");
    }
    return Status::Ok();
}

Status CheckCoordinateSpace(const std::string& space) {
    if (space != "global" && space != "local") {
        return InvalidArgument("coordinate_space must be 'global' or 'local', got '" +
                               space.substr(0, 64) + "'");
    }
    return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// WireWriter.
// ---------------------------------------------------------------------------------------------

void WireWriter::Fail(Status s) {
    if (status_.ok() && !s.ok()) status_ = std::move(s);
}

void WireWriter::WriteString(std::string_view s, std::size_t max_bytes, std::string_view what) {
    WriteBytes(std::as_bytes(std::span<const char>(s.data(), s.size())), max_bytes, what);
}

void WireWriter::WriteBytes(std::span<const std::byte> b, std::size_t max_bytes,
                            std::string_view what) {
    if (b.size() > max_bytes || b.size() > UINT32_MAX) {
        Fail(InvalidArgument(std::string(what) + " is " + Num(b.size()) +
                             " bytes, more than the limit of " + Num(max_bytes)));
        WriteU32(0);
        return;
    }
    WriteU32(static_cast<std::uint32_t>(b.size()));
    buf_.insert(buf_.end(), b.begin(), b.end());
}

void WireWriter::WriteI64Vector(std::span<const std::int64_t> v, std::size_t max_count,
                                std::string_view what) {
    WriteCount(v.size(), max_count, what);
    if (v.size() > max_count) return;
    for (std::int64_t x : v) WriteI64(x);
}

void WireWriter::WriteCount(std::size_t count, std::size_t max_count, std::string_view what) {
    if (count > max_count || count > UINT32_MAX) {
        Fail(InvalidArgument(std::string(what) + " has " + Num(count) +
                             " elements, more than the limit of " + Num(max_count)));
    }
    WriteU32(static_cast<std::uint32_t>(std::min<std::size_t>(count, UINT32_MAX)));
}

void WireWriter::PatchU32(std::size_t offset, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_[offset + i] = static_cast<std::byte>(v >> (8 * i));
}

// ---------------------------------------------------------------------------------------------
// WireReader.
// ---------------------------------------------------------------------------------------------

Status WireReader::Need(std::size_t n) const {
    if (n > remaining()) {
        return InvalidArgument("truncated message: need " + Num(n) + " bytes at offset " +
                               Num(offset_) + ", have " + Num(remaining()));
    }
    return Status::Ok();
}

std::uint64_t WireReader::TakeLE(int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) {
        v |= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(data_[offset_ + i]))
             << (8 * i);
    }
    offset_ += static_cast<std::size_t>(n);
    return v;
}

Result<std::uint8_t> WireReader::ReadU8() {
    MCS_RETURN_IF_ERROR(Need(1));
    return static_cast<std::uint8_t>(TakeLE(1));
}
Result<std::uint16_t> WireReader::ReadU16() {
    MCS_RETURN_IF_ERROR(Need(2));
    return static_cast<std::uint16_t>(TakeLE(2));
}
Result<std::uint32_t> WireReader::ReadU32() {
    MCS_RETURN_IF_ERROR(Need(4));
    return static_cast<std::uint32_t>(TakeLE(4));
}
Result<std::uint64_t> WireReader::ReadU64() {
    MCS_RETURN_IF_ERROR(Need(8));
    return TakeLE(8);
}
Result<std::int64_t> WireReader::ReadI64() {
    MCS_RETURN_IF_ERROR(Need(8));
    return static_cast<std::int64_t>(TakeLE(8));
}
Result<bool> WireReader::ReadBool() {
    MCS_RETURN_IF_ERROR(Need(1));
    const std::size_t at = offset_;
    const auto v = static_cast<std::uint8_t>(TakeLE(1));
    if (v > 1) {
        offset_ = at;
        return InvalidArgument("invalid bool value " + Num(v) + " at offset " + Num(at));
    }
    return v == 1;
}
Result<double> WireReader::ReadF64() {
    MCS_RETURN_IF_ERROR(Need(8));
    return std::bit_cast<double>(TakeLE(8));
}

Result<std::vector<std::byte>> WireReader::ReadBytes(std::size_t max_bytes,
                                                     std::string_view what) {
    const std::size_t at = offset_;
    MCS_ASSIGN_OR_RETURN(std::uint32_t len, ReadU32());
    if (len > max_bytes) {
        offset_ = at;
        return InvalidArgument(std::string(what) + " length " + Num(len) + " at offset " +
                               Num(at) + " exceeds the limit of " + Num(max_bytes));
    }
    if (Status s = Need(len); !s.ok()) {
        offset_ = at;
        return s;
    }
    std::vector<std::byte> out(data_.begin() + static_cast<std::ptrdiff_t>(offset_),
                               data_.begin() + static_cast<std::ptrdiff_t>(offset_ + len));
    offset_ += len;
    return out;
}

Result<std::string> WireReader::ReadString(std::size_t max_bytes, std::string_view what) {
    const std::size_t at = offset_;
    MCS_ASSIGN_OR_RETURN(std::uint32_t len, ReadU32());
    if (len > max_bytes) {
        offset_ = at;
        return InvalidArgument(std::string(what) + " length " + Num(len) + " at offset " +
                               Num(at) + " exceeds the limit of " + Num(max_bytes));
    }
    if (Status s = Need(len); !s.ok()) {
        offset_ = at;
        return s;
    }
    std::string out(reinterpret_cast<const char*>(data_.data() + offset_), len);
    offset_ += len;
    return out;
}

Result<std::size_t> WireReader::ReadCount(std::size_t max_count, std::size_t min_element_bytes,
                                          std::string_view what) {
    const std::size_t at = offset_;
    MCS_ASSIGN_OR_RETURN(std::uint32_t count, ReadU32());
    if (count > max_count) {
        offset_ = at;
        return InvalidArgument(std::string(what) + " count " + Num(count) + " at offset " +
                               Num(at) + " exceeds the limit of " + Num(max_count));
    }
    // count <= 2^32 and min_element_bytes is a small constant: no overflow in 64 bits.
    const std::uint64_t need = std::uint64_t{count} * std::max<std::size_t>(min_element_bytes, 1);
    if (need > remaining()) {
        const std::size_t have = remaining();
        offset_ = at;
        return InvalidArgument("truncated message: need " + Num(need) + " bytes at offset " +
                               Num(at + 4) + ", have " + Num(have) + " (" + std::string(what) +
                               " count " + Num(count) + ")");
    }
    return static_cast<std::size_t>(count);
}

Result<std::vector<std::int64_t>> WireReader::ReadI64Vector(std::size_t max_count,
                                                            std::string_view what) {
    MCS_ASSIGN_OR_RETURN(std::size_t count, ReadCount(max_count, 8, what));
    std::vector<std::int64_t> out;
    out.reserve(count);  // count * 8 bytes are present: checked by ReadCount.
    for (std::size_t i = 0; i < count; ++i) out.push_back(static_cast<std::int64_t>(TakeLE(8)));
    return out;
}

Status WireReader::ExpectEnd() const {
    if (remaining() != 0) {
        return InvalidArgument(Num(remaining()) + " unexpected trailing bytes at offset " +
                               Num(offset_));
    }
    return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Frames.
// ---------------------------------------------------------------------------------------------

std::string_view MessageTypeName(MessageType type) {
    switch (type) {
        case MessageType::kHello: return "Hello";
        case MessageType::kHelloReply: return "HelloReply";
        case MessageType::kError: return "Error";
        case MessageType::kOk: return "Ok";
        case MessageType::kRegisterBuffer: return "RegisterBuffer";
        case MessageType::kPut: return "Put";
        case MessageType::kStat: return "Stat";
        case MessageType::kStatReply: return "StatReply";
        case MessageType::kReadMember: return "ReadMember";
        case MessageType::kReadRanges: return "ReadRanges";
        case MessageType::kRemove: return "Remove";
        case MessageType::kList: return "List";
        case MessageType::kListReply: return "ListReply";
        case MessageType::kLease: return "Lease";
        case MessageType::kLeaseReply: return "LeaseReply";
        case MessageType::kRelease: return "Release";
        case MessageType::kSparseCommit: return "SparseCommit";
        case MessageType::kSparseCommitReply: return "SparseCommitReply";
        case MessageType::kSparseAdmit: return "SparseAdmit";
        case MessageType::kSparseAdmitReply: return "SparseAdmitReply";
        case MessageType::kSparseManifest: return "SparseManifest";
        case MessageType::kSparseManifestReply: return "SparseManifestReply";
        case MessageType::kSparseCurrentGeneration: return "SparseCurrentGeneration";
        case MessageType::kSparseCurrentGenerationReply: return "SparseCurrentGenerationReply";
        case MessageType::kSparseRead: return "SparseRead";
        case MessageType::kSparseReadReply: return "SparseReadReply";
        case MessageType::kMetrics: return "Metrics";
        case MessageType::kMetricsReply: return "MetricsReply";
        case MessageType::kClearCaches: return "ClearCaches";
        case MessageType::kTensorPut: return "TensorPut";
        case MessageType::kTensorGet: return "TensorGet";
    }
    return "Unknown";
}

bool IsKnownMessageType(std::uint16_t value) {
    return MessageTypeName(static_cast<MessageType>(value)) != "Unknown";
}

bool IsReplyType(MessageType type) {
    switch (type) {
        case MessageType::kHelloReply:
        case MessageType::kError:
        case MessageType::kOk:
        case MessageType::kStatReply:
        case MessageType::kListReply:
        case MessageType::kLeaseReply:
        case MessageType::kSparseCommitReply:
        case MessageType::kSparseAdmitReply:
        case MessageType::kSparseManifestReply:
        case MessageType::kSparseCurrentGenerationReply:
        case MessageType::kSparseReadReply:
        case MessageType::kMetricsReply: return true;
        default: return false;
    }
}

void EncodeFrameHeader(const FrameHeader& h, std::span<std::byte, kFrameHeaderBytes> out) {
    auto put = [&](std::size_t at, std::uint64_t v, int n) {
        for (int i = 0; i < n; ++i) out[at + i] = static_cast<std::byte>(v >> (8 * i));
    };
    put(0, kWireMagic, 4);
    put(4, h.version, 2);
    put(6, static_cast<std::uint16_t>(h.type), 2);
    put(8, h.request_id, 8);
    put(16, h.payload_len, 4);
    put(20, h.flags, 4);
}

Result<FrameHeader> DecodeFrameHeader(std::span<const std::byte> bytes) {
    if (bytes.size() < kFrameHeaderBytes) {
        return InvalidArgument("truncated message: need " + Num(kFrameHeaderBytes) +
                               " bytes at offset 0, have " + Num(bytes.size()) +
                               " (frame header)");
    }
    WireReader r(bytes.first(kFrameHeaderBytes));
    const std::uint32_t magic = *r.ReadU32();
    if (magic != kWireMagic) {
        return InvalidArgument("bad frame magic 0x" + [&] {
            char buf[9];
            std::snprintf(buf, sizeof buf, "%08x", magic);
            return std::string(buf);
        }() + " (not a mooncake-sparse node daemon peer?)");
    }
    FrameHeader h;
    h.version = *r.ReadU16();
    if (h.version != kWireVersion) {
        return InvalidArgument("unsupported frame version " + Num(h.version) + " (expected " +
                               Num(kWireVersion) + ")");
    }
    const std::uint16_t type = *r.ReadU16();
    if (!IsKnownMessageType(type)) {
        return InvalidArgument("unknown message type " + Num(type));
    }
    h.type = static_cast<MessageType>(type);
    h.request_id = *r.ReadU64();
    h.payload_len = *r.ReadU32();
    if (h.payload_len > kMaxPayloadBytes) {
        return InvalidArgument("frame payload of " + Num(h.payload_len) +
                               " bytes exceeds the limit of " + Num(kMaxPayloadBytes));
    }
    h.flags = *r.ReadU32();
    if (h.flags != 0) {
        return InvalidArgument("unknown frame flags 0x" + [&] {
            char buf[9];
            std::snprintf(buf, sizeof buf, "%08x", h.flags);
            return std::string(buf);
        }());
    }
    return h;
}

Result<Frame> DecodeFrame(std::span<const std::byte> bytes) {
    MCS_ASSIGN_OR_RETURN(FrameHeader h, DecodeFrameHeader(bytes));
    const std::size_t have = bytes.size() - kFrameHeaderBytes;
    if (have < h.payload_len) {
        return InvalidArgument("truncated message: need " + Num(h.payload_len) +
                               " bytes at offset " + Num(kFrameHeaderBytes) + ", have " +
                               Num(have) + " (frame payload)");
    }
    if (have > h.payload_len) {
        return InvalidArgument("frame has " + Num(have - h.payload_len) +
                               " bytes after its payload of " + Num(h.payload_len));
    }
    return Frame{h, bytes.subspan(kFrameHeaderBytes)};
}

// ---------------------------------------------------------------------------------------------
// Shared pieces.
// ---------------------------------------------------------------------------------------------

Result<DType> DecodeDType(WireReader& r) {
    const std::size_t at = r.offset();
    MCS_ASSIGN_OR_RETURN(std::uint8_t v, r.ReadU8());
    if (v >= kNumDTypes) {
        return InvalidArgument("unknown dtype " + Num(v) + " at offset " + Num(at));
    }
    return static_cast<DType>(v);
}

void BufferRef::Encode(WireWriter& w) const {
    w.WriteU8(static_cast<std::uint8_t>(kind));
    w.WriteU64(offset);
    w.WriteU64(size);
    if (size > UINT64_MAX - offset) {
        w.Fail(InvalidArgument("buffer offset + size overflows"));
    }
    if (kind == BufferKind::kCudaIpc) {
        if (cuda_ipc_handle.size() != kCudaIpcHandleBytes) {
            w.Fail(InvalidArgument("cuda_ipc_handle must be " + Num(kCudaIpcHandleBytes) +
                                   " bytes, got " + Num(cuda_ipc_handle.size())));
        }
        if (device < 0) w.Fail(InvalidArgument("cuda device ordinal is negative"));
        w.WriteString(cuda_ipc_handle, kCudaIpcHandleBytes, "cuda_ipc_handle");
        w.WriteU32(static_cast<std::uint32_t>(device));
    } else if (kind == BufferKind::kClientBuffer) {
        if (!cuda_ipc_handle.empty() || device != -1) {
            w.Fail(InvalidArgument("a client-buffer reference carries no CUDA handle/device"));
        }
    } else {
        w.Fail(InvalidArgument("unknown buffer kind " + Num(static_cast<std::uint8_t>(kind))));
    }
}

Result<BufferRef> BufferRef::Decode(WireReader& r) {
    BufferRef b;
    const std::size_t at = r.offset();
    MCS_ASSIGN_OR_RETURN(std::uint8_t kind, r.ReadU8());
    if (kind > static_cast<std::uint8_t>(BufferKind::kCudaIpc)) {
        return InvalidArgument("unknown buffer kind " + Num(kind) + " at offset " + Num(at));
    }
    b.kind = static_cast<BufferKind>(kind);
    MCS_ASSIGN_OR_RETURN(b.offset, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(b.size, r.ReadU64());
    MCS_RETURN_IF_ERROR(CheckNoOverflow(b.offset, b.size, "buffer"));
    if (b.kind == BufferKind::kCudaIpc) {
        MCS_ASSIGN_OR_RETURN(b.cuda_ipc_handle, r.ReadString(kCudaIpcHandleBytes, "cuda_ipc_handle"));
        if (b.cuda_ipc_handle.size() != kCudaIpcHandleBytes) {
            return InvalidArgument("cuda_ipc_handle must be " + Num(kCudaIpcHandleBytes) +
                                   " bytes, got " + Num(b.cuda_ipc_handle.size()));
        }
        MCS_ASSIGN_OR_RETURN(std::uint32_t device, r.ReadU32());
        if (device > static_cast<std::uint32_t>(INT32_MAX)) {
            return InvalidArgument("cuda device ordinal " + Num(device) + " out of range");
        }
        b.device = static_cast<std::int32_t>(device);
    }
    return b;
}

void SegmentSlice::Encode(WireWriter& w) const {
    w.WriteU32(segment_id);
    w.WriteU64(offset);
    w.WriteU64(size);
    if (size > UINT64_MAX - offset) w.Fail(InvalidArgument("segment offset + size overflows"));
}

Result<SegmentSlice> SegmentSlice::Decode(WireReader& r) {
    SegmentSlice s;
    MCS_ASSIGN_OR_RETURN(s.segment_id, r.ReadU32());
    MCS_ASSIGN_OR_RETURN(s.offset, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(s.size, r.ReadU64());
    MCS_RETURN_IF_ERROR(CheckNoOverflow(s.offset, s.size, "segment slice"));
    return s;
}

void SegmentInfo::Encode(WireWriter& w) const {
    w.WriteU32(segment_id);
    w.WriteU64(size);
    w.WriteBool(read_only);
}

Result<SegmentInfo> SegmentInfo::Decode(WireReader& r) {
    SegmentInfo s;
    MCS_ASSIGN_OR_RETURN(s.segment_id, r.ReadU32());
    MCS_ASSIGN_OR_RETURN(s.size, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(s.read_only, r.ReadBool());
    return s;
}

void EncodeGeneration(WireWriter& w, const Generation& g) {
    if (g.delta <= g.base) w.Fail(InvalidArgument("generation " + g.ToString() + " has delta <= base"));
    w.WriteU64(g.base);
    w.WriteU64(g.delta);
}

Result<Generation> DecodeGeneration(WireReader& r) {
    MCS_ASSIGN_OR_RETURN(std::uint64_t base, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(std::uint64_t delta, r.ReadU64());
    return Generation::Make(base, delta);
}

void EncodeBox(WireWriter& w, const Box& box) {
    w.WriteI64Vector(box.origin(), kMaxRank, "box origin");
    w.WriteI64Vector(box.shape(), kMaxRank, "box shape");
}

Result<Box> DecodeBox(WireReader& r) {
    MCS_ASSIGN_OR_RETURN(std::vector<std::int64_t> origin, r.ReadI64Vector(kMaxRank, "box origin"));
    MCS_ASSIGN_OR_RETURN(std::vector<std::int64_t> shape, r.ReadI64Vector(kMaxRank, "box shape"));
    return Box::Make(origin, shape);
}

void EncodeNamedAxes(WireWriter& w, const NamedAxes& axes) {
    w.WriteCount(axes.entries().size(), kMaxAxes, "placement axes");
    for (const auto& [name, ordinal] : axes.entries()) {
        w.WriteString(name, kMaxNameBytes, "placement axis name");
        w.WriteI64(ordinal);
    }
}

Result<NamedAxes> DecodeNamedAxes(WireReader& r) {
    using Entry = NamedAxes::Entry;
    MCS_ASSIGN_OR_RETURN(
        std::vector<Entry> entries,
        ReadVector<Entry>(r, kMaxAxes, kMinAxisBytes, "placement axes",
                          [](WireReader& rr) -> Result<Entry> {
                              MCS_ASSIGN_OR_RETURN(std::string name,
                                                   rr.ReadString(kMaxNameBytes, "axis name"));
                              MCS_ASSIGN_OR_RETURN(std::int64_t ordinal, rr.ReadI64());
                              return Entry{std::move(name), ordinal};
                          }));
    return NamedAxes::Make(std::move(entries));
}

void EncodePlacementPolicy(WireWriter& w, const PlacementPolicy& policy) {
    w.WriteU8(static_cast<std::uint8_t>(policy.kind()));
    w.WriteString(policy.axis(), kMaxNameBytes, "policy axis");
}

Result<PlacementPolicy> DecodePlacementPolicy(WireReader& r) {
    const std::size_t at = r.offset();
    MCS_ASSIGN_OR_RETURN(std::uint8_t kind, r.ReadU8());
    MCS_ASSIGN_OR_RETURN(std::string axis, r.ReadString(kMaxNameBytes, "policy axis"));
    switch (static_cast<PlacementPolicy::Kind>(kind)) {
        case PlacementPolicy::Kind::kNone:
            if (!axis.empty()) return InvalidArgument("policy 'none' carries an axis");
            return PlacementPolicy::None();
        case PlacementPolicy::Kind::kOwner: return PlacementPolicy::Owner(std::move(axis));
        case PlacementPolicy::Kind::kReplicate: return PlacementPolicy::Replicate(std::move(axis));
    }
    return InvalidArgument("unknown placement policy kind " + Num(kind) + " at offset " + Num(at));
}

void EncodeSourceDescriptor(WireWriter& w, const SourceDescriptor& d) {
    w.WriteString(d.source_ref, kMaxKeyBytes, "source_ref");
    w.WriteString(d.tensor_id, kMaxNameBytes, "tensor_id");
    w.WriteI64Vector(d.global_shape, kMaxRank, "global_shape");
    EncodeBox(w, d.box);
    EncodeGeneration(w, d.generation);
    EncodeNamedAxes(w, d.placement);
    EncodePlacementPolicy(w, d.policy);
    w.WriteI64Vector(d.tile_shape, kMaxRank, "tile_shape");
    w.WriteU64(d.nnz);
    w.WriteU64(d.num_tiles);
    w.WriteU8(static_cast<std::uint8_t>(d.apply));
    w.WriteU8(static_cast<std::uint8_t>(d.index_dtype));
    w.WriteU8(static_cast<std::uint8_t>(d.value_dtype));
}

Result<SourceDescriptor> DecodeSourceDescriptor(WireReader& r) {
    SourceDescriptor d;
    MCS_ASSIGN_OR_RETURN(d.source_ref, r.ReadString(kMaxKeyBytes, "source_ref"));
    MCS_ASSIGN_OR_RETURN(d.tensor_id, r.ReadString(kMaxNameBytes, "tensor_id"));
    MCS_ASSIGN_OR_RETURN(d.global_shape, r.ReadI64Vector(kMaxRank, "global_shape"));
    MCS_ASSIGN_OR_RETURN(d.box, DecodeBox(r));
    MCS_ASSIGN_OR_RETURN(d.generation, DecodeGeneration(r));
    MCS_ASSIGN_OR_RETURN(d.placement, DecodeNamedAxes(r));
    MCS_ASSIGN_OR_RETURN(d.policy, DecodePlacementPolicy(r));
    MCS_ASSIGN_OR_RETURN(d.tile_shape, r.ReadI64Vector(kMaxRank, "tile_shape"));
    MCS_ASSIGN_OR_RETURN(d.nnz, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(d.num_tiles, r.ReadU64());
    const std::size_t at = r.offset();
    MCS_ASSIGN_OR_RETURN(std::uint8_t apply, r.ReadU8());
    if (apply > static_cast<std::uint8_t>(ApplyMode::kScatterAdd)) {
        return InvalidArgument("unknown apply mode " + Num(apply) + " at offset " + Num(at));
    }
    d.apply = static_cast<ApplyMode>(apply);
    MCS_ASSIGN_OR_RETURN(d.index_dtype, DecodeDType(r));
    MCS_ASSIGN_OR_RETURN(d.value_dtype, DecodeDType(r));
    return SourceDescriptor::Make(std::move(d));
}

void EncodeTargetDescriptor(WireWriter& w, const TargetDescriptor& t) {
    w.WriteString(t.target_id, kMaxNameBytes, "target_id");
    w.WriteString(t.node_id, kMaxNameBytes, "node_id");
    w.WriteString(t.tensor_id, kMaxNameBytes, "tensor_id");
    EncodeNamedAxes(w, t.placement);
    EncodeBox(w, t.box);
}

Result<TargetDescriptor> DecodeTargetDescriptor(WireReader& r) {
    MCS_ASSIGN_OR_RETURN(std::string target_id, r.ReadString(kMaxNameBytes, "target_id"));
    MCS_ASSIGN_OR_RETURN(std::string node_id, r.ReadString(kMaxNameBytes, "node_id"));
    MCS_ASSIGN_OR_RETURN(std::string tensor_id, r.ReadString(kMaxNameBytes, "tensor_id"));
    MCS_ASSIGN_OR_RETURN(NamedAxes placement, DecodeNamedAxes(r));
    MCS_ASSIGN_OR_RETURN(std::vector<std::int64_t> origin, r.ReadI64Vector(kMaxRank, "box origin"));
    MCS_ASSIGN_OR_RETURN(std::vector<std::int64_t> shape, r.ReadI64Vector(kMaxRank, "box shape"));
    return TargetDescriptor::Make(std::move(target_id), std::move(node_id), std::move(tensor_id),
                                  std::move(placement), std::move(origin), std::move(shape));
}

namespace {

void EncodeMemberInfo(WireWriter& w, const MemberInfo& m) {
    w.WriteString(m.name, kMaxNameBytes, "member name");
    w.WriteU8(static_cast<std::uint8_t>(m.dtype));
    w.WriteI64Vector(m.shape, kMaxRank, "member shape");
    w.WriteU64(m.size_bytes);
    w.WriteU64(m.checksum);
}

Result<MemberInfo> DecodeMemberInfo(WireReader& r) {
    MemberInfo m;
    MCS_ASSIGN_OR_RETURN(m.name, r.ReadString(kMaxNameBytes, "member name"));
    MCS_ASSIGN_OR_RETURN(m.dtype, DecodeDType(r));
    MCS_ASSIGN_OR_RETURN(m.shape, r.ReadI64Vector(kMaxRank, "member shape"));
    MCS_ASSIGN_OR_RETURN(m.size_bytes, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(m.checksum, r.ReadU64());
    return m;
}

}  // namespace

void EncodeObjectInfo(WireWriter& w, const ObjectInfo& info) {
    w.WriteString(info.key, kMaxKeyBytes, "key");
    w.WriteString(info.metadata, kMaxMetadataBytes, "metadata");
    w.WriteCount(info.members.size(), kMaxMembers, "members");
    for (const MemberInfo& m : info.members) EncodeMemberInfo(w, m);
    w.WriteU64(info.version);
    w.WriteBool(info.hard_pinned);
}

Result<ObjectInfo> DecodeObjectInfo(WireReader& r) {
    ObjectInfo info;
    MCS_ASSIGN_OR_RETURN(info.key, r.ReadString(kMaxKeyBytes, "key"));
    MCS_ASSIGN_OR_RETURN(info.metadata, r.ReadString(kMaxMetadataBytes, "metadata"));
    MCS_ASSIGN_OR_RETURN(info.members,
                         ReadVector<MemberInfo>(r, kMaxMembers, kMinMemberInfoBytes, "members",
                                                DecodeMemberInfo));
    MCS_ASSIGN_OR_RETURN(info.version, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(info.hard_pinned, r.ReadBool());
    return info;
}

bool SameObjectInfo(const ObjectInfo& a, const ObjectInfo& b) {
    auto same_member = [](const MemberInfo& x, const MemberInfo& y) {
        return x.name == y.name && x.dtype == y.dtype && x.shape == y.shape &&
               x.size_bytes == y.size_bytes && x.checksum == y.checksum;
    };
    return a.key == b.key && a.metadata == b.metadata && a.version == b.version &&
           a.hard_pinned == b.hard_pinned &&
           std::equal(a.members.begin(), a.members.end(), b.members.begin(), b.members.end(),
                      same_member);
}

// ---------------------------------------------------------------------------------------------
// Messages.
// ---------------------------------------------------------------------------------------------

void HelloRequest::Encode(WireWriter& w) const {
    w.WriteU32(protocol_version);
    w.WriteU32(pid);
    w.WriteString(client_name, kMaxNameBytes, "client_name");
}

Result<HelloRequest> HelloRequest::Decode(WireReader& r) {
    HelloRequest m;
    MCS_ASSIGN_OR_RETURN(m.protocol_version, r.ReadU32());
    MCS_ASSIGN_OR_RETURN(m.pid, r.ReadU32());
    MCS_ASSIGN_OR_RETURN(m.client_name, r.ReadString(kMaxNameBytes, "client_name"));
    return m;
}

void HelloReply::Encode(WireWriter& w) const {
    w.WriteU32(protocol_version);
    w.WriteString(daemon_version, kMaxNameBytes, "daemon_version");
    w.WriteString(node_id, kMaxNameBytes, "node_id");
    std::set<std::uint32_t> ids;
    for (const SegmentInfo& s : segments) {
        if (!ids.insert(s.segment_id).second) {
            w.Fail(InvalidArgument("segment id " + Num(s.segment_id) + " repeated"));
        }
    }
    WriteStructVector(w, segments, kMaxSegments, "segments");
    w.WriteU64(client_buffer_max);
}

Result<HelloReply> HelloReply::Decode(WireReader& r) {
    HelloReply m;
    MCS_ASSIGN_OR_RETURN(m.protocol_version, r.ReadU32());
    MCS_ASSIGN_OR_RETURN(m.daemon_version, r.ReadString(kMaxNameBytes, "daemon_version"));
    MCS_ASSIGN_OR_RETURN(m.node_id, r.ReadString(kMaxNameBytes, "node_id"));
    MCS_ASSIGN_OR_RETURN(m.segments, ReadStructVector<SegmentInfo>(r, kMaxSegments,
                                                                   kMinSegmentInfoBytes,
                                                                   "segments"));
    std::set<std::uint32_t> ids;
    for (const SegmentInfo& s : m.segments) {
        if (!ids.insert(s.segment_id).second) {
            return InvalidArgument("segment id " + Num(s.segment_id) + " repeated");
        }
    }
    MCS_ASSIGN_OR_RETURN(m.client_buffer_max, r.ReadU64());
    return m;
}

ErrorReply ErrorReply::FromStatus(const Status& status) {
    if (status.ok()) return {StatusCode::kInternal, "error reply built from an OK status"};
    std::string message = status.message();
    if (message.size() > kMaxMessageBytes) {
        message.resize(kMaxMessageBytes - 3);
        message += "...";
    }
    StatusCode code = status.code();
    if (static_cast<int>(code) < 1 || static_cast<int>(code) > static_cast<int>(kLastStatusCode)) {
        code = StatusCode::kInternal;
    }
    return {code, std::move(message)};
}

void ErrorReply::Encode(WireWriter& w) const {
    const int c = static_cast<int>(code);
    if (c < 1 || c > static_cast<int>(kLastStatusCode)) {
        w.Fail(InvalidArgument("error reply with invalid status code " + std::to_string(c)));
    }
    w.WriteU32(static_cast<std::uint32_t>(c));
    w.WriteString(message, kMaxMessageBytes, "error message");
}

Result<ErrorReply> ErrorReply::Decode(WireReader& r) {
    const std::size_t at = r.offset();
    MCS_ASSIGN_OR_RETURN(std::uint32_t code, r.ReadU32());
    if (code < 1 || code > static_cast<std::uint32_t>(kLastStatusCode)) {
        return InvalidArgument("invalid status code " + Num(code) + " at offset " + Num(at));
    }
    ErrorReply m;
    m.code = static_cast<StatusCode>(code);
    MCS_ASSIGN_OR_RETURN(m.message, r.ReadString(kMaxMessageBytes, "error message"));
    return m;
}

void RegisterBufferRequest::Encode(WireWriter& w) const { w.WriteU64(size); }

Result<RegisterBufferRequest> RegisterBufferRequest::Decode(WireReader& r) {
    RegisterBufferRequest m;
    MCS_ASSIGN_OR_RETURN(m.size, r.ReadU64());
    return m;
}

void PutMember::Encode(WireWriter& w) const {
    w.WriteString(name, kMaxNameBytes, "member name");
    w.WriteU8(static_cast<std::uint8_t>(dtype));
    w.WriteI64Vector(shape, kMaxRank, "member shape");
    w.WriteU64(checksum);
    src.Encode(w);
}

Result<PutMember> PutMember::Decode(WireReader& r) {
    PutMember m;
    MCS_ASSIGN_OR_RETURN(m.name, r.ReadString(kMaxNameBytes, "member name"));
    MCS_ASSIGN_OR_RETURN(m.dtype, DecodeDType(r));
    MCS_ASSIGN_OR_RETURN(m.shape, r.ReadI64Vector(kMaxRank, "member shape"));
    MCS_ASSIGN_OR_RETURN(m.checksum, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(m.src, BufferRef::Decode(r));
    return m;
}

void PutRequest::Encode(WireWriter& w) const {
    w.WriteString(key, kMaxKeyBytes, "key");
    w.WriteString(metadata, kMaxMetadataBytes, "metadata");
    WriteStructVector(w, members, kMaxMembers, "members");
    w.WriteU8(static_cast<std::uint8_t>(mode));
    w.WriteBool(hard_pin);
}

Result<PutRequest> PutRequest::Decode(WireReader& r) {
    PutRequest m;
    MCS_ASSIGN_OR_RETURN(m.key, r.ReadString(kMaxKeyBytes, "key"));
    MCS_ASSIGN_OR_RETURN(m.metadata, r.ReadString(kMaxMetadataBytes, "metadata"));
    MCS_ASSIGN_OR_RETURN(m.members, ReadStructVector<PutMember>(r, kMaxMembers, kMinPutMemberBytes,
                                                                "members"));
    const std::size_t at = r.offset();
    MCS_ASSIGN_OR_RETURN(std::uint8_t mode, r.ReadU8());
    if (mode > static_cast<std::uint8_t>(PutMode::kUpsert)) {
        return InvalidArgument("unknown put mode " + Num(mode) + " at offset " + Num(at));
    }
    m.mode = static_cast<PutMode>(mode);
    MCS_ASSIGN_OR_RETURN(m.hard_pin, r.ReadBool());
    return m;
}

void StatRequest::Encode(WireWriter& w) const { w.WriteString(key, kMaxKeyBytes, "key"); }

Result<StatRequest> StatRequest::Decode(WireReader& r) {
    StatRequest m;
    MCS_ASSIGN_OR_RETURN(m.key, r.ReadString(kMaxKeyBytes, "key"));
    return m;
}

void StatReply::Encode(WireWriter& w) const { EncodeObjectInfo(w, info); }

Result<StatReply> StatReply::Decode(WireReader& r) {
    StatReply m;
    MCS_ASSIGN_OR_RETURN(m.info, DecodeObjectInfo(r));
    return m;
}

void ReadMemberRequest::Encode(WireWriter& w) const {
    w.WriteString(key, kMaxKeyBytes, "key");
    w.WriteString(member, kMaxNameBytes, "member");
    dst.Encode(w);
}

Result<ReadMemberRequest> ReadMemberRequest::Decode(WireReader& r) {
    ReadMemberRequest m;
    MCS_ASSIGN_OR_RETURN(m.key, r.ReadString(kMaxKeyBytes, "key"));
    MCS_ASSIGN_OR_RETURN(m.member, r.ReadString(kMaxNameBytes, "member"));
    MCS_ASSIGN_OR_RETURN(m.dst, BufferRef::Decode(r));
    return m;
}

void RangeItem::Encode(WireWriter& w) const {
    w.WriteString(key, kMaxKeyBytes, "key");
    w.WriteString(member, kMaxNameBytes, "member");
    w.WriteU64(row_start);
    w.WriteU64(row_end);
    dst.Encode(w);
}

Result<RangeItem> RangeItem::Decode(WireReader& r) {
    RangeItem m;
    MCS_ASSIGN_OR_RETURN(m.key, r.ReadString(kMaxKeyBytes, "key"));
    MCS_ASSIGN_OR_RETURN(m.member, r.ReadString(kMaxNameBytes, "member"));
    MCS_ASSIGN_OR_RETURN(m.row_start, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(m.row_end, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(m.dst, BufferRef::Decode(r));
    return m;
}

void ReadRangesRequest::Encode(WireWriter& w) const {
    WriteStructVector(w, items, kMaxBatchItems, "range items");
}

Result<ReadRangesRequest> ReadRangesRequest::Decode(WireReader& r) {
    ReadRangesRequest m;
    MCS_ASSIGN_OR_RETURN(m.items, ReadStructVector<RangeItem>(r, kMaxBatchItems,
                                                              kMinRangeItemBytes, "range items"));
    return m;
}

void RemoveRequest::Encode(WireWriter& w) const { w.WriteString(key, kMaxKeyBytes, "key"); }

Result<RemoveRequest> RemoveRequest::Decode(WireReader& r) {
    RemoveRequest m;
    MCS_ASSIGN_OR_RETURN(m.key, r.ReadString(kMaxKeyBytes, "key"));
    return m;
}

void ListRequest::Encode(WireWriter& w) const { w.WriteString(prefix, kMaxKeyBytes, "prefix"); }

Result<ListRequest> ListRequest::Decode(WireReader& r) {
    ListRequest m;
    MCS_ASSIGN_OR_RETURN(m.prefix, r.ReadString(kMaxKeyBytes, "prefix"));
    return m;
}

void ListReply::Encode(WireWriter& w) const {
    w.WriteCount(keys.size(), kMaxListKeys, "keys");
    for (const std::string& k : keys) w.WriteString(k, kMaxKeyBytes, "key");
}

Result<ListReply> ListReply::Decode(WireReader& r) {
    ListReply m;
    MCS_ASSIGN_OR_RETURN(m.keys, ReadVector<std::string>(r, kMaxListKeys, kMinStringBytes, "keys",
                                                         [](WireReader& rr) {
                                                             return rr.ReadString(kMaxKeyBytes,
                                                                                  "key");
                                                         }));
    return m;
}

void LeaseRequest::Encode(WireWriter& w) const { w.WriteString(key, kMaxKeyBytes, "key"); }

Result<LeaseRequest> LeaseRequest::Decode(WireReader& r) {
    LeaseRequest m;
    MCS_ASSIGN_OR_RETURN(m.key, r.ReadString(kMaxKeyBytes, "key"));
    return m;
}

void LeaseReply::Encode(WireWriter& w) const {
    w.WriteU64(lease_id);
    EncodeObjectInfo(w, info);
    if (locations.size() != info.members.size()) {
        w.Fail(InvalidArgument("lease reply has " + Num(locations.size()) + " locations for " +
                               Num(info.members.size()) + " members"));
    }
    WriteStructVector(w, locations, kMaxMembers, "locations");
}

Result<LeaseReply> LeaseReply::Decode(WireReader& r) {
    LeaseReply m;
    MCS_ASSIGN_OR_RETURN(m.lease_id, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(m.info, DecodeObjectInfo(r));
    MCS_ASSIGN_OR_RETURN(m.locations, ReadStructVector<SegmentSlice>(r, kMaxMembers,
                                                                     kMinSegmentSliceBytes,
                                                                     "locations"));
    if (m.locations.size() != m.info.members.size()) {
        return InvalidArgument("lease reply has " + Num(m.locations.size()) +
                               " locations for " + Num(m.info.members.size()) + " members");
    }
    return m;
}

void ReleaseRequest::Encode(WireWriter& w) const {
    if (lease_ids.empty()) w.Fail(InvalidArgument("release of no lease ids"));
    w.WriteCount(lease_ids.size(), kMaxBatchItems, "lease_ids");
    for (std::uint64_t id : lease_ids) w.WriteU64(id);
}

Result<ReleaseRequest> ReleaseRequest::Decode(WireReader& r) {
    ReleaseRequest m;
    MCS_ASSIGN_OR_RETURN(std::size_t count, r.ReadCount(kMaxBatchItems, 8, "lease_ids"));
    if (count == 0) return InvalidArgument("release of no lease ids");
    m.lease_ids.reserve(count);  // count * 8 bytes are present.
    for (std::size_t i = 0; i < count; ++i) {
        MCS_ASSIGN_OR_RETURN(std::uint64_t id, r.ReadU64());
        m.lease_ids.push_back(id);
    }
    return m;
}

void ClientMember::Encode(WireWriter& w) const {
    src.Encode(w);
    w.WriteU64(checksum);
}

Result<ClientMember> ClientMember::Decode(WireReader& r) {
    ClientMember m;
    MCS_ASSIGN_OR_RETURN(m.src, BufferRef::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.checksum, r.ReadU64());
    return m;
}

void SparseCommitRequest::Encode(WireWriter& w) const {
    EncodeSourceDescriptor(w, desc);
    w.Fail(CheckCoordinateSpace(coordinate_space));
    w.WriteString(coordinate_space, kMaxNameBytes, "coordinate_space");
    indices.Encode(w);
    values.Encode(w);
    tile_coords.Encode(w);
    tile_ptr.Encode(w);
    w.WriteBool(hard_pin);
}

Result<SparseCommitRequest> SparseCommitRequest::Decode(WireReader& r) {
    SparseCommitRequest m;
    MCS_ASSIGN_OR_RETURN(m.desc, DecodeSourceDescriptor(r));
    MCS_ASSIGN_OR_RETURN(m.coordinate_space, r.ReadString(kMaxNameBytes, "coordinate_space"));
    MCS_RETURN_IF_ERROR(CheckCoordinateSpace(m.coordinate_space));
    MCS_ASSIGN_OR_RETURN(m.indices, ClientMember::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.values, ClientMember::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.tile_coords, ClientMember::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.tile_ptr, ClientMember::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.hard_pin, r.ReadBool());
    return m;
}

void SparseCommitReply::Encode(WireWriter& w) const {
    w.WriteString(source_ref, kMaxKeyBytes, "source_ref");
    w.WriteBool(created);
    w.WriteU64(nnz);
    w.WriteU64(bytes);
}

Result<SparseCommitReply> SparseCommitReply::Decode(WireReader& r) {
    SparseCommitReply m;
    MCS_ASSIGN_OR_RETURN(m.source_ref, r.ReadString(kMaxKeyBytes, "source_ref"));
    MCS_ASSIGN_OR_RETURN(m.created, r.ReadBool());
    MCS_ASSIGN_OR_RETURN(m.nnz, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(m.bytes, r.ReadU64());
    return m;
}

void SparseAdmitRequest::Encode(WireWriter& w) const {
    w.WriteString(tensor_id, kMaxNameBytes, "tensor_id");
    EncodeGeneration(w, generation);
    EncodePlacementPolicy(w, policy);
    EncodeNamedAxes(w, source_placement);
    w.WriteString(writer_id, kMaxNameBytes, "writer_id");
}

Result<SparseAdmitRequest> SparseAdmitRequest::Decode(WireReader& r) {
    SparseAdmitRequest m;
    MCS_ASSIGN_OR_RETURN(m.tensor_id, r.ReadString(kMaxNameBytes, "tensor_id"));
    MCS_ASSIGN_OR_RETURN(m.generation, DecodeGeneration(r));
    MCS_ASSIGN_OR_RETURN(m.policy, DecodePlacementPolicy(r));
    MCS_ASSIGN_OR_RETURN(m.source_placement, DecodeNamedAxes(r));
    MCS_ASSIGN_OR_RETURN(m.writer_id, r.ReadString(kMaxNameBytes, "writer_id"));
    return m;
}

void SparseAdmitReply::Encode(WireWriter& w) const { w.WriteBool(admitted); }

Result<SparseAdmitReply> SparseAdmitReply::Decode(WireReader& r) {
    SparseAdmitReply m;
    MCS_ASSIGN_OR_RETURN(m.admitted, r.ReadBool());
    return m;
}

void SparseManifestRequest::Encode(WireWriter& w) const { EncodeGeneration(w, generation); }

Result<SparseManifestRequest> SparseManifestRequest::Decode(WireReader& r) {
    SparseManifestRequest m;
    MCS_ASSIGN_OR_RETURN(m.generation, DecodeGeneration(r));
    return m;
}

void SparseManifestReply::Encode(WireWriter& w) const {
    w.WriteCount(sources.size(), kMaxBatchItems, "sources");
    for (const SourceDescriptor& d : sources) EncodeSourceDescriptor(w, d);
}

Result<SparseManifestReply> SparseManifestReply::Decode(WireReader& r) {
    SparseManifestReply m;
    MCS_ASSIGN_OR_RETURN(m.sources,
                         ReadVector<SourceDescriptor>(r, kMaxBatchItems, kMinSourceDescriptorBytes,
                                                      "sources", DecodeSourceDescriptor));
    return m;
}

void SparseCurrentGenerationRequest::Encode(WireWriter& w) const {
    w.WriteString(tensor_id, kMaxNameBytes, "tensor_id");
}

Result<SparseCurrentGenerationRequest> SparseCurrentGenerationRequest::Decode(WireReader& r) {
    SparseCurrentGenerationRequest m;
    MCS_ASSIGN_OR_RETURN(m.tensor_id, r.ReadString(kMaxNameBytes, "tensor_id"));
    return m;
}

void SparseCurrentGenerationReply::Encode(WireWriter& w) const {
    w.WriteBool(generation.has_value());
    if (generation) EncodeGeneration(w, *generation);
}

Result<SparseCurrentGenerationReply> SparseCurrentGenerationReply::Decode(WireReader& r) {
    SparseCurrentGenerationReply m;
    MCS_ASSIGN_OR_RETURN(bool has, r.ReadBool());
    if (has) {
        MCS_ASSIGN_OR_RETURN(m.generation, DecodeGeneration(r));
    }
    return m;
}

void SparseReadOptions::Encode(WireWriter& w) const {
    w.WriteU64(plan.limits.max_tiles_per_query);
    w.WriteU64(plan.limits.max_groups_per_query);
    w.WriteU64(plan.limits.max_regions);
    if (plan.read_coalesce_gap < -1) w.Fail(InvalidArgument("read_coalesce_gap < -1"));
    w.WriteI64(plan.read_coalesce_gap);
    w.WriteU8(static_cast<std::uint8_t>(strategy));
    if (strategy > ReadStrategy::kFullSourcePerTarget) {
        w.Fail(InvalidArgument("unknown read strategy"));
    }
    w.WriteU32(num_threads);
}

Result<SparseReadOptions> SparseReadOptions::Decode(WireReader& r) {
    SparseReadOptions o;
    MCS_ASSIGN_OR_RETURN(o.plan.limits.max_tiles_per_query, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(o.plan.limits.max_groups_per_query, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(o.plan.limits.max_regions, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(o.plan.read_coalesce_gap, r.ReadI64());
    if (o.plan.read_coalesce_gap < -1) {
        return InvalidArgument("read_coalesce_gap " + std::to_string(o.plan.read_coalesce_gap) +
                               " < -1");
    }
    const std::size_t at = r.offset();
    MCS_ASSIGN_OR_RETURN(std::uint8_t strategy, r.ReadU8());
    if (strategy > static_cast<std::uint8_t>(ReadStrategy::kFullSourcePerTarget)) {
        return InvalidArgument("unknown read strategy " + Num(strategy) + " at offset " + Num(at));
    }
    o.strategy = static_cast<ReadStrategy>(strategy);
    MCS_ASSIGN_OR_RETURN(o.num_threads, r.ReadU32());
    return o;
}

void SparseReadRequest::Encode(WireWriter& w) const {
    w.WriteCount(manifest.size(), kMaxBatchItems, "manifest");
    for (const SourceDescriptor& d : manifest) EncodeSourceDescriptor(w, d);
    w.WriteCount(targets.size(), kMaxBatchItems, "targets");
    for (const TargetDescriptor& t : targets) EncodeTargetDescriptor(w, t);
    options.Encode(w);
}

Result<SparseReadRequest> SparseReadRequest::Decode(WireReader& r) {
    SparseReadRequest m;
    MCS_ASSIGN_OR_RETURN(m.manifest,
                         ReadVector<SourceDescriptor>(r, kMaxBatchItems, kMinSourceDescriptorBytes,
                                                      "manifest", DecodeSourceDescriptor));
    MCS_ASSIGN_OR_RETURN(m.targets,
                         ReadVector<TargetDescriptor>(r, kMaxBatchItems, kMinTargetDescriptorBytes,
                                                      "targets", DecodeTargetDescriptor));
    MCS_ASSIGN_OR_RETURN(m.options, SparseReadOptions::Decode(r));
    return m;
}

void SegmentMember::Encode(WireWriter& w) const {
    slice.Encode(w);
    w.WriteU64(checksum);
}

Result<SegmentMember> SegmentMember::Decode(WireReader& r) {
    SegmentMember m;
    MCS_ASSIGN_OR_RETURN(m.slice, SegmentSlice::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.checksum, r.ReadU64());
    return m;
}

void TargetObjectLocation::Encode(WireWriter& w) const {
    w.WriteString(target_id, kMaxNameBytes, "target_id");
    w.WriteString(node_id, kMaxNameBytes, "node_id");
    EncodeBox(w, target_box);
    EncodeSourceDescriptor(w, desc);
    w.Fail(CheckCoordinateSpace(coordinate_space));
    w.WriteString(coordinate_space, kMaxNameBytes, "coordinate_space");
    indices.Encode(w);
    values.Encode(w);
    tile_coords.Encode(w);
    tile_ptr.Encode(w);
    w.WriteU64(lease_id);
}

Result<TargetObjectLocation> TargetObjectLocation::Decode(WireReader& r) {
    TargetObjectLocation m;
    MCS_ASSIGN_OR_RETURN(m.target_id, r.ReadString(kMaxNameBytes, "target_id"));
    MCS_ASSIGN_OR_RETURN(m.node_id, r.ReadString(kMaxNameBytes, "node_id"));
    MCS_ASSIGN_OR_RETURN(m.target_box, DecodeBox(r));
    MCS_ASSIGN_OR_RETURN(m.desc, DecodeSourceDescriptor(r));
    MCS_ASSIGN_OR_RETURN(m.coordinate_space, r.ReadString(kMaxNameBytes, "coordinate_space"));
    MCS_RETURN_IF_ERROR(CheckCoordinateSpace(m.coordinate_space));
    MCS_ASSIGN_OR_RETURN(m.indices, SegmentMember::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.values, SegmentMember::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.tile_coords, SegmentMember::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.tile_ptr, SegmentMember::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.lease_id, r.ReadU64());
    return m;
}

void SparseReadReply::Encode(WireWriter& w) const {
    WriteStructVector(w, objects, kMaxBatchItems, "objects");
}

Result<SparseReadReply> SparseReadReply::Decode(WireReader& r) {
    SparseReadReply m;
    MCS_ASSIGN_OR_RETURN(m.objects, ReadStructVector<TargetObjectLocation>(
                                        r, kMaxBatchItems, kMinTargetObjectBytes, "objects"));
    return m;
}

void MetricsRequest::Encode(WireWriter& w) const { w.WriteBool(reset); }

Result<MetricsRequest> MetricsRequest::Decode(WireReader& r) {
    MetricsRequest m;
    MCS_ASSIGN_OR_RETURN(m.reset, r.ReadBool());
    return m;
}

void MetricItem::Encode(WireWriter& w) const {
    w.WriteString(name, kMaxNameBytes, "metric name");
    w.WriteF64(value);
}

Result<MetricItem> MetricItem::Decode(WireReader& r) {
    MetricItem m;
    MCS_ASSIGN_OR_RETURN(m.name, r.ReadString(kMaxNameBytes, "metric name"));
    MCS_ASSIGN_OR_RETURN(m.value, r.ReadF64());
    return m;
}

void MetricsReply::Encode(WireWriter& w) const {
    WriteStructVector(w, items, kMaxMetrics, "metrics");
}

Result<MetricsReply> MetricsReply::Decode(WireReader& r) {
    MetricsReply m;
    MCS_ASSIGN_OR_RETURN(m.items,
                         ReadStructVector<MetricItem>(r, kMaxMetrics, kMinMetricBytes, "metrics"));
    return m;
}

void TensorLocation::Encode(WireWriter& w) const {
    ref.Encode(w);
    w.WriteU64(cuda_base);
    w.WriteU64(cuda_alloc_size);
    w.WriteString(pci_bus_id, kMaxNameBytes, "pci_bus_id");
    if (ref.kind == BufferKind::kCudaIpc) {
        if (ref.offset > cuda_alloc_size || ref.size > cuda_alloc_size - ref.offset) {
            w.Fail(InvalidArgument("CUDA IPC range runs past its allocation of " +
                                   Num(cuda_alloc_size) + " bytes"));
        }
    } else if (cuda_base != 0 || cuda_alloc_size != 0 || !pci_bus_id.empty()) {
        w.Fail(InvalidArgument("a client-buffer tensor location carries no CUDA allocation"));
    }
}

Result<TensorLocation> TensorLocation::Decode(WireReader& r) {
    TensorLocation m;
    MCS_ASSIGN_OR_RETURN(m.ref, BufferRef::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.cuda_base, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(m.cuda_alloc_size, r.ReadU64());
    MCS_ASSIGN_OR_RETURN(m.pci_bus_id, r.ReadString(kMaxNameBytes, "pci_bus_id"));
    if (m.ref.kind == BufferKind::kCudaIpc) {
        if (m.ref.offset > m.cuda_alloc_size || m.ref.size > m.cuda_alloc_size - m.ref.offset) {
            return InvalidArgument("CUDA IPC range [" + Num(m.ref.offset) + ", +" +
                                   Num(m.ref.size) + ") runs past its allocation of " +
                                   Num(m.cuda_alloc_size) + " bytes");
        }
    } else if (m.cuda_base != 0 || m.cuda_alloc_size != 0 || !m.pci_bus_id.empty()) {
        return InvalidArgument("a client-buffer tensor location carries no CUDA allocation");
    }
    return m;
}

void TensorItem::Encode(WireWriter& w) const {
    w.WriteString(key, kMaxKeyBytes, "key");
    w.WriteU8(static_cast<std::uint8_t>(dtype));
    w.WriteI64Vector(shape, kMaxRank, "tensor shape");
    location.Encode(w);
    w.WriteI64Vector(strides, kMaxRank, "tensor strides");
    if (!strides.empty() && strides.size() != shape.size()) {
        w.Fail(InvalidArgument("tensor strides do not match its rank"));
    }
    if (!strides.empty() && location.ref.kind != BufferKind::kCudaIpc) {
        w.Fail(InvalidArgument("only a CUDA tensor location carries strides"));
    }
}

Result<TensorItem> TensorItem::Decode(WireReader& r) {
    TensorItem m;
    MCS_ASSIGN_OR_RETURN(m.key, r.ReadString(kMaxKeyBytes, "key"));
    MCS_ASSIGN_OR_RETURN(m.dtype, DecodeDType(r));
    MCS_ASSIGN_OR_RETURN(m.shape, r.ReadI64Vector(kMaxRank, "tensor shape"));
    MCS_ASSIGN_OR_RETURN(m.location, TensorLocation::Decode(r));
    MCS_ASSIGN_OR_RETURN(m.strides, r.ReadI64Vector(kMaxRank, "tensor strides"));
    if (!m.strides.empty() && m.strides.size() != m.shape.size()) {
        return InvalidArgument(Num(m.strides.size()) + " tensor strides for rank " +
                               Num(m.shape.size()));
    }
    if (!m.strides.empty() && m.location.ref.kind != BufferKind::kCudaIpc) {
        return InvalidArgument("only a CUDA tensor location carries strides");
    }
    return m;
}

void TensorPutRequest::Encode(WireWriter& w) const {
    if (items.empty()) w.Fail(InvalidArgument("TensorPut carries no tensors"));
    WriteStructVector(w, items, kMaxBatchItems, "tensors");
    w.WriteU8(static_cast<std::uint8_t>(mode));
    w.WriteBool(hard_pin);
}

Result<TensorPutRequest> TensorPutRequest::Decode(WireReader& r) {
    TensorPutRequest m;
    MCS_ASSIGN_OR_RETURN(m.items, ReadStructVector<TensorItem>(r, kMaxBatchItems,
                                                               kMinTensorItemBytes, "tensors"));
    if (m.items.empty()) return InvalidArgument("TensorPut carries no tensors");
    const std::size_t at = r.offset();
    MCS_ASSIGN_OR_RETURN(std::uint8_t mode, r.ReadU8());
    if (mode > static_cast<std::uint8_t>(PutMode::kUpsert)) {
        return InvalidArgument("unknown put mode " + Num(mode) + " at offset " + Num(at));
    }
    m.mode = static_cast<PutMode>(mode);
    MCS_ASSIGN_OR_RETURN(m.hard_pin, r.ReadBool());
    return m;
}

void TensorGetRequest::Encode(WireWriter& w) const {
    if (items.empty()) w.Fail(InvalidArgument("TensorGet carries no tensors"));
    WriteStructVector(w, items, kMaxBatchItems, "tensors");
}

Result<TensorGetRequest> TensorGetRequest::Decode(WireReader& r) {
    TensorGetRequest m;
    MCS_ASSIGN_OR_RETURN(m.items, ReadStructVector<TensorItem>(r, kMaxBatchItems,
                                                               kMinTensorItemBytes, "tensors"));
    if (m.items.empty()) return InvalidArgument("TensorGet carries no tensors");
    return m;
}

// ---------------------------------------------------------------------------------------------
// Whole messages.
// ---------------------------------------------------------------------------------------------

MessageType TypeOf(const Message& message) {
    return std::visit([](const auto& m) { return std::decay_t<decltype(m)>::kType; }, message);
}

namespace {

Status EncodeInto(WireWriter& w, const Message& message) {
    std::visit([&](const auto& m) { m.Encode(w); }, message);
    if (!w.status().ok()) {
        return w.status().WithContext("encoding " + std::string(MessageTypeName(TypeOf(message))));
    }
    return Status::Ok();
}

template <std::size_t I = 0>
Result<Message> DecodeByIndex(MessageType type, std::span<const std::byte> payload) {
    if constexpr (I == std::variant_size_v<Message>) {
        return InvalidArgument("unknown message type " +
                               Num(static_cast<std::uint16_t>(type)));
    } else {
        using M = std::variant_alternative_t<I, Message>;
        if (type == M::kType) {
            auto m = DecodePayloadAs<M>(payload);
            if (!m.ok()) return m.status();
            return Message(std::in_place_index<I>, std::move(m).value());
        }
        return DecodeByIndex<I + 1>(type, payload);
    }
}

}  // namespace

Result<std::vector<std::byte>> EncodePayload(const Message& message) {
    WireWriter w;
    MCS_RETURN_IF_ERROR(EncodeInto(w, message));
    if (w.size() > kMaxPayloadBytes) {
        return ResourceExhausted(std::string(MessageTypeName(TypeOf(message))) + " payload of " +
                                 Num(w.size()) + " bytes exceeds the frame limit of " +
                                 Num(kMaxPayloadBytes));
    }
    return std::move(w).Take();
}

Result<std::vector<std::byte>> EncodeFrame(const Message& message, std::uint64_t request_id) {
    WireWriter w;
    for (std::size_t i = 0; i < kFrameHeaderBytes; ++i) w.WriteU8(0);
    MCS_RETURN_IF_ERROR(EncodeInto(w, message));
    const std::size_t payload = w.size() - kFrameHeaderBytes;
    if (payload > kMaxPayloadBytes) {
        return ResourceExhausted(std::string(MessageTypeName(TypeOf(message))) + " payload of " +
                                 Num(payload) + " bytes exceeds the frame limit of " +
                                 Num(kMaxPayloadBytes));
    }
    std::vector<std::byte> out = std::move(w).Take();
    FrameHeader h;
    h.type = TypeOf(message);
    h.request_id = request_id;
    h.payload_len = static_cast<std::uint32_t>(payload);
    EncodeFrameHeader(h, std::span<std::byte, kFrameHeaderBytes>(out.data(), kFrameHeaderBytes));
    return out;
}

Result<Message> DecodePayload(MessageType type, std::span<const std::byte> payload) {
    return DecodeByIndex(type, payload);
}

Result<Message> DecodeMessage(const Frame& frame) {
    return DecodePayload(frame.header.type, frame.payload);
}

}  // namespace mooncake::sparse::wire
