// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon's wire format (docs/design.md §5-6): frames exchanged between the node daemon
// (`mooncake_sparse_node`, the RealClient that owns the shared-memory segments) and the
// DummyClients of the same node over its Unix socket, and the field visitor that encodes and
// decodes every message from one list of its fields.
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
// Payload encoding: the fields of a message in the order its Fields() lists them, with nothing
// between them. Fixed-width little-endian integers; bool is one byte 0 or 1; f64 is the IEEE-754
// bit pattern as u64; a string is u32 length + bytes; a vector is u32 count + elements; an
// optional is a bool + the value when present; an enum is its EnumTraits::Wire integer; a struct
// is its fields. Every length and count has a limit (a string or vector field without one does
// not compile), checked on encode (so a frame that encodes always decodes) and on decode, and
// decoding checks that the bytes are present before it allocates for them, so arbitrary input
// never crashes, hangs or allocates more than a small multiple of its own size. Every enum is
// range-checked; types whose invariants their own factory enforces (Box, NamedAxes,
// SourceDescriptor, ...) are rebuilt through it on decode.
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mooncake/sparse/status.h"

namespace mooncake::sparse::wire {

// ---------------------------------------------------------------------------------------------
// Constants and limits.
// ---------------------------------------------------------------------------------------------

inline constexpr std::uint32_t kWireMagic = 0x5053434Du;  ///< "MCSP" read as little-endian.
inline constexpr std::uint16_t kWireVersion = 1;          ///< Frame layout version.
/// Message set version (Hello). 2: TensorItem carries the strides of a CUDA view. 5: commits
/// of updates in the client's CUDA memory (SparseCommitDevice). 6: leased objects copied into
/// the client's CUDA memory (LeasesToDevice). 8: reads of a sealed step by its generation
/// (SparseReadStep). 9: a read's reply carries what the read decided of each target object
/// (ReadTargetLocation), not its whole descriptor; a planned read names a sealed step
/// (SparseReadPlanRequest::sealed_entries). 10: admissions in batches
/// (SparseAdmitBatch). 11: LeaseRangesToDevice may answer before its copies are done, having
/// recorded the client's CUDA IPC event after them (LeaseRangesToDeviceRequest::ready_event).
/// 12: a planned read's targets kept per connection (SparseReadPlanRequest::target_set).
/// 13: a planned read's ranges copied to the client's device as the daemon plans them
/// (SparseReadPlanRequest::to_device, SparseReadPlanReply::staged_at). 14: a device commit's
/// members as offsets into one exported allocation (SparseCommitDeviceRequest::memory).
inline constexpr std::uint32_t kProtocolVersion = 14;
inline constexpr std::size_t kFrameHeaderBytes = 24;
inline constexpr std::size_t kMaxFrameBytes = std::size_t{64} << 20;  ///< Header + payload.
inline constexpr std::size_t kMaxPayloadBytes = kMaxFrameBytes - kFrameHeaderBytes;

inline constexpr std::size_t kMaxKeyBytes = 16 << 10;           ///< Object keys, prefixes.
inline constexpr std::size_t kMaxNameBytes = 4 << 10;           ///< Member/client names, ids.
inline constexpr std::size_t kMaxMessageBytes = 64 << 10;       ///< Error messages.
inline constexpr std::size_t kMaxMetadataBytes = 16 << 20;      ///< Object metadata.
inline constexpr std::size_t kMaxMembers = 4096;                ///< Members of one object.
inline constexpr std::size_t kMaxBatchItems = std::size_t{1} << 20;  ///< Ranges, targets, ...
/// Planned reads' target sets a connection keeps (SparseReadPlanRequest::target_set), and
/// their targets in all.
inline constexpr std::size_t kMaxKeptTargetSets = 64;
inline constexpr std::size_t kMaxKeptTargets = kMaxBatchItems;
inline constexpr std::size_t kMaxListKeys = std::size_t{1} << 22;
inline constexpr std::size_t kMaxFdsPerFrame = 64;  ///< SCM_RIGHTS fds one frame may carry.
inline constexpr std::size_t kMaxSegments = kMaxFdsPerFrame;    ///< One fd per segment.
inline constexpr std::size_t kMaxAxes = 64;                     ///< Named placement axes.
inline constexpr std::size_t kMaxMetrics = 4096;
inline constexpr std::size_t kCudaIpcHandleBytes = 64;          ///< sizeof(cudaIpcMemHandle_t).

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
    kSparseStepManifest = 60,
    kSparseStepManifestReply = 61,
    kSparseSeal = 62,
    kSparseWait = 63,
    kSparseLatest = 64,
    kSparseLatestReply = 65,
    kSparseRetention = 66,
    kSparseRetentionReply = 67,
    kSparseAnchor = 68,
    kSparseCommitBatch = 70,
    kSparseCommitBatchReply = 71,
    kSparseCommitDevice = 72,  ///< Replied by kSparseCommitBatchReply.
    kLeasesToDevice = 73,
    kSparseReadPlan = 74,
    kSparseReadPlanReply = 75,
    kLeaseRangesToDevice = 76,  ///< Replied by kOk.
    kSparseReadStep = 77,       ///< Replied by kSparseReadReply.
    kSparseAdmitBatch = 78,
    kSparseAdmitBatchReply = 79,
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
// Primitive codec.
// ---------------------------------------------------------------------------------------------

/// Appends little-endian fields to a growing buffer. A string or vector beyond its limit does
/// not throw: the writer records the first such error (status()) and the frame encoder returns
/// it, so an encodable frame is always a decodable one.
class WireWriter {
public:
    WireWriter() = default;
    /// Writes into `reuse` (cleared, its capacity kept): a connection encodes every frame into
    /// the same memory instead of faulting in a fresh buffer for each.
    explicit WireWriter(std::vector<std::byte> reuse) : buf_(std::move(reuse)) { buf_.clear(); }

