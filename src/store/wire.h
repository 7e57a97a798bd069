// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon's message codec (docs/design.md §5-6): frames exchanged between the node daemon
// (`mooncake_sparse_node`, the RealClient that owns the shared-memory segments) and the
// DummyClients of the same node over its Unix socket.
//
// A frame is a fixed 24-byte header followed by a payload, all little-endian:
//
//     offset  size  field
//          0     4  magic        'M' 'C' 'S' 'P' (kWireMagic as a little-endian u32)
//          4     2  version      kWireVersion (1)
//          6     2  type         MessageType
//          8     8  request_id   chosen by the requester; a reply echoes it
//         16     4  payload_len  bytes after the header
//         20     4  flags        0 in version 1 (every bit reserved)
//
// The payload carries metadata only: bulk data moves through shared memory (the daemon's
// segments and the client's registered buffer) or CUDA IPC, never through the socket, so
// kMaxFrameBytes bounds what a peer can make the other side allocate.
//
// Payload encoding: fixed-width little-endian integers; bool is one byte 0 or 1; f64 is the
// IEEE-754 bit pattern as u64; a string is u32 length + bytes; a vector is u32 count +
// elements; an enum is its underlying integer. Every length and count has a limit, checked on
// encode (so a frame that encodes always decodes) and on decode, and decoding checks that the
// bytes are present before it allocates for them, so arbitrary input never crashes, hangs or
// allocates more than a small multiple of its own size. Every enum (message type, dtype, put
// mode, status code, ...) is validated; descriptors from the planner layer are rebuilt through
// their validating factories (SourceDescriptor::Make, TargetDescriptor::Make, Box::Make, ...).
//
// Conversation (every request gets exactly one reply with the same request_id: the listed one
// on success, ErrorReply on failure):
//
//     HelloRequest                  -> HelloReply     (+ one fd per segment, SCM_RIGHTS, in order)
//     RegisterBufferRequest (+1 fd) -> OkReply        the client's own buffer (memfd)
//     PutRequest                    -> OkReply
//     StatRequest                   -> StatReply
//     ReadMemberRequest             -> OkReply        daemon copies into dst
//     ReadRangesRequest             -> OkReply
//     RemoveRequest                 -> OkReply
//     ListRequest                   -> ListReply
//     LeaseRequest                  -> LeaseReply     object pinned in place until released
//     ReleaseRequest                -> OkReply
//     SparseCommitRequest           -> SparseCommitReply
//     SparseAdmitRequest            -> SparseAdmitReply
//     SparseManifestRequest         -> SparseManifestReply
//     SparseCurrentGenerationRequest-> SparseCurrentGenerationReply
//     SparseReadRequest             -> SparseReadReply (target objects in segments, leased)
//     MetricsRequest                -> MetricsReply
//     ClearCachesRequest            -> OkReply        drops the daemon's node-local caches
//     TensorPutRequest              -> OkReply        tensors from the client buffer / CUDA IPC
//     TensorGetRequest              -> OkReply        stored tensors into the same
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/placement.h"
#include "mooncake/sparse/planner.h"
#include "mooncake/sparse/status.h"
#include "store/object_store.h"

namespace mooncake::sparse::wire {

// ---------------------------------------------------------------------------------------------
// Constants and limits.
// ---------------------------------------------------------------------------------------------

inline constexpr std::uint32_t kWireMagic = 0x5053434Du;  ///< "MCSP" read as little-endian.
inline constexpr std::uint16_t kWireVersion = 1;          ///< Frame layout version.
inline constexpr std::uint32_t kProtocolVersion = 2;      ///< Message set version (Hello).
inline constexpr std::size_t kFrameHeaderBytes = 24;
inline constexpr std::size_t kMaxFrameBytes = std::size_t{64} << 20;  ///< Header + payload.
inline constexpr std::size_t kMaxPayloadBytes = kMaxFrameBytes - kFrameHeaderBytes;

inline constexpr std::size_t kMaxKeyBytes = 16 << 10;           ///< Object keys, prefixes.
inline constexpr std::size_t kMaxNameBytes = 4 << 10;           ///< Member/client names, ids.
inline constexpr std::size_t kMaxMessageBytes = 64 << 10;       ///< Error messages.
inline constexpr std::size_t kMaxMetadataBytes = 16 << 20;      ///< Object metadata.
inline constexpr std::size_t kMaxMembers = 4096;                ///< Members of one object.
inline constexpr std::size_t kMaxBatchItems = std::size_t{1} << 20;  ///< Ranges, targets, ...
inline constexpr std::size_t kMaxListKeys = std::size_t{1} << 22;
inline constexpr std::size_t kMaxFdsPerFrame = 64;  ///< SCM_RIGHTS fds one frame may carry.
inline constexpr std::size_t kMaxSegments = kMaxFdsPerFrame;    ///< One fd per segment.
inline constexpr std::size_t kMaxAxes = 64;                     ///< Named placement axes.
inline constexpr std::size_t kMaxMetrics = 4096;
inline constexpr std::size_t kCudaIpcHandleBytes = 64;          ///< sizeof(cudaIpcMemHandle_t).

// ---------------------------------------------------------------------------------------------
// Primitive codec.
// ---------------------------------------------------------------------------------------------

/// Appends little-endian fields to a growing buffer. A string or vector beyond its limit does
/// not throw: the writer records the first such error (status()) and the frame encoder returns
/// it, so an encodable frame is always a decodable one.
class WireWriter {
public:
    WireWriter() = default;

