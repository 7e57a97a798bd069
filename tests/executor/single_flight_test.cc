// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Single flight in SparseStore::ReadSparseObjects: concurrent calls that need the same range
// (or tile index) while it is being read wait for that read instead of reading it again, so a
// node (the node daemon runs one SparseStore for all its processes) reads each unique range
// once. Meant to run under TSan as well.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "executor/sparse_store.h"

namespace mooncake::sparse {
namespace {

using namespace std::chrono_literals;

/// The embedded store, with range reads (and index reads) slowed down so that concurrent
/// callers overlap, counting physical reads, and optionally failing the next range read.
class SlowStore : public ObjectStore {
public:
    SlowStore() : inner_(MakeEmbeddedStore()) {}
    Status Put(std::string_view key, std::string_view metadata, std::span<const MemberData> members,
               const PutOptions& options) override {
        return inner_->Put(key, metadata, members, options);
    }
    Result<ObjectInfo> Stat(std::string_view key) override { return inner_->Stat(key); }
    Status ReadMember(std::string_view key, std::string_view member, std::span<std::byte> dst) override {
        if (slow) std::this_thread::sleep_for(20ms);
        member_reads.fetch_add(1);
        return inner_->ReadMember(key, member, dst);
    }
    Status ReadRanges(std::span<const RangeRead> reads) override {
        if (slow) std::this_thread::sleep_for(50ms);
        range_calls.fetch_add(1);
        if (fail_next.exchange(false)) return Unavailable("injected range read failure");
        return inner_->ReadRanges(reads);
    }
    Status Remove(std::string_view key) override { return inner_->Remove(key); }
    Result<std::vector<std::string>> List(std::string_view prefix) override {
        return inner_->List(prefix);
    }
    StoreCounters Counters() const override { return inner_->Counters(); }

    std::atomic<bool> slow{false};
    std::atomic<bool> fail_next{false};
    std::atomic<int> range_calls{0};
    std::atomic<int> member_reads{0};

private:
    std::unique_ptr<ObjectStore> inner_;
};

void Commit(SparseStore& store, const std::string& tensor, Index rows, Index cols, int nnz) {
    std::mt19937_64 rng(42);
    std::vector<std::int64_t> flat(static_cast<std::size_t>(rows * cols));
    for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<std::int64_t>(i);
    std::shuffle(flat.begin(), flat.end(), rng);
    std::vector<std::int64_t> idx;
    std::vector<float> val;
    for (int i = 0; i < nnz; ++i) {
        idx.push_back(flat[i] / cols);
        idx.push_back(flat[i] % cols);
        val.push_back(float(i));
    }
    PutSparseRequest r;
    r.tensor_id = tensor;
    r.global_shape = {rows, cols};
    r.indices = {DType::kInt64, {Index(nnz), 2}, std::as_bytes(std::span(idx))};
    r.values = {DType::kFloat32, {Index(nnz)}, std::as_bytes(std::span(val))};
    r.placement_policy = *PlacementPolicy::Parse("replicate(ep)");
    r.generation = {0, 1};
    ASSERT_TRUE(store.PutSparseObject(r).ok());
}

std::vector<TargetDescriptor> TpTargets(const std::string& tensor, Index rows, Index cols, int tp,
                                        const std::string& prefix) {
    std::vector<TargetDescriptor> out;
    for (int t = 0; t < tp; ++t) {
        out.push_back(*TargetDescriptor::Make(prefix + std::to_string(t), "node0", tensor,
                                              *NamedAxes::Make({{"tp", t}}),
                                              {Index(t) * (rows / tp), 0}, {rows / tp, cols}));
    }
    return out;
}

TEST(SingleFlightTest, ConcurrentCallsReadEachUniqueRangeOnce) {
    auto slow = std::make_shared<SlowStore>();
    SparseStore store(slow);
    Commit(store, "w", 512, 256, 5000);
    // As readers that did not commit find it: no tile index cached (the commit cached its own).
    ASSERT_TRUE(store.ClearCaches().ok());
    auto manifest = *store.Manifest({0, 1});
    store.ResetMetrics();
    slow->slow = true;
    constexpr int kCallers = 4;
    std::latch start(kCallers);
    std::atomic<int> ok{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < kCallers; ++c) {
        threads.emplace_back([&, c] {
            // Every caller wants the same 4 TP boxes (as EP replicas do).
            const auto targets = TpTargets("w", 512, 256, 4, "c" + std::to_string(c) + "/tp");
            start.arrive_and_wait();
            auto r = store.ReadSparseObjects(manifest, targets);
            if (r.ok() && r->size() == 4) ok.fetch_add(1);
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), kCallers);
    const SparseMetrics m = store.Metrics();
    EXPECT_EQ(m.index_gets, 1u);
    EXPECT_EQ(m.index_gets + m.index_cache_hits + m.index_single_flight_waits, unsigned(kCallers));
    EXPECT_EQ(m.range_gets, 4u);  // each TP box once for the whole node
    EXPECT_EQ(m.range_gets + m.range_cache_hits + m.single_flight_waits, 4u * kCallers);
    EXPECT_EQ(m.range_bytes_read, 5000u * (2 * 2 + 4));
    EXPECT_EQ(slow->range_calls.load(), 1)
        << "one physical batch read; the other callers waited or hit the cache";
}

TEST(SingleFlightTest, AFailedReadFailsItsWaitersAndIsNotRemembered) {
    auto slow = std::make_shared<SlowStore>();
    SparseStore store(slow);
    Commit(store, "w", 256, 256, 2000);
    auto manifest = *store.Manifest({0, 1});
    const auto targets = TpTargets("w", 256, 256, 2, "tp");
    slow->slow = true;
    slow->fail_next = true;
    std::latch start(2);
    std::vector<Status> results(2);
    std::vector<std::thread> threads;
    for (int c = 0; c < 2; ++c) {
        threads.emplace_back([&, c] {
            start.arrive_and_wait();
            if (c == 1) std::this_thread::sleep_for(30ms);  // arrives while c == 0 reads
            results[c] = store.ReadSparseObjects(manifest, targets).status();
        });
    }
    for (auto& t : threads) t.join();
    // Whichever caller read first failed; a caller that waited on its flight fails with the
    // same code, one that came too late for it reads again and succeeds.
    int failed = 0;
    for (const Status& s : results) {
        EXPECT_TRUE(s.ok() || s.code() == StatusCode::kUnavailable) << s.ToString();
        failed += s.ok() ? 0 : 1;
    }
    EXPECT_GE(failed, 1);
    // Nothing of the failure stays: the next call reads and succeeds.
    slow->slow = false;
    auto again = store.ReadSparseObjects(manifest, targets);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->size(), 2u);
}

TEST(SingleFlightTest, SameRangeForTwoNodesInOneBatchIsReadPerNode) {
    auto slow = std::make_shared<SlowStore>();
    SparseStore store(slow);
    Commit(store, "w", 256, 256, 900);
    auto manifest = *store.Manifest({0, 1});
    std::vector<TargetDescriptor> targets = {
        *TargetDescriptor::Make("a", "nodeA", "w", {}, {0, 0}, {128, 256}),
        *TargetDescriptor::Make("b", "nodeB", "w", {}, {0, 0}, {128, 256})};
    ASSERT_TRUE(store.ReadSparseObjects(manifest, targets).ok());
    EXPECT_EQ(store.Metrics().range_gets, 2u);
    EXPECT_EQ(store.Metrics().single_flight_waits, 0u);
}

}  // namespace
}  // namespace mooncake::sparse