    template <std::integral T>
    void WriteInt(T v) {
        WriteLE(static_cast<std::make_unsigned_t<T>>(v), sizeof(T));
    }
    void WriteU8(std::uint8_t v) { WriteInt(v); }
    void WriteU16(std::uint16_t v) { WriteInt(v); }
    void WriteU32(std::uint32_t v) { WriteInt(v); }
    void WriteU64(std::uint64_t v) { WriteInt(v); }
    void WriteI64(std::int64_t v) { WriteInt(v); }
    void WriteBool(bool v) { WriteU8(v ? 1 : 0); }
    void WriteF64(double v) { WriteU64(std::bit_cast<std::uint64_t>(v)); }
    /// u32 length + bytes; longer than `max_bytes` records InvalidArgument naming `what`.
    void WriteString(std::string_view s, std::size_t max_bytes, std::string_view what);
    /// u32 count + i64 values.
    void WriteI64Vector(std::span<const std::int64_t> v, std::size_t max_count,
                        std::string_view what);
    /// A u32 element count; beyond `max_count` records InvalidArgument naming `what`.
    void WriteCount(std::size_t count, std::size_t max_count, std::string_view what);

    /// Records `s` unless an error is recorded already (first error wins).
    void Fail(Status s);

    const Status& status() const { return status_; }
    std::size_t size() const { return buf_.size(); }
    std::span<const std::byte> bytes() const { return buf_; }
    std::vector<std::byte> Take() && { return std::move(buf_); }

private:
    void WriteLE(std::uint64_t v, std::size_t n) {
        const std::size_t at = buf_.size();
        buf_.resize(at + n);
        if constexpr (std::endian::native == std::endian::little) {
            std::memcpy(buf_.data() + at, &v, n);  // a frame holds millions of fields
        } else {
            for (std::size_t i = 0; i < n; ++i) buf_[at + i] = static_cast<std::byte>(v >> (8 * i));
        }
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

    template <std::integral T>
    Result<T> ReadInt() {
        if (sizeof(T) > remaining()) return Truncated(sizeof(T));
        return static_cast<T>(static_cast<std::make_unsigned_t<T>>(TakeLE(sizeof(T))));
    }
    Result<std::uint8_t> ReadU8() { return ReadInt<std::uint8_t>(); }
    Result<std::uint16_t> ReadU16() { return ReadInt<std::uint16_t>(); }
    Result<std::uint32_t> ReadU32() { return ReadInt<std::uint32_t>(); }
    Result<std::uint64_t> ReadU64() { return ReadInt<std::uint64_t>(); }
    Result<std::int64_t> ReadI64() { return ReadInt<std::int64_t>(); }
    /// Errors: InvalidArgument for a byte other than 0 or 1.
    Result<bool> ReadBool();
    Result<double> ReadF64();
    /// Errors: InvalidArgument when the length exceeds `max_bytes` or the bytes are missing.
    Result<std::string> ReadString(std::size_t max_bytes, std::string_view what);
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
    Status Need(std::size_t n) const {
        return n > remaining() ? Truncated(n) : Status::Ok();
    }
    /// The error of a read of `n` bytes past the end.
    Status Truncated(std::size_t n) const;
    /// The next `n` <= 8 bytes (present), little-endian.
    std::uint64_t TakeLE(std::size_t n) {
        std::uint64_t v = 0;
        if constexpr (std::endian::native == std::endian::little) {
            std::memcpy(&v, data_.data() + offset_, n);
        } else {
            for (std::size_t i = 0; i < n; ++i) {
                v |= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(data_[offset_ + i]))
                     << (8 * i);
            }
        }
        offset_ += n;
        return v;
    }

