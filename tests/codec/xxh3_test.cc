// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// codec/xxh3.h (the XXH3-64 that device code computes member checksums with) against libxxhash's
// XXH3_64bits: every length to 2000 bytes at every alignment class, the boundaries of the short
// paths, of stripes and of blocks, and large random buffers; and the block decomposition the
// device uses (per-word gains summed per lane, then chained) against BlockLane.

#include "codec/xxh3.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace mooncake::sparse {
namespace {

constexpr xxh3::Secret kSecret = xxh3::DefaultSecret();

std::vector<std::uint8_t> RandomBytes(std::size_t n, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::uint8_t> out(n);
    for (auto& b : out) b = static_cast<std::uint8_t>(rng());
    return out;
}

TEST(Xxh3Test, SecretIsLibxxhashDefault) {
    for (std::size_t i = 0; i < xxh3::kSecretSize; ++i) {
        ASSERT_EQ(kSecret.bytes[i], XXH3_kSecret[i]) << "byte " << i;
    }
}

TEST(Xxh3Test, EveryLengthTo2000AtEveryAlignment) {
    const std::vector<std::uint8_t> buf = RandomBytes(2000 + 8, 1);
    for (std::size_t offset = 0; offset < 8; ++offset) {
        for (std::size_t len = 0; len <= 2000; ++len) {
            const std::uint8_t* p = buf.data() + offset;
            ASSERT_EQ(xxh3::Hash64(p, len, kSecret.bytes), XXH3_64bits(p, len))
                << "length " << len << " offset " << offset;
        }
    }
}

TEST(Xxh3Test, ZeroAndConstantInputs) {
    for (const std::uint8_t fill : {std::uint8_t{0}, std::uint8_t{0xff}, std::uint8_t{0x5a}}) {
        const std::vector<std::uint8_t> buf(70000, fill);
        for (std::size_t len : {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 65536,
                                70000}) {
            ASSERT_EQ(xxh3::Hash64(buf.data(), len, kSecret.bytes), XXH3_64bits(buf.data(), len))
                << "length " << len << " fill " << int{fill};
        }
    }
}

TEST(Xxh3Test, BoundariesOfStripesAndBlocks) {
    const std::vector<std::uint8_t> buf = RandomBytes((1 << 20) + 64, 2);
    std::vector<std::size_t> lengths;
    for (std::size_t k = 1; k <= 40; ++k) {
        for (std::size_t base : {k * xxh3::kBlockLen, k * xxh3::kBlockLen + 240,
                                 k * xxh3::kBlockLen + 15 * xxh3::kStripeLen}) {
            for (std::size_t d = 0; d < 3; ++d) lengths.push_back(base + d - 1);
        }
    }
    for (std::size_t s = 1; s < 64; ++s) lengths.push_back(s * xxh3::kStripeLen);
    lengths.push_back(std::size_t{1} << 20);
    lengths.push_back((std::size_t{1} << 20) - 1);
    lengths.push_back((std::size_t{1} << 20) + 1);
    for (std::size_t len : lengths) {
        for (std::size_t offset : {0, 2, 4, 5}) {
            const std::uint8_t* p = buf.data() + offset;
            ASSERT_EQ(xxh3::Hash64(p, len, kSecret.bytes), XXH3_64bits(p, len))
                << "length " << len << " offset " << offset;
        }
    }
}

TEST(Xxh3Test, LargeRandomBuffers) {
    std::mt19937_64 rng(3);
    for (int round = 0; round < 8; ++round) {
        const std::size_t len = 1 + rng() % (std::size_t{9} << 20);
        const std::vector<std::uint8_t> buf = RandomBytes(len + 3, rng());
        for (std::size_t offset : {0, 3}) {
            const std::uint8_t* p = buf.data() + offset;
            ASSERT_EQ(xxh3::Hash64(p, len, kSecret.bytes), XXH3_64bits(p, len))
                << "length " << len << " offset " << offset;
        }
    }
}

// The device's split of a block: each of the block's 128 words gives its own lane a product
// and its pair lane the word (StripeWord); the gains summed per lane in any order are BlockLane.
TEST(Xxh3Test, WordGainsSumToBlockLanes) {
    const std::vector<std::uint8_t> buf = RandomBytes(16 * xxh3::kBlockLen, 4);
    for (std::size_t b = 0; b < 16; ++b) {
        const std::uint8_t* block = buf.data() + b * xxh3::kBlockLen;
        std::uint64_t lanes[xxh3::kLanes] = {};
        // Words taken in the order a warp takes them: thread t, words t, t + 32, t + 64, t + 96.
        for (std::size_t t = 0; t < 32; ++t) {
            for (std::size_t k = 0; k < 4; ++k) {
                const std::size_t w = t + 32 * k;
                const std::size_t stripe = w / xxh3::kLanes, lane = w % xxh3::kLanes;
                const xxh3::WordGain g = xxh3::StripeWord(
                    xxh3::Read64(block + 8 * w), xxh3::Read64(kSecret.bytes + 8 * (stripe + lane)));
                lanes[lane] += g.mine;
                lanes[lane ^ 1] += g.pair;
            }
        }
        for (std::size_t lane = 0; lane < xxh3::kLanes; ++lane) {
            EXPECT_EQ(lanes[lane], xxh3::BlockLane(block, kSecret.bytes, lane)) << b << " " << lane;
        }
    }
}

// The chain over precomputed block sums, as the device runs it, gives the library's hash.
TEST(Xxh3Test, ChainOfPrecomputedBlockSums) {
    for (std::size_t len : {241, 1024, 1025, 2048, 4097, 100000, 1 << 20}) {
        const std::vector<std::uint8_t> buf = RandomBytes(len, len);
        const std::size_t blocks = xxh3::FullBlocks(len);
        std::vector<std::uint64_t> sums(blocks * xxh3::kLanes);
        for (std::size_t b = 0; b < blocks; ++b) {
            for (std::size_t lane = 0; lane < xxh3::kLanes; ++lane) {
                sums[b * xxh3::kLanes + lane] =
                    xxh3::BlockLane(buf.data() + b * xxh3::kBlockLen, kSecret.bytes, lane);
            }
        }
        std::uint64_t acc[xxh3::kLanes];
        for (std::size_t lane = 0; lane < xxh3::kLanes; ++lane) {
            std::uint64_t a = xxh3::InitAcc(lane);
            for (std::size_t b = 0; b < blocks; ++b) {
                a = xxh3::ScrambleLane(a + sums[b * xxh3::kLanes + lane], kSecret.bytes, lane);
            }
            acc[lane] = xxh3::FinishLane(a, buf.data(), len, kSecret.bytes, lane);
        }
        EXPECT_EQ(xxh3::MergeAccs(acc, len, kSecret.bytes), XXH3_64bits(buf.data(), len)) << len;
    }
}

}  // namespace
}  // namespace mooncake::sparse
