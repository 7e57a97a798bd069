// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// libFuzzer target for the node daemon's wire codec (src/store/wire.h): whatever bytes a peer
// sends, decoding must fail cleanly with InvalidArgument or succeed, never crash, hang, leak or
// allocate without bound; and a message that decodes must encode again, decode to an equal
// message, and re-encode to the same bytes (the encoding is canonical).
//
// Each input is tried two ways:
//   1. as a whole frame (header + payload): DecodeFrame + DecodeMessage;
//   2. as a payload alone, so that mutations need not keep payload_len consistent: after a
//      valid header, the bytes that follow it as the header's type; otherwise input[0] picks
//      the type and input[1:] is the payload.
//
// Build and run: scripts/fuzz.sh (Clang, -DMOONCAKE_SPARSE_BUILD_FUZZERS=ON).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <utility>
#include <variant>

#include "node/wire.h"

namespace {

using namespace mooncake::sparse;
using namespace mooncake::sparse::wire;

[[noreturn]] void Die(const char* what, const Status& status = Status::Ok()) {
    std::fprintf(stderr, "wire_fuzzer: %s %s\n", what, status.ToString().c_str());
    std::abort();
}

/// Every message type, in variant order (input[0] indexes it).
template <std::size_t... I>
constexpr auto MakeTypes(std::index_sequence<I...>) {
    return std::array<MessageType, sizeof...(I)>{std::variant_alternative_t<I, Message>::kType...};
}
constexpr auto kTypes = MakeTypes(std::make_index_sequence<std::variant_size_v<Message>>{});

void ExpectCleanFailure(const Status& status) {
    if (status.code() != StatusCode::kInvalidArgument) Die("decode failed with", status);
    if (status.message().empty()) Die("decode failed without a message");
}

void CheckRoundTrip(const Message& message, std::uint64_t request_id) {
    auto bytes = EncodeFrame(message, request_id);
    if (!bytes.ok()) Die("a decoded message does not encode:", bytes.status());
    auto frame = DecodeFrame(*bytes);
    if (!frame.ok()) Die("an encoded frame does not decode:", frame.status());
    if (frame->header.type != TypeOf(message) || frame->header.request_id != request_id) {
        Die("frame header changed in a round trip");
    }
    auto again = DecodeMessage(*frame);
    if (!again.ok()) Die("a re-encoded message does not decode:", again.status());
    if (!(*again == message)) Die("a round trip changed the message");
    auto bytes2 = EncodeFrame(*again, request_id);
    if (!bytes2.ok() || *bytes2 != *bytes) Die("the encoding is not canonical");
    auto payload = EncodePayload(message);
    if (!payload.ok() || payload->size() != bytes->size() - kFrameHeaderBytes) {
        Die("EncodePayload disagrees with EncodeFrame");
    }
}

void TryPayload(MessageType type, std::span<const std::byte> payload) {
    auto m = DecodePayload(type, payload);
    if (!m.ok()) {
        ExpectCleanFailure(m.status());
        return;
    }
    if (TypeOf(*m) != type) Die("decoded message has another type");
    CheckRoundTrip(*m, 0x0123456789abcdefull);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);

    // 1. A whole frame.
    auto frame = DecodeFrame(in);
    if (frame.ok()) {
        auto m = DecodeMessage(*frame);
        if (m.ok()) {
            CheckRoundTrip(*m, frame->header.request_id);
        } else {
            ExpectCleanFailure(m.status());
        }
        // A client reading this frame as the reply to its request.
        auto reply = DecodeReplyAs<OkReply>(*frame);
        if (!reply.ok() && frame->header.type != MessageType::kError) {
            ExpectCleanFailure(reply.status());
        }
    } else {
        ExpectCleanFailure(frame.status());
    }

    // 2. A payload alone.
    auto header = DecodeFrameHeader(in);
    if (header.ok()) {
        TryPayload(header->type, in.subspan(kFrameHeaderBytes));
    } else if (size >= 1) {
        TryPayload(kTypes[data[0] % kTypes.size()], in.subspan(1));
    }
    return 0;
}