    std::span<const std::byte> data_;
    std::size_t offset_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Field visitor.
//
// A message (or a piece of one) lists its fields once, in wire order:
//
//     struct RangeItem {
//         std::string key;
//         ...
//         static void Fields(auto& v, auto& m) {
//             v("key", m.key, kMaxKeyBytes);        // string: its byte limit
//             v("row_start", m.row_start);          // integer, bool, f64, enum
//             v("dst", m.dst);                      // a nested struct
//         }
//         Status Validate() const;                  // optional: cross-field rules
//     };
//
// FieldWriter and FieldReader both run that list, with `m` const for the writer, so the two
// directions cannot drift. A vector field takes its count limit, then the limits of its
// elements (`v("keys", m.keys, kMaxListKeys, kMaxKeyBytes)`); an optional or a nested struct
// needs none. Fields may branch on a field visited before them (a BufferRef's CUDA handle
// follows only kind kCudaIpc); the reader has set that field by then.
//
// Validate() (or Schema<T>::Validate) runs after the fields in both directions: a writer
// records its error, a reader returns it. Types of other layers, whose fields this layer may not
// add functions to, describe themselves in a Schema<T> specialization: Fields over the type
// itself, or over a `Form` that decoding fills and then turns into the type through
// `Make(Form) -> Result<T>` (their validating factory), with `ViewOf(const T&)` giving the
// writer the same fields without a copy.
// ---------------------------------------------------------------------------------------------

/// How a type of another layer is encoded (see above). Undefined for types with own Fields.
template <typename T>
struct Schema;

/// How an enum is encoded: `Wire` (an unsigned integer type), the valid range [kMin, kMax] and
/// the error for a value outside it ("unknown dtype" -> "unknown dtype 15 at offset 3").
template <typename E>
struct EnumTraits;

template <typename W, W kLo, W kHi>
struct EnumRange {
    using Wire = W;
    static constexpr W kMin = kLo;
    static constexpr W kMax = kHi;
};

namespace internal {

template <typename T>
struct IsVector : std::false_type {};
template <typename E, typename A>
struct IsVector<std::vector<E, A>> : std::true_type {};
template <typename T>
struct IsSpan : std::false_type {};
template <typename E, std::size_t N>
struct IsSpan<std::span<E, N>> : std::true_type {};
template <typename T>
struct IsOptional : std::false_type {};
template <typename E>
struct IsOptional<std::optional<E>> : std::true_type {};

template <typename T>
concept OwnFields = requires(T& t, int& v) { T::Fields(v, t); };
template <typename T>
concept OwnValidate = requires(const T& t) {
    { t.Validate() } -> std::same_as<Status>;
};
template <typename T>
concept SchemaForm = requires { typename Schema<T>::Form; };
template <typename T>
concept SchemaView = requires(const T& t) { Schema<T>::ViewOf(t); };
template <typename T>
concept SchemaValidate = requires(const T& t) {
    { Schema<T>::Validate(t) } -> std::same_as<Status>;
};

template <typename T>
inline constexpr bool kIsScalar = std::is_arithmetic_v<T> || std::is_enum_v<T>;

/// Vectors of structs reserve up front at most this many bytes of elements (and at most the
/// elements whose minimal encodings the message holds); beyond it they grow with the elements
/// actually decoded. A read reply of 10,000 targets reserves all of them: growing by doubling
/// moved every element several times.
inline constexpr std::size_t kMaxReserveBytes = std::size_t{64} << 20;

/// Visits the fields of a struct-like `value` with `visitor`: its own Fields, or its Schema's
/// over `value` (or over Schema<T>::ViewOf(value)).
template <typename T, typename V>
void VisitStruct(V& visitor, T& value) {
    using U = std::remove_const_t<T>;
    if constexpr (OwnFields<U>) {
        U::Fields(visitor, value);
    } else if constexpr (std::is_const_v<T> && SchemaView<U>) {
        const auto& view = Schema<U>::ViewOf(value);
        Schema<U>::Fields(visitor, view);
    } else {
        Schema<U>::Fields(visitor, value);
    }
}

template <typename T>
Status ValidateValue(const T& value) {
    if constexpr (OwnValidate<T>) {
        return value.Validate();
    } else if constexpr (SchemaValidate<T>) {
        return Schema<T>::Validate(value);
    } else {
        return Status::Ok();
    }
}

template <typename E>
Status CheckEnum(typename EnumTraits<E>::Wire v) {
    using Traits = EnumTraits<E>;
    bool ok = v <= Traits::kMax;
    if constexpr (Traits::kMin > 0) ok = ok && v >= Traits::kMin;
    if (ok) return Status::Ok();
    return InvalidArgument(std::string(Traits::kUnknown) + " " + std::to_string(v));
}

/// Sums the smallest encoding of each field (an empty string or vector, an absent optional, the
/// default branch of a field that branches), for MinBytes.
class MinSizeVisitor {
public:
    template <typename T, typename... Bounds>
    void operator()(std::string_view, const T& value, const Bounds&...) {
        if constexpr (std::is_enum_v<T>) {
            bytes_ += sizeof(typename EnumTraits<T>::Wire);
        } else if constexpr (std::is_arithmetic_v<T>) {
            bytes_ += sizeof(T);
        } else if constexpr (std::is_convertible_v<const T&, std::string_view> ||
                             IsVector<T>::value || IsSpan<T>::value) {
            bytes_ += 4;
        } else if constexpr (IsOptional<T>::value) {
            bytes_ += 1;
        } else if constexpr (SchemaForm<T>) {
            const typename Schema<T>::Form form{};
            Schema<T>::Fields(*this, form);
        } else {
            VisitStruct(*this, value);
        }
    }
    std::size_t bytes() const { return bytes_; }

private:
    std::size_t bytes_ = 0;
};

}  // namespace internal

/// The fewest bytes any encoding of a T takes. A decoder checks `count * MinBytes<T>()` against
/// the bytes left before it reserves for a vector of T. Fields that branch must take their
/// shortest branch at their default value (a BufferRef defaults to the client buffer).
template <typename T>
std::size_t MinBytes() {
    static const std::size_t bytes = [] {
        internal::MinSizeVisitor v;
        v("", T{});
        return v.bytes();
    }();
    return bytes;
}

/// Runs Fields lists against a WireWriter.
class FieldWriter {
public:
    explicit FieldWriter(WireWriter& w) : w_(w) {}

