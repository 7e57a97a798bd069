// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Structure-aware libFuzzer target for the node daemon's request handlers (DESIGN.md §5-6):
// well-formed requests with hostile fields, sent to a real NodeServer over its Unix socket,
// against a real shared-memory store that holds committed sparse source objects, plain objects
// and a tensor. Whatever a client asks, the daemon must answer with the request's reply or an
// ErrorReply on the same connection, never crash, hang, leak, allocate without bound or
// point a client outside its segments.
//
// Why it is built this way:
// - The input is a sequence of decisions (which request, which field to corrupt, with which
//   value), read through FuzzedDataProvider; each request is built by the project's own wire
//   encoder, so every frame decodes and the fuzzer's time goes into the handlers, the sparse
//   store and the codec behind them (wire_fuzzer covers the codec on arbitrary bytes).
// - Every decision has a plausible default (value 0: the real descriptor, an existing key, an
//   in-range offset), so a short input is a valid request that succeeds, and hostile values
//   (2^40 entries, 2^64-1, tile shapes whose volume overflows, offsets past the buffer,
//   descriptors that disagree with what is stored) are one mutation away.
// - The daemon is started once per process, in-process, so sanitizers and libFuzzer's malloc
//   and RSS limits watch its threads too. Each input gets a fresh connection, and the store is
//   restored to its initial state after an input that changed it, so an input that crashes
//   reproduces alone.
// - The seed corpus (fuzz/corpus/node_request) is written by this binary: scripted decisions
//   are encoded into the bytes that make FuzzedDataProvider return them, and replayed to check
//   that they do (see WriteSeedCorpus).
//
// Build and run: scripts/fuzz.sh (Clang, -DMOONCAKE_SPARSE_BUILD_FUZZERS=ON).
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "codec/codec.h"
#include "node/log.h"
#include "node/node_server.h"
#include "executor/sparse_store.h"
#include "executor/tensor_store.h"
#include "store/shm_segment.h"
#include "node/uds.h"
#include "node/wire.h"

namespace {

using namespace mooncake::sparse;
namespace w = mooncake::sparse::wire;

[[noreturn]] void Die(const std::string& what) {
    std::fprintf(stderr, "node_request_fuzzer: %s\n", what.c_str());
    std::abort();
}

// ---------------------------------------------------------------------------------------------
// Decisions.
// ---------------------------------------------------------------------------------------------

/// Where the fuzzer's decisions come from. `label` names a decision for seed scripts; fuzzing
/// ignores it.
class Choices {
public:
    virtual ~Choices() = default;
    /// A value in [lo, hi]; lo once the input is exhausted.
    virtual std::uint64_t Range(std::string_view label, std::uint64_t lo, std::uint64_t hi) = 0;
    /// At most `max_len` bytes.
    virtual std::string Text(std::string_view label, std::size_t max_len) = 0;

    bool Flag(std::string_view label) { return Range(label, 0, 1) == 1; }
    std::size_t Pick(std::string_view label, std::size_t n) {
        return n == 0 ? 0 : static_cast<std::size_t>(Range(label, 0, n - 1));
    }
};

/// Decisions read from a fuzzer input: integers from its end, bytes from its front.
class InputChoices final : public Choices {
public:
    InputChoices(const std::uint8_t* data, std::size_t size) : fdp_(data, size) {}
    std::uint64_t Range(std::string_view, std::uint64_t lo, std::uint64_t hi) override {
        return fdp_.ConsumeIntegralInRange<std::uint64_t>(lo, hi);
    }
    std::string Text(std::string_view, std::size_t max_len) override {
        return fdp_.ConsumeBytesAsString(fdp_.ConsumeIntegralInRange<std::size_t>(0, max_len));
    }

private:
    FuzzedDataProvider fdp_;
};

/// One scripted decision: the next decision named `label` takes `value` (or the text).
struct Step {
    Step(std::string_view label, std::uint64_t value, std::string text = {})
        : label(label), value(value), text(std::move(text)) {}
    std::string_view label;
    std::uint64_t value;
    std::string text;
};
using Script = std::vector<Step>;

/// Replays a script (decisions it does not name take their lowest value) and records the input
/// bytes that make InputChoices decide the same: integers as FuzzedDataProvider reads them (most
/// significant byte first, from the end of the input), texts at the front.
class ScriptChoices final : public Choices {
public:
    explicit ScriptChoices(Script script) : script_(std::move(script)) {}

    std::uint64_t Range(std::string_view label, std::uint64_t lo, std::uint64_t hi) override {
        std::uint64_t v = lo;
        if (next_ < script_.size() && script_[next_].label == label) {
            v = std::clamp(script_[next_++].value, lo, hi);
        }
        const std::uint64_t range = hi - lo, r = v - lo;
        int bytes = 0;
        while (bytes < 8 && (range >> (8 * bytes)) > 0) ++bytes;
        for (int i = bytes - 1; i >= 0; --i) back_.push_back(std::uint8_t(r >> (8 * i)));
        return v;
    }
    std::string Text(std::string_view label, std::size_t max_len) override {
        std::string s;
        if (next_ < script_.size() && script_[next_].label == label) {
            s = script_[next_++].text.substr(0, max_len);
        }
        return RecordText(s, max_len);
    }

    bool finished() const { return next_ == script_.size(); }
    std::vector<std::uint8_t> Bytes() const {
        std::vector<std::uint8_t> out = front_;
        out.insert(out.end(), back_.rbegin(), back_.rend());
        return out;
    }

private:
    /// The length as InputChoices reads it (an integer in [0, max_len]), then the bytes.
    std::string RecordText(const std::string& s, std::size_t max_len) {
        const std::uint64_t range = max_len;
        int bytes = 0;
        while (bytes < 8 && (range >> (8 * bytes)) > 0) ++bytes;
        for (int i = bytes - 1; i >= 0; --i) back_.push_back(std::uint8_t(s.size() >> (8 * i)));
        front_.insert(front_.end(), s.begin(), s.end());
        return s;
    }

    Script script_;
    std::size_t next_ = 0;
    std::vector<std::uint8_t> front_, back_;
};

// ---------------------------------------------------------------------------------------------
// Hostile values.
// ---------------------------------------------------------------------------------------------

constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();
constexpr std::int64_t kI64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kI64Min = std::numeric_limits<std::int64_t>::min();

/// Values that break size arithmetic: around byte, 2^31, 2^32 and 2^63 boundaries, counts no
/// memory holds (2^40, 2^48), and values whose products with small factors overflow.
constexpr std::uint64_t kHostileU64[] = {
    0,
    1,
    2,
    3,
    7,
    8,
    9,
    16,
    63,
    64,
    255,
    256,
    4096,
    65535,
    65536,
    (std::uint64_t{1} << 31) - 1,
    std::uint64_t{1} << 31,
    (std::uint64_t{1} << 32) - 1,
    std::uint64_t{1} << 32,
    (std::uint64_t{1} << 32) + 1,
    std::uint64_t{1} << 40,
    std::uint64_t{1} << 48,
    std::uint64_t{1} << 61,
    std::uint64_t{1} << 62,
    (std::uint64_t{1} << 63) - 1,
    std::uint64_t{1} << 63,
    kU64Max - 7,
    kU64Max,
};
constexpr std::size_t kNumHostile = std::size(kHostileU64);

/// `real` (decision 0), a table value, `real` +- a few, or anything.
std::uint64_t U64(Choices& c, std::string_view label, std::uint64_t real) {
    const std::uint64_t how = c.Range(label, 0, kNumHostile + 2);
    if (how == 0) return real;
    if (how <= kNumHostile) return kHostileU64[how - 1];
    if (how == kNumHostile + 1) return real + c.Range(label, 0, 16) - 8;
    return c.Range(label, 0, kU64Max);
}

/// As U64, plus the negative counterparts of the table.
std::int64_t I64(Choices& c, std::string_view label, std::int64_t real) {
    const bool negative = c.Flag(label);
    const auto v = static_cast<std::int64_t>(U64(c, label, static_cast<std::uint64_t>(real)));
    if (!negative) return v;
    return v == kI64Min ? kI64Max : -v;
}

/// The script steps that make U64(label, real) return `v` (a table value when it is one).
void Hostile(Script& s, std::string_view label, std::uint64_t v) {
    for (std::size_t i = 0; i < kNumHostile; ++i) {
        if (kHostileU64[i] == v) {
            s.push_back({label, i + 1});
            return;
        }
    }
    s.push_back({label, kNumHostile + 2});
    s.push_back({label, v});
}
/// The steps of I64(label, real) returning `v` (v >= 0).
void HostileI64(Script& s, std::string_view label, std::int64_t v) {
    s.push_back({label, 0});  // Not negated.
    Hostile(s, label, static_cast<std::uint64_t>(v));
}

/// `real`, or a shape of a fuzzed rank (0 .. kMaxRank + 1) whose extents start from `real`'s.
Shape ShapeOf(Choices& c, std::string_view label, const Shape& real) {
    const std::uint64_t how = c.Range(label, 0, 2);
    if (how == 0) return real;
    std::size_t rank = real.size();
    if (how == 2) rank = c.Range(label, 0, kMaxRank + 1);
    Shape out(rank);
    for (std::size_t d = 0; d < rank; ++d) out[d] = I64(c, label, d < real.size() ? real[d] : 1);
    return out;
}

/// One of `known` (decision 0 is the first), or a fuzzed string.
std::string StringOf(Choices& c, std::string_view label, std::span<const std::string> known,
                     std::size_t max_len = 64) {
    const std::size_t i = c.Pick(label, known.size() + 1);
    if (i < known.size()) return known[i];
    return c.Text(label, max_len);
}

DType DTypeOf(Choices& c, std::string_view label, DType real) {
    const std::uint64_t v = c.Range(label, 0, kNumDTypes);
    return v == 0 ? real : static_cast<DType>(v - 1);
}

// ---------------------------------------------------------------------------------------------
// The daemon and what it stores before each input.
// ---------------------------------------------------------------------------------------------

/// A byte range of the client buffer.
struct Region {
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
};

constexpr std::uint64_t kClientBufferBytes = 256 << 10;
constexpr Region kObjectRegion{0, 64 << 10};      ///< The uncommitted sparse object's members.
constexpr Region kDataRegion{64 << 10, 4 << 10};  ///< Source bytes of Put / TensorPut.
constexpr Region kOutRegion{128 << 10, 128 << 10};  ///< Destinations of reads.
constexpr std::string_view kNodeId = "node0";

template <typename T>
std::span<const std::byte> AsBytes(const std::vector<T>& v) {
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(T)};
}

