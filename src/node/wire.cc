// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Session messages and whole-message encoding; see wire.h. The codec itself is the field
// visitor of wire_format.h, run over each message's Fields.
#include "node/wire.h"

#include <set>
#include <string>
#include <utility>

namespace mooncake::sparse::wire {
namespace {

std::string Num(std::uint64_t v) { return std::to_string(v); }

}  // namespace

Status HelloReply::Validate() const {
    std::set<std::uint32_t> ids;
    for (const SegmentInfo& s : segments) {
        if (!ids.insert(s.segment_id).second) {
            return InvalidArgument("segment id " + Num(s.segment_id) + " repeated");
        }
    }
    return Status::Ok();
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

MessageType TypeOf(const Message& message) {
    return std::visit([](const auto& m) { return std::decay_t<decltype(m)>::kType; }, message);
}

void MessageRef::EncodeTo(WireWriter& w) const {
    if (message_ != nullptr) {
        std::visit([&](const auto& m) { Encode(w, m); }, *message_);
    } else {
        encode_(w, object_);
    }
}

namespace {

Status EncodeInto(WireWriter& w, MessageRef message) {
    message.EncodeTo(w);
    if (!w.status().ok()) {
        return w.status().WithContext("encoding " + std::string(MessageTypeName(message.type())));
    }
    return Status::Ok();
}

template <std::size_t I = 0>
Result<Message> DecodeByIndex(MessageType type, std::span<const std::byte> payload) {
    if constexpr (I == std::variant_size_v<Message>) {
        return InvalidArgument("unknown message type " + Num(static_cast<std::uint16_t>(type)));
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

Status EncodeFrameInto(MessageRef message, std::uint64_t request_id, std::vector<std::byte>& out) {
    WireWriter w(std::move(out));
    out.clear();
    for (std::size_t i = 0; i < kFrameHeaderBytes; ++i) w.WriteU8(0);
    Status s = EncodeInto(w, message);
    const std::size_t payload = w.size() - kFrameHeaderBytes;
    if (s.ok() && payload > kMaxPayloadBytes) {
        s = ResourceExhausted(std::string(MessageTypeName(message.type())) + " payload of " +
                              Num(payload) + " bytes exceeds the frame limit of " +
                              Num(kMaxPayloadBytes));
    }
    out = std::move(w).Take();
    if (!s.ok()) {
        out.clear();
        return s;
    }
    FrameHeader h;
    h.type = message.type();
    h.request_id = request_id;
    h.payload_len = static_cast<std::uint32_t>(payload);
    EncodeFrameHeader(h, std::span<std::byte, kFrameHeaderBytes>(out.data(), kFrameHeaderBytes));
    return Status::Ok();
}

Result<std::vector<std::byte>> EncodeFrame(MessageRef message, std::uint64_t request_id) {
    std::vector<std::byte> out;
    MCS_RETURN_IF_ERROR(EncodeFrameInto(message, request_id, out));
    return out;
}

Result<Message> DecodePayload(MessageType type, std::span<const std::byte> payload) {
    return DecodeByIndex(type, payload);
}

Result<Message> DecodeMessage(const Frame& frame) {
    return DecodePayload(frame.header.type, frame.payload);
}

}  // namespace mooncake::sparse::wire