    void WriteU8(std::uint8_t v) { buf_.push_back(static_cast<std::byte>(v)); }
    void WriteU16(std::uint16_t v) { WriteLE(v, 2); }
    void WriteU32(std::uint32_t v) { WriteLE(v, 4); }
    void WriteU64(std::uint64_t v) { WriteLE(v, 8); }
    void WriteI64(std::int64_t v) { WriteLE(static_cast<std::uint64_t>(v), 8); }
    void WriteBool(bool v) { WriteU8(v ? 1 : 0); }
    void WriteF64(double v) { WriteU64(std::bit_cast<std::uint64_t>(v)); }
    /// u32 length + bytes; longer than `max_bytes` records InvalidArgument naming `what`.
    void WriteString(std::string_view s, std::size_t max_bytes, std::string_view what);
    void WriteBytes(std::span<const std::byte> b, std::size_t max_bytes, std::string_view what);
    /// u32 count + i64 values.
    void WriteI64Vector(std::span<const std::int64_t> v, std::size_t max_count,
                        std::string_view what);
    /// A u32 element count; beyond `max_count` records InvalidArgument naming `what`.
    void WriteCount(std::size_t count, std::size_t max_count, std::string_view what);
    /// Overwrites 4 bytes at `offset` (for a length known only at the end).
    void PatchU32(std::size_t offset, std::uint32_t v);

    /// Records `s` unless an error is recorded already (first error wins).
    void Fail(Status s);

    const Status& status() const { return status_; }
    std::size_t size() const { return buf_.size(); }
    std::span<const std::byte> bytes() const { return buf_; }
    std::vector<std::byte> Take() && { return std::move(buf_); }

private:
    void WriteLE(std::uint64_t v, int n) {
        for (int i = 0; i < n; ++i) buf_.push_back(static_cast<std::byte>(v >> (8 * i)));
    }

    std::vector<std::byte> buf_;
    Status status_;
};

/// Reads little-endian fields from a byte span. Every read is bounds-checked: past the end it
/// fails with InvalidArgument "truncated message: need N bytes at offset K, have M" and does
/// not advance.
class WireReader {
public:
    explicit WireReader(std::span<const std::byte> data) : data_(data) {}

    Result<std::uint8_t> ReadU8();
    Result<std::uint16_t> ReadU16();
    Result<std::uint32_t> ReadU32();
    Result<std::uint64_t> ReadU64();
    Result<std::int64_t> ReadI64();
    /// Errors: InvalidArgument for a byte other than 0 or 1.
    Result<bool> ReadBool();
    Result<double> ReadF64();
    /// Errors: InvalidArgument when the length exceeds `max_bytes` or the bytes are missing.
    Result<std::string> ReadString(std::size_t max_bytes, std::string_view what);
    Result<std::vector<std::byte>> ReadBytes(std::size_t max_bytes, std::string_view what);
    Result<std::vector<std::int64_t>> ReadI64Vector(std::size_t max_count, std::string_view what);
    /// Reads a u32 element count and checks it against `max_count` and against the bytes left
    /// (`count * min_element_bytes` must be present), so that callers may reserve `count`
    /// elements of at most a few times `min_element_bytes` each.
    /// Errors: InvalidArgument.
    Result<std::size_t> ReadCount(std::size_t max_count, std::size_t min_element_bytes,
                                  std::string_view what);
    /// Errors: InvalidArgument when bytes are left over.
    Status ExpectEnd() const;

    std::size_t offset() const { return offset_; }
    std::size_t remaining() const { return data_.size() - offset_; }

private:
    Status Need(std::size_t n) const;
    std::uint64_t TakeLE(int n);