/// `nnz` distinct coordinates of `box` (a deterministic spread) as int64 [nnz, rank], and
/// float32 values.
std::pair<std::vector<std::int64_t>, std::vector<float>> Entries(const Box& box, std::uint64_t nnz,
                                                                 std::uint64_t salt) {
    std::vector<std::int64_t> idx;
    std::vector<float> vals;
    const auto count = static_cast<std::uint64_t>(box.NumElements());
    for (std::uint64_t i = 0; i < nnz; ++i) {
        std::uint64_t flat = (i * (count / nnz) + salt) % count;  // distinct: stride >= 1
        std::vector<std::int64_t> coord(box.rank());
        for (std::size_t d = box.rank(); d-- > 0;) {
            coord[d] = box.begin(d) + static_cast<std::int64_t>(flat % box.shape()[d]);
            flat /= box.shape()[d];
        }
        idx.insert(idx.end(), coord.begin(), coord.end());
        vals.push_back(float(i) * 0.25f - 3.0f);
    }
    return {std::move(idx), std::move(vals)};
}

struct SourceSpec {
    const char* tensor_id;
    Shape global_shape;
    Shape offset;       ///< Empty: the whole tensor.
    Shape local_shape;  ///< Empty: the whole tensor.
    const char* policy;
    NamedAxes::Entry placement;  ///< Empty name: none.
    Shape tile_shape;            ///< Empty: the default.
    std::uint64_t nnz;
    ApplyMode apply;
};

/// What the daemon holds before every input, and the client buffer's initial contents.
struct World {
    std::string socket_path;
    std::unique_ptr<NodeServer> server;
    std::vector<SourceDescriptor> sources;  ///< Committed, generation (0, 1).
    std::vector<std::string> tensor_ids;
    std::vector<std::string> source_refs;
    std::vector<std::string> keys;      ///< Every key in the store.
    std::vector<ObjectInfo> infos;      ///< Stat of each key, same order.
    std::vector<std::string> member_names;
    std::vector<std::string> prefixes;
    std::vector<std::string> tensor_keys;  ///< Tensor objects (TensorGet).
    /// Objects built for the next generation of a committed tensor (w.rows, then w.one_tile),
    /// laid out in kObjectRegion but not committed: the SparseCommits to corrupt. w.one_tile's
    /// index is one tile, so it stays valid under any tile shape at least as large as the
    /// tensor, and a hostile one such as (2^32, 2^32) reaches the codec.
    std::vector<w::SparseCommitRequest> commits;
    std::vector<std::byte> image;  ///< The client buffer before each input.
};

std::string TempDir() {
    char tmpl[] = "/tmp/mcs-node-fuzz-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
    return tmpl;
}

void Check(const Status& s, const std::string& what) {
    if (!s.ok()) Die(what + ": " + s.ToString());
}
template <typename T>
T Check(Result<T> r, const std::string& what) {
    if (!r.ok()) Die(what + ": " + r.status().ToString());
    return std::move(r).value();
}

/// Starts the daemon and commits the initial objects through the normal API.
void StartWorld(World& world) {
    NodeServerOptions o;
    o.socket_path = world.socket_path;
    o.node_id = std::string(kNodeId);
    o.store.segment_size = 8 << 20;
    o.store.num_segments = 2;
    o.store.metadata_capacity_bytes = 8 << 20;
    o.store.name = "node_request_fuzzer";
    o.cache_capacity_bytes = 8 << 20;
    o.client_buffer_max_bytes = 1 << 20;
    o.max_leases_per_connection = 64;
    o.read_threads = 1;
    o.send_timeout = std::chrono::milliseconds(5000);
    world.server = Check(NodeServer::Start(o), "starting the daemon");
    NodeServer& server = *world.server;

    const SourceSpec specs[] = {
        {"w.rows", {64, 96}, {}, {}, "replicate(ep)", {}, {16, 16}, 400, ApplyMode::kOverwrite},
        {"w.experts", {4, 32, 64}, {2, 0, 0}, {1, 32, 64}, "owner(expert)", {"expert", 2}, {},
         200, ApplyMode::kScatterAdd},
        {"w.vec", {5000}, {}, {}, "", {}, {128}, 100, ApplyMode::kOverwrite},
        {"w.wide", {3, 70000}, {}, {}, "replicate(ep)", {}, {1, 4096}, 50,
         ApplyMode::kOverwrite},
        {"w.empty", {16, 16}, {}, {}, "", {}, {4, 4}, 0, ApplyMode::kOverwrite},
        {"w.one_tile", {48, 8}, {}, {}, "replicate(ep)", {}, {48, 8}, 60, ApplyMode::kOverwrite},
    };
    world.image.assign(kClientBufferBytes, std::byte{0});
    world.commits.clear();
    std::uint64_t at = kObjectRegion.offset;
    for (const SourceSpec& spec : specs) {
        PutSparseRequest r;
        r.tensor_id = spec.tensor_id;
        r.global_shape = spec.global_shape;
        if (!spec.offset.empty()) {
            r.global_offset = spec.offset;
            r.local_shape = spec.local_shape;
        }
        const Box box = Check(Box::Make(spec.offset.empty() ? Shape(spec.global_shape.size(), 0)
                                                            : spec.offset,
                                        spec.offset.empty() ? spec.global_shape : spec.local_shape),
                              "source box");
        auto [idx, vals] = Entries(box, spec.nnz, 5);
        r.indices = {DType::kInt64, {Index(spec.nnz), Index(box.rank())}, AsBytes(idx)};
        r.values = {DType::kFloat32, {Index(spec.nnz)}, AsBytes(vals)};
        r.placement_policy = Check(PlacementPolicy::Parse(spec.policy), "policy");
        if (!spec.placement.first.empty()) {
            r.source_placement = Check(NamedAxes::Make({spec.placement}), "placement");
        }
        r.generation = {0, 1};
        r.apply = spec.apply;
        if (!spec.tile_shape.empty()) r.encode.tile_shape = spec.tile_shape;
        r.encode.num_threads = 1;
        Check(server.sparse().PutSparseObject(r).status(),
              std::string("committing ") + r.tensor_id);
        const std::string_view id = spec.tensor_id;
        if (id == "w.rows" || id == "w.one_tile") {
            // The next generation of the same tensor, encoded like a trainer would send it.
            PutSparseRequest next = r;
            next.generation = {1, 2};
            const std::uint64_t nnz = spec.nnz - 7;
            auto [idx2, vals2] = Entries(box, nnz, 11);
            next.indices = {DType::kInt64, {Index(nnz), Index(box.rank())}, AsBytes(idx2)};
            next.values = {DType::kFloat32, {Index(nnz)}, AsBytes(vals2)};
            SparseObject o = Check(BuildSourceObject(next), "encoding a pending object");
            auto place = [&](std::span<const std::byte> bytes, std::uint64_t checksum) {
                if (at + bytes.size() > kObjectRegion.offset + kObjectRegion.size) {
                    Die("the pending objects do not fit their region");
                }
                std::memcpy(world.image.data() + at, bytes.data(), bytes.size());
                w::ClientMember m{w::BufferRef::Client(at, bytes.size()), checksum};
                at += (bytes.size() + 63) / 64 * 64;
                return m;
            };
            w::SparseCommitRequest commit;
            commit.desc = o.desc;
            commit.coordinate_space = o.coordinate_space;
            commit.indices = place(o.indices, o.checksum_indices);
            commit.values = place(o.values, o.checksum_values);
            commit.tile_coords = place(AsBytes(o.tile_coords), o.checksum_tile_coords);
            commit.tile_ptr = place(AsBytes(o.tile_ptr), o.checksum_tile_ptr);
            world.commits.push_back(std::move(commit));
        }
    }
    for (std::uint64_t i = 0; i < kDataRegion.size; ++i) {
        world.image[kDataRegion.offset + i] = std::byte((i * 131 + 7) & 0xff);
    }

    // A plain object and a tensor.
    const std::span<const std::byte> data(world.image.data() + kDataRegion.offset, 256);
    const MemberData members[] = {
        {"data", DType::kUInt8, {256}, data, Checksum(data)},
        {"rows", DType::kFloat32, {16, 4}, data, Checksum(data)},
    };
    Check(server.store().Put("obj/a", "{\"kind\":\"plain\"}", members, {}), "putting obj/a");
    std::vector<std::byte> tensor(128);
    std::memcpy(tensor.data(), data.data(), tensor.size());
    const std::string tensor_key = "tensor/a";
    const TensorRef ref = TensorRef::Host(DType::kFloat32, {4, 8}, tensor);
    Check(server.tensors().Put(std::span(&tensor_key, 1), std::span(&ref, 1), {}), "tensor/a");

    world.sources = Check(server.sparse().Manifest({0, 1}), "manifest");
    world.tensor_ids.clear();
    world.source_refs.clear();
    for (const SourceDescriptor& d : world.sources) {
        world.tensor_ids.push_back(d.tensor_id);
        world.source_refs.push_back(d.source_ref);
    }
    world.keys = Check(server.store().List(""), "listing keys");
    // Objects with members first: decision 0 of a key is then one that ReadMember can read.
    std::stable_partition(world.keys.begin(), world.keys.end(), [&](const std::string& key) {
        return !Check(server.store().Stat(key), "stat " + key).members.empty();
    });
    world.infos.clear();
    world.member_names = {"indices", "values", "tile_coords", "tile_ptr", "data", "rows"};
    for (const std::string& key : world.keys) {
        world.infos.push_back(Check(server.store().Stat(key), "stat " + key));
    }
    world.prefixes = {"", "mcs/", "obj/", "tensor/", "fuzz/"};
    world.tensor_keys = {tensor_key};
}

