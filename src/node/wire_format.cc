// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The frame layout and the primitive codec of the node daemon's protocol; see wire_format.h.
//
// Decoding is written against hostile input: every read goes through WireReader's bounds check,
// every count is checked against the bytes left before anything is reserved (so a 4-byte count
// cannot make us allocate gigabytes), and recursion depth is fixed by the message grammar (no
// self-nested types), so decode time is linear in the input.
#include "node/wire_format.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

namespace mooncake::sparse::wire {
namespace {

std::string Num(std::uint64_t v) { return std::to_string(v); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// WireWriter.
// ---------------------------------------------------------------------------------------------

void WireWriter::Fail(Status s) {
    if (status_.ok() && !s.ok()) status_ = std::move(s);
}

void WireWriter::WriteString(std::string_view s, std::size_t max_bytes, std::string_view what) {
    if (s.size() > max_bytes || s.size() > UINT32_MAX) {
        Fail(InvalidArgument(std::string(what) + " is " + Num(s.size()) +
                             " bytes, more than the limit of " + Num(max_bytes)));
        WriteU32(0);
        return;
    }
    WriteU32(static_cast<std::uint32_t>(s.size()));
    const auto bytes = std::as_bytes(std::span<const char>(s.data(), s.size()));
    buf_.insert(buf_.end(), bytes.begin(), bytes.end());
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

// ---------------------------------------------------------------------------------------------
// WireReader.
// ---------------------------------------------------------------------------------------------

Status WireReader::Truncated(std::size_t n) const {
    return InvalidArgument("truncated message: need " + Num(n) + " bytes at offset " +
                           Num(offset_) + ", have " + Num(remaining()));
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
        case MessageType::kSparseCommitBatch: return "SparseCommitBatch";
        case MessageType::kSparseCommitBatchReply: return "SparseCommitBatchReply";
        case MessageType::kSparseCommitDevice: return "SparseCommitDevice";
        case MessageType::kLeasesToDevice: return "LeasesToDevice";
        case MessageType::kSparseReadPlan: return "SparseReadPlan";
        case MessageType::kSparseReadPlanReply: return "SparseReadPlanReply";
        case MessageType::kLeaseRangesToDevice: return "LeaseRangesToDevice";
        case MessageType::kSparseReadStep: return "SparseReadStep";
        case MessageType::kSparseAdmit: return "SparseAdmit";
        case MessageType::kSparseAdmitReply: return "SparseAdmitReply";
        case MessageType::kSparseAdmitBatch: return "SparseAdmitBatch";
        case MessageType::kSparseAdmitBatchReply: return "SparseAdmitBatchReply";
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
        case MessageType::kSparseStepManifest: return "SparseStepManifest";
        case MessageType::kSparseStepManifestReply: return "SparseStepManifestReply";
        case MessageType::kSparseSeal: return "SparseSeal";
        case MessageType::kSparseWait: return "SparseWait";
        case MessageType::kSparseLatest: return "SparseLatest";
        case MessageType::kSparseLatestReply: return "SparseLatestReply";
        case MessageType::kSparseRetention: return "SparseRetention";
        case MessageType::kSparseRetentionReply: return "SparseRetentionReply";
        case MessageType::kSparseAnchor: return "SparseAnchor";
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
        case MessageType::kSparseCommitBatchReply:
        case MessageType::kSparseAdmitReply:
        case MessageType::kSparseAdmitBatchReply:
        case MessageType::kSparseManifestReply:
        case MessageType::kSparseCurrentGenerationReply:
        case MessageType::kSparseStepManifestReply:
        case MessageType::kSparseLatestReply:
        case MessageType::kSparseRetentionReply:
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

}  // namespace mooncake::sparse::wire