    std::span<const std::byte> data_;
    std::size_t offset_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Frames.
// ---------------------------------------------------------------------------------------------

enum class MessageType : std::uint16_t {
    kHello = 1,
    kHelloReply = 2,
    kError = 3,
    kOk = 4,
    kRegisterBuffer = 5,
    kPut = 10,
    kStat = 11,
    kStatReply = 12,
    kReadMember = 13,
    kReadRanges = 14,
    kRemove = 15,
    kList = 16,
    kListReply = 17,
    kLease = 18,
    kLeaseReply = 19,
    kRelease = 20,
    kSparseCommit = 30,
    kSparseCommitReply = 31,
    kSparseAdmit = 32,
    kSparseAdmitReply = 33,
    kSparseManifest = 34,
    kSparseManifestReply = 35,
    kSparseCurrentGeneration = 36,
    kSparseCurrentGenerationReply = 37,
    kSparseRead = 38,
    kSparseReadReply = 39,
    kMetrics = 40,
    kMetricsReply = 41,
    kClearCaches = 42,
    kTensorPut = 50,
    kTensorGet = 51,
};

/// "Put", "SparseReadReply", ... or "Unknown".
std::string_view MessageTypeName(MessageType type);
bool IsKnownMessageType(std::uint16_t value);
/// True for the types a daemon sends (replies), false for requests.
bool IsReplyType(MessageType type);

struct FrameHeader {
    std::uint16_t version = kWireVersion;
    MessageType type = MessageType::kOk;
    std::uint64_t request_id = 0;
    std::uint32_t payload_len = 0;
    std::uint32_t flags = 0;

    friend bool operator==(const FrameHeader&, const FrameHeader&) = default;
};

/// Writes the 24 header bytes.
void EncodeFrameHeader(const FrameHeader& header, std::span<std::byte, kFrameHeaderBytes> out);

/// Parses and validates the first kFrameHeaderBytes of `bytes` (more may follow): magic,
/// version, a known type, payload_len <= kMaxPayloadBytes, flags == 0.
/// Errors: InvalidArgument.
Result<FrameHeader> DecodeFrameHeader(std::span<const std::byte> bytes);

/// A decoded frame; `payload` views the bytes given to DecodeFrame.
struct Frame {
    FrameHeader header;
    std::span<const std::byte> payload;
};

/// A complete frame: a valid header whose payload_len is exactly the bytes that follow.
/// Errors: InvalidArgument.
Result<Frame> DecodeFrame(std::span<const std::byte> bytes);

// ---------------------------------------------------------------------------------------------
// Shared pieces of messages.
// ---------------------------------------------------------------------------------------------

/// Where the daemon finds (Put, SparseCommit) or writes (ReadMember, ReadRanges) client bytes.
enum class BufferKind : std::uint8_t {
    kClientBuffer = 0,  ///< The connection's registered buffer (RegisterBufferRequest).
    kCudaIpc = 1,       ///< A CUDA allocation exported by the client (docs/design.md §5).
};

struct BufferRef {
    BufferKind kind = BufferKind::kClientBuffer;
    /// Byte offset into the client buffer, or into the CUDA allocation whose base the handle
    /// names (the handle is of the allocation base; the offset is carried separately).
    std::uint64_t offset = 0;
    std::uint64_t size = 0;  ///< offset + size never overflows (checked).
    std::string cuda_ipc_handle;  ///< kCudaIpc: exactly kCudaIpcHandleBytes; else empty.
    std::int32_t device = -1;     ///< kCudaIpc: the CUDA device ordinal (>= 0); else -1.

    void Encode(WireWriter& w) const;
    static Result<BufferRef> Decode(WireReader& r);
    static BufferRef Client(std::uint64_t offset, std::uint64_t size) {
        return {BufferKind::kClientBuffer, offset, size, {}, -1};
    }
    friend bool operator==(const BufferRef&, const BufferRef&) = default;
};

/// A byte range of one daemon segment (mapped by the client from HelloReply's fds).
struct SegmentSlice {
    std::uint32_t segment_id = 0;
    std::uint64_t offset = 0;
    std::uint64_t size = 0;  ///< offset + size never overflows (checked).

    void Encode(WireWriter& w) const;
    static Result<SegmentSlice> Decode(WireReader& r);
    friend bool operator==(const SegmentSlice&, const SegmentSlice&) = default;
};

struct SegmentInfo {
    std::uint32_t segment_id = 0;
    std::uint64_t size = 0;
    bool read_only = true;  ///< The client maps it PROT_READ.

