// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The steps of a training run on SparseStore (docs/design.md §9): seals with the model's tensor
// list, fencing across skipped steps, unchanged tensors read as empty objects, folds of several
// steps (overwrite: latest value; scatter_add: sum), waits, retention with readers' leases, and
// namespaces.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "codec/codec.h"
#include "executor/sparse_store.h"
#include "../status_matchers.h"
#include "../store/store_test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::StatusIs;
using ::mooncake::sparse::testing::StatusIsWithMessage;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Clock = std::chrono::steady_clock;

Generation Step(std::uint64_t k) { return {k - 1, k}; }

std::int64_t NowMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

double SecondsSince(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

Box MakeBox(Shape origin, Shape shape) { return *Box::Make(origin, shape); }
Box WholeBox(const Shape& shape) { return *Box::Whole(shape); }

/// A dense array of any dtype (the weights of a reference model, or of one target).
struct Dense {
    DType dtype = DType::kFloat32;
    Shape shape;
    std::vector<std::byte> bytes;

    static Dense Zeros(DType dtype, Shape shape) {
        Dense d{dtype, std::move(shape), {}};
        d.bytes.assign(std::size_t(NumElements(d.shape)) * DTypeSize(dtype), std::byte{0});
        return d;
    }
    std::size_t esize() const { return DTypeSize(dtype); }
};

/// A global COO update: int64 coordinates and values of the tensor's dtype.
struct Update {
    std::vector<std::int64_t> idx;
    std::vector<std::byte> val;
    std::size_t nnz = 0;
};

std::size_t Flat(const Shape& shape, const std::int64_t* coord) {
    std::size_t flat = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + std::size_t(coord[d]);
    return flat;
}

/// `nnz` distinct random coordinates inside `box`, with random values: arbitrary bits for
/// overwrite, small integers for scatter_add (so that sums are exact in float32 too).
Update RandomUpdate(std::mt19937_64& rng, const Box& box, std::size_t nnz, DType dtype,
                    bool small_integers) {
    Update u;
    std::set<std::vector<std::int64_t>> seen;
    nnz = std::min<std::size_t>(nnz, std::size_t(box.NumElements()));
    while (seen.size() < nnz) {
        std::vector<std::int64_t> p;
        for (std::size_t d = 0; d < box.rank(); ++d) {
            p.push_back(box.begin(d) + std::int64_t(rng() % std::uint64_t(box.shape()[d])));
        }
        if (!seen.insert(p).second) continue;
        u.idx.insert(u.idx.end(), p.begin(), p.end());
        const std::int64_t small = std::int64_t(rng() % 17) - 8;
        std::byte v[8] = {};
        switch (dtype) {
            case DType::kFloat32: {
                float f = small_integers ? float(small)
                                         : std::uniform_real_distribution<float>(-4, 4)(rng);
                std::memcpy(v, &f, 4);
                break;
            }
            case DType::kInt32: {
                std::int32_t i = small_integers ? std::int32_t(small) : std::int32_t(rng());
                std::memcpy(v, &i, 4);
                break;
            }
            case DType::kBFloat16: {
                // The top half of a float32: a bf16 bit pattern.
                float f = std::uniform_real_distribution<float>(-4, 4)(rng);
                std::uint32_t bits;
                std::memcpy(&bits, &f, 4);
                const std::uint16_t h = std::uint16_t(bits >> 16);
                std::memcpy(v, &h, 2);
                break;
            }
            default:
                ADD_FAILURE() << "dtype not handled by RandomUpdate";
        }
        u.val.insert(u.val.end(), v, v + DTypeSize(dtype));
    }
    u.nnz = nnz;
    return u;
}

/// The reference apply, in global coordinates.
void ApplyReference(Dense& ref, const Update& u, ApplyMode apply) {
    const std::size_t rank = ref.shape.size(), es = ref.esize();
    for (std::size_t i = 0; i < u.nnz; ++i) {
        std::byte* dst = ref.bytes.data() + Flat(ref.shape, &u.idx[i * rank]) * es;
        const std::byte* src = u.val.data() + i * es;
        if (apply == ApplyMode::kOverwrite) {
            std::memcpy(dst, src, es);
        } else if (ref.dtype == DType::kFloat32) {
            float a, b;
            std::memcpy(&a, dst, 4);
            std::memcpy(&b, src, 4);
            a += b;
            std::memcpy(dst, &a, 4);
        } else {
            ASSERT_EQ(ref.dtype, DType::kInt32);
            std::int32_t a, b;
            std::memcpy(&a, dst, 4);
            std::memcpy(&b, src, 4);
            a = std::int32_t(std::uint32_t(a) + std::uint32_t(b));
            std::memcpy(dst, &a, 4);
        }
    }
}

/// The elements of `ref` inside `box`, C order.
std::vector<std::byte> Slice(const Dense& ref, const Box& box) {
    const std::size_t rank = box.rank(), es = ref.esize();
    std::vector<std::byte> out;
    std::vector<std::int64_t> c(box.origin().begin(), box.origin().end());
    const std::size_t n = std::size_t(box.NumElements());
    out.reserve(n * es);
    for (std::size_t i = 0; i < n; ++i) {
        const std::byte* src = ref.bytes.data() + Flat(ref.shape, c.data()) * es;
        out.insert(out.end(), src, src + es);
        for (std::size_t d = rank; d-- > 0;) {
            if (++c[d] < box.end(d)) break;
            c[d] = box.begin(d);
        }
    }
    return out;
}

/// Applies a target-local object to the target's weight, as an inference rank does.
Status ApplyTarget(Dense& local, const TargetObject& t) {
    const SourceDescriptor& d = t.object.desc;
    const MutableHostArray w{local.dtype, local.shape, std::span<std::byte>(local.bytes)};
    const HostArray idx{d.index_dtype, {Index(d.nnz), Index(d.rank())}, t.object.indices};
    const HostArray val{d.value_dtype, {Index(d.nnz)}, t.object.values};
    return ApplySparse(w, idx, val, d.apply, 1);
}

PutSparseRequest Req(const std::string& id, const Shape& shape, const Update& u, DType dtype,
                     Generation g, ApplyMode apply = ApplyMode::kOverwrite,
                     const std::string& policy = "none", NamedAxes placement = {},
                     std::optional<Box> box = std::nullopt) {
    PutSparseRequest r;
    r.tensor_id = id;
    r.global_shape = shape;
    if (box) {
        r.global_offset = Shape(box->origin().begin(), box->origin().end());
        r.local_shape = Shape(box->shape().begin(), box->shape().end());
    }
    r.indices = {DType::kInt64, {Index(u.nnz), Index(shape.size())},
                 std::as_bytes(std::span(u.idx))};
    r.values = {dtype, {Index(u.nnz)}, u.val};
    r.placement_policy = *PlacementPolicy::Parse(policy);
    r.source_placement = std::move(placement);
    r.generation = g;
    r.apply = apply;
    return r;
}

/// A one-entry float32 update of element (row, col) of a 2-D tensor.
Update One(std::int64_t row, std::int64_t col, float value) {
    Update u;
    u.idx = {row, col};
    u.val.resize(4);
    std::memcpy(u.val.data(), &value, 4);
    u.nnz = 1;
    return u;
}

TargetDescriptor Target(const std::string& id, const std::string& tensor, const std::string& node,
                        Shape offset, Shape local, std::vector<NamedAxes::Entry> axes = {}) {
    return *TargetDescriptor::Make(id, node, tensor, *NamedAxes::Make(std::move(axes)), offset,
                                   local);
}

/// The float32 entries of a target object, by local coordinate.
std::map<std::vector<std::int64_t>, float> Entries(const TargetObject& o) {
    std::map<std::vector<std::int64_t>, float> out;
    const auto& d = o.object.desc;
    const std::size_t isz = DTypeSize(d.index_dtype);
    for (std::uint64_t i = 0; i < d.nnz; ++i) {
        std::vector<std::int64_t> p;
        for (std::size_t k = 0; k < d.rank(); ++k) {
            std::uint64_t v = 0;
            std::memcpy(&v, o.object.indices.data() + (i * d.rank() + k) * isz, isz);
            p.push_back(std::int64_t(v));
        }
        float f;
        std::memcpy(&f, o.object.values.data() + i * 4, 4);
        out[p] = f;
    }
    return out;
}

std::vector<std::string> Ids(std::initializer_list<const char*> ids) {
    return std::vector<std::string>(ids.begin(), ids.end());
}

struct StoreSize {
    std::size_t keys = 0;
    std::uint64_t bytes = 0;           ///< Metadata and members.
    std::uint64_t member_bytes = 0;
    std::uint64_t max_metadata = 0;  ///< Of one object.
};

StoreSize SizeOf(ObjectStore& os, const std::string& prefix = "") {
    StoreSize s;
    auto keys = os.List(prefix);
    EXPECT_TRUE(keys.ok());
    for (const std::string& k : *keys) {
        auto info = os.Stat(k);
        if (!info.ok()) continue;
        ++s.keys;
        s.bytes += info->metadata.size();
        s.max_metadata = std::max<std::uint64_t>(s.max_metadata, info->metadata.size());
        for (const MemberInfo& m : info->members) {
            s.member_bytes += m.size_bytes;
            s.bytes += m.size_bytes;
        }
    }
    return s;
}

/// The deltas of the steps whose source objects the store holds (from "mcs/src<tag>/" keys).
std::set<std::uint64_t> StepsWithSources(ObjectStore& os, const std::string& src_prefix) {
    std::set<std::uint64_t> out;
    const std::vector<std::string> keys = *os.List(src_prefix);
    for (const std::string& k : keys) {
        const auto g = k.find("/g");
        const auto dash = k.find('-', g);
        const auto slash = k.find('/', dash);
        out.insert(std::stoull(k.substr(dash + 1, slash - dash - 1)));
    }
    return out;
}

SparseStoreOptions Options(std::string node_id, std::string name_space = "",
                           double lease_seconds = 60) {
    SparseStoreOptions o;
    o.node_id = std::move(node_id);
    o.name_space = std::move(name_space);
    o.lease_seconds = lease_seconds;
    return o;
}

/// A reader's lease object on a step, written as SparseStore writes one (what a reader that
/// crashed mid-read leaves behind).
void WriteLease(ObjectStore& os, const std::string& tag, Generation step, const std::string& holder,
                std::int64_t expires_ms) {
    const std::string key = "mcs/lease" + tag + "/" + GenerationTag(step) + "/" + holder;
    ASSERT_OK(os.Put(key, nlohmann::json{{"expires_ms", expires_ms}}.dump(), {},
                     {PutMode::kUpsert, true}));
}

/// The embedded store, with range reads that can be held (a reader stuck mid-read).
class HoldingStore : public ObjectStore {
public:
    HoldingStore() : inner_(MakeEmbeddedStore()) {}
    Status Put(std::string_view key, std::string_view metadata,
               std::span<const MemberData> members, const PutOptions& options) override {
        return inner_->Put(key, metadata, members, options);
    }
    Result<ObjectInfo> Stat(std::string_view key) override { return inner_->Stat(key); }
    Status ReadMember(std::string_view key, std::string_view member,
                      std::span<std::byte> dst) override {
        return inner_->ReadMember(key, member, dst);
    }
    Status ReadRanges(std::span<const RangeRead> reads) override {
        {
            std::unique_lock lock(mu_);
            if (hold_) {
                ++held_;
                cv_.notify_all();
                cv_.wait(lock, [&] { return !hold_; });
            }
        }
        return inner_->ReadRanges(reads);
    }
    Status Remove(std::string_view key) override { return inner_->Remove(key); }
    Result<std::vector<std::string>> List(std::string_view prefix) override {
        return inner_->List(prefix);
    }
    StoreCounters Counters() const override { return inner_->Counters(); }

    void Hold() {
        std::lock_guard lock(mu_);
        hold_ = true;
    }
    void WaitHeld() {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return held_ > 0; });
    }
    void Release() {
        std::lock_guard lock(mu_);
        hold_ = false;
        cv_.notify_all();
    }

private:
    std::unique_ptr<ObjectStore> inner_;
    std::mutex mu_;
    std::condition_variable cv_;
    bool hold_ = false;
    int held_ = 0;
};