    template <typename T, typename... Bounds>
    void operator()(std::string_view name, const T& value, const Bounds&... bounds) {
        if constexpr (std::is_same_v<T, bool>) {
            w_.WriteBool(value);
        } else if constexpr (std::is_enum_v<T>) {
            const auto v = static_cast<typename EnumTraits<T>::Wire>(
                static_cast<std::underlying_type_t<T>>(value));
            w_.Fail(internal::CheckEnum<T>(v));
            w_.WriteInt(v);
        } else if constexpr (std::is_integral_v<T>) {
            w_.WriteInt(value);
        } else if constexpr (std::is_same_v<T, double>) {
            w_.WriteF64(value);
        } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
            static_assert(sizeof...(Bounds) == 1, "a string field needs its byte limit");
            w_.WriteString(value, bounds..., name);
        } else if constexpr (internal::IsVector<T>::value || internal::IsSpan<T>::value) {
            static_assert(sizeof...(Bounds) >= 1, "a vector field needs its count limit");
            WriteSequence(name, value, bounds...);
        } else if constexpr (internal::IsOptional<T>::value) {
            w_.WriteBool(value.has_value());
            if (value) (*this)(name, *value, bounds...);
        } else {
            static_assert(sizeof...(Bounds) == 0, "a struct field takes no limit");
            internal::VisitStruct(*this, value);
            w_.Fail(internal::ValidateValue(value));
        }
    }

private:
    template <typename Seq, typename... ElementBounds>
    void WriteSequence(std::string_view name, const Seq& seq, std::size_t max_count,
                       const ElementBounds&... element_bounds) {
        w_.WriteCount(seq.size(), max_count, name);
        if (seq.size() > max_count) return;
        for (const auto& e : seq) (*this)(name, e, element_bounds...);
    }