    void Encode(WireWriter& w) const;
    static Result<SegmentInfo> Decode(WireReader& r);
    friend bool operator==(const SegmentInfo&, const SegmentInfo&) = default;
};

// Planner and store types (their own validation runs on decode).
void EncodeGeneration(WireWriter& w, const Generation& g);
Result<Generation> DecodeGeneration(WireReader& r);  ///< delta > base.
void EncodeBox(WireWriter& w, const Box& box);
Result<Box> DecodeBox(WireReader& r);
void EncodeNamedAxes(WireWriter& w, const NamedAxes& axes);
Result<NamedAxes> DecodeNamedAxes(WireReader& r);
void EncodePlacementPolicy(WireWriter& w, const PlacementPolicy& policy);
Result<PlacementPolicy> DecodePlacementPolicy(WireReader& r);
void EncodeSourceDescriptor(WireWriter& w, const SourceDescriptor& d);
Result<SourceDescriptor> DecodeSourceDescriptor(WireReader& r);
void EncodeTargetDescriptor(WireWriter& w, const TargetDescriptor& t);
Result<TargetDescriptor> DecodeTargetDescriptor(WireReader& r);
void EncodeObjectInfo(WireWriter& w, const ObjectInfo& info);
Result<ObjectInfo> DecodeObjectInfo(WireReader& r);
Result<DType> DecodeDType(WireReader& r);
bool SameObjectInfo(const ObjectInfo& a, const ObjectInfo& b);

// ---------------------------------------------------------------------------------------------
// Messages. Each has kType, Encode(WireWriter&) and static Decode(WireReader&) of its payload.
// ---------------------------------------------------------------------------------------------

/// First request on a connection.
struct HelloRequest {
    static constexpr MessageType kType = MessageType::kHello;
    std::uint32_t protocol_version = kProtocolVersion;
    std::uint32_t pid = 0;
    std::string client_name;

    void Encode(WireWriter& w) const;
    static Result<HelloRequest> Decode(WireReader& r);
    friend bool operator==(const HelloRequest&, const HelloRequest&) = default;
};

/// Sent with one SCM_RIGHTS fd per segment, in `segments` order.
struct HelloReply {
    static constexpr MessageType kType = MessageType::kHelloReply;
    std::uint32_t protocol_version = kProtocolVersion;
    std::string daemon_version;
    std::string node_id;
    std::vector<SegmentInfo> segments;  ///< At most kMaxSegments; ids unique.
    std::uint64_t client_buffer_max = 0;  ///< Largest buffer RegisterBufferRequest accepts.

    void Encode(WireWriter& w) const;
    static Result<HelloReply> Decode(WireReader& r);
    friend bool operator==(const HelloReply&, const HelloReply&) = default;
};

/// The failure reply to any request.
struct ErrorReply {
    static constexpr MessageType kType = MessageType::kError;
    StatusCode code = StatusCode::kInternal;  ///< Never kOk.
    std::string message;

    static ErrorReply FromStatus(const Status& status);  ///< An OK status becomes kInternal.
    Status ToStatus() const { return {code, message}; }

    void Encode(WireWriter& w) const;
    static Result<ErrorReply> Decode(WireReader& r);
    friend bool operator==(const ErrorReply&, const ErrorReply&) = default;
};

/// The success reply of requests that return nothing.
struct OkReply {
    static constexpr MessageType kType = MessageType::kOk;

    void Encode(WireWriter&) const {}
    static Result<OkReply> Decode(WireReader&) { return OkReply{}; }
    friend bool operator==(const OkReply&, const OkReply&) = default;
};

/// Sent with one SCM_RIGHTS fd (a memfd of `size` bytes) that replaces the connection's client
/// buffer; BufferKind::kClientBuffer offsets address it.
struct RegisterBufferRequest {
    static constexpr MessageType kType = MessageType::kRegisterBuffer;
    std::uint64_t size = 0;

    void Encode(WireWriter& w) const;
    static Result<RegisterBufferRequest> Decode(WireReader& r);
    friend bool operator==(const RegisterBufferRequest&, const RegisterBufferRequest&) = default;
};

struct PutMember {
    std::string name;
    DType dtype = DType::kUInt8;
    Shape shape;  ///< At most kMaxRank extents (values are the store's to validate).
    std::uint64_t checksum = 0;
    BufferRef src;  ///< src.size is the member's byte size.

    void Encode(WireWriter& w) const;
    static Result<PutMember> Decode(WireReader& r);
    friend bool operator==(const PutMember&, const PutMember&) = default;
};

/// ObjectStore::Put with the member bytes in the client's buffer (or CUDA allocations).
struct PutRequest {
    static constexpr MessageType kType = MessageType::kPut;
    std::string key;
    std::string metadata;
    std::vector<PutMember> members;
    PutMode mode = PutMode::kCreate;
    bool hard_pin = false;

    void Encode(WireWriter& w) const;
    static Result<PutRequest> Decode(WireReader& r);
    friend bool operator==(const PutRequest&, const PutRequest&) = default;
};

struct StatRequest {
    static constexpr MessageType kType = MessageType::kStat;
    std::string key;

    void Encode(WireWriter& w) const;
    static Result<StatRequest> Decode(WireReader& r);
    friend bool operator==(const StatRequest&, const StatRequest&) = default;
};

struct StatReply {
    static constexpr MessageType kType = MessageType::kStatReply;
    ObjectInfo info;