/// Commits a one-entry float32 update of tensor `id` ([8, 8], policy none) at `step`.
Status CommitOne(SparseStore& s, const std::string& id, std::uint64_t step, float value,
                 std::int64_t col = 0) {
    return s.PutSparseObject(Req(id, {8, 8}, One(0, col, value), DType::kFloat32, Step(step)))
        .status();
}

/// Commits every tensor of `ids` at `step` and seals it with `ids`.
void CommitAndSeal(SparseStore& s, const std::vector<std::string>& ids, std::uint64_t step) {
    for (const std::string& id : ids) ASSERT_OK(CommitOne(s, id, step, float(step)));
    ASSERT_OK(s.SealGeneration(Step(step), ids));
}

// ---------------------------------------------------------------------------------------------
// Seals.
// ---------------------------------------------------------------------------------------------

TEST(StepsTest, SealListsTheModelAndIsFinal) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore store(os);
    ASSERT_OK_AND_ASSIGN(auto latest0, store.LatestGeneration());
    EXPECT_FALSE(latest0.has_value());

    ASSERT_OK(CommitOne(store, "w", 1, 1.0f));
    // Not a step.
    EXPECT_THAT(store.SealGeneration({0, 2}, Ids({"w"})), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store.SealGeneration({1, 1}, Ids({"w"})), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store.SealGeneration({2, 1}, Ids({"w"})), StatusIs(StatusCode::kInvalidArgument));
    // A committed tensor missing from the list; a bad or repeated id.
    EXPECT_THAT(store.SealGeneration(Step(1), Ids({"v"})),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "'w'"));
    EXPECT_THAT(store.SealGeneration(Step(1), {}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store.SealGeneration(Step(1), Ids({"w", "v", "w"})),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store.SealGeneration(Step(1), Ids({"w", ""})),
                StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(store.SealGeneration(Step(1), Ids({"w", "a\nb"})),
                StatusIs(StatusCode::kInvalidArgument));
    // Nothing of the failed seals is visible.
    ASSERT_OK_AND_ASSIGN(StepManifest open, store.GetManifest(Step(1)));
    EXPECT_FALSE(open.sealed);
    EXPECT_EQ(open.sources.size(), 1u);
    EXPECT_THAT(open.unchanged, IsEmpty());
    EXPECT_FALSE(store.LatestGeneration()->has_value());

    // The tensor list in any order; "v" and "n" are unchanged.
    ASSERT_OK(store.SealGeneration(Step(1), Ids({"v", "w", "n"})));
    EXPECT_THAT(store.SealGeneration(Step(1), Ids({"v", "w", "n"})),
                StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_THAT(store.SealGeneration(Step(1), Ids({"w"})),
                StatusIs(StatusCode::kFailedPrecondition));
    ASSERT_OK_AND_ASSIGN(auto latest1, store.LatestGeneration());
    EXPECT_EQ(latest1, Step(1));

    ASSERT_OK_AND_ASSIGN(StepManifest m, store.GetManifest(Step(1)));
    EXPECT_TRUE(m.sealed);
    EXPECT_EQ(m.generation, Step(1));
    ASSERT_EQ(m.sources.size(), 1u);
    EXPECT_EQ(m.sources[0].tensor_id, "w");
    EXPECT_THAT(m.unchanged, ElementsAre("n", "v"));

    // Commits into the sealed step: a new tensor, another box of "w", another payload of the
    // same key are Conflict; an identical retry is still an idempotent success.
    EXPECT_THAT(CommitOne(store, "v", 1, 1.0f), StatusIs(StatusCode::kConflict));
    EXPECT_THAT(store.PutSparseObject(Req("w", {8, 8}, One(4, 0, 1.0f), DType::kFloat32,
                                          Step(1), ApplyMode::kOverwrite, "none", {},
                                          MakeBox({4, 0}, {4, 8})))
                    .status(),
                StatusIs(StatusCode::kConflict));
    EXPECT_THAT(CommitOne(store, "w", 1, 2.0f), StatusIs(StatusCode::kConflict));
    ASSERT_OK_AND_ASSIGN(CommitResult retry, store.PutSparseObject(Req(
                                                 "w", {8, 8}, One(0, 0, 1.0f), DType::kFloat32,
                                                 Step(1))));
    EXPECT_FALSE(retry.created);
    ASSERT_OK_AND_ASSIGN(StepManifest after, store.GetManifest(Step(1)));
    EXPECT_EQ(after.sources.size(), 1u);
    EXPECT_THAT(after.unchanged, ElementsAre("n", "v"));
    EXPECT_FALSE(os->Stat("mcs/head/v").ok());  // the refused commit left nothing

    // A step with no commit at all: every tensor unchanged.
    ASSERT_OK(store.SealGeneration(Step(2), Ids({"w", "v", "n"})));
    ASSERT_OK_AND_ASSIGN(StepManifest empty, store.GetManifest(Step(2)));
    EXPECT_TRUE(empty.sealed);
    EXPECT_THAT(empty.sources, IsEmpty());
    EXPECT_THAT(empty.unchanged, ElementsAre("n", "v", "w"));
    EXPECT_EQ(*store.LatestGeneration(), Step(2));
}

TEST(StepsTest, ASealedManifestReadAgainIsTheSameUntilRetentionFreesTheStep) {
    // Readers of a node read each sealed step's manifest once per rank; the store keeps the last
    // few. A cached manifest never outlives its step, in this store or in another of the run.
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore trainer(os, Options("trainer"));
    SparseStore reader(os, Options("n0"));
    ASSERT_OK(trainer.SetRetention(1));
    CommitAndSeal(trainer, {"w", "v"}, 1);
    ASSERT_OK_AND_ASSIGN(StepManifest first, reader.GetManifest(Step(1)));
    ASSERT_OK_AND_ASSIGN(StepManifest again, reader.GetManifest(Step(1)));
    ASSERT_OK_AND_ASSIGN(StepManifest own, trainer.GetManifest(Step(1)));
    ASSERT_EQ(first.sources.size(), 2u);
    EXPECT_EQ(again.sources, first.sources);
    EXPECT_EQ(own.sources, first.sources);
    ASSERT_OK(reader.ClearCaches());
    ASSERT_OK_AND_ASSIGN(StepManifest cleared, reader.GetManifest(Step(1)));
    EXPECT_EQ(cleared.sources, first.sources);
    // Step 2 sealed: retention frees step 1 (through the trainer), whose manifest both stores
    // had cached.
    CommitAndSeal(trainer, {"w", "v"}, 2);
    EXPECT_THAT(reader.GetManifest(Step(1)), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(trainer.GetManifest(Step(1)), StatusIs(StatusCode::kNotFound));
    ASSERT_OK_AND_ASSIGN(StepManifest second, reader.GetManifest(Step(2)));
    ASSERT_EQ(second.sources.size(), 2u);
    EXPECT_EQ(second.sources[0].generation, Step(2));
}

TEST(StepsTest, RetentionOverAJumpInStepNumbersFreesTheStepsThatExistOnly) {
    // A step sealed far past the steps before it (numbers skipped): retention frees the steps
    // that left records, a step committed in the gap and never sealed among them, and moves
    // the floor past the gap, without trying every number in it (2^50 here: a pass that tried
    // each would never end).
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore trainer(os, Options("trainer"));
    ASSERT_OK(trainer.SetRetention(1));
    CommitAndSeal(trainer, {"w"}, 1);
    CommitAndSeal(trainer, {"w"}, 2);
    const std::uint64_t far = std::uint64_t{1} << 50;
    ASSERT_OK(CommitOne(trainer, "u", far / 2, 3.0f));  // in the gap, never sealed
    const std::string gap_tag = "/" + std::to_string(far / 2 - 1) + "-" + std::to_string(far / 2);
    const auto gap_keys = [&] {
        auto keys = os->List("mcs/");
        EXPECT_TRUE(keys.ok());
        std::size_t n = 0;
        for (const std::string& k : keys.ok() ? *keys : std::vector<std::string>{}) {
            n += k.find(gap_tag) != std::string::npos;
        }
        return n;
    };
    EXPECT_GT(gap_keys(), 0u);
    CommitAndSeal(trainer, {"w"}, far);
    EXPECT_THAT(trainer.GetManifest(Step(2)), StatusIs(StatusCode::kNotFound));
    EXPECT_EQ(gap_keys(), 0u);
    ASSERT_OK_AND_ASSIGN(StepManifest kept, trainer.GetManifest(Step(far)));
    EXPECT_EQ(kept.sources.size(), 1u);
    CommitAndSeal(trainer, {"w"}, far + 1);
    EXPECT_THAT(trainer.GetManifest(Step(far)), StatusIs(StatusCode::kNotFound));
    ASSERT_OK_AND_ASSIGN(StepManifest last, trainer.GetManifest(Step(far + 1)));
    EXPECT_EQ(last.sources.size(), 1u);
    // A retention near 2^64 steps keeps everything (floor + keep_last does not wrap around).
    ASSERT_OK(trainer.SetRetention(~std::uint64_t{0}));
    CommitAndSeal(trainer, {"w"}, far + 2);
    ASSERT_OK_AND_ASSIGN(StepManifest still, trainer.GetManifest(Step(far + 1)));
    EXPECT_EQ(still.sources.size(), 1u);
}

TEST(StepsTest, ASealKeepsExactlyTheDecodedManifestOfItsStep) {
    // What a seal keeps for the readers of its step is exactly what a decode of the step's
    // manifest gives, in the same order: every field, boxes, placements, policies, apply modes
    // and dtypes, with entries committed through another store among them.
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore trainer(os, Options("trainer"));
    SparseStore other(os, Options("other"));
    SparseStore reader(os, Options("n0"));
    std::mt19937_64 rng(31);
    std::vector<std::string> ids;
    for (std::uint64_t k = 1; k <= 3; ++k) {
        std::vector<PutSparseRequest> mine, theirs;
        std::vector<Update> updates;
        updates.reserve(64);
        ids.clear();
        for (int t = 0; t < 24; ++t) {
            const std::string id = "layers." + std::to_string(t) + ".w";
            ids.push_back(id);
            const Shape shape{32, 48};
            const Box box = t % 3 == 0 ? MakeBox({16, 0}, {16, 48}) : WholeBox(shape);
            const DType dtype = t % 2 == 0 ? DType::kFloat32 : DType::kBFloat16;
            updates.push_back(RandomUpdate(rng, box, 5 + t, dtype, false));
            const ApplyMode apply = t % 4 == 2 ? ApplyMode::kScatterAdd : ApplyMode::kOverwrite;
            PutSparseRequest r =
                t % 5 == 0 ? Req(id, shape, updates.back(), dtype, Step(k), apply,
                                 "owner(expert)", *NamedAxes::Make({{"expert", t}}), box)
                           : Req(id, shape, updates.back(), dtype, Step(k), apply, "none", {},
                                 box);
            (t % 7 == 3 ? theirs : mine).push_back(std::move(r));
        }
        std::sort(ids.begin(), ids.end());
        for (const auto& result : trainer.PutSparseObjects(mine, 2)) ASSERT_OK(result.status());
        for (const auto& result : other.PutSparseObjects(theirs, 1)) ASSERT_OK(result.status());
        ASSERT_OK(trainer.SealGeneration(Step(k), ids));
        ASSERT_OK_AND_ASSIGN(StepManifest sealed, trainer.GetManifest(Step(k)));
        ASSERT_OK_AND_ASSIGN(std::vector<SourceDescriptor> decoded, reader.Manifest(Step(k)));
        ASSERT_EQ(sealed.sources.size(), mine.size() + theirs.size());
        EXPECT_EQ(sealed.sources, decoded) << "step " << k;
        ASSERT_OK(trainer.ClearCaches());
        ASSERT_OK_AND_ASSIGN(StepManifest again, trainer.GetManifest(Step(k)));
        EXPECT_EQ(again.sources, decoded);
    }
}

TEST(StepsTest, ASharedManifestOfASealedStepIsTheKeptOneUntilRetentionFreesIt) {
    // GetManifestShared hands out the kept arrays of a sealed step (every reader of the node
    // the same, never copied); an unsealed step or a fold gets arrays of its own.
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore trainer(os, Options("trainer"));
    SparseStore reader(os, Options("n0"));
    ASSERT_OK(trainer.SetRetention(2));
    CommitAndSeal(trainer, {"w", "v"}, 1);
    ASSERT_OK(trainer.SealGeneration(Step(2), std::vector<std::string>{"w", "v", "u"}));
    ASSERT_OK_AND_ASSIGN(SparseStore::SharedStepManifest first, reader.GetManifestShared(Step(1)));
    ASSERT_OK_AND_ASSIGN(SparseStore::SharedStepManifest again, reader.GetManifestShared(Step(1)));
    ASSERT_OK_AND_ASSIGN(StepManifest copied, reader.GetManifest(Step(1)));
    EXPECT_TRUE(first.sealed);
    EXPECT_EQ(first.sources.get(), again.sources.get());  // the kept array, not a copy
    EXPECT_EQ(first.unchanged.get(), again.unchanged.get());
    EXPECT_EQ(*first.sources, copied.sources);
    EXPECT_EQ(*first.unchanged, copied.unchanged);
    EXPECT_EQ(first.view().sources.data(), first.sources->data());
    ASSERT_OK_AND_ASSIGN(SparseStore::SharedStepManifest waited,
                         reader.WaitGenerationShared(Step(1), 1.0));
    EXPECT_EQ(waited.sources.get(), first.sources.get());  // waiting gives the kept one too
    ASSERT_OK_AND_ASSIGN(StepManifest waited_copy, reader.WaitGeneration(Step(1), 1.0));
    EXPECT_EQ(waited_copy.sources, copied.sources);
    EXPECT_EQ(waited_copy.unchanged, copied.unchanged);
    // The step sealed through this store: its seal's check of the manifest is what it keeps,
    // with the seal's unchanged ids.
    ASSERT_OK_AND_ASSIGN(SparseStore::SharedStepManifest empty, trainer.GetManifestShared(Step(2)));
    EXPECT_TRUE(empty.sealed);
    EXPECT_TRUE(empty.sources->empty());
    EXPECT_EQ(*empty.unchanged, (std::vector<std::string>{"u", "v", "w"}));
    ASSERT_OK_AND_ASSIGN(StepManifest empty_copied, reader.GetManifest(Step(2)));
    EXPECT_EQ(empty_copied.unchanged, *empty.unchanged);
    // A fold and an unsealed step: arrays of their own, equal to GetManifest's.
    ASSERT_OK_AND_ASSIGN(SparseStore::SharedStepManifest fold, reader.GetManifestShared({0, 2}));
    ASSERT_OK_AND_ASSIGN(StepManifest fold_copied, reader.GetManifest({0, 2}));
    EXPECT_NE(fold.sources.get(), first.sources.get());
    EXPECT_EQ(*fold.sources, fold_copied.sources);
    EXPECT_EQ(*fold.unchanged, fold_copied.unchanged);
    ASSERT_OK_AND_ASSIGN(SparseStore::SharedStepManifest open, reader.GetManifestShared(Step(3)));
    EXPECT_FALSE(open.sealed);
    EXPECT_TRUE(open.sources->empty());
    // A reader's arrays outlive the store's kept copy: retention frees step 1 after step 3.
    CommitAndSeal(trainer, {"w", "v"}, 3);
    EXPECT_THAT(reader.GetManifestShared(Step(1)), StatusIs(StatusCode::kNotFound));
    EXPECT_EQ(*first.sources, copied.sources);
    EXPECT_THAT(reader.GetManifestShared({0, 0}), StatusIs(StatusCode::kInvalidArgument));
}

TEST(StepsTest, IndexesCachedFromAnOwnedManifestReferToItUntilTheCacheDropsThem) {
    // A read given its manifest's owner (ReadOptions::manifest_owner) caches indexes that
    // refer to the manifest's entries: the same objects as a read without it, the array kept
    // while they are cached, and a fold (which reads copies of the entries per step) is right.
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore store(os, Options("n0"));
    CommitAndSeal(store, {"w", "v"}, 1);
    CommitAndSeal(store, {"w", "v"}, 2);
    const std::vector<TargetDescriptor> targets = {Target("w/t", "w", "n0", {0, 0}, {8, 8}),
                                                   Target("v/t", "v", "n0", {0, 4}, {8, 4})};
    ASSERT_OK_AND_ASSIGN(StepManifest step, store.GetManifest(Step(2)));
    ASSERT_OK_AND_ASSIGN(std::vector<TargetObject> plain,
                         store.ReadSparseObjects(StepManifestView(step), targets, {}));
    ASSERT_OK(store.ClearCaches());
    auto owner = std::make_shared<const StepManifest>(step);
    std::weak_ptr<const StepManifest> watch = owner;
    ReadOptions options;
    options.manifest_owner = owner;
    ASSERT_OK_AND_ASSIGN(std::vector<TargetObject> owned,
                         store.ReadSparseObjects(StepManifestView(*owner), targets, options));
    ASSERT_EQ(owned.size(), plain.size());
    for (std::size_t t = 0; t < owned.size(); ++t) {
        EXPECT_EQ(Entries(owned[t]), Entries(plain[t]));
        EXPECT_EQ(owned[t].object.desc, plain[t].object.desc);
    }
    options.manifest_owner.reset();
    owner.reset();
    EXPECT_FALSE(watch.expired());  // the cached indexes refer to its entries
    // Another requester's copy of the same entries hits the cache and reads the same.
    ASSERT_OK_AND_ASSIGN(std::vector<TargetObject> again,
                         store.ReadSparseObjects(StepManifestView(step), targets, {}));
    EXPECT_EQ(Entries(again[0]), Entries(plain[0]));
    ASSERT_OK(store.ClearCaches());
    EXPECT_TRUE(watch.expired());

    // A fold of steps 1-2 with its owner: per-step copies are read, never referred to.
    ASSERT_OK_AND_ASSIGN(StepManifest fold, store.GetManifest({0, 2}));
    auto fold_owner = std::make_shared<const StepManifest>(fold);
    ReadOptions fold_options;
    fold_options.manifest_owner = fold_owner;
    ASSERT_OK_AND_ASSIGN(std::vector<TargetObject> folded,
                         store.ReadSparseObjects(StepManifestView(*fold_owner), targets,
                                                 fold_options));
    fold_options.manifest_owner.reset();
    fold_owner.reset();
    // Served from the indexes the fold cached (whose descriptors must still be there).
    ASSERT_OK_AND_ASSIGN(std::vector<TargetObject> folded_plain,
                         store.ReadSparseObjects(StepManifestView(fold), targets, {}));
    ASSERT_EQ(folded.size(), 2u);
    for (std::size_t t = 0; t < folded.size(); ++t) {
        EXPECT_EQ(Entries(folded[t]), Entries(folded_plain[t]));
    }
}

TEST(StepsTest, AReadOfAKeptManifestChecksEachSourceAgainstItsEntryText) {
    // A read of the kept manifest of a sealed step (GetManifestShared, its array as the owner)
    // takes a source whose metadata is exactly its manifest entry's text without writing the
    // entry out again; it reads what a read of a copy of the manifest reads, and a source object
    // replaced under the same key with other metadata is still refused.
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore store(os, Options("n0"));
    CommitAndSeal(store, {"w", "v"}, 1);
    const std::vector<TargetDescriptor> targets = {Target("w/t", "w", "n0", {0, 0}, {8, 8}),
                                                   Target("v/t", "v", "n0", {0, 4}, {8, 4})};
    ASSERT_OK_AND_ASSIGN(SparseStore::SharedStepManifest kept, store.GetManifestShared(Step(1)));
    ASSERT_TRUE(kept.sealed);
    ReadOptions options;
    options.manifest_owner = kept.sources;
    ASSERT_OK_AND_ASSIGN(std::vector<TargetObject> owned,
                         store.ReadSparseObjects(kept.view(), targets, options));
    ASSERT_OK_AND_ASSIGN(StepManifest copy, store.GetManifest(Step(1)));
    SparseStore other(os, Options("n1"));  // cold caches: decodes and checks everything
    ASSERT_OK_AND_ASSIGN(std::vector<TargetObject> plain,
                         other.ReadSparseObjects(StepManifestView(copy), targets, {}));
    ASSERT_EQ(owned.size(), 2u);
    for (std::size_t t = 0; t < owned.size(); ++t) {
        EXPECT_EQ(Entries(owned[t]), Entries(plain[t]));
        EXPECT_EQ(owned[t].object.desc, plain[t].object.desc);
    }

    // The source of "w" replaced: the same members, metadata that says scatter_add.
    const std::string& ref = (*kept.sources)[0].tensor_id == "w" ? (*kept.sources)[0].source_ref
                                                                 : (*kept.sources)[1].source_ref;
    ASSERT_OK_AND_ASSIGN(ObjectInfo info, os->Stat(ref));
    std::string metadata = info.metadata;
    const std::string from = "\"apply\":\"overwrite\"";
    const std::size_t at = metadata.find(from);
    ASSERT_NE(at, std::string::npos) << metadata;
    metadata.replace(at, from.size(), "\"apply\":\"scatter_add\"");
    std::vector<std::vector<std::byte>> bytes;
    std::vector<MemberData> members;
    for (const MemberInfo& m : info.members) {
        bytes.emplace_back(m.size_bytes);
        ASSERT_OK(os->ReadMember(ref, m.name, bytes.back()));
    }
    for (std::size_t m = 0; m < info.members.size(); ++m) {
        members.push_back({info.members[m].name, info.members[m].dtype, info.members[m].shape,
                           bytes[m], info.members[m].checksum});
    }
    ASSERT_OK(os->Put(ref, metadata, members, {PutMode::kUpsert, false}));
    ASSERT_OK(store.ClearCaches());  // the index of the old object is not kept either
    ASSERT_OK_AND_ASSIGN(SparseStore::SharedStepManifest again, store.GetManifestShared(Step(1)));
    options.manifest_owner = again.sources;
    EXPECT_THAT(store.ReadSparseObjects(again.view(), targets, options),
                StatusIsWithMessage(StatusCode::kInvalidArgument, "apply"));
}

TEST(StepsTest, SealWaitsForEveryAdmittedWriter) {
    SparseStore store(MakeEmbeddedStore());
    const auto owner = *PlacementPolicy::Parse("owner(expert)");
    const Shape shape{2, 8, 8};
    auto expert = [&](int e, Generation g) {
        Update u;
        u.idx = {e, 1, 2};
        const float v = float(e + 1);
        u.val.resize(4);
        std::memcpy(u.val.data(), &v, 4);
        u.nnz = 1;
        return store.PutSparseObject(Req("experts", shape, u, DType::kFloat32, g,
                                         ApplyMode::kOverwrite, "owner(expert)",
                                         *NamedAxes::Make({{"expert", e}}),
                                         MakeBox({e, 0, 0}, {1, 8, 8})));
    };
    for (int e = 0; e < 2; ++e) {
        ASSERT_OK_AND_ASSIGN(bool won, store.Admit("experts", Step(1), owner,
                                                   *NamedAxes::Make({{"expert", e}}),
                                                   "rank" + std::to_string(e)));
        EXPECT_TRUE(won);
    }
    // An admission for the next step does not hold this one.
    ASSERT_OK_AND_ASSIGN(bool next, store.Admit("experts", Step(2), owner,
                                                *NamedAxes::Make({{"expert", 0}}), "rank0"));
    EXPECT_TRUE(next);
    EXPECT_THAT(store.SealGeneration(Step(1), Ids({"experts"})),
                StatusIsWithMessage(StatusCode::kFailedPrecondition, "expert=0"));
    ASSERT_OK(expert(0, Step(1)).status());
    EXPECT_THAT(store.SealGeneration(Step(1), Ids({"experts"})),
                StatusIsWithMessage(StatusCode::kFailedPrecondition, "expert=1"));
    ASSERT_OK(expert(1, Step(1)).status());
    ASSERT_OK(store.SealGeneration(Step(1), Ids({"experts"})));
    ASSERT_OK_AND_ASSIGN(StepManifest m, store.GetManifest(Step(1)));
    EXPECT_EQ(m.sources.size(), 2u);
    EXPECT_THAT(m.unchanged, IsEmpty());

    // Step 2: rank0 admitted, not committed.
    EXPECT_THAT(store.SealGeneration(Step(2), Ids({"experts"})),
                StatusIs(StatusCode::kFailedPrecondition));
    ASSERT_OK(expert(0, Step(2)).status());
    // expert 1 did not change: it commits an empty box, so its targets still read (an
    // empty update).
    Update none;
    ASSERT_OK(store.PutSparseObject(Req("experts", shape, none, DType::kFloat32, Step(2),
                                        ApplyMode::kOverwrite, "owner(expert)",
                                        *NamedAxes::Make({{"expert", 1}}),
                                        MakeBox({1, 0, 0}, {1, 8, 8})))
                  .status());
    ASSERT_OK(store.SealGeneration(Step(2), Ids({"experts"})));
    ASSERT_OK_AND_ASSIGN(StepManifest m2, store.GetManifest(Step(2)));
    std::vector<TargetDescriptor> targets = {
        Target("e0", "experts", "n", {0, 0, 0}, {1, 8, 8}, {{"expert", 0}}),
        Target("e1", "experts", "n", {1, 0, 0}, {1, 8, 8}, {{"expert", 1}})};
    ASSERT_OK_AND_ASSIGN(auto objs, store.ReadSparseObjects(m2, targets));
    EXPECT_EQ(objs[0].object.desc.nnz, 1u);
    EXPECT_EQ(objs[1].object.desc.nnz, 0u);
    // Fold of both steps: expert 0 keeps step 2's value, expert 1 step 1's.
    ASSERT_OK_AND_ASSIGN(StepManifest fold, store.GetManifest({0, 2}));
    ASSERT_OK_AND_ASSIGN(auto folded, store.ReadSparseObjects(fold, targets));
    using E = std::map<std::vector<std::int64_t>, float>;
    EXPECT_EQ(Entries(folded[0]), (E{{{0, 1, 2}, 1.0f}}));
    EXPECT_EQ(Entries(folded[1]), (E{{{0, 1, 2}, 2.0f}}));
}

// ---------------------------------------------------------------------------------------------
// Fencing.
// ---------------------------------------------------------------------------------------------

TEST(StepsTest, FencingLetsAnUnchangedTensorCommitALaterStep) {
    SparseStore store(MakeEmbeddedStore());
    ASSERT_OK(CommitOne(store, "w", 1, 1));
    ASSERT_OK(CommitOne(store, "v", 1, 1));
    ASSERT_OK(store.SealGeneration(Step(1), Ids({"w", "v"})));
    ASSERT_OK(CommitOne(store, "w", 2, 2));
    ASSERT_OK(store.SealGeneration(Step(2), Ids({"w", "v"})));
    // "v" is at (0, 1): it skips step 2 and commits step 3.
    ASSERT_OK(CommitOne(store, "v", 3, 3));
    ASSERT_OK(CommitOne(store, "w", 3, 3));
    // Another box of the same tensor in the same step extends it too.
    ASSERT_OK(store.PutSparseObject(Req("w", {8, 8}, One(5, 0, 3), DType::kFloat32, Step(3),
                                        ApplyMode::kOverwrite, "none", {},
                                        MakeBox({4, 0}, {4, 8})))
                  .status());
    ASSERT_OK(store.SealGeneration(Step(3), Ids({"w", "v"})));
    EXPECT_EQ(**store.CurrentGeneration("v"), Step(3));
    // "w" jumps ahead to step 5; then step 4 is stale for it (4's base 3 < its head's 5).
    ASSERT_OK(CommitOne(store, "w", 5, 5));
    EXPECT_EQ(**store.CurrentGeneration("w"), Step(5));
    EXPECT_THAT(CommitOne(store, "w", 4, 4), StatusIs(StatusCode::kStaleGeneration));
    // Another box of step 5 (the head's own generation) is fine; an older one is stale.
    ASSERT_OK(store.PutSparseObject(Req("w", {8, 8}, One(5, 0, 5), DType::kFloat32, Step(5),
                                        ApplyMode::kOverwrite, "none", {},
                                        MakeBox({4, 0}, {4, 8})))
                  .status());
    // "v" is at (2, 3): a base before 3 is stale whatever the delta; base 3 extends it.
    EXPECT_THAT(
        store.PutSparseObject(Req("v", {8, 8}, One(0, 1, 9), DType::kFloat32, {2, 7})).status(),
        StatusIs(StatusCode::kStaleGeneration));
    EXPECT_THAT(CommitOne(store, "v", 2, 9), StatusIs(StatusCode::kConflict));  // sealed
    // An identical retry of a committed step succeeds even after the tensor moved on.
    ASSERT_OK_AND_ASSIGN(CommitResult r, store.PutSparseObject(Req("w", {8, 8}, One(0, 0, 2),
                                                                   DType::kFloat32, Step(2))));
    EXPECT_FALSE(r.created);
    EXPECT_EQ(**store.CurrentGeneration("w"), Step(5));
    EXPECT_EQ(**store.CurrentGeneration("v"), Step(3));
}

// ---------------------------------------------------------------------------------------------
// Unchanged tensors.
// ---------------------------------------------------------------------------------------------

TEST(StepsTest, UnchangedTensorsReadAsEmptyObjectsThatApplyToAnyDtype) {
    SparseStore store(MakeEmbeddedStore());
    ASSERT_OK(CommitOne(store, "w", 1, 7));
    ASSERT_OK(store.SealGeneration(Step(1), Ids({"w", "norm", "embed"})));
    ASSERT_OK_AND_ASSIGN(StepManifest m, store.GetManifest(Step(1)));
    EXPECT_THAT(m.unchanged, ElementsAre("embed", "norm"));
    const std::vector<TargetDescriptor> targets = {
        Target("t0", "w", "n0", {0, 0}, {8, 8}),
        Target("t1", "norm", "n0", {0}, {300}),
        Target("t2", "embed", "n1", {1000, 0}, {70000, 4}),
        Target("t3", "norm", "n1", {100}, {200}),
    };
    ASSERT_OK_AND_ASSIGN(auto objs, store.ReadSparseObjects(m, targets));
    ASSERT_EQ(objs.size(), 4u);
    EXPECT_EQ(Entries(objs[0]).size(), 1u);
    for (std::size_t i = 1; i < 4; ++i) {
        const TargetObject& o = objs[i];
        EXPECT_EQ(o.target_id, targets[i].target_id);
        EXPECT_EQ(o.node_id, targets[i].node_id);
        EXPECT_EQ(o.target_box, targets[i].box);
        EXPECT_EQ(o.object.desc.nnz, 0u);
        EXPECT_EQ(o.object.desc.tensor_id, targets[i].tensor_id);
        EXPECT_EQ(o.object.desc.value_dtype, DType::kUInt8);
        EXPECT_EQ(o.object.coordinate_space, "local");
        EXPECT_THAT(o.object.values, IsEmpty());
    }
    // The empty object is a no-op on a weight of any dtype.
    for (DType dt : {DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kInt32}) {
        Dense w = Dense::Zeros(dt, {300});
        for (std::size_t i = 0; i < w.bytes.size(); ++i) w.bytes[i] = std::byte(i * 7);
        const auto before = w.bytes;
        ASSERT_OK(ApplyTarget(w, objs[1]));
        EXPECT_EQ(w.bytes, before);
    }
    Dense embed = Dense::Zeros(DType::kBFloat16, {70000, 4});
    ASSERT_OK(ApplyTarget(embed, objs[2]));
    // Only unchanged targets.
    ASSERT_OK_AND_ASSIGN(auto only, store.ReadSparseObjects(
                                        m, std::vector<TargetDescriptor>{targets[1], targets[3]}));
    EXPECT_EQ(only.size(), 2u);
    // A tensor that the seal does not list is still NotFound; so is an unchanged tensor of a
    // step that is not sealed.
    EXPECT_THAT(store.ReadSparseObjects(m, std::vector<TargetDescriptor>{
                                               targets[0], Target("x", "nope", "n0", {0}, {4})}),
                StatusIs(StatusCode::kNotFound));
    ASSERT_OK(CommitOne(store, "w", 2, 8));
    ASSERT_OK_AND_ASSIGN(StepManifest open, store.GetManifest(Step(2)));
    EXPECT_FALSE(open.sealed);
    EXPECT_THAT(store.ReadSparseObjects(open, targets), StatusIs(StatusCode::kNotFound));
}

// ---------------------------------------------------------------------------------------------
// Folds.
// ---------------------------------------------------------------------------------------------

/// A small model of a few tensors with targets on two nodes, its reference weights, and a
/// writer that commits random updates per step.
struct Model {
    struct Tensor {
        std::string id;
        DType dtype;
        Shape shape;
        ApplyMode apply;
        std::vector<Box> source_boxes;  ///< Policy none, one source per box.
        Dense ref;
    };
    std::vector<Tensor> tensors;
    std::vector<TargetDescriptor> targets;
    std::vector<std::string> ids;

    static Model Make(ApplyMode apply) {
        Model m;
        const DType f32 = DType::kFloat32;
        const DType other = apply == ApplyMode::kOverwrite ? DType::kBFloat16 : DType::kInt32;
        m.tensors = {
            {"attn.w", f32, {96, 64}, apply,
             {MakeBox({0, 0}, {32, 64}), MakeBox({32, 0}, {64, 64})}, {}},
            {"mlp.w", other, {40, 24}, apply, {WholeBox({40, 24})}, {}},
            {"norm", f32, {64}, apply, {WholeBox({64})}, {}},
            {"cube", f32, {6, 10, 12}, apply,
             {MakeBox({0, 0, 0}, {3, 10, 12}), MakeBox({3, 0, 0}, {3, 10, 12})}, {}},
        };
        for (Tensor& t : m.tensors) {
            t.ref = Dense::Zeros(t.dtype, t.shape);
            m.ids.push_back(t.id);
        }
        m.targets = {
            Target("n0/a0", "attn.w", "n0", {0, 0}, {48, 64}),
            Target("n0/a1", "attn.w", "n0", {48, 0}, {48, 64}),
            Target("n1/a0", "attn.w", "n1", {0, 0}, {96, 32}),
            Target("n1/a1", "attn.w", "n1", {0, 32}, {96, 32}),
            Target("n0/m", "mlp.w", "n0", {0, 0}, {40, 24}),
            Target("n1/m0", "mlp.w", "n1", {0, 0}, {40, 12}),
            Target("n1/m1", "mlp.w", "n1", {0, 12}, {40, 12}),
            Target("n0/norm", "norm", "n0", {0}, {64}),
            Target("n1/norm", "norm", "n1", {32}, {32}),
            Target("n0/c", "cube", "n0", {0, 0, 0}, {6, 10, 12}),
            Target("n1/c0", "cube", "n1", {0, 0, 0}, {2, 10, 12}),
            Target("n1/c1", "cube", "n1", {2, 0, 0}, {4, 10, 12}),
        };
        return m;
    }

    const Tensor& TensorOf(const std::string& id) const {
        for (const Tensor& t : tensors) {
            if (t.id == id) return t;
        }
        std::abort();
    }

    /// Commits random updates of the tensors for which `changes(id)` holds, applies them to
    /// the reference, and seals the step with every tensor id.
    template <typename Changes>
    void CommitStep(SparseStore& store, std::mt19937_64& rng, std::uint64_t step,
                    Changes changes, std::size_t nnz = 60) {
        for (Tensor& t : tensors) {
            if (!changes(t.id)) continue;
            for (const Box& box : t.source_boxes) {
                const std::size_t n = rng() % 4 == 0 ? 0 : 1 + rng() % nnz;  // some boxes empty
                const Update u = RandomUpdate(rng, box, n, t.dtype,
                                              t.apply == ApplyMode::kScatterAdd);
                auto r = store.PutSparseObject(
                    Req(t.id, t.shape, u, t.dtype, Step(step), t.apply, "none", {}, box));
                ASSERT_TRUE(r.ok()) << t.id << " step " << step << ": " << r.status().ToString();
                ApplyReference(t.ref, u, t.apply);
            }
        }
        ASSERT_OK(store.SealGeneration(Step(step), ids));
    }
};

/// One inference reader: the local weights of every target of the model.
struct Reader {
    std::map<std::string, Dense> weights;  // by target id
    std::uint64_t at = 0;                  // the step it holds

    explicit Reader(const Model& m) {
        for (const TargetDescriptor& t : m.targets) {
            weights[t.target_id] = Dense::Zeros(m.TensorOf(t.tensor_id).dtype,
                                                Shape(t.box.shape().begin(), t.box.shape().end()));
        }
    }
    void Apply(const std::vector<TargetObject>& objs) {
        for (const TargetObject& o : objs) {
            auto it = weights.find(o.target_id);
            ASSERT_NE(it, weights.end());
            ASSERT_OK(ApplyTarget(it->second, o));
        }
    }
    /// Bit-exact against the model's reference.
    void ExpectEquals(const Model& m, const std::string& what) const {
        for (const TargetDescriptor& t : m.targets) {
            const Dense& ref = m.TensorOf(t.tensor_id).ref;
            EXPECT_TRUE(weights.at(t.target_id).bytes == Slice(ref, t.box))
                << what << ": target " << t.target_id << " differs";
        }
    }
};

/// A fold (j, k) read onto a reader at step j gives the weights of step k: for every pair j < k
/// of a run whose tensors change in some steps only.
void CheckEveryFold(ApplyMode apply, std::uint64_t seed) {
    SparseStore store(MakeEmbeddedStore());
    std::mt19937_64 rng(seed);
    Model model = Model::Make(apply);
    constexpr std::uint64_t kSteps = 7;
    std::vector<Reader> at_step;  // a reader's weights after each step, from step-by-step reads
    at_step.emplace_back(model);
    for (std::uint64_t k = 1; k <= kSteps; ++k) {
        model.CommitStep(store, rng, k, [&](const std::string& id) {
            if (id == "attn.w") return true;
            if (id == "mlp.w") return k % 3 == 1;  // steps 1, 4, 7
            if (id == "norm") return k == 2;
            return k == 1 || k == 5;  // cube
        });
        ASSERT_OK_AND_ASSIGN(StepManifest m, store.GetManifest(Step(k)));
        Reader r = at_step.back();
        ASSERT_OK_AND_ASSIGN(auto objs, store.ReadSparseObjects(m, model.targets));
        r.Apply(objs);
        r.ExpectEquals(model, "step " + std::to_string(k));
        at_step.push_back(std::move(r));
    }
    for (std::uint64_t j = 0; j + 2 <= kSteps; ++j) {
        for (std::uint64_t k = j + 2; k <= kSteps; ++k) {
            const std::string what = "fold (" + std::to_string(j) + ", " + std::to_string(k) + ")";
            ASSERT_OK_AND_ASSIGN(StepManifest fold, store.GetManifest({j, k}));
            EXPECT_TRUE(fold.sealed) << what;
            EXPECT_EQ(fold.generation, (Generation{j, k}));
            std::size_t sources = 0;
            std::set<std::string> changed;
            for (std::uint64_t s = j + 1; s <= k; ++s) {
                ASSERT_OK_AND_ASSIGN(auto step_sources, store.Manifest(Step(s)));
                sources += step_sources.size();
                for (const auto& d : step_sources) changed.insert(d.tensor_id);
            }
            EXPECT_EQ(fold.sources.size(), sources) << what;
            std::vector<std::string> unchanged;
            for (const std::string& id : model.ids) {
                if (!changed.count(id)) unchanged.push_back(id);
            }
            std::sort(unchanged.begin(), unchanged.end());
            EXPECT_EQ(fold.unchanged, unchanged) << what;
            Reader r = at_step[j];
            ASSERT_OK_AND_ASSIGN(auto objs, store.ReadSparseObjects(fold, model.targets));
            ASSERT_EQ(objs.size(), model.targets.size());
            for (std::size_t t = 0; t < objs.size(); ++t) {
                EXPECT_EQ(objs[t].target_id, model.targets[t].target_id);
                // One object per target, coordinates unique.
                EXPECT_EQ(objs[t].object.desc.nnz * objs[t].object.desc.rank() *
                              DTypeSize(objs[t].object.desc.index_dtype),
                          objs[t].object.indices.size());
            }
            r.Apply(objs);
            for (const TargetDescriptor& t : model.targets) {
                EXPECT_TRUE(r.weights.at(t.target_id).bytes ==
                            at_step[k].weights.at(t.target_id).bytes)
                    << what << ": target " << t.target_id;
            }
        }
    }
}

TEST(StepsTest, FoldOfOverwriteStepsEqualsApplyingEachStep) {
    CheckEveryFold(ApplyMode::kOverwrite, 101);
}

TEST(StepsTest, FoldOfScatterAddStepsSums) { CheckEveryFold(ApplyMode::kScatterAdd, 202); }

TEST(StepsTest, FoldMergesRepeatedCoordinates) {
    SparseStore store(MakeEmbeddedStore());
    // The same coordinate in every step: overwrite keeps the last, scatter_add sums.
    for (std::uint64_t k = 1; k <= 4; ++k) {
        ASSERT_OK(store.PutSparseObject(
                           Req("w", {8, 8}, One(2, 3, float(k)), DType::kFloat32, Step(k)))
                      .status());
        ASSERT_OK(store.PutSparseObject(Req("acc", {8, 8}, One(2, 3, float(k)), DType::kFloat32,
                                            Step(k), ApplyMode::kScatterAdd))
                      .status());
        ASSERT_OK(store.SealGeneration(Step(k), Ids({"w", "acc"})));
    }
    ASSERT_OK_AND_ASSIGN(StepManifest fold, store.GetManifest({0, 4}));
    EXPECT_EQ(fold.sources.size(), 8u);
    const std::vector<TargetDescriptor> targets = {Target("w", "w", "n", {2, 0}, {2, 8}),
                                                   Target("a", "acc", "n", {0, 0}, {8, 8})};
    ASSERT_OK_AND_ASSIGN(auto objs, store.ReadSparseObjects(fold, targets));
    using E = std::map<std::vector<std::int64_t>, float>;
    EXPECT_EQ(Entries(objs[0]), (E{{{0, 3}, 4.0f}}));
    EXPECT_EQ(Entries(objs[1]), (E{{{2, 3}, 10.0f}}));
    EXPECT_EQ(objs[0].object.desc.apply, ApplyMode::kOverwrite);
    EXPECT_EQ(objs[1].object.desc.apply, ApplyMode::kScatterAdd);
    EXPECT_EQ(objs[0].object.desc.generation, (Generation{0, 4}));
    // A fold of 2 steps out of 4.
    ASSERT_OK_AND_ASSIGN(StepManifest late, store.GetManifest({1, 3}));
    ASSERT_OK_AND_ASSIGN(auto two, store.ReadSparseObjects(
                                       late, std::span<const TargetDescriptor>(&targets[1], 1)));
    EXPECT_EQ(Entries(two[0]), (E{{{2, 3}, 5.0f}}));
}

TEST(StepsTest, FoldOfDenseAndSparseTilesKeepsTheLastValue) {
    // Steps from 0.1 % to 40 % of a [300, 200] tensor (tiles clipped at its edges), so a fold
    // merges tiles both ways (by marks where the steps are dense, by sorting where sparse).
    SparseStore store(MakeEmbeddedStore());
    std::mt19937_64 rng(7);
    const Shape shape{300, 200};
    std::map<std::vector<std::int64_t>, float> expect;  // of the target box rows [50, 300)
    const std::vector<double> density = {0.001, 0.002, 0.4, 0.3, 0.001, 0.1, 0.4, 0.005};
    std::map<std::vector<std::int64_t>, float> after_two;  // the fold (0, 2): sparse tiles
    for (std::uint64_t k = 1; k <= density.size(); ++k) {
        Update u;
        std::set<std::int64_t> flat;
        while (flat.size() < std::size_t(density[k - 1] * 300 * 200)) flat.insert(rng() % 60000);
        for (std::int64_t f : flat) {
            const float v = float(k * 100000 + f);
            u.idx.push_back(f / 200);
            u.idx.push_back(f % 200);
            u.val.resize(u.val.size() + 4);
            std::memcpy(u.val.data() + u.val.size() - 4, &v, 4);
            if (f / 200 >= 50) expect[{f / 200 - 50, f % 200}] = v;
        }
        u.nnz = flat.size();
        PutSparseRequest req = Req("w", shape, u, DType::kFloat32, Step(k));
        req.encode.tile_shape = Shape{64, 48};
        ASSERT_OK(store.PutSparseObject(req).status());
        ASSERT_OK(store.SealGeneration(Step(k), Ids({"w"})));
        if (k == 2) after_two = expect;
    }
    const std::vector<TargetDescriptor> targets = {Target("t", "w", "n", {50, 0}, {250, 200})};
    ASSERT_OK_AND_ASSIGN(StepManifest first_two, store.GetManifest({0, 2}));
    ASSERT_OK_AND_ASSIGN(auto sparse, store.ReadSparseObjects(first_two, targets));
    EXPECT_EQ(Entries(sparse[0]), after_two);
    ASSERT_OK_AND_ASSIGN(StepManifest fold, store.GetManifest({0, density.size()}));
    ASSERT_OK_AND_ASSIGN(auto objs, store.ReadSparseObjects(fold, targets));
    EXPECT_EQ(Entries(objs[0]), expect);
    // Its tile index and checksums are those the codec builds for its entries.
    SparseObject rebuilt = objs[0].object;
    ASSERT_OK(BuildTileIndex(rebuilt));
    UpdateChecksums(rebuilt);
    EXPECT_EQ(rebuilt.tile_coords, objs[0].object.tile_coords);
    EXPECT_EQ(rebuilt.tile_ptr, objs[0].object.tile_ptr);
    EXPECT_EQ(rebuilt.desc.num_tiles, objs[0].object.desc.num_tiles);
    EXPECT_EQ(rebuilt.checksum_tile_ptr, objs[0].object.checksum_tile_ptr);
    EXPECT_EQ(rebuilt.checksum_values, objs[0].object.checksum_values);
}

TEST(StepsTest, FoldNeedsEverySealedStep) {
    SparseStore store(MakeEmbeddedStore());
    CommitAndSeal(store, Ids({"w"}), 1);
    CommitAndSeal(store, Ids({"w"}), 2);
    ASSERT_OK(CommitOne(store, "w", 3, 3));  // step 3 open
    EXPECT_THAT(store.GetManifest({0, 3}), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(store.GetManifest({1, 3}), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(store.GetManifest({0, 9}), StatusIs(StatusCode::kNotFound));
    ASSERT_OK(store.SealGeneration(Step(3), Ids({"w"})));
    // Step 5 sealed with step 4 missing: a fold across 4 is NotFound, from 4 on it works.
    CommitAndSeal(store, Ids({"w"}), 5);
    EXPECT_THAT(store.GetManifest({2, 5}), StatusIs(StatusCode::kNotFound));
    ASSERT_OK_AND_ASSIGN(StepManifest m, store.GetManifest({0, 3}));
    EXPECT_TRUE(m.sealed);
    EXPECT_EQ(m.sources.size(), 3u);
    EXPECT_THAT(store.GetManifest({3, 2}), StatusIs(StatusCode::kInvalidArgument));
}

// ---------------------------------------------------------------------------------------------
// A run: 30 steps, retention, bounded store, catch-up.
// ---------------------------------------------------------------------------------------------

TEST(StepsTest, ThirtyStepRunIsBitExactWithBoundedStore) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore trainer(os, Options("trainer"));
    SparseStore inference(os, Options("n0"));  // another process of the run, same store
    ASSERT_OK(trainer.SetRetention(3));
    EXPECT_EQ(*inference.Retention(), 3u);
    std::mt19937_64 rng(303);
    Model model = Model::Make(ApplyMode::kOverwrite);
    Reader every_step(model), every_third(model);
    constexpr std::uint64_t kSteps = 30, kKeep = 3;
    StoreSize max;  // the largest the store was after a step
    std::uint64_t max_step_bytes = 0;
    for (std::uint64_t k = 1; k <= kSteps; ++k) {
        const std::uint64_t bytes_before = trainer.Metrics().source_bytes_put;
        model.CommitStep(trainer, rng, k, [&](const std::string& id) {
            if (id == "attn.w") return true;
            if (id == "mlp.w") return k % 7 == 1;
            if (id == "norm") return k == 1;  // unchanged after step 1
            return rng() % 3 == 0;           // cube: now and then
        });
        max_step_bytes =
            std::max(max_step_bytes, trainer.Metrics().source_bytes_put - bytes_before);
        // The reader learns of the step by waiting for it.
        ASSERT_OK_AND_ASSIGN(StepManifest m, inference.WaitGeneration(Step(k), 5));
        ASSERT_TRUE(m.sealed);
        ASSERT_OK_AND_ASSIGN(auto objs, inference.ReadSparseObjects(m, model.targets));
        every_step.Apply(objs);
        every_step.ExpectEquals(model, "step " + std::to_string(k));
        EXPECT_EQ(*inference.LatestGeneration(), Step(k));
        // A reader that catches up every third step with one fold read.
        if (k % 3 == 0) {
            ASSERT_OK_AND_ASSIGN(StepManifest fold, inference.GetManifest({every_third.at, k}));
            ASSERT_OK_AND_ASSIGN(auto folded, inference.ReadSparseObjects(fold, model.targets));
            every_third.Apply(folded);
            every_third.at = k;
            every_third.ExpectEquals(model, "fold to step " + std::to_string(k));
        }
        // Retention: only the sources of the last 3 steps remain, no lease is left behind.
        const std::set<std::uint64_t> held = StepsWithSources(*os, "mcs/src/");
        if (!held.empty()) {
            EXPECT_GE(*held.begin() + kKeep, k + 1)
                << "step " << k << " keeps step " << *held.begin();
        }
        EXPECT_THAT(*os->List("mcs/lease"), IsEmpty());
        EXPECT_LE(os->List("mcs/seal/")->size(), kKeep);
        const StoreSize size = SizeOf(*os);
        max.keys = std::max(max.keys, size.keys);
        max.bytes = std::max(max.bytes, size.bytes);
        max.member_bytes = std::max(max.member_bytes, size.member_bytes);
        max.max_metadata = std::max(max.max_metadata, size.max_metadata);
        if (k >= kKeep) {
            ASSERT_OK_AND_ASSIGN(StepManifest window, inference.GetManifest({k - kKeep, k}));
            EXPECT_TRUE(window.sealed);
        }
        if (k > kKeep) {
            // One step further back reaches a freed step.
            EXPECT_THAT(inference.GetManifest({k - kKeep - 1, k}),
                        StatusIs(StatusCode::kNotFound));
        }
    }
    // Bounded: per kept step at most 6 sources (an object and a manifest entry each) and a
    // seal, plus one head per tensor and the three step records; the members are those of the
    // kept steps' sources and seals (a tensor list), each object's metadata is small.
    EXPECT_LE(max.keys, kKeep * (6 * 2 + 1) + model.tensors.size() + 3);
    EXPECT_LE(max.member_bytes, kKeep * (max_step_bytes + 64));
    EXPECT_LE(max.max_metadata, 2048u);
    EXPECT_LE(max.bytes, max.member_bytes + max.keys * max.max_metadata);
    // And it is what the store holds at the end, not more: nothing accumulates.
    const StoreSize end = SizeOf(*os);
    EXPECT_LE(end.keys, max.keys);
    // A reader stuck at step 20 cannot fold past retention; from the window it can.
    EXPECT_THAT(inference.GetManifest({20, 30}), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(inference.WaitGeneration({20, 30}, 0), StatusIs(StatusCode::kNotFound));
    ASSERT_OK_AND_ASSIGN(StepManifest tail, inference.GetManifest({27, 30}));
    EXPECT_TRUE(std::binary_search(tail.unchanged.begin(), tail.unchanged.end(), "norm"));
}


// ---------------------------------------------------------------------------------------------
// Leases.
// ---------------------------------------------------------------------------------------------

TEST(StepsTest, AnUnexpiredLeaseBlocksFreeingAnExpiredOneDoesNot) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore store(os);
    for (std::uint64_t k = 1; k <= 5; ++k) CommitAndSeal(store, Ids({"w"}), k);
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{1, 2, 3, 4, 5}));

    // A reader holds step 2: a retention that would free it fails and changes nothing.
    WriteLease(*os, "", Step(2), "reader-a", NowMs() + 60'000);
    const StoreSize before = SizeOf(*os);
    EXPECT_THAT(store.SetRetention(2), StatusIsWithMessage(StatusCode::kFailedPrecondition, "2"));
    EXPECT_THAT(store.SetRetention(3), StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_EQ(*store.Retention(), 0u);
    EXPECT_EQ(SizeOf(*os).keys, before.keys);
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{1, 2, 3, 4, 5}));
    // One that frees only step 1 is fine.
    ASSERT_OK(store.SetRetention(4));
    EXPECT_EQ(*store.Retention(), 4u);
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{2, 3, 4, 5}));
    EXPECT_FALSE(os->Stat("mcs/seal/steps/0-1").ok());
    EXPECT_TRUE(os->Stat("mcs/seal/steps/1-2").ok());

    // The reader crashed: its lease expired. Retention frees the step and the lease.
    WriteLease(*os, "", Step(2), "reader-a", NowMs() - 1);
    ASSERT_OK(store.SetRetention(2));
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{4, 5}));
    EXPECT_THAT(*os->List("mcs/lease/"), IsEmpty());
    EXPECT_THAT(*os->List("mcs/manifest/0-1/"), IsEmpty());
    EXPECT_THAT(*os->List("mcs/manifest/2-3/"), IsEmpty());

    // The GC after a seal stops at a leased step and frees it once the lease has expired.
    WriteLease(*os, "", Step(4), "reader-b", NowMs() + 300);
    CommitAndSeal(store, Ids({"w"}), 6);
    CommitAndSeal(store, Ids({"w"}), 7);
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{4, 5, 6, 7}));
    // The kept steps still fold.
    ASSERT_OK_AND_ASSIGN(StepManifest fold, store.GetManifest({3, 7}));
    EXPECT_EQ(fold.sources.size(), 4u);
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    CommitAndSeal(store, Ids({"w"}), 8);
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{7, 8}));
    EXPECT_THAT(*os->List("mcs/lease/"), IsEmpty());
    EXPECT_THAT(store.GetManifest({3, 8}), StatusIs(StatusCode::kNotFound));
    EXPECT_EQ(*os->List("mcs/seal/"), Ids({"mcs/seal/steps/6-7", "mcs/seal/steps/7-8"}));
}