    WireWriter& w_;
};

/// Runs Fields lists against a WireReader. The first error sticks: later fields are skipped
/// and the struct being decoded is left partly filled (the caller discards it).
class FieldReader {
public:
    explicit FieldReader(WireReader& r) : r_(r) {}

    const Status& status() const { return status_; }
    bool ok() const { return status_.ok(); }

    template <typename T, typename... Bounds>
    void operator()(std::string_view name, T& value, const Bounds&... bounds) {
        if (!ok()) return;
        if constexpr (std::is_same_v<T, bool>) {
            Take(r_.ReadBool(), value);
        } else if constexpr (std::is_enum_v<T>) {
            ReadEnum(value);
        } else if constexpr (std::is_integral_v<T>) {
            Take(r_.ReadInt<T>(), value);
        } else if constexpr (std::is_same_v<T, double>) {
            Take(r_.ReadF64(), value);
        } else if constexpr (std::is_same_v<T, std::string>) {
            static_assert(sizeof...(Bounds) == 1, "a string field needs its byte limit");
            Take(r_.ReadString(bounds..., name), value);
        } else if constexpr (internal::IsVector<T>::value) {
            static_assert(sizeof...(Bounds) >= 1, "a vector field needs its count limit");
            ReadSequence(name, value, bounds...);
        } else if constexpr (internal::IsOptional<T>::value) {
            bool present = false;
            Take(r_.ReadBool(), present);
            value.reset();
            if (ok() && present) {
                // Read into a value of its own, then moved in: GCC 12 takes an optional's
                // payload of strings filled in place for uninitialized (-Wmaybe-uninitialized).
                typename T::value_type read{};
                (*this)(name, read, bounds...);
                value = std::move(read);
            }
        } else {
            static_assert(sizeof...(Bounds) == 0, "a struct field takes no limit");
            ReadStruct(value);
        }
    }

private:
    void Fail(Status s) {
        if (ok() && !s.ok()) status_ = std::move(s);
    }

    template <typename R, typename T>
    void Take(R&& result, T& out) {
        if (result.ok()) {
            out = std::move(result).value();
        } else {
            Fail(std::move(result).status());
        }
    }

    template <typename E>
    void ReadEnum(E& out) {
        using Wire = typename EnumTraits<E>::Wire;
        const std::size_t at = r_.offset();
        auto v = r_.ReadInt<Wire>();
        if (!v.ok()) {
            Fail(v.status());
        } else if (Status s = internal::CheckEnum<E>(*v); !s.ok()) {
            Fail(InvalidArgument(s.message() + " at offset " + std::to_string(at)));
        } else {
            out = static_cast<E>(*v);
        }
    }

    template <typename E, typename... ElementBounds>
    void ReadSequence(std::string_view name, std::vector<E>& out, std::size_t max_count,
                      const ElementBounds&... element_bounds) {
        auto count = r_.ReadCount(max_count, MinBytes<E>(), name);
        if (!count.ok()) {
            Fail(count.status());
            return;
        }
        out.clear();
        // ReadCount checked that count * MinBytes<E>() bytes are present: scalars may reserve
        // all of them, larger elements (which may each own much more) up to a bound in bytes.
        out.reserve(internal::kIsScalar<E>
                        ? *count
                        : std::min(*count, internal::kMaxReserveBytes / sizeof(E)));
        for (std::size_t i = 0; i < *count; ++i) {
            (*this)(name, out.emplace_back(), element_bounds...);
            if (!ok()) {
                status_ = status_.WithContext(std::string(name) + "[" + std::to_string(i) + "]");
                return;
            }
        }
    }

    template <typename T>
    void ReadStruct(T& out) {
        if constexpr (internal::SchemaForm<T>) {
            typename Schema<T>::Form form;
            Schema<T>::Fields(*this, form);
            if (!ok()) return;
            Take(Schema<T>::Make(std::move(form)), out);
        } else {
            internal::VisitStruct(*this, out);
            if (ok()) Fail(internal::ValidateValue(out));
        }
    }

    WireReader& r_;
    Status status_;
};

/// Appends the encoding of `value`; an error (a field beyond its limit, a failed Validate) is
/// recorded in `w`.
template <typename T>
void Encode(WireWriter& w, const T& value) {
    FieldWriter v(w);
    v("", value);
}

/// Decodes a T at the reader's position.
/// Errors: InvalidArgument.
template <typename T>
Result<T> Decode(WireReader& r) {
    FieldReader v(r);
    T out{};
    v("", out);
    if (!v.ok()) return v.status();
    return out;
}

}  // namespace mooncake::sparse::wire