    void Encode(WireWriter& w) const;
    static Result<StatReply> Decode(WireReader& r);
    friend bool operator==(const StatReply& a, const StatReply& b) {
        return SameObjectInfo(a.info, b.info);
    }
};

/// ObjectStore::ReadMember into `dst` (dst.size must equal the member's size).
struct ReadMemberRequest {
    static constexpr MessageType kType = MessageType::kReadMember;
    std::string key;
    std::string member;
    BufferRef dst;

    void Encode(WireWriter& w) const;
    static Result<ReadMemberRequest> Decode(WireReader& r);
    friend bool operator==(const ReadMemberRequest&, const ReadMemberRequest&) = default;
};

struct RangeItem {
    std::string key;
    std::string member;
    std::uint64_t row_start = 0;
    std::uint64_t row_end = 0;  ///< Exclusive; the store checks the range.
    BufferRef dst;

    void Encode(WireWriter& w) const;
    static Result<RangeItem> Decode(WireReader& r);
    friend bool operator==(const RangeItem&, const RangeItem&) = default;
};

/// ObjectStore::ReadRanges (all-or-nothing, one snapshot).
struct ReadRangesRequest {
    static constexpr MessageType kType = MessageType::kReadRanges;
    std::vector<RangeItem> items;

    void Encode(WireWriter& w) const;
    static Result<ReadRangesRequest> Decode(WireReader& r);
    friend bool operator==(const ReadRangesRequest&, const ReadRangesRequest&) = default;
};

struct RemoveRequest {
    static constexpr MessageType kType = MessageType::kRemove;
    std::string key;

    void Encode(WireWriter& w) const;
    static Result<RemoveRequest> Decode(WireReader& r);
    friend bool operator==(const RemoveRequest&, const RemoveRequest&) = default;
};

struct ListRequest {
    static constexpr MessageType kType = MessageType::kList;
    std::string prefix;

    void Encode(WireWriter& w) const;
    static Result<ListRequest> Decode(WireReader& r);
    friend bool operator==(const ListRequest&, const ListRequest&) = default;
};

struct ListReply {
    static constexpr MessageType kType = MessageType::kListReply;
    std::vector<std::string> keys;

    void Encode(WireWriter& w) const;
    static Result<ListReply> Decode(WireReader& r);
    friend bool operator==(const ListReply&, const ListReply&) = default;
};

/// Zero-copy read: pins the object where it lies and returns its members' locations, valid
/// until ReleaseRequest (or until the connection closes).
struct LeaseRequest {
    static constexpr MessageType kType = MessageType::kLease;
    std::string key;

    void Encode(WireWriter& w) const;
    static Result<LeaseRequest> Decode(WireReader& r);
    friend bool operator==(const LeaseRequest&, const LeaseRequest&) = default;
};

struct LeaseReply {
    static constexpr MessageType kType = MessageType::kLeaseReply;
    std::uint64_t lease_id = 0;
    ObjectInfo info;
    std::vector<SegmentSlice> locations;  ///< One per info.members, same order (checked).

    void Encode(WireWriter& w) const;
    static Result<LeaseReply> Decode(WireReader& r);
    friend bool operator==(const LeaseReply& a, const LeaseReply& b) {
        return a.lease_id == b.lease_id && SameObjectInfo(a.info, b.info) &&
               a.locations == b.locations;
    }
};

/// Ends leases (LeaseReply, SparseReadReply objects); releasing an unknown id is NotFound.
struct ReleaseRequest {
    static constexpr MessageType kType = MessageType::kRelease;
    std::vector<std::uint64_t> lease_ids;  ///< 1 .. kMaxBatchItems.

    void Encode(WireWriter& w) const;
    static Result<ReleaseRequest> Decode(WireReader& r);
    friend bool operator==(const ReleaseRequest&, const ReleaseRequest&) = default;
};

// ---- Sparse object layer (src/executor/sparse_store.h) ---------------------------------------

/// A member the client wrote into its buffer, with its checksum (XXH3-64 of the bytes).
struct ClientMember {
    BufferRef src;
    std::uint64_t checksum = 0;

    void Encode(WireWriter& w) const;
    static Result<ClientMember> Decode(WireReader& r);
    friend bool operator==(const ClientMember&, const ClientMember&) = default;
};

/// SparseStore::CommitSparseObject of an object the client encoded (codec BuildSparseObject):
/// the descriptor plus its four members in the client's buffer.
struct SparseCommitRequest {
    static constexpr MessageType kType = MessageType::kSparseCommit;
    SourceDescriptor desc;
    std::string coordinate_space = "global";  ///< "global" or "local".
    ClientMember indices;      ///< [nnz, rank] of desc.index_dtype
    ClientMember values;       ///< [nnz] of desc.value_dtype
    ClientMember tile_coords;  ///< [num_tiles, rank] uint32
    ClientMember tile_ptr;     ///< [num_tiles + 1] uint64
    bool hard_pin = true;