/// A read of step 2 held in its range reads; the writer seals on meanwhile.
struct HeldRead {
    std::shared_ptr<HoldingStore> hs = std::make_shared<HoldingStore>();
    SparseStore writer{hs, Options("trainer")};
    std::optional<SparseStore> reader;
    std::optional<Result<std::vector<TargetObject>>> result;
    std::thread thread;
    const std::vector<TargetDescriptor> targets = {Target("r0", "w", "n0", {0, 0}, {8, 8})};

    void Start(double lease_seconds) {
        reader.emplace(hs, Options("n0", "", lease_seconds));
        ASSERT_OK(writer.SetRetention(1));
        CommitAndSeal(writer, Ids({"w"}), 1);
        CommitAndSeal(writer, Ids({"w"}), 2);
        ASSERT_OK_AND_ASSIGN(StepManifest m, reader->GetManifest(Step(2)));
        hs->Hold();
        thread = std::thread([this, m] { result.emplace(reader->ReadSparseObjects(m, targets)); });
        hs->WaitHeld();
    }
    void Finish() {
        hs->Release();
        thread.join();
    }
};

TEST(StepsTest, AReaderMidReadKeepsItsStep) {
    HeldRead h;
    ASSERT_NO_FATAL_FAILURE(h.Start(30));
    // The reader's lease, as it wrote it.
    const std::vector<std::string> leases = *h.hs->List("mcs/lease/1-2/");
    ASSERT_EQ(leases.size(), 1u);
    ASSERT_OK_AND_ASSIGN(ObjectInfo lease, h.hs->Stat(leases[0]));
    const auto meta = nlohmann::json::parse(lease.metadata);
    const std::int64_t expires = meta.at("expires_ms").get<std::int64_t>();
    EXPECT_GT(expires, NowMs() + 25'000);
    EXPECT_LE(expires, NowMs() + 30'000);

    CommitAndSeal(h.writer, Ids({"w"}), 3);  // would free step 2: kept
    EXPECT_EQ(StepsWithSources(*h.hs, "mcs/src/"), (std::set<std::uint64_t>{2, 3}));
    EXPECT_THAT(h.writer.SetRetention(1), StatusIs(StatusCode::kFailedPrecondition));
    CommitAndSeal(h.writer, Ids({"w"}), 4);
    EXPECT_EQ(StepsWithSources(*h.hs, "mcs/src/"), (std::set<std::uint64_t>{2, 3, 4}));
    h.Finish();
    ASSERT_TRUE(h.result->ok()) << h.result->status().ToString();
    using E = std::map<std::vector<std::int64_t>, float>;
    EXPECT_EQ(Entries((**h.result)[0]), (E{{{0, 0}, 2.0f}}));
    // The read ended its lease; the next seal frees what retention no longer keeps.
    EXPECT_THAT(*h.hs->List("mcs/lease/"), IsEmpty());
    CommitAndSeal(h.writer, Ids({"w"}), 5);
    EXPECT_EQ(StepsWithSources(*h.hs, "mcs/src/"), (std::set<std::uint64_t>{5}));
}

TEST(StepsTest, AStuckReadersLeaseExpires) {
    HeldRead h;
    ASSERT_NO_FATAL_FAILURE(h.Start(0.2));
    ASSERT_EQ(h.hs->List("mcs/lease/1-2/")->size(), 1u);
    std::this_thread::sleep_for(std::chrono::milliseconds(350));
    CommitAndSeal(h.writer, Ids({"w"}), 3);  // the lease has expired: step 2 goes
    EXPECT_EQ(StepsWithSources(*h.hs, "mcs/src/"), (std::set<std::uint64_t>{3}));
    EXPECT_THAT(*h.hs->List("mcs/lease/"), IsEmpty());
    h.Finish();
    // The late reader gets a typed error, not stale or torn data.
    EXPECT_THAT(*h.result, StatusIs(StatusCode::kNotFound));
}

// ---------------------------------------------------------------------------------------------
// Waits.
// ---------------------------------------------------------------------------------------------

TEST(StepsTest, WaitGenerationHonorsItsDeadline) {
    SparseStore store(MakeEmbeddedStore());
    ASSERT_OK(CommitOne(store, "w", 1, 1));
    auto t0 = Clock::now();
    EXPECT_THAT(store.WaitGeneration(Step(1), 0), StatusIs(StatusCode::kDeadlineExceeded));
    EXPECT_LT(SecondsSince(t0), 1.0);
    t0 = Clock::now();
    EXPECT_THAT(store.WaitGeneration(Step(1), 0.15),
                StatusIsWithMessage(StatusCode::kDeadlineExceeded, "(0, 1)"));
    const double waited = SecondsSince(t0);
    EXPECT_GE(waited, 0.14);
    EXPECT_LT(waited, 2.0);
    EXPECT_THAT(store.WaitGeneration({3, 2}, 1), StatusIs(StatusCode::kInvalidArgument));
    // A sealed step returns at once, with its manifest.
    ASSERT_OK(store.SealGeneration(Step(1), Ids({"w", "n"})));
    t0 = Clock::now();
    ASSERT_OK_AND_ASSIGN(StepManifest m, store.WaitGeneration(Step(1), -1));
    EXPECT_LT(SecondsSince(t0), 1.0);
    EXPECT_TRUE(m.sealed);
    EXPECT_EQ(m.sources.size(), 1u);
    EXPECT_THAT(m.unchanged, ElementsAre("n"));
    // A fold waits for its last step.
    EXPECT_THAT(store.WaitGeneration({0, 2}, 0.05), StatusIs(StatusCode::kDeadlineExceeded));
}

TEST(StepsTest, WaitGenerationWakesOnASealThroughTheSameStore) {
    SparseStoreOptions opts = Options("n0");
    opts.wait_poll_max_seconds = 30;  // only the seal's notification can wake the waiter early
    SparseStore store(MakeEmbeddedStore(), opts);
    CommitAndSeal(store, Ids({"w"}), 1);
    ASSERT_OK(CommitOne(store, "w", 2, 2));
    std::optional<Result<StepManifest>> step, fold;
    Clock::time_point step_woke, fold_woke;
    std::thread forever([&] {
        step.emplace(store.WaitGeneration(Step(2), -1));
        step_woke = Clock::now();
    });
    std::thread deadline([&] {
        fold.emplace(store.WaitGeneration({0, 2}, 60));
        fold_woke = Clock::now();
    });
    // The waiters' own checks are 1 ms, 2 ms, 4 ms, ... apart: at 600 ms they are in a 512 ms
    // wait that ends at about 1023 ms.
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    const auto sealed_at = Clock::now();
    ASSERT_OK(store.SealGeneration(Step(2), Ids({"w"})));
    forever.join();
    deadline.join();
    ASSERT_TRUE(step->ok()) << step->status().ToString();
    ASSERT_TRUE(fold->ok()) << fold->status().ToString();
    EXPECT_LT(std::chrono::duration<double>(step_woke - sealed_at).count(), 0.3);
    EXPECT_LT(std::chrono::duration<double>(fold_woke - sealed_at).count(), 0.3);
    EXPECT_TRUE((*step)->sealed);
    EXPECT_EQ((*step)->generation, Step(2));
    EXPECT_EQ((*step)->sources.size(), 1u);
    EXPECT_EQ((*fold)->generation, (Generation{0, 2}));
    EXPECT_EQ((*fold)->sources.size(), 2u);
}

TEST(StepsTest, WaitGenerationSeesASealByAnotherProcess) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore trainer(os, Options("trainer"));
    SparseStoreOptions opts = Options("n0");
    opts.wait_poll_max_seconds = 0.02;
    SparseStore reader(os, opts);
    ASSERT_OK(CommitOne(trainer, "w", 1, 1));
    std::optional<Result<StepManifest>> got;
    std::thread waiter([&] { got.emplace(reader.WaitGeneration(Step(1), 20)); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto sealed_at = Clock::now();
    ASSERT_OK(trainer.SealGeneration(Step(1), Ids({"w"})));
    waiter.join();
    EXPECT_LT(SecondsSince(sealed_at), 2.0);
    ASSERT_TRUE(got->ok()) << got->status().ToString();
    EXPECT_TRUE((*got)->sealed);
    EXPECT_EQ(*reader.LatestGeneration(), Step(1));
}

// ---------------------------------------------------------------------------------------------
// Namespaces.
// ---------------------------------------------------------------------------------------------

TEST(StepsTest, NamespacesKeepRunsApart) {
    EXPECT_OK(ValidateNamespace(""));
    EXPECT_OK(ValidateNamespace("run-1_a.B"));
    EXPECT_THAT(ValidateNamespace("a/b"), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateNamespace("a b"), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateNamespace("a@b"), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(ValidateNamespace(std::string(65, 'a')), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_OK(ValidateNamespace(std::string(64, 'a')));

    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore a(os, Options("n0", "runA"));
    SparseStore b(os, Options("n0", "runB"));
    SparseStore d(os, Options("n0"));
    // The same tensor id and step, different payloads: no conflict across namespaces.
    for (auto [s, v] : {std::pair{&a, 1.0f}, {&b, 2.0f}, {&d, 3.0f}}) {
        ASSERT_OK_AND_ASSIGN(CommitResult r, s->PutSparseObject(Req("w", {8, 8}, One(0, 0, v),
                                                                    DType::kFloat32, Step(1))));
        EXPECT_TRUE(r.created);
    }
    EXPECT_EQ(os->List("mcs/src@runA/")->size(), 1u);
    EXPECT_EQ(os->List("mcs/src@runB/")->size(), 1u);
    EXPECT_EQ(os->List("mcs/src/")->size(), 1u);
    // A seal in one run seals nothing in the others.
    ASSERT_OK(a.SealGeneration(Step(1), Ids({"w"})));
    EXPECT_EQ(*a.LatestGeneration(), Step(1));
    EXPECT_FALSE(b.LatestGeneration()->has_value());
    EXPECT_FALSE(d.LatestGeneration()->has_value());
    EXPECT_FALSE(b.GetManifest(Step(1))->sealed);
    EXPECT_THAT(b.WaitGeneration(Step(1), 0.05), StatusIs(StatusCode::kDeadlineExceeded));
    ASSERT_OK(CommitOne(b, "v", 1, 5));  // b's step 1 is open
    EXPECT_THAT(CommitOne(a, "v", 1, 5), StatusIs(StatusCode::kConflict));
    ASSERT_OK(b.SealGeneration(Step(1), Ids({"w", "v"})));
    ASSERT_OK(d.SealGeneration(Step(1), Ids({"w"})));

    // Run A goes on with retention 1; B and the default run keep their step 1.
    ASSERT_OK(a.SetRetention(1));
    for (std::uint64_t k = 2; k <= 5; ++k) CommitAndSeal(a, Ids({"w"}), k);
    EXPECT_EQ(StepsWithSources(*os, "mcs/src@runA/"), (std::set<std::uint64_t>{5}));
    EXPECT_EQ(StepsWithSources(*os, "mcs/src@runB/"), (std::set<std::uint64_t>{1}));
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{1}));
    EXPECT_EQ(*b.Retention(), 0u);
    EXPECT_EQ(*b.LatestGeneration(), Step(1));
    // Fencing is per run: A's "w" is at step 5, B's at step 1.
    EXPECT_EQ(**a.CurrentGeneration("w"), Step(5));
    EXPECT_EQ(**b.CurrentGeneration("w"), Step(1));
    ASSERT_OK(CommitOne(b, "w", 2, 6));
    ASSERT_OK(b.SealGeneration(Step(2), Ids({"w", "v"})));

    // Each run reads its own objects.
    const std::vector<TargetDescriptor> targets = {Target("t", "w", "n0", {0, 0}, {8, 8})};
    using E = std::map<std::vector<std::int64_t>, float>;
    for (auto [s, step, v] : {std::tuple{&a, 5u, 5.0f}, {&b, 1u, 2.0f}, {&d, 1u, 3.0f}}) {
        ASSERT_OK_AND_ASSIGN(StepManifest m, s->GetManifest(Step(step)));
        ASSERT_OK_AND_ASSIGN(auto objs, s->ReadSparseObjects(m, targets));
        EXPECT_EQ(Entries(objs[0]), (E{{{0, 0}, v}}));
    }
    ASSERT_OK_AND_ASSIGN(StepManifest bm, b.GetManifest(Step(1)));
    EXPECT_THAT(bm.unchanged, IsEmpty());  // b's seal, not d's
    ASSERT_OK_AND_ASSIGN(StepManifest dm, d.GetManifest(Step(1)));
    EXPECT_THAT(dm.unchanged, IsEmpty());

    // Leases are per run too: one in A's namespace does not hold B's step 1; one in B's does.
    WriteLease(*os, "@runA", Step(1), "reader", NowMs() + 60'000);
    WriteLease(*os, "@runB", Step(1), "reader", NowMs() + 60'000);
    EXPECT_THAT(b.SetRetention(1), StatusIs(StatusCode::kFailedPrecondition));
    ASSERT_OK(os->Remove(*os->List("mcs/lease@runB/")->begin()));
    ASSERT_OK(b.SetRetention(1));
    EXPECT_EQ(StepsWithSources(*os, "mcs/src@runB/"), (std::set<std::uint64_t>{2}));
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{1}));
    EXPECT_EQ(os->List("mcs/seal/")->size(), 1u);
    EXPECT_EQ(os->List("mcs/seal@runA/")->size(), 1u);
}


// ---------------------------------------------------------------------------------------------
// Steps that retention freed, and steps sealed out of order.
// ---------------------------------------------------------------------------------------------

TEST(StepsTest, AFreedStepCannotBeWaitedOnResealedOrCommittedTo) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore store(os);
    ASSERT_OK(store.SetRetention(2));
    ASSERT_OK(CommitOne(store, "u", 1, 1));  // "u" never changes after step 1
    for (std::uint64_t k = 1; k <= 5; ++k) {
        ASSERT_OK(CommitOne(store, "w", k, float(k)));
        ASSERT_OK(store.SealGeneration(Step(k), Ids({"w", "u"})));
    }
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{4, 5}));
    const StoreSize before = SizeOf(*os);
    // A lagging reader asking for a freed step learns it at once instead of waiting for ever.
    const auto t0 = Clock::now();
    EXPECT_THAT(store.WaitGeneration(Step(2), 5), StatusIs(StatusCode::kNotFound));
    EXPECT_THAT(store.WaitGeneration(Step(3), -1), StatusIs(StatusCode::kNotFound));
    EXPECT_LT(SecondsSince(t0), 1.0);
    EXPECT_THAT(store.GetManifest(Step(2)), StatusIs(StatusCode::kNotFound));
    // Sealing it again, or a late commit into it ("u" is at (0, 1), so fencing alone would
    // let it in), would leave objects that no retention pass reaches.
    EXPECT_THAT(store.SealGeneration(Step(2), Ids({"w", "u"})),
                StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_THAT(CommitOne(store, "u", 3, 3), StatusIs(StatusCode::kConflict));
    EXPECT_EQ(SizeOf(*os).keys, before.keys);
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{4, 5}));
    EXPECT_EQ(**store.CurrentGeneration("u"), Step(1));
    // The kept steps and the next one are unaffected.
    ASSERT_OK_AND_ASSIGN(StepManifest m, store.WaitGeneration(Step(4), 0));
    EXPECT_THAT(m.unchanged, ElementsAre("u"));
    ASSERT_OK(CommitOne(store, "u", 6, 6));
    ASSERT_OK(store.SealGeneration(Step(6), Ids({"w", "u"})));
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{5, 6}));
}