void StopWorld(World& world) {
    if (world.server) world.server->Stop();
    world.server.reset();
}

// ---------------------------------------------------------------------------------------------
// One input's connection.
// ---------------------------------------------------------------------------------------------

/// MCS_NODE_FUZZ_TRACE=1: print each request and its reply (to see what an input does).
bool Tracing() {
    static const bool on = [] {
        const char* v = std::getenv("MCS_NODE_FUZZ_TRACE");
        return v && *v && std::string_view(v) != "0";
    }();
    return on;
}

std::string Describe(const SourceDescriptor& d) {
    return d.tensor_id + " ref=" + d.source_ref +
           " shape=" + internal::JoinIndices(d.global_shape) + " box=" + d.box.ToString() +
           " tile=" + internal::JoinIndices(d.tile_shape) +
           " nnz=" + std::to_string(d.nnz) + " tiles=" + std::to_string(d.num_tiles) +
           " index=" + std::string(DTypeName(d.index_dtype)) +
           " value=" + std::string(DTypeName(d.value_dtype));
}

/// The fields of `request` that the fuzzer corrupts most, for the trace.
std::string Describe(const w::Message& request) {
    std::string out(w::MessageTypeName(w::TypeOf(request)));
    if (const auto* r = std::get_if<w::SparseReadRequest>(&request)) {
        for (const SourceDescriptor& d : r->manifest) out += "\n    source " + Describe(d);
        for (const TargetDescriptor& t : r->targets) {
            out += "\n    target " + t.tensor_id + " box=" + t.box.ToString();
        }
        out += "\n    strategy=" + std::to_string(int(r->options.strategy)) +
               " threads=" + std::to_string(r->options.num_threads);
    } else if (const auto* c = std::get_if<w::SparseCommitRequest>(&request)) {
        out += "\n    source " + Describe(c->desc);
    }
    return out;
}

/// The reply type of each request.
w::MessageType ReplyTypeOf(w::MessageType request) {
    using T = w::MessageType;
    switch (request) {
        case T::kHello: return T::kHelloReply;
        case T::kStat: return T::kStatReply;
        case T::kList: return T::kListReply;
        case T::kLease: return T::kLeaseReply;
        case T::kSparseCommit: return T::kSparseCommitReply;
        case T::kSparseCommitBatch: return T::kSparseCommitBatchReply;
        case T::kSparseCommitDevice: return T::kSparseCommitBatchReply;
        case T::kSparseAdmit: return T::kSparseAdmitReply;
        case T::kSparseAdmitBatch: return T::kSparseAdmitBatchReply;
        case T::kSparseManifest: return T::kSparseManifestReply;
        case T::kSparseCurrentGeneration: return T::kSparseCurrentGenerationReply;
        case T::kSparseRead: return T::kSparseReadReply;
        case T::kSparseReadStep: return T::kSparseReadReply;
        case T::kSparseReadPlan: return T::kSparseReadPlanReply;
        case T::kMetrics: return T::kMetricsReply;
        case T::kSparseStepManifest: return T::kSparseStepManifestReply;
        case T::kSparseWait: return T::kSparseStepManifestReply;
        case T::kSparseLatest: return T::kSparseLatestReply;
        case T::kSparseRetention: return T::kSparseRetentionReply;
        default: return T::kOk;
    }
}

/// Requests whose success changes what the store holds.
bool Mutates(w::MessageType request) {
    using T = w::MessageType;
    return request == T::kPut || request == T::kRemove || request == T::kSparseCommit ||
           request == T::kSparseCommitBatch || request == T::kSparseCommitDevice ||
           request == T::kSparseAdmit || request == T::kSparseAdmitBatch ||
           request == T::kTensorPut || request == T::kSparseSeal ||
           request == T::kSparseRetention || request == T::kSparseAnchor;
}

/// A connection to the daemon with its client buffer registered; or, when writing the seed
/// corpus, no connection at all (requests are only encoded and recorded).
class Conversation {
public:
    Conversation(World& world, ShmSegment* buffer) : world_(world), buffer_(buffer) {}

    /// Resets the client buffer to the world's image with `pokes` applied, connects, says
    /// Hello and registers the buffer.
    void Open(std::span<const std::pair<std::uint64_t, std::uint8_t>> pokes) {
        if (!buffer_) return;
        std::memcpy(buffer_->data(), world_.image.data(), world_.image.size());
        for (const auto& [offset, value] : pokes) buffer_->data()[offset] = std::byte{value};
        conn_ = Check(UnixConnection::Connect(world_.socket_path), "connecting");
        w::HelloRequest hello;
        hello.pid = static_cast<std::uint32_t>(::getpid());
        hello.client_name = "node_request_fuzzer";
        auto reply = Send(hello, {});
        if (!reply || !std::holds_alternative<w::HelloReply>(*reply)) Die("Hello was refused");
        for (const w::SegmentInfo& s : std::get<w::HelloReply>(*reply).segments) {
            segment_sizes_.push_back({s.segment_id, s.size});
        }
        const int fd = buffer_->fd();
        auto ok = Send(w::RegisterBufferRequest{buffer_->size()}, std::span<const int>(&fd, 1));
        if (!ok || !std::holds_alternative<w::OkReply>(*ok)) Die("RegisterBuffer was refused");
    }

