// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The node daemon's protocol (docs/design.md §5-6): every message between the node daemon
// (`mooncake_sparse_node`, the RealClient that owns the shared-memory segments) and the
// DummyClients of the same node, and the calls that turn them into frames and back. The frame
// layout and the payload encoding are in wire_format.h; the messages of each conversation in
// their own header, included here:
//
//     session (this header)                  HelloRequest, ErrorReply, OkReply
//     object store (wire_objects.h)          Put, Stat, ReadMember, ReadRanges, List, Lease, ...
//     sparse objects (wire_sparse.h)         SparseCommit, SparseAdmit, SparseRead, Metrics, ...
//     tensor fast path (wire_tensor.h)       TensorPut, TensorGet
//
// Every request gets exactly one reply with the same request_id: the listed one on success,
// ErrorReply on failure. A connection starts with
//
//     HelloRequest                  -> HelloReply     (+ one fd per segment, SCM_RIGHTS, in order)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "mooncake/sparse/status.h"
#include "node/wire_common.h"
#include "node/wire_format.h"
#include "node/wire_objects.h"
#include "node/wire_sparse.h"
#include "node/wire_tensor.h"

namespace mooncake::sparse::wire {

// ---- Session ---------------------------------------------------------------------------------

/// First request on a connection.
struct HelloRequest {
    static constexpr MessageType kType = MessageType::kHello;
    std::uint32_t protocol_version = kProtocolVersion;
    std::uint32_t pid = 0;
    std::string client_name;
    std::string name_space;  ///< The run's namespace of this connection's sparse calls.

    static void Fields(auto& v, auto& m) {
        v("protocol_version", m.protocol_version);
        v("pid", m.pid);
        v("client_name", m.client_name, kMaxNameBytes);
        v("name_space", m.name_space, kMaxNameBytes);
    }
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

    static void Fields(auto& v, auto& m) {
        v("protocol_version", m.protocol_version);
        v("daemon_version", m.daemon_version, kMaxNameBytes);
        v("node_id", m.node_id, kMaxNameBytes);
        v("segments", m.segments, kMaxSegments);
        v("client_buffer_max", m.client_buffer_max);
    }
    Status Validate() const;
    friend bool operator==(const HelloReply&, const HelloReply&) = default;
};

/// The failure reply to any request.
struct ErrorReply {
    static constexpr MessageType kType = MessageType::kError;
    StatusCode code = StatusCode::kInternal;  ///< Never kOk.
    std::string message;

    static ErrorReply FromStatus(const Status& status);  ///< An OK status becomes kInternal.
    Status ToStatus() const { return {code, message}; }

    static void Fields(auto& v, auto& m) {
        v("status code", m.code);
        v("error message", m.message, kMaxMessageBytes);
    }
    friend bool operator==(const ErrorReply&, const ErrorReply&) = default;
};

/// The success reply of requests that return nothing.
struct OkReply {
    static constexpr MessageType kType = MessageType::kOk;

    static void Fields(auto&, auto&) {}
    friend bool operator==(const OkReply&, const OkReply&) = default;
};

// ---- Every message ---------------------------------------------------------------------------

/// Every message, for dispatch (`std::visit`) and for the fuzzer.
using Message = std::variant<
    HelloRequest, HelloReply, ErrorReply, OkReply, RegisterBufferRequest, PutRequest, StatRequest,
    StatReply, ReadMemberRequest, ReadRangesRequest, RemoveRequest, ListRequest, ListReply,
    LeaseRequest, LeaseReply, ReleaseRequest, SparseCommitRequest, SparseCommitReply,
    SparseAdmitRequest, SparseAdmitReply, SparseManifestRequest, SparseManifestReply,
    SparseCurrentGenerationRequest, SparseCurrentGenerationReply, SparseReadRequest,
    SparseReadReply, MetricsRequest, MetricsReply, TensorPutRequest, TensorGetRequest,
    ClearCachesRequest, SparseStepManifestRequest, SparseStepManifestReply, SparseSealRequest,
    SparseWaitRequest, SparseLatestRequest, SparseLatestReply, SparseRetentionRequest,
    SparseRetentionReply, SparseAnchorRequest, SparseCommitBatchRequest, SparseCommitBatchReply,
    SparseCommitDeviceRequest, LeasesToDeviceRequest, SparseReadPlanRequest, SparseReadPlanReply,
    LeaseRangesToDeviceRequest, SparseReadStepRequest, SparseAdmitBatchRequest,
    SparseAdmitBatchReply>;

MessageType TypeOf(const Message& message);

// ---------------------------------------------------------------------------------------------
// Encoding and decoding whole frames and payloads.
// ---------------------------------------------------------------------------------------------

/// A message to encode, by reference: a Message, or one of its alternatives encoded where it
/// lies (a request of tens of thousands of items is not copied into a Message first). It refers
/// to the message it was made from, which must outlive it: pass it down a call, never keep it.
class MessageRef {
public:
    MessageRef(const Message& message)  // NOLINT(google-explicit-constructor): a view
        : type_(TypeOf(message)), message_(&message) {}
    template <typename M>
        requires(!std::is_same_v<M, Message> && requires { M::kType; })
    MessageRef(const M& message)  // NOLINT(google-explicit-constructor): a view
        : type_(M::kType), object_(&message), encode_([](WireWriter& w, const void* m) {
              Encode(w, *static_cast<const M*>(m));
          }) {}

    MessageType type() const { return type_; }
    /// The message's payload, appended to `w` (its status tells whether a field was refused).
    void EncodeTo(WireWriter& w) const;

private:
    MessageType type_;
    const Message* message_ = nullptr;
    const void* object_ = nullptr;
    void (*encode_)(WireWriter&, const void*) = nullptr;
};

/// Header + payload of `message`.
/// Errors: InvalidArgument (a field beyond its limit); ResourceExhausted (frame larger than
/// kMaxFrameBytes).
Result<std::vector<std::byte>> EncodeFrame(MessageRef message, std::uint64_t request_id);

/// EncodeFrame into `out` (replaced; its capacity is reused).
/// Errors: as EncodeFrame (`out` is then empty).
Status EncodeFrameInto(MessageRef message, std::uint64_t request_id, std::vector<std::byte>& out);

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
    auto m = Decode<M>(r);
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