    void Encode(WireWriter& w) const;
    static Result<SparseCommitRequest> Decode(WireReader& r);
    friend bool operator==(const SparseCommitRequest&, const SparseCommitRequest&) = default;
};

/// SparseStore CommitResult.
struct SparseCommitReply {
    static constexpr MessageType kType = MessageType::kSparseCommitReply;
    std::string source_ref;
    bool created = false;
    std::uint64_t nnz = 0;
    std::uint64_t bytes = 0;

    void Encode(WireWriter& w) const;
    static Result<SparseCommitReply> Decode(WireReader& r);
    friend bool operator==(const SparseCommitReply&, const SparseCommitReply&) = default;
};

/// SparseStore::Admit.
struct SparseAdmitRequest {
    static constexpr MessageType kType = MessageType::kSparseAdmit;
    std::string tensor_id;
    Generation generation;
    PlacementPolicy policy;
    NamedAxes source_placement;
    std::string writer_id;

    void Encode(WireWriter& w) const;
    static Result<SparseAdmitRequest> Decode(WireReader& r);
    friend bool operator==(const SparseAdmitRequest&, const SparseAdmitRequest&) = default;
};

struct SparseAdmitReply {
    static constexpr MessageType kType = MessageType::kSparseAdmitReply;
    bool admitted = false;

    void Encode(WireWriter& w) const;
    static Result<SparseAdmitReply> Decode(WireReader& r);
    friend bool operator==(const SparseAdmitReply&, const SparseAdmitReply&) = default;
};

/// SparseStore::Manifest.
struct SparseManifestRequest {
    static constexpr MessageType kType = MessageType::kSparseManifest;
    Generation generation;

    void Encode(WireWriter& w) const;
    static Result<SparseManifestRequest> Decode(WireReader& r);
    friend bool operator==(const SparseManifestRequest&, const SparseManifestRequest&) = default;
};

struct SparseManifestReply {
    static constexpr MessageType kType = MessageType::kSparseManifestReply;
    std::vector<SourceDescriptor> sources;

    void Encode(WireWriter& w) const;
    static Result<SparseManifestReply> Decode(WireReader& r);
    friend bool operator==(const SparseManifestReply&, const SparseManifestReply&) = default;
};

/// SparseStore::CurrentGeneration.
struct SparseCurrentGenerationRequest {
    static constexpr MessageType kType = MessageType::kSparseCurrentGeneration;
    std::string tensor_id;

    void Encode(WireWriter& w) const;
    static Result<SparseCurrentGenerationRequest> Decode(WireReader& r);
    friend bool operator==(const SparseCurrentGenerationRequest&,
                           const SparseCurrentGenerationRequest&) = default;
};

struct SparseCurrentGenerationReply {
    static constexpr MessageType kType = MessageType::kSparseCurrentGenerationReply;
    std::optional<Generation> generation;

    void Encode(WireWriter& w) const;
    static Result<SparseCurrentGenerationReply> Decode(WireReader& r);
    friend bool operator==(const SparseCurrentGenerationReply&,
                           const SparseCurrentGenerationReply&) = default;
};

/// Mirrors executor ReadStrategy (same values); the store layer cannot include the executor.
enum class ReadStrategy : std::uint8_t {
    kSparseRanges = 0,
    kFullSourcePerTarget = 1,
};

/// Mirrors executor ReadOptions.
struct SparseReadOptions {
    PlanOptions plan;  ///< read_coalesce_gap >= -1 (checked).
    ReadStrategy strategy = ReadStrategy::kSparseRanges;
    std::uint32_t num_threads = 0;  ///< 0: the daemon's default.

    void Encode(WireWriter& w) const;
    static Result<SparseReadOptions> Decode(WireReader& r);
    friend bool operator==(const SparseReadOptions& a, const SparseReadOptions& b) {
        return a.plan.limits.max_tiles_per_query == b.plan.limits.max_tiles_per_query &&
               a.plan.limits.max_groups_per_query == b.plan.limits.max_groups_per_query &&
               a.plan.limits.max_regions == b.plan.limits.max_regions &&
               a.plan.read_coalesce_gap == b.plan.read_coalesce_gap &&
               a.strategy == b.strategy && a.num_threads == b.num_threads;
    }
};

/// SparseStore::ReadSparseObjects (docs/design.md §4) run by the daemon: its node-local caches serve
/// every process of the node.
struct SparseReadRequest {
    static constexpr MessageType kType = MessageType::kSparseRead;
    std::vector<SourceDescriptor> manifest;
    std::vector<TargetDescriptor> targets;
    SparseReadOptions options;