    /// Closes the connection and waits until the daemon has dropped its session (leases,
    /// mapping), so that nothing of this input outlives it.
    void Close() {
        if (!buffer_) return;
        conn_.Close();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (world_.server->Stats().connections_active != 0) {
            if (std::chrono::steady_clock::now() > deadline) Die("the daemon kept a session");
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

    /// Sends `request`; the reply on success, nullopt for an ErrorReply (or when not connected).
    /// Dies when the daemon breaks the conversation: no reply, a reply of the wrong type or id,
    /// fds where none belong, locations outside the segments.
    std::optional<w::Message> Send(const w::Message& request, std::span<const int> fds = {}) {
        auto frame = w::EncodeFrame(request, ++request_id_);
        if (!frame.ok()) {
            // A field the encoder refuses (e.g. a string beyond its limit): not sendable.
            ++unsendable_;
            return std::nullopt;
        }
        sent_.push_back(*frame);
        if (!buffer_) return std::nullopt;
        const w::MessageType type = w::TypeOf(request);
        if (Tracing()) std::fprintf(stderr, "%s\n", Describe(request).c_str());
        Check(conn_.SendFrame(*frame, fds, Deadline::After(std::chrono::seconds(30))),
              "sending " + std::string(w::MessageTypeName(type)));
        std::vector<UniqueFd> reply_fds;
        auto bytes = conn_.RecvFrame(w::kMaxFrameBytes, &reply_fds,
                                     Deadline::After(std::chrono::seconds(30)));
        if (!bytes.ok()) {
            Die("no reply to " + std::string(w::MessageTypeName(type)) + ": " +
                bytes.status().ToString());
        }
        const w::Frame reply = Check(w::DecodeFrame(*bytes), "the reply frame");
        if (reply.header.request_id != request_id_) Die("a reply with another request id");
        const w::Message message = Check(w::DecodeMessage(reply), "the reply");
        if (Tracing()) {
            const auto* err = std::get_if<w::ErrorReply>(&message);
            std::fprintf(stderr, "  %s -> %s\n", std::string(w::MessageTypeName(type)).c_str(),
                         err ? err->ToStatus().ToString().substr(0, 300).c_str()
                             : std::string(w::MessageTypeName(reply.header.type)).c_str());
        }
        if (reply.header.type == w::MessageType::kError) {
            if (!reply_fds.empty()) Die("an ErrorReply carries fds");
            return std::nullopt;
        }
        if (reply.header.type != ReplyTypeOf(type)) {
            Die(std::string(w::MessageTypeName(type)) + " answered by " +
                std::string(w::MessageTypeName(reply.header.type)));
        }
        if (type == w::MessageType::kHello) {
            if (reply_fds.size() != std::get<w::HelloReply>(message).segments.size()) {
                Die("HelloReply carries a wrong number of fds");
            }
        } else if (!reply_fds.empty()) {
            Die(std::string(w::MessageTypeName(reply.header.type)) + " carries fds");
        }
        if (Mutates(type)) dirty_ = true;
        CheckLocations(message);
        return message;
    }

    bool dirty() const { return dirty_; }
    std::size_t unsendable() const { return unsendable_; }
    const std::vector<std::vector<std::byte>>& sent() const { return sent_; }

private:
    void CheckSlice(const w::SegmentSlice& s, std::string_view what) {
        for (const auto& [id, size] : segment_sizes_) {
            if (id == s.segment_id) {
                if (!RangeWithin(s.offset, s.size, size)) {
                    Die(std::string(what) + " outside its segment");
                }
                return;
            }
        }
        Die(std::string(what) + " in an unknown segment");
    }
    void CheckLocations(const w::Message& message) {
        if (const auto* lease = std::get_if<w::LeaseReply>(&message)) {
            for (const w::SegmentSlice& s : lease->locations) CheckSlice(s, "a leased member");
        } else if (const auto* read = std::get_if<w::SparseReadReply>(&message)) {
            for (const w::ReadTargetLocation& o : read->objects) {
                for (const w::SegmentMember* m :
                     {&o.indices, &o.values, &o.tile_coords, &o.tile_ptr}) {
                    CheckSlice(m->slice, "a target object member");
                }
            }
        } else if (const auto* plan = std::get_if<w::SparseReadPlanReply>(&message)) {
            // Leased members inside the segments, ranges inside them, pieces inside the ranges'
            // entries (whole entries: the ranges' values are at least a byte per entry).
            for (const w::PlannedSource& p : plan->sources) {
                CheckSlice(p.indices, "a planned source's indices");
                CheckSlice(p.values, "a planned source's values");
            }
            for (const w::PlannedRange& r : plan->ranges) {
                if (r.source >= plan->sources.size()) Die("a planned range of no source");
                const w::PlannedSource& p = plan->sources[r.source];
                if (!RangeWithin(r.indices_offset, r.indices_bytes, p.indices.size) ||
                    !RangeWithin(r.values_offset, r.values_bytes, p.values.size)) {
                    Die("a planned range outside its source");
                }
            }
            std::uint64_t pieces = 0;
            for (const w::PlannedTarget& t : plan->targets) pieces += t.pieces;
            if (pieces != plan->pieces.size()) Die("planned pieces of no target");
            for (const w::PlannedPiece& p : plan->pieces) {
                if (p.range >= plan->ranges.size() ||
                    !RangeWithin(p.begin, p.count, plan->ranges[p.range].values_bytes)) {
                    Die("a planned piece outside its range");
                }
            }
        }
    }

    World& world_;
    ShmSegment* buffer_;
    UnixConnection conn_;
    std::vector<std::pair<std::uint32_t, std::uint64_t>> segment_sizes_;
    std::uint64_t request_id_ = 0;
    bool dirty_ = false;
    std::size_t unsendable_ = 0;
    std::vector<std::vector<std::byte>> sent_;
};

// ---------------------------------------------------------------------------------------------
// Requests.
// ---------------------------------------------------------------------------------------------

/// Lease ids the daemon returned in this input (Release picks among them).
struct Held {
    std::vector<std::uint64_t> leases;
};

w::BufferRef BufferRefOf(Choices& c, std::string_view label, Region real) {
    w::BufferRef ref = w::BufferRef::Client(U64(c, label, real.offset), U64(c, label, real.size));
    if (c.Range(label, 0, 7) == 7) {  // Now and then a CUDA allocation (no GPU: refused).
        ref.kind = w::BufferKind::kCudaIpc;
        ref.cuda_ipc_handle = c.Text(label, w::kCudaIpcHandleBytes);
        ref.cuda_ipc_handle.resize(w::kCudaIpcHandleBytes, '\0');
        ref.device = static_cast<std::int32_t>(c.Range(label, 0, 8));
    }
    return ref;
}

/// A key of the store (decision 0: the first source object) or a fuzzed one.
const ObjectInfo* KeyOf(Choices& c, const World& world, std::string& key) {
    const std::size_t i = c.Pick("key", world.keys.size() + 1);
    if (i < world.keys.size()) {
        key = world.keys[i];
        return &world.infos[i];
    }
    key = "fuzz/" + c.Text("key", 32);
    return nullptr;
}

/// A member of `info` (or a fuzzed name), with its byte size and row bytes when known.
std::string MemberOf(Choices& c, const ObjectInfo* info, std::uint64_t& size,
                     std::uint64_t& row_bytes, std::uint64_t& rows) {
    size = row_bytes = rows = 0;
    if (info && !info->members.empty()) {
        const std::size_t i = c.Pick("member", info->members.size() + 1);
        if (i < info->members.size()) {
            const MemberInfo& m = info->members[i];
            size = m.size_bytes;
            row_bytes = m.RowBytes();
            rows = m.shape.empty() ? 1 : static_cast<std::uint64_t>(m.shape[0]);
            return m.name;
        }
    }
    return c.Text("member", 16);
}

Region OutOf(std::uint64_t size) { return {kOutRegion.offset, std::min(size, kOutRegion.size)}; }

NamedAxes AxesOf(Choices& c, std::string_view label, const NamedAxes& real) {
    if (!c.Flag(label)) return real;
    static const std::string kAxes[] = {"expert", "ep", "tp"};
    std::vector<NamedAxes::Entry> entries;
    const std::size_t n = c.Range(label, 0, 3);
    for (std::size_t i = 0; i < n; ++i) {
        entries.emplace_back(StringOf(c, label, kAxes, 8), I64(c, label, 2));
    }
    auto axes = NamedAxes::Make(entries);
    return axes.ok() ? *axes : real;  // An invalid one cannot be represented (nor encoded).
}

PlacementPolicy PolicyOf(Choices& c, std::string_view label, const PlacementPolicy& real) {
    static const std::string kPolicies[] = {"none", "owner(expert)", "replicate(ep)", "owner(ep)",
                                            "replicate(expert)"};
    if (!c.Flag(label)) return real;
    auto p = PlacementPolicy::Parse(StringOf(c, label, kPolicies, 24));
    return p.ok() ? *p : real;
}

/// A box of rank <= kMaxRank (what a Box can hold) from fuzzed origin and shape.
Box BoxOf(Choices& c, std::string_view label, const Box& real) {
    if (!c.Flag(label)) return real;
    const Shape origin(real.origin().begin(), real.origin().end());
    const Shape shape(real.shape().begin(), real.shape().end());
    Shape o = ShapeOf(c, label, origin), s = ShapeOf(c, label, shape);
    const std::size_t rank = std::min({o.size(), s.size(), kMaxRank});
    o.resize(rank);
    s.resize(rank);
    return Box::Unchecked(o, s);
}

Generation GenerationOf(Choices& c, std::string_view label, Generation real) {
    return {U64(c, label, real.base), U64(c, label, real.delta)};
}

/// `d` with some fields replaced by hostile values: counts no buffer can hold, tile shapes
/// whose volume overflows, boxes and shapes that disagree with what is stored, another source's
/// reference, dtypes of other sizes.
SourceDescriptor DescriptorOf(Choices& c, const World& world, SourceDescriptor d) {
    const std::size_t n = c.Range("desc", 0, 4);
    for (std::size_t i = 0; i < n; ++i) {
        switch (c.Range("desc.field", 0, 12)) {
            case 0: d.source_ref = StringOf(c, "source_ref", world.source_refs); break;
            case 1: d.tensor_id = StringOf(c, "tensor_id", world.tensor_ids); break;
            case 2: d.global_shape = ShapeOf(c, "global_shape", d.global_shape); break;
            case 3: d.box = BoxOf(c, "box", d.box); break;
            case 4: d.generation = GenerationOf(c, "generation", d.generation); break;
            case 5: d.placement = AxesOf(c, "placement", d.placement); break;
            case 6: d.policy = PolicyOf(c, "policy", d.policy); break;
            case 7: d.tile_shape = ShapeOf(c, "tile_shape", d.tile_shape); break;
            case 8: d.nnz = U64(c, "nnz", d.nnz); break;
            case 9: d.num_tiles = U64(c, "num_tiles", d.num_tiles); break;
            case 10:
                d.apply = c.Flag("apply") ? ApplyMode::kScatterAdd : ApplyMode::kOverwrite;
                break;
            case 11: d.index_dtype = DTypeOf(c, "index_dtype", d.index_dtype); break;
            default: d.value_dtype = DTypeOf(c, "value_dtype", d.value_dtype); break;
        }
    }
    return d;
}

w::Message StatOf(Choices& c, const World& world) {
    w::StatRequest r;
    KeyOf(c, world, r.key);
    return r;
}

w::Message ReadMemberOf(Choices& c, const World& world) {
    w::ReadMemberRequest r;
    const ObjectInfo* info = KeyOf(c, world, r.key);
    std::uint64_t size, row_bytes, rows;
    r.member = MemberOf(c, info, size, row_bytes, rows);
    r.dst = BufferRefOf(c, "dst", OutOf(size));
    return r;
}

w::Message ReadRangesOf(Choices& c, const World& world) {
    w::ReadRangesRequest r;
    const std::size_t n = c.Range("items", 1, 4);
    std::uint64_t out = kOutRegion.offset;
    for (std::size_t i = 0; i < n; ++i) {
        w::RangeItem item;
        const ObjectInfo* info = KeyOf(c, world, item.key);
        std::uint64_t size, row_bytes, rows;
        item.member = MemberOf(c, info, size, row_bytes, rows);
        const std::uint64_t start = rows / 4, end = rows == 0 ? 0 : rows / 2 + 1;
        item.row_start = U64(c, "row_start", start);
        item.row_end = U64(c, "row_end", end);
        const std::uint64_t want = (end - start) * row_bytes;
        item.dst = BufferRefOf(c, "dst", {out, want});
        out += want;
        r.items.push_back(std::move(item));
    }
    return r;
}

w::Message RemoveOf(Choices& c, const World& world) {
    w::RemoveRequest r;
    KeyOf(c, world, r.key);
    return r;
}

w::Message ListOf(Choices& c, const World& world) {
    return w::ListRequest{StringOf(c, "prefix", world.prefixes, 32)};
}

w::Message LeaseOf(Choices& c, const World& world) {
    w::LeaseRequest r;
    KeyOf(c, world, r.key);
    return r;
}

w::Message ReleaseOf(Choices& c, const Held& held) {
    w::ReleaseRequest r;
    const std::size_t n = c.Range("leases", 1, 4);
    for (std::size_t i = 0; i < n; ++i) {
        // The same decisions whatever the daemon answered, so that seeds replay without it.
        const std::size_t pick = c.Range("lease", 0, 7);
        const std::uint64_t real = held.leases.empty() ? 1 : held.leases[pick % held.leases.size()];
        r.lease_ids.push_back(U64(c, "lease", real));
    }
    return r;
}

/// A fuzzed CUDA destination (no GPU here: refused, typed, after the items are checked).
void CudaDestinationOf(Choices& c, w::TensorLocation& d) {
    d.ref.kind = w::BufferKind::kCudaIpc;
    d.ref.offset = U64(c, "destination", 0);
    d.ref.size = U64(c, "destination", std::uint64_t{1} << 20);
    d.ref.cuda_ipc_handle = c.Text("destination", w::kCudaIpcHandleBytes);
    d.ref.cuda_ipc_handle.resize(w::kCudaIpcHandleBytes, '\0');
    d.ref.device = static_cast<std::int32_t>(c.Range("destination", 0, 8));
    d.cuda_base = U64(c, "destination", std::uint64_t{1} << 40);
    d.cuda_alloc_size = U64(c, "destination", std::uint64_t{1} << 20);
}

/// A lease the connection holds (or a fuzzed id).
std::uint64_t HeldLease(Choices& c, const Held& held) {
    const std::size_t pick = c.Range("lease", 0, 7);
    const std::uint64_t real = held.leases.empty() ? 1 : held.leases[pick % held.leases.size()];
    return U64(c, "lease", real);
}

/// Members of held leases (or fuzzed ids and names) into a fuzzed CUDA destination.
w::Message LeasesToDeviceOf(Choices& c, const Held& held) {
    w::LeasesToDeviceRequest r;
    static const std::string kMembers[] = {"indices", "values", "tile_coords", "tile_ptr"};
    for (std::size_t n = c.Range("copies", 0, 4), i = 0; i < n; ++i) {
        const std::uint64_t lease = HeldLease(c, held);
        r.items.push_back({lease, StringOf(c, "member", kMembers, 16), U64(c, "offset", 4096 * i)});
    }
    CudaDestinationOf(c, r.destination);
    return r;
}

/// Byte ranges of held leases' members (or fuzzed ids, members, offsets and sizes) into a
/// fuzzed CUDA destination.
w::Message LeaseRangesToDeviceOf(Choices& c, const Held& held) {
    w::LeaseRangesToDeviceRequest r;
    for (std::size_t n = c.Range("copies", 0, 4), i = 0; i < n; ++i) {
        const std::uint64_t lease = HeldLease(c, held);
        const auto member = static_cast<std::uint32_t>(c.Range("member", 0, 5));
        r.items.push_back({lease, member, U64(c, "offset", 64 * i), U64(c, "bytes", 64),
                           U64(c, "dst_offset", 4096 * i)});
    }
    CudaDestinationOf(c, r.destination);
    return r;
}

w::Message PutOf(Choices& c, const World& world) {
    w::PutRequest r;
    r.key = c.Flag("put.existing") ? world.keys[c.Pick("key", world.keys.size())]
                                   : "fuzz/" + c.Text("key", 32);
    r.metadata = c.Text("metadata", 64);
    const std::size_t n = c.Range("members", 1, 4);
    for (std::size_t i = 0; i < n; ++i) {
        w::PutMember m;
        static const std::string kNames[] = {"data", "indices", "values", "tile_coords",
                                             "tile_ptr"};
        m.name = StringOf(c, "name", kNames, 16);
        m.dtype = DTypeOf(c, "dtype", DType::kUInt8);
        m.shape = ShapeOf(c, "shape", {64});
        m.src = BufferRefOf(c, "src", {kDataRegion.offset + 64 * i, 64});
        // The checksum of the bytes named, when they lie in the buffer (else any).
        std::uint64_t sum = 0;
        if (RangeWithin(m.src.offset, m.src.size, kClientBufferBytes)) {
            sum = Checksum({world.image.data() + m.src.offset, m.src.size});
        }
        m.checksum = U64(c, "checksum", sum);
        r.members.push_back(std::move(m));
    }
    r.mode = c.Flag("mode") ? PutMode::kUpsert : PutMode::kCreate;
    r.hard_pin = c.Flag("hard_pin");
    return r;
}

w::ClientMember ClientMemberOf(Choices& c, std::string_view label, const w::ClientMember& real) {
    w::ClientMember m = real;
    m.src = BufferRefOf(c, label, {real.src.offset, real.src.size});
    m.checksum = U64(c, label, real.checksum);
    return m;
}

w::Message SparseCommitOf(Choices& c, const World& world) {
    w::SparseCommitRequest r = world.commits[c.Pick("commit.object", world.commits.size())];
    // Decision 0 commits the pending object; others start from a committed descriptor.
    const std::size_t base = c.Pick("commit.base", world.sources.size() + 1);
    if (base > 0) r.desc = world.sources[base - 1];
    r.desc = DescriptorOf(c, world, r.desc);
    static const std::string kSpaces[] = {"global", "local"};
    r.coordinate_space = StringOf(c, "coordinate_space", kSpaces, 8);
    r.indices = ClientMemberOf(c, "indices", r.indices);
    r.values = ClientMemberOf(c, "values", r.values);
    r.tile_coords = ClientMemberOf(c, "tile_coords", r.tile_coords);
    r.tile_ptr = ClientMemberOf(c, "tile_ptr", r.tile_ptr);
    r.hard_pin = !c.Flag("hard_pin");
    return r;
}

/// A batch of up to three commits, each drawn as a single SparseCommit is.
w::Message SparseCommitBatchOf(Choices& c, const World& world) {
    w::SparseCommitBatchRequest r;
    for (std::size_t n = c.Range("batch items", 0, 3), i = 0; i < n; ++i) {
        r.items.push_back(std::get<w::SparseCommitRequest>(SparseCommitOf(c, world)));
    }
    return r;
}

/// A device commit of up to three updates drawn from the pending objects, their members laid
/// out in a fuzzed CUDA allocation (no GPU here: every update is refused alone, typed).
w::Message SparseCommitDeviceOf(Choices& c, const World& world) {
    w::SparseCommitDeviceRequest r;
    std::uint64_t end = 0;  // Where the members laid out so far end.
    for (std::size_t n = c.Range("device items", 0, 3), i = 0; i < n; ++i) {
        const w::SparseCommitRequest& pending =
            world.commits[c.Pick("commit.object", world.commits.size())];
        const SourceDescriptor d = DescriptorOf(c, world, pending.desc);
        w::DeviceUpdate u;
        u.tensor_id = d.tensor_id;
        u.global_shape = d.global_shape;
        if (c.Flag("device.box")) {
            u.global_offset = Shape(d.box.origin().begin(), d.box.origin().end());
            u.local_shape = Shape(d.box.shape().begin(), d.box.shape().end());
        }
        u.source_placement = d.placement;
        u.policy = d.policy;
        u.generation = d.generation;
        u.apply = d.apply;
        if (c.Flag("device.tile_shape")) u.tile_shape = d.tile_shape;
        u.duplicates = static_cast<DuplicatePolicy>(c.Range("duplicates", 0, 2));
        u.hard_pin = !c.Flag("hard_pin");
        const auto member = [&](std::string_view label, DType dtype, Shape shape) {
            w::DeviceMember m;
            m.dtype = DTypeOf(c, label, dtype);
            m.shape = ShapeOf(c, label, shape);
            std::uint64_t bytes = DTypeSize(m.dtype);
            for (Index e : m.shape) bytes *= static_cast<std::uint64_t>(e < 0 ? 0 : e);
            m.offset = U64(c, label, (end + 63) / 64 * 64);
            m.size = U64(c, label, bytes);
            if (m.offset <= ~std::uint64_t{0} - m.size) end = std::max(end, m.offset + m.size);
            return m;
        };
        const Index nnz = static_cast<Index>(d.nnz), rank = static_cast<Index>(d.rank());
        u.indices = member("device.indices", d.index_dtype, {nnz, rank});
        u.values = member("device.values", d.value_dtype, {nnz});
        r.items.push_back(std::move(u));
    }
    const std::string label = "device.memory";
    r.memory.ref.kind = w::BufferKind::kCudaIpc;
    r.memory.ref.offset = U64(c, label, 0);
    r.memory.ref.size = U64(c, label, end);
    r.memory.ref.cuda_ipc_handle = c.Text(label, w::kCudaIpcHandleBytes);
    r.memory.ref.cuda_ipc_handle.resize(w::kCudaIpcHandleBytes, '\0');
    r.memory.ref.device = static_cast<std::int32_t>(c.Range(label, 0, 8));
    r.memory.cuda_base = U64(c, label, std::uint64_t{1} << 40);
    r.memory.cuda_alloc_size = U64(c, label, std::uint64_t{64} << 20);
    return r;
}

w::Message SparseAdmitOf(Choices& c, const World& world) {
    const SourceDescriptor& s = world.sources[c.Pick("source", world.sources.size())];
    w::SparseAdmitRequest r;
    r.tensor_id = StringOf(c, "tensor_id", world.tensor_ids);
    r.generation = GenerationOf(c, "generation", {1, 2});
    r.policy = PolicyOf(c, "policy", s.policy);
    r.source_placement = AxesOf(c, "placement", s.placement);
    static const std::string kWriters[] = {"writer0"};
    r.writer_id = StringOf(c, "writer", kWriters, 32);
    return r;
}

w::Message SparseManifestOf(Choices& c) {
    return w::SparseManifestRequest{GenerationOf(c, "generation", {0, 1})};
}

w::Message SparseSealOf(Choices& c, const World& world) {
    w::SparseSealRequest r;
    r.generation = GenerationOf(c, "generation", {0, 1});
    // Decision 0: every committed tensor; else a few, possibly hostile, ids.
    if (!c.Flag("seal.subset")) {
        r.tensor_ids = world.tensor_ids;
    } else {
        for (std::size_t n = c.Range("seal ids", 0, 3), i = 0; i < n; ++i) {
            r.tensor_ids.push_back(StringOf(c, "tensor_id", world.tensor_ids));
        }
    }
    return r;
}

w::Message SparseWaitOf(Choices& c) {
    static const double kTimeouts[] = {0.0, 0.002, -1.0, 1e300, std::nan("")};
    return w::SparseWaitRequest{GenerationOf(c, "generation", {0, 1}),
                                kTimeouts[c.Pick("timeout", std::size(kTimeouts))]};
}

w::Message SparseCurrentGenerationOf(Choices& c, const World& world) {
    return w::SparseCurrentGenerationRequest{StringOf(c, "tensor_id", world.tensor_ids)};
}

w::Message SparseReadOf(Choices& c, const World& world) {
    w::SparseReadRequest r;
    // Decision 0: the whole committed manifest, read by one target per source.
    const bool whole = !c.Flag("manifest.subset");
    const std::size_t n = whole ? world.sources.size() : c.Range("manifest", 1, 3);
    for (std::size_t i = 0; i < n; ++i) {
        const std::size_t pick = whole ? i : c.Pick("source", world.sources.size());
        r.manifest.push_back(DescriptorOf(c, world, world.sources[pick]));
    }
    const std::size_t targets = c.Range("targets", 1, 3);
    for (std::size_t i = 0; i < targets; ++i) {
        const SourceDescriptor& s = world.sources[c.Pick("target.source", world.sources.size())];
        TargetDescriptor t;
        t.target_id = "t" + std::to_string(i);
        t.node_id = c.Flag("target.node") ? c.Text("node_id", 16) : std::string(kNodeId);
        t.tensor_id = StringOf(c, "tensor_id", world.tensor_ids);
        if (t.tensor_id == world.tensor_ids.front()) t.tensor_id = s.tensor_id;
        t.placement = AxesOf(c, "target.placement", s.placement);
        t.box = BoxOf(c, "target.box", s.box);
        r.targets.push_back(std::move(t));
    }
    PlanningLimits& limits = r.options.plan.limits;
    if (c.Flag("limits")) {
        limits.max_tiles_per_query = U64(c, "limits", limits.max_tiles_per_query);
        limits.max_groups_per_query = U64(c, "limits", limits.max_groups_per_query);
        limits.max_regions = U64(c, "limits", limits.max_regions);
    }
    r.options.plan.read_coalesce_gap = I64(c, "coalesce_gap", -1);
    r.options.strategy = c.Flag("strategy") ? w::ReadStrategy::kFullSourcePerTarget
                                            : w::ReadStrategy::kSparseRanges;
    r.options.num_threads = static_cast<std::uint32_t>(c.Range("threads", 0, 3) == 3
                                                           ? U64(c, "threads", 4)
                                                           : 0);
    return r;
}

/// The read of SparseReadOf planned as a step's (its sources leased to the connection).
w::Message SparseReadPlanOf(Choices& c, const World& world) {
    w::SparseReadRequest read = std::get<w::SparseReadRequest>(SparseReadOf(c, world));
    w::SparseReadPlanRequest r;
    r.step = GenerationOf(c, "generation", {0, 1});
    r.manifest = std::move(read.manifest);
    r.targets = std::move(read.targets);
    r.options = read.options;
    for (std::size_t n = c.Range("unchanged", 0, 2), i = 0; i < n; ++i) {
        r.unchanged.push_back(StringOf(c, "tensor_id", world.tensor_ids));
    }
    if (c.Flag("plan.by_step")) {
        // Naming the step instead (the daemon's own manifest of it): any count of entries, and
        // sometimes a manifest sent all the same.
        r.sealed_entries = U64(c, "sealed_entries", world.sources.size());
        if (!c.Flag("plan.by_step.with_manifest")) {
            r.manifest.clear();
            r.unchanged.clear();
        }
    }
    return r;
}

/// The targets of SparseReadOf read by naming a step (the daemon's own manifest of it): any
/// generation, sealed or not, a fold, or one never committed.
w::Message SparseReadStepOf(Choices& c, const World& world) {
    w::SparseReadRequest read = std::get<w::SparseReadRequest>(SparseReadOf(c, world));
    w::SparseReadStepRequest r;
    r.step = GenerationOf(c, "generation", {0, 1});
    r.targets = std::move(read.targets);
    r.options = read.options;
    return r;
}

w::Message TensorItemsOf(Choices& c, const World& world, bool put) {
    std::vector<w::TensorItem> items;
    const std::size_t n = c.Range("items", 1, 3);
    for (std::size_t i = 0; i < n; ++i) {
        w::TensorItem item;
        static const std::string kFresh[] = {"fuzz/tensor0", "fuzz/tensor1"};
        item.key = put ? StringOf(c, "key", kFresh, 32) : StringOf(c, "key", world.tensor_keys, 32);
        item.dtype = DTypeOf(c, "dtype", DType::kFloat32);
        item.shape = ShapeOf(c, "shape", {4, 8});
        const Region real = put ? Region{kDataRegion.offset + 128 * i, 128}
                                : Region{kOutRegion.offset + 128 * i, 128};
        item.location.ref = BufferRefOf(c, "location", real);
        if (item.location.ref.kind == w::BufferKind::kCudaIpc) {
            item.location.cuda_base = U64(c, "cuda_base", std::uint64_t{1} << 40);
            item.location.cuda_alloc_size = U64(c, "cuda_alloc_size", 4096);
        }
        items.push_back(std::move(item));
    }
    if (put) {
        w::TensorPutRequest r;
        r.items = std::move(items);
        r.mode = c.Flag("mode") ? PutMode::kUpsert : PutMode::kCreate;
        r.hard_pin = c.Flag("hard_pin");
        return r;
    }
    return w::TensorGetRequest{std::move(items)};
}

/// The request kinds, in the order of the "op" decision (0 ends the input).
enum Op : std::uint64_t {
    kEnd = 0,
    kStat,
    kReadMember,
    kReadRanges,
    kRemove,
    kList,
    kLease,
    kRelease,
    kPut,
    kSparseCommit,
    kSparseAdmit,
    kSparseManifest,
    kSparseCurrentGeneration,
    kSparseRead,
    kMetrics,
    kClearCaches,
    kTensorPut,
    kTensorGet,
    kHelloAgain,
    kRegisterBufferWithoutFd,
    kSparseStepManifest,
    kSparseSeal,
    kSparseWait,
    kSparseLatest,
    kSparseRetention,
    kSparseAnchor,
    kSparseCommitBatch,
    kSparseCommitDevice,
    kLeasesToDevice,
    kSparseReadPlan,
    kLeaseRangesToDevice,
    kSparseReadStep,
    kSparseAdmitBatch,
    kNumOps,
};

constexpr std::size_t kMaxRequestsPerInput = 8;
constexpr std::size_t kMaxPokes = 4;

/// One input: optional corruption of the client buffer, then up to kMaxRequestsPerInput
/// requests on one connection.
void RunInput(Choices& c, World& world, Conversation& conv) {
    // A few bytes of the client buffer changed, so that committed members and their checksums
    // disagree (the daemon must notice, or copy before it validates).
    std::vector<std::pair<std::uint64_t, std::uint8_t>> pokes;
    for (std::size_t n = c.Range("pokes", 0, kMaxPokes), i = 0; i < n; ++i) {
        const std::uint64_t offset =
            kObjectRegion.offset + c.Range("poke", 0, kObjectRegion.size - 1);
        pokes.emplace_back(offset, static_cast<std::uint8_t>(c.Range("poke", 0, 255)));
    }
    conv.Open(pokes);
    Held held;
    for (std::size_t i = 0; i < kMaxRequestsPerInput; ++i) {
        const std::uint64_t op = c.Range("op", 0, kNumOps - 1);
        w::Message request;
        switch (op) {
            case kEnd: return;
            case kStat: request = StatOf(c, world); break;
            case kReadMember: request = ReadMemberOf(c, world); break;
            case kReadRanges: request = ReadRangesOf(c, world); break;
            case kRemove: request = RemoveOf(c, world); break;
            case kList: request = ListOf(c, world); break;
            case kLease: request = LeaseOf(c, world); break;
            case kRelease: request = ReleaseOf(c, held); break;
            case kPut: request = PutOf(c, world); break;
            case kSparseCommit: request = SparseCommitOf(c, world); break;
            case kSparseAdmit: request = SparseAdmitOf(c, world); break;
            case kSparseManifest: request = SparseManifestOf(c); break;
            case kSparseCurrentGeneration: request = SparseCurrentGenerationOf(c, world); break;
            case kSparseRead: request = SparseReadOf(c, world); break;
            case kMetrics: request = w::MetricsRequest{c.Flag("reset")}; break;
            case kClearCaches: request = w::ClearCachesRequest{}; break;
            case kTensorPut: request = TensorItemsOf(c, world, true); break;
            case kTensorGet: request = TensorItemsOf(c, world, false); break;
            case kSparseStepManifest:
                request = w::SparseStepManifestRequest{GenerationOf(c, "generation", {0, 1})};
                break;
            case kSparseSeal: request = SparseSealOf(c, world); break;
            case kSparseCommitBatch: request = SparseCommitBatchOf(c, world); break;
            case kSparseCommitDevice: request = SparseCommitDeviceOf(c, world); break;
            case kLeasesToDevice: request = LeasesToDeviceOf(c, held); break;
            case kSparseReadPlan: request = SparseReadPlanOf(c, world); break;
            case kLeaseRangesToDevice: request = LeaseRangesToDeviceOf(c, held); break;
            case kSparseReadStep: request = SparseReadStepOf(c, world); break;
            case kSparseAdmitBatch: {
                w::SparseAdmitBatchRequest r;
                for (std::size_t n = c.Range("admissions", 0, 3), i = 0; i < n; ++i) {
                    r.items.push_back(std::get<w::SparseAdmitRequest>(SparseAdmitOf(c, world)));
                }
                request = std::move(r);
                break;
            }
            case kSparseWait: request = SparseWaitOf(c); break;
            case kSparseLatest: request = w::SparseLatestRequest{c.Flag("anchor")}; break;
            case kSparseAnchor: {
                w::SparseAnchorRequest r;
                r.generation = GenerationOf(c, "generation", {0, 1});
                for (std::size_t n = c.Range("anchor ids", 0, 3), i = 0; i < n; ++i) {
                    r.tensor_ids.push_back(StringOf(c, "tensor_id", world.tensor_ids));
                }
                request = r;
                break;
            }
            case kSparseRetention:
                request = w::SparseRetentionRequest{
                    c.Flag("set"), U64(c, "keep_last", 2),
                    c.Flag("keep_anchors.set") ? std::optional<std::uint64_t>(U64(c, "keep_anchors", 1))
                                               : std::nullopt};
                break;
            case kHelloAgain: {
                w::HelloRequest hello;
                hello.protocol_version = static_cast<std::uint32_t>(U64(c, "protocol", 1));
                hello.client_name = c.Text("client", 16);
                request = hello;
                break;
            }
            default: request = w::RegisterBufferRequest{U64(c, "size", kClientBufferBytes)}; break;
        }
        auto reply = conv.Send(request);
        if (!reply) continue;
        if (const auto* lease = std::get_if<w::LeaseReply>(&*reply)) {
            held.leases.push_back(lease->lease_id);
        } else if (const auto* read = std::get_if<w::SparseReadReply>(&*reply)) {
            for (const auto& o : read->objects) held.leases.push_back(o.lease_id);
        } else if (const auto* plan = std::get_if<w::SparseReadPlanReply>(&*reply)) {
            for (const auto& source : plan->sources) held.leases.push_back(source.lease_id);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The seed corpus.
// ---------------------------------------------------------------------------------------------

std::size_t SourceIndex(const World& world, std::string_view tensor_id) {
    for (std::size_t i = 0; i < world.sources.size(); ++i) {
        if (world.sources[i].tensor_id == tensor_id) return i;
    }
    Die("no source " + std::string(tensor_id));
}

std::size_t KeyIndex(const World& world, std::string_view key) {
    for (std::size_t i = 0; i < world.keys.size(); ++i) {
        if (world.keys[i] == key) return i;
    }
    Die("no key " + std::string(key));
}

/// A SparseRead of one source of `tensor_id` by one target of its box, the descriptor changed
/// by `desc` (steps of DescriptorOf).
Script ReadOne(const World& world, std::string_view tensor_id, const Script& desc) {
    const std::uint64_t source = SourceIndex(world, tensor_id);
    Script s = {{"op", kSparseRead}, {"manifest.subset", 1}, {"manifest", 1}, {"source", source}};
    s.insert(s.end(), desc.begin(), desc.end());
    s.push_back({"target.source", source});
    return s;
}

/// Steps of DescriptorOf that set one field (`field` as numbered there) through `set`.
Script Field(std::uint64_t field, Script set) {
    Script s = {{"desc", 1}, {"desc.field", field}};
    s.insert(s.end(), set.begin(), set.end());
    return s;
}
Script HostileField(std::uint64_t field, std::string_view label, std::uint64_t v) {
    Script set;
    Hostile(set, label, v);
    return Field(field, set);
}
/// A tile shape (DescriptorOf field 7) of the given extents.
Script TileShape(std::initializer_list<std::int64_t> extents) {
    Script set = {{"tile_shape", 1}};  // ShapeOf: same rank, fuzzed extents.
    for (std::int64_t e : extents) HostileI64(set, "tile_shape", e);
    return Field(7, set);
}
/// `real + delta` for U64(label) (|delta| <= 8).
Script Near(std::string_view label, int delta) {
    return {{label, kNumHostile + 1}, {label, static_cast<std::uint64_t>(delta + 8)}};
}

std::vector<std::pair<std::string, Script>> SeedScripts(const World& world) {
    std::vector<std::pair<std::string, Script>> seeds;
    // One well-formed request of each kind, with every field at its default: most succeed.
    static const char* const kNames[] = {
        "end", "stat", "read_member", "read_ranges", "remove", "list", "lease", "release",
        "put", "sparse_commit", "sparse_admit", "sparse_manifest", "sparse_current_generation",
        "sparse_read", "metrics", "clear_caches", "tensor_put", "tensor_get", "hello_again",
        "register_buffer_without_fd", "sparse_step_manifest", "sparse_seal", "sparse_wait",
        "sparse_latest", "sparse_retention", "sparse_anchor", "sparse_commit_batch",
        "sparse_commit_device", "leases_to_device", "sparse_read_plan",
        "lease_ranges_to_device", "sparse_read_step", "sparse_admit_batch"};
    static_assert(std::size(kNames) == kNumOps);
    for (std::uint64_t op = 1; op < kNumOps; ++op) seeds.push_back({kNames[op], {{"op", op}}});

    // Sparse reads whose descriptors disagree with what is stored.
    constexpr std::uint64_t k2e32 = std::uint64_t{1} << 32, k2e40 = std::uint64_t{1} << 40;
    auto rows = [&](const Script& desc) { return ReadOne(world, "w.rows", desc); };
    seeds.push_back({"sparse_read_nnz_2e40", rows(HostileField(8, "nnz", k2e40))});
    seeds.push_back({"sparse_read_nnz_u64max", rows(HostileField(8, "nnz", kU64Max))});
    {
        Script d = {{"desc", 2}, {"desc.field", 8}};
        Hostile(d, "nnz", k2e40);
        d.push_back({"desc.field", 9});
        Hostile(d, "num_tiles", k2e40);
        seeds.push_back({"sparse_read_num_tiles_2e40", rows(d)});
    }
    {
        Script s = rows(HostileField(8, "nnz", kU64Max));
        s.push_back({"strategy", 1});  // Each target reads its whole sources.
        seeds.push_back({"sparse_read_full_source_nnz_u64max", s});
    }
    seeds.push_back({"sparse_read_num_tiles_plus_1",
                     rows(Field(9, Near("num_tiles", 1)))});
    seeds.push_back({"sparse_read_tile_shape_2e32x2e32",
                     rows(TileShape({std::int64_t(k2e32), std::int64_t(k2e32)}))});
    seeds.push_back({"sparse_read_tile_shape_2e62x8",
                     rows(TileShape({std::int64_t{1} << 62, 8}))});
    seeds.push_back({"sparse_read_tile_larger_than_shape",
                     rows(TileShape({1000, 1000}))});
    seeds.push_back({"sparse_read_one_tile_shape_2e32x2e32",
                     ReadOne(world, "w.one_tile",
                             TileShape({std::int64_t(k2e32), std::int64_t(k2e32)}))});
    seeds.push_back({"sparse_read_one_tile_shape_2e62x8",
                     ReadOne(world, "w.one_tile", TileShape({std::int64_t{1} << 62, 8}))});
    seeds.push_back({"sparse_read_tile_shape_3d_2e32",
                     ReadOne(world, "w.experts", TileShape({1, std::int64_t(k2e32), 64}))});
    {
        Script set = {{"global_shape", 1}};
        HostileI64(set, "global_shape", 128);
        seeds.push_back({"sparse_read_global_shape_differs", rows(Field(2, set))});
    }
    seeds.push_back({"sparse_read_other_source_ref",
                     rows(Field(0, {{"source_ref", SourceIndex(world, "w.vec")}}))});
    seeds.push_back({"sparse_read_index_dtype_uint64",
                     rows(Field(11, {{"index_dtype", 1 + std::uint64_t(DType::kUInt64)}}))});
    {
        Script s = rows({});
        s.push_back({"target.box", 1});
        s.push_back({"target.box", 1});  // ShapeOf(origin): same rank, fuzzed extents
        HostileI64(s, "target.box", k2e40);
        seeds.push_back({"sparse_read_target_box_outside", s});
    }
    {
        // The tile index cached by a first read, then a second read whose descriptor disagrees
        // with it: the cache must not be trusted for another descriptor.
        Script s = rows({});
        Script d = {{"desc", 2}, {"desc.field", 9}};
        auto near = Near("num_tiles", -1);
        d.insert(d.end(), near.begin(), near.end());
        d.push_back({"desc.field", 8});
        auto fewer = Near("nnz", -8);
        d.insert(d.end(), fewer.begin(), fewer.end());
        const Script second = rows(d);
        s.insert(s.end(), second.begin(), second.end());
        seeds.push_back({"sparse_read_cached_index_then_fewer_tiles", s});
    }

    // Commits with hostile descriptors and members.
    auto commit = [](Script desc) {
        Script s = {{"op", kSparseCommit}};
        s.insert(s.end(), desc.begin(), desc.end());
        return s;
    };
    seeds.push_back({"sparse_commit_nnz_2e40", commit(HostileField(8, "nnz", k2e40))});
    {
        Script d = {{"desc", 2}, {"desc.field", 8}};
        Hostile(d, "nnz", kU64Max);
        d.push_back({"desc.field", 9});
        Hostile(d, "num_tiles", kU64Max);
        seeds.push_back({"sparse_commit_num_tiles_u64max", commit(d)});
    }
    seeds.push_back({"sparse_commit_tile_shape_2e32x2e32",
                     commit(TileShape({std::int64_t(k2e32), std::int64_t(k2e32)}))});
    {
        Script s = {{"op", kSparseCommit}, {"commit.object", 1}};
        const Script tile = TileShape({std::int64_t(k2e32), std::int64_t(k2e32)});
        s.insert(s.end(), tile.begin(), tile.end());
        seeds.push_back({"sparse_commit_one_tile_shape_2e32x2e32", s});
        s = {{"op", kSparseCommit}, {"commit.object", 1}};
        const Script tile2 = TileShape({std::int64_t{1} << 62, 8});
        s.insert(s.end(), tile2.begin(), tile2.end());
        seeds.push_back({"sparse_commit_one_tile_shape_2e62x8", s});
    }
    seeds.push_back({"sparse_commit_poked_values",
                     {{"pokes", 2}, {"poke", 600}, {"poke", 0xff}, {"poke", 2}, {"poke", 0x80},
                      {"op", kSparseCommit}}});

    // Object and tensor requests with out-of-range offsets and overflowing shapes.
    const std::uint64_t obj = KeyIndex(world, "obj/a");
    {
        Script s = {{"op", kReadRanges}, {"key", obj}, {"member", 1}};
        Hostile(s, "row_end", kU64Max);
        seeds.push_back({"read_ranges_row_end_u64max", s});
    }
    {
        Script s = {{"op", kReadMember}, {"key", obj}};
        Hostile(s, "dst", std::uint64_t{1} << 63);
        seeds.push_back({"read_member_dst_offset_2e63", s});
    }
    {
        Script s = {{"op", kPut}, {"dtype", 1 + std::uint64_t(DType::kFloat64)}, {"shape", 1}};
        HostileI64(s, "shape", k2e32);
        seeds.push_back({"put_shape_2e32", s});
    }
    {
        Script s = {{"op", kTensorPut}, {"shape", 1}};
        HostileI64(s, "shape", k2e32);
        HostileI64(s, "shape", k2e32);
        seeds.push_back({"tensor_put_shape_2e32x2e32", s});
    }
    seeds.push_back({"lease_then_release", {{"op", kLease}, {"op", kRelease}}});
    seeds.push_back({"sparse_read_then_release", {{"op", kSparseRead}, {"op", kRelease}}});
    seeds.push_back({"sparse_seal_then_read_step", {{"op", kSparseSeal}, {"op", kSparseReadStep}}});
    seeds.push_back({"sparse_seal_then_plan_step",
                     {{"op", kSparseSeal}, {"op", kSparseReadPlan}, {"plan.by_step", 1}}});
    seeds.push_back({"sparse_admit_batch_of_two", {{"op", kSparseAdmitBatch}, {"admissions", 2}}});
    return seeds;
}

/// Writes one input per seed script into `dir`, after checking that each replays (through
/// FuzzedDataProvider) to exactly the requests the script built.
void WriteSeedCorpus(World& world, const std::string& dir) {
    std::filesystem::create_directories(dir);
    int n = 0;
    for (auto& [name, script] : SeedScripts(world)) {
        ScriptChoices scripted(script);
        Conversation recorded(world, nullptr);
        RunInput(scripted, world, recorded);
        if (!scripted.finished()) Die("seed " + name + ": a step of its script was not used");
        const std::vector<std::uint8_t> bytes = scripted.Bytes();
        InputChoices replayed_choices(bytes.data(), bytes.size());
        Conversation replayed(world, nullptr);
        RunInput(replayed_choices, world, replayed);
        if (replayed.sent() != recorded.sent()) Die("seed " + name + " does not replay");
        if (recorded.unsendable() != 0) {
            Die("seed " + name + " builds a request that cannot be encoded");
        }
        char prefix[8];
        std::snprintf(prefix, sizeof(prefix), "%02d_", n++);
        const std::string path = dir + "/" + prefix + name + ".bin";
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        if (!out) Die("cannot write " + path);
    }
    std::fprintf(stderr, "node_request_fuzzer: wrote %d seeds to %s\n", n, dir.c_str());
}

// ---------------------------------------------------------------------------------------------
// The process's daemon.
// ---------------------------------------------------------------------------------------------

World* g_world = nullptr;
ShmSegment* g_buffer = nullptr;

void StopAtExit() {
    if (!g_world) return;
    StopWorld(*g_world);
    std::error_code ignored;
    std::filesystem::remove_all(std::filesystem::path(g_world->socket_path).parent_path(), ignored);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    // The daemon logs every connection at info level: only errors, so the fuzzer's own output
    // stays readable.
    daemon::SetLogSink(nullptr, daemon::LogSeverity::kError);
    g_world = new World;
    g_world->socket_path = TempDir() + "/node.sock";
    StartWorld(*g_world);
    std::atexit(StopAtExit);
    g_buffer = new ShmSegment(Check(
        ShmSegment::Create("node_request_fuzzer_client", kClientBufferBytes,
                           {.seal_future_write = false}),
        "creating the client buffer"));
    // MCS_NODE_FUZZ_CORPUS_DIR=DIR: write the seed corpus instead of fuzzing.
    if (const char* dir = std::getenv("MCS_NODE_FUZZ_CORPUS_DIR"); dir && *dir) {
        WriteSeedCorpus(*g_world, dir);
        std::exit(0);
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    World& world = *g_world;
    InputChoices choices(data, size);
    Conversation conv(world, g_buffer);
    RunInput(choices, world, conv);
    conv.Close();
    // What the input left in the daemon's caches goes with it, so that the next input starts
    // from the same state (and frees within its own run what it allocated: no false leak).
    (void)world.server->sparse().ClearCaches();  // Never fails.
    world.server->sparse().ResetMetrics();
    if (conv.dirty()) {
        StopWorld(world);
        StartWorld(world);
    }
    return 0;
}