TEST(StepsTest, StepsSealedOutOfOrderFoldAndAreFreed) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore store(os);
    ASSERT_OK(CommitOne(store, "w", 1, 1));
    ASSERT_OK(CommitOne(store, "v", 2, 2));
    // Step 2 is sealed before step 1 (a slow writer of step 1).
    ASSERT_OK(store.SealGeneration(Step(2), Ids({"w", "v"})));
    EXPECT_THAT(store.WaitGeneration(Step(1), 0), StatusIs(StatusCode::kDeadlineExceeded));
    ASSERT_OK(store.SealGeneration(Step(1), Ids({"w", "v"})));
    EXPECT_EQ(*store.LatestGeneration(), Step(2));
    ASSERT_OK_AND_ASSIGN(StepManifest fold, store.GetManifest({0, 2}));
    EXPECT_EQ(fold.sources.size(), 2u);
    ASSERT_OK(store.SetRetention(1));
    EXPECT_EQ(StepsWithSources(*os, "mcs/src/"), (std::set<std::uint64_t>{2}));
    EXPECT_EQ(*os->List("mcs/seal/"), Ids({"mcs/seal/steps/1-2"}));
}


TEST(StepsTest, WaitGenerationWithAHugeTimeoutWaits) {
    SparseStore store(MakeEmbeddedStore());
    const double timeouts[] = {1e12, 1e300, std::numeric_limits<double>::infinity()};
    for (std::uint64_t k = 1; k <= 3; ++k) {
        ASSERT_OK(CommitOne(store, "w", k, float(k)));
        std::atomic<bool> returned{false};
        std::optional<Result<StepManifest>> got;
        std::thread waiter([&] {
            got.emplace(store.WaitGeneration(Step(k), timeouts[k - 1]));
            returned = true;
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        EXPECT_FALSE(returned.load()) << "timeout " << timeouts[k - 1] << " did not wait";
        ASSERT_OK(store.SealGeneration(Step(k), Ids({"w"})));
        waiter.join();
        EXPECT_OK(*got);
    }
    EXPECT_THAT(store.WaitGeneration(Step(4), std::numeric_limits<double>::quiet_NaN()),
                StatusIs(StatusCode::kInvalidArgument));
}

// A commit racing with the seal of its step: either the commit lands first (and the seal,
// whose list lacks the tensor, fails) or the seal does (and the commit is refused); never both.
TEST(StepsTest, ACommitRacingTheSealOfItsStepIsInOrRefused) {
    SparseStore store(MakeEmbeddedStore());
    int both = 0, commits_first = 0, seals_first = 0;
    for (std::uint64_t k = 1; k <= 300; ++k) {
        ASSERT_OK(CommitOne(store, "w", k, float(k)));
        Status commit, seal;
        std::atomic<int> ready{0};
        std::thread a([&] {
            ++ready;
            while (ready.load() < 2) {
            }
            commit = CommitOne(store, "late" + std::to_string(k % 2), k, 1);
        });
        std::thread b([&] {
            ++ready;
            while (ready.load() < 2) {
            }
            seal = store.SealGeneration(Step(k), Ids({"w"}));
        });
        a.join();
        b.join();
        if (commit.ok() && seal.ok()) ++both;
        if (commit.ok() && !seal.ok()) {
            ++commits_first;
            ASSERT_THAT(seal, StatusIs(StatusCode::kInvalidArgument));
            ASSERT_OK(store.SealGeneration(Step(k), Ids({"w", "late0", "late1"})));
        }
        if (!commit.ok()) {
            ++seals_first;
            ASSERT_THAT(commit, StatusIs(StatusCode::kConflict));
            ASSERT_OK(seal);
        }
        ASSERT_OK_AND_ASSIGN(StepManifest m, store.GetManifest(Step(k)));
        ASSERT_TRUE(m.sealed);
    }
    EXPECT_EQ(both, 0) << commits_first << " commits first, " << seals_first << " seals first";
}

// Two SparseStores over one object store stand for two processes on a shared store
// (mooncake://): their mutexes do not order a commit of one against a seal of the other.
TEST(StepsTest, ACommitRacingASealByAnotherProcessIsInTheSealOrUndone) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore trainer(os, Options("trainer"));
    SparseStore late_writer(os, Options("late"));
    int in = 0, undone = 0;
    for (std::uint64_t k = 1; k <= 200; ++k) {
        ASSERT_OK(CommitOne(trainer, "w", k, float(k)));
        Status commit, seal;
        std::atomic<int> ready{0};
        const std::string late = "late" + std::to_string(k % 2);
        std::thread a([&] {
            ++ready;
            while (ready.load() < 2) {
            }
            commit = CommitOne(late_writer, late, k, 1);
        });
        std::thread b([&] {
            ++ready;
            while (ready.load() < 2) {
            }
            // Staggered, so that the seal lands before, during and after the commit.
            std::this_thread::sleep_for(std::chrono::microseconds(10 * (k % 16)));
            seal = trainer.SealGeneration(Step(k), Ids({"w", "late0", "late1"}));
        });
        a.join();
        b.join();
        ASSERT_OK(seal);
        for (SparseStore* reader : {&trainer, &late_writer}) {
            ASSERT_OK_AND_ASSIGN(StepManifest m, reader->GetManifest(Step(k)));
            ASSERT_TRUE(m.sealed);
            const bool listed = std::any_of(m.sources.begin(), m.sources.end(),
                                            [&](const SourceDescriptor& d) {
                                                return d.tensor_id == late;
                                            });
            // Never a commit that succeeded and is missing from the sealed step.
            ASSERT_EQ(listed, commit.ok()) << commit.ToString();
        }
        if (commit.ok()) {
            ++in;
        } else {
            ++undone;
            ASSERT_THAT(commit, StatusIs(StatusCode::kConflict));
            // Nothing of the undone commit is left: neither its source nor its manifest entry.
            ASSERT_OK_AND_ASSIGN(auto src, os->List("mcs/src/" + late + "/g" +
                                                    GenerationTag(Step(k)) + "/"));
            ASSERT_OK_AND_ASSIGN(auto entries, os->List("mcs/manifest/" +
                                                        GenerationTag(Step(k)) + "/" + late));
            EXPECT_THAT(src, IsEmpty());
            EXPECT_THAT(entries, IsEmpty());
        }
    }
    EXPECT_EQ(in + undone, 200);
}

/// An object store whose List of one prefix runs a hook first (once): a commit by another
/// process that lands while a seal reads its step's manifest.
class ListHookStore : public testing::ForwardingStore {
public:
    explicit ListHookStore(std::shared_ptr<ObjectStore> inner) : ForwardingStore(std::move(inner)) {}
    Result<std::vector<std::string>> List(std::string_view prefix) override {
        auto out = ForwardingStore::List(prefix);
        if (hook_ && prefix == hook_prefix_) std::exchange(hook_, nullptr)();
        return out;
    }

    void OnList(std::string prefix, std::function<void()> hook) {
        hook_prefix_ = std::move(prefix);
        hook_ = std::move(hook);
    }

private:
    std::string hook_prefix_;
    std::function<void()> hook_;
};

TEST(StepsTest, ACommitListedAfterAnotherProcessReadTheManifestIsRefused) {
    auto shared = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    auto hooked = std::make_shared<ListHookStore>(shared);
    SparseStore trainer(hooked, Options("trainer"));
    SparseStore late_writer(shared, Options("late"));
    ASSERT_OK(CommitOne(trainer, "w", 1, 1));
    std::optional<Status> late;
    std::thread writer;
    // Right after the seal read the manifest, the other process commits: it lists itself in
    // the manifest, finds the seal in progress, waits for it, and is then refused.
    hooked->OnList("mcs/manifest/" + GenerationTag(Step(1)) + "/", [&] {
        writer = std::thread([&] { late = CommitOne(late_writer, "v", 1, 2); });
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    });
    ASSERT_OK(trainer.SealGeneration(Step(1), Ids({"v", "w"})));
    writer.join();
    ASSERT_TRUE(late.has_value());
    EXPECT_THAT(*late, StatusIsWithMessage(StatusCode::kConflict, "sealed by another process"));
    for (SparseStore* reader : {&trainer, &late_writer}) {
        ASSERT_OK_AND_ASSIGN(StepManifest m, reader->GetManifest(Step(1)));
        ASSERT_EQ(m.sources.size(), 1u);
        EXPECT_EQ(m.sources[0].tensor_id, "w");
        EXPECT_THAT(m.unchanged, ElementsAre("v"));
    }
    ASSERT_OK_AND_ASSIGN(auto left, shared->List("mcs/manifest/" + GenerationTag(Step(1)) + "/v"));
    EXPECT_THAT(left, IsEmpty());
    // The step's next writer of v is not fenced out by the refused commit.
    ASSERT_OK(CommitOne(late_writer, "v", 2, 3));
}

TEST(StepsTest, ASealInProgressExcludesASecondAndACrashedOneIsTakenOver) {
    auto os = std::shared_ptr<ObjectStore>(MakeEmbeddedStore());
    SparseStore trainer(os, Options("trainer"));
    SparseStore other(os, Options("other"));
    ASSERT_OK(CommitOne(trainer, "w", 1, 1));
    const std::string pending = "mcs/seal/pending/" + GenerationTag(Step(1));
    // A live seal of another process: a second seal is refused, a commit waits for it.
    ASSERT_OK(os->Put(pending, nlohmann::json{{"expires_ms", NowMs() + 60'000}}.dump(), {},
                      {PutMode::kCreate, true, false}));
    EXPECT_THAT(trainer.SealGeneration(Step(1), Ids({"w"})),
                StatusIsWithMessage(StatusCode::kFailedPrecondition, "in progress"));
    std::optional<Status> commit;
    std::thread writer([&] { commit = CommitOne(other, "v", 1, 2); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(commit.has_value());  // waiting for the seal in progress
    ASSERT_OK(os->Remove(pending));    // that seal gave up: the commit stands
    writer.join();
    ASSERT_OK(*commit);
    // A crashed sealer's expired record does not block the step.
    ASSERT_OK(os->Put(pending, nlohmann::json{{"expires_ms", NowMs() - 1}}.dump(), {},
                      {PutMode::kCreate, true, false}));
    ASSERT_OK(CommitOne(other, "u", 1, 3));
    ASSERT_OK(trainer.SealGeneration(Step(1), Ids({"u", "v", "w"})));
    ASSERT_OK_AND_ASSIGN(StepManifest m, other.GetManifest(Step(1)));
    EXPECT_EQ(m.sources.size(), 3u);
    EXPECT_THAT(m.unchanged, IsEmpty());
    ASSERT_OK_AND_ASSIGN(auto left, os->List("mcs/seal/pending/"));
    EXPECT_THAT(left, IsEmpty());
}


TEST(StepsTest, AFoldReadLeasesEveryStepItReads) {
    auto hs = std::make_shared<HoldingStore>();
    SparseStore writer(hs, Options("trainer"));
    SparseStore reader(hs, Options("n0"));
    for (std::uint64_t k = 1; k <= 3; ++k) CommitAndSeal(writer, Ids({"w"}), k);
    ASSERT_OK(writer.SealGeneration(Step(4), Ids({"w"})));  // no source: nothing to lease
    ASSERT_OK_AND_ASSIGN(StepManifest fold, reader.GetManifest({0, 4}));
    const std::vector<TargetDescriptor> targets = {Target("r0", "w", "n0", {0, 0}, {8, 8})};
    std::optional<Result<std::vector<TargetObject>>> got;
    hs->Hold();
    std::thread t([&] { got.emplace(reader.ReadSparseObjects(fold, targets)); });
    hs->WaitHeld();
    const std::vector<std::string> leases = *hs->List("mcs/lease/");
    ASSERT_EQ(leases.size(), 3u);
    EXPECT_TRUE(leases[0].starts_with("mcs/lease/0-1/"));
    EXPECT_TRUE(leases[2].starts_with("mcs/lease/2-3/"));
    EXPECT_THAT(writer.SetRetention(1), StatusIs(StatusCode::kFailedPrecondition));
    hs->Release();
    t.join();
    ASSERT_TRUE(got->ok()) << got->status().ToString();
    using E = std::map<std::vector<std::int64_t>, float>;
    EXPECT_EQ(Entries((**got)[0]), (E{{{0, 0}, 3.0f}}));
    EXPECT_THAT(*hs->List("mcs/lease/"), IsEmpty());
    ASSERT_OK(writer.SetRetention(1));
    EXPECT_EQ(StepsWithSources(*hs, "mcs/src/"), (std::set<std::uint64_t>{}));
    EXPECT_EQ(*hs->List("mcs/seal/"), Ids({"mcs/seal/steps/3-4"}));
}

TEST(StepsTest, AFoldOfStepsWithDifferentApplyModesIsRejected) {
    SparseStore store(MakeEmbeddedStore());
    ASSERT_OK(CommitOne(store, "w", 1, 1));
    ASSERT_OK(store.SealGeneration(Step(1), Ids({"w"})));
    ASSERT_OK(store.PutSparseObject(Req("w", {8, 8}, One(0, 0, 1), DType::kFloat32, Step(2),
                                        ApplyMode::kScatterAdd))
                  .status());
    ASSERT_OK(store.SealGeneration(Step(2), Ids({"w"})));
    ASSERT_OK_AND_ASSIGN(StepManifest fold, store.GetManifest({0, 2}));
    EXPECT_THAT(store.ReadSparseObjects(fold, std::vector<TargetDescriptor>{
                                                  Target("r0", "w", "n0", {0, 0}, {8, 8})}),
                StatusIs(StatusCode::kInvalidArgument));
    // Each step on its own reads.
    for (std::uint64_t k = 1; k <= 2; ++k) {
        ASSERT_OK_AND_ASSIGN(StepManifest m, store.GetManifest(Step(k)));
        EXPECT_OK(store.ReadSparseObjects(
            m, std::vector<TargetDescriptor>{Target("r0", "w", "n0", {0, 0}, {8, 8})}));
    }
}

}  // namespace
}  // namespace mooncake::sparse