    void Encode(WireWriter& w) const;
    static Result<SparseReadRequest> Decode(WireReader& r);
    friend bool operator==(const SparseReadRequest&, const SparseReadRequest&) = default;
};

/// A member the daemon published into a segment.
struct SegmentMember {
    SegmentSlice slice;
    std::uint64_t checksum = 0;

    void Encode(WireWriter& w) const;
    static Result<SegmentMember> Decode(WireReader& r);
    friend bool operator==(const SegmentMember&, const SegmentMember&) = default;
};

/// One target-local object (executor TargetObject) published into the daemon's segments; the
/// client reads it from its read-only mapping, then releases `lease_id`.
struct TargetObjectLocation {
    std::string target_id;
    std::string node_id;
    Box target_box;
    SourceDescriptor desc;
    std::string coordinate_space = "local";  ///< "global" or "local".
    SegmentMember indices;
    SegmentMember values;
    SegmentMember tile_coords;
    SegmentMember tile_ptr;
    std::uint64_t lease_id = 0;

    void Encode(WireWriter& w) const;
    static Result<TargetObjectLocation> Decode(WireReader& r);
    friend bool operator==(const TargetObjectLocation&, const TargetObjectLocation&) = default;
};

/// One object per target, in request order.
struct SparseReadReply {
    static constexpr MessageType kType = MessageType::kSparseReadReply;
    std::vector<TargetObjectLocation> objects;

    void Encode(WireWriter& w) const;
    static Result<SparseReadReply> Decode(WireReader& r);
    friend bool operator==(const SparseReadReply&, const SparseReadReply&) = default;
};

struct MetricsRequest {
    static constexpr MessageType kType = MessageType::kMetrics;
    bool reset = false;  ///< Reset the daemon's sparse metrics after reading them.

    void Encode(WireWriter& w) const;
    static Result<MetricsRequest> Decode(WireReader& r);
    friend bool operator==(const MetricsRequest&, const MetricsRequest&) = default;
};

struct MetricItem {
    std::string name;
    double value = 0;

    void Encode(WireWriter& w) const;
    static Result<MetricItem> Decode(WireReader& r);
    /// Bitwise on `value`, so NaN round-trips compare equal.
    friend bool operator==(const MetricItem& a, const MetricItem& b) {
        return a.name == b.name &&
               std::bit_cast<std::uint64_t>(a.value) == std::bit_cast<std::uint64_t>(b.value);
    }
};

/// SparseMetrics::Items() of the daemon (the §4 counters and more), plus any daemon gauges
/// (store counters, pinned quota/use, capabilities) as further named values.
struct MetricsReply {
    static constexpr MessageType kType = MessageType::kMetricsReply;
    std::vector<MetricItem> items;

    void Encode(WireWriter& w) const;
    static Result<MetricsReply> Decode(WireReader& r);
    friend bool operator==(const MetricsReply&, const MetricsReply&) = default;
};

// ---- Tensor fast path (executor/tensor_store.h, docs/design.md §5) ---------------------------------

/// Where one tensor's bytes are in the client: its registered buffer, or a CUDA allocation
/// exported by IPC (`ref` = handle of the allocation base + offset of the tensor + its size).
struct TensorLocation {
    BufferRef ref;
    /// kCudaIpc: the allocation's base address and size in the client — with the handle they
    /// identify the allocation (the daemon's mapping cache key); offset + size <= alloc_size.
    std::uint64_t cuda_base = 0;
    std::uint64_t cuda_alloc_size = 0;
    /// kCudaIpc: the device's PCI bus id (ordinals differ between processes); "" = ordinal.
    std::string pci_bus_id;

    void Encode(WireWriter& w) const;
    static Result<TensorLocation> Decode(WireReader& r);
    friend bool operator==(const TensorLocation&, const TensorLocation&) = default;
};

/// One tensor of a TensorPut (the source) or TensorGet (the destination, whose dtype and shape
/// the stored tensor must match).
struct TensorItem {
    std::string key;
    DType dtype = DType::kFloat32;
    Shape shape;  ///< At most kMaxRank extents (the daemon's TensorStore validates them).
    TensorLocation location;
    /// Element strides of a kCudaIpc tensor (a strided view, e.g. a TP slice of a fused
    /// parameter); empty: C-contiguous, else one per extent. With strides, `location.ref` covers
    /// the view's extent — from its lowest to its highest element — so the daemon checks that
    /// extent against what it mapped before it writes.
    std::vector<std::int64_t> strides;

    void Encode(WireWriter& w) const;
    static Result<TensorItem> Decode(WireReader& r);
    friend bool operator==(const TensorItem&, const TensorItem&) = default;
};

/// put_tensor / upsert_tensor of a batch (all or nothing).
struct TensorPutRequest {
    static constexpr MessageType kType = MessageType::kTensorPut;
    std::vector<TensorItem> items;  ///< 1 .. kMaxBatchItems.
    PutMode mode = PutMode::kCreate;
    bool hard_pin = false;

    void Encode(WireWriter& w) const;
    static Result<TensorPutRequest> Decode(WireReader& r);
    friend bool operator==(const TensorPutRequest&, const TensorPutRequest&) = default;
};

/// get_tensor_into of a batch: every item validated before any byte is written.
struct TensorGetRequest {
    static constexpr MessageType kType = MessageType::kTensorGet;
    std::vector<TensorItem> items;  ///< 1 .. kMaxBatchItems.

    void Encode(WireWriter& w) const;
    static Result<TensorGetRequest> Decode(WireReader& r);
    friend bool operator==(const TensorGetRequest&, const TensorGetRequest&) = default;
};

/// SparseStore::ClearCaches of the daemon: drops the node-local tile-index and range caches
/// (every process of the node shares them). No payload.
struct ClearCachesRequest {
    static constexpr MessageType kType = MessageType::kClearCaches;

    void Encode(WireWriter&) const {}
    static Result<ClearCachesRequest> Decode(WireReader&) { return ClearCachesRequest{}; }
    friend bool operator==(const ClearCachesRequest&, const ClearCachesRequest&) = default;
};

/// Every message, for dispatch (`std::visit`) and for the fuzzer.
using Message = std::variant<
    HelloRequest, HelloReply, ErrorReply, OkReply, RegisterBufferRequest, PutRequest, StatRequest,
    StatReply, ReadMemberRequest, ReadRangesRequest, RemoveRequest, ListRequest, ListReply,
    LeaseRequest, LeaseReply, ReleaseRequest, SparseCommitRequest, SparseCommitReply,
    SparseAdmitRequest, SparseAdmitReply, SparseManifestRequest, SparseManifestReply,
    SparseCurrentGenerationRequest, SparseCurrentGenerationReply, SparseReadRequest,
    SparseReadReply, MetricsRequest, MetricsReply, TensorPutRequest, TensorGetRequest,
    ClearCachesRequest>;

MessageType TypeOf(const Message& message);

// ---------------------------------------------------------------------------------------------
// Encoding and decoding whole frames and payloads.
// ---------------------------------------------------------------------------------------------

/// Header + payload of `message`.
/// Errors: InvalidArgument (a field beyond its limit); ResourceExhausted (frame larger than
/// kMaxFrameBytes).
Result<std::vector<std::byte>> EncodeFrame(const Message& message, std::uint64_t request_id);

template <typename M>
Result<std::vector<std::byte>> EncodeFrame(const M& message, std::uint64_t request_id) {
    return EncodeFrame(Message(message), request_id);
}

/// The payload bytes of `message` alone.
/// Errors: as EncodeFrame.
Result<std::vector<std::byte>> EncodePayload(const Message& message);

/// Decodes a payload of type `type`; trailing bytes are an error.
/// Errors: InvalidArgument (unknown type, malformed or truncated payload).
Result<Message> DecodePayload(MessageType type, std::span<const std::byte> payload);

/// Decodes the frame's message (any type).
/// Errors: InvalidArgument.
Result<Message> DecodeMessage(const Frame& frame);

/// Decodes a payload of a known type `M`.
/// Errors: InvalidArgument.
template <typename M>
Result<M> DecodePayloadAs(std::span<const std::byte> payload) {
    WireReader r(payload);
    auto m = M::Decode(r);
    if (!m.ok()) {
        return m.status().WithContext("decoding " + std::string(MessageTypeName(M::kType)));
    }
    if (Status s = r.ExpectEnd(); !s.ok()) {
        return s.WithContext("decoding " + std::string(MessageTypeName(M::kType)));
    }
    return m;
}

/// The reply `M` to a request: an ErrorReply becomes its Status, any other type is an error.
/// Errors: the ErrorReply's code; InvalidArgument (wrong type, malformed payload).
template <typename M>
Result<M> DecodeReplyAs(const Frame& frame) {
    if (frame.header.type == MessageType::kError) {
        auto err = DecodePayloadAs<ErrorReply>(frame.payload);
        if (!err.ok()) return err.status();
        return err->ToStatus();
    }
    if (frame.header.type != M::kType) {
        return InvalidArgument("expected a " + std::string(MessageTypeName(M::kType)) +
                               " frame, got " + std::string(MessageTypeName(frame.header.type)));
    }
    return DecodePayloadAs<M>(frame.payload);
}

}  // namespace mooncake::sparse::wire
