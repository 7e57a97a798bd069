// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// BFloat16 / Float16 <-> float32: exhaustive round trips over all 65536 bit patterns, decoding
// against an independent formula, and rounding against independent nearest-value references
// (plus the F16C instruction where the CPU has it).

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "codec/codec.h"
#include "codec_test_util.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MCS_HAVE_F16C_REFERENCE 1
#endif

namespace mooncake::sparse {
namespace {

bool IsNaNBf16(std::uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0; }
bool IsNaNF16(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }

/// Float16 decoded with ldexp, independently of the library's bit manipulation.
double ReferenceF16Value(std::uint16_t h) {
    const int sign = (h >> 15) ? -1 : 1;
    const int exp = (h >> 10) & 0x1f;
    const int mant = h & 0x3ff;
    if (exp == 0) return sign * std::ldexp(mant, -24);
    if (exp == 31) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
    return sign * std::ldexp(1024 + mant, exp - 25);
}

/// Round to nearest even by brute force over the sorted positive finite fp16 values; values at
/// or past 65520 (the midpoint between 65504 and the would-be 65536) overflow to infinity.
std::uint16_t ReferenceF32ToF16(float f) {
    static const std::vector<double> kPositive = [] {
        std::vector<double> v;
        for (std::uint16_t h = 0; h < 0x7c00; ++h) v.push_back(ReferenceF16Value(h));
        return v;
    }();
    const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    const double a = std::fabs(static_cast<double>(f));
    if (a >= 65520.0) return sign | 0x7c00;
    auto it = std::lower_bound(kPositive.begin(), kPositive.end(), a);
    auto hi = static_cast<std::uint16_t>(it - kPositive.begin());
    if (hi == 0) return sign;
    if (hi == kPositive.size()) return sign | static_cast<std::uint16_t>(hi - 1);
    const std::uint16_t lo = hi - 1;
    const double dlo = a - kPositive[lo], dhi = kPositive[hi] - a;
    if (dlo < dhi) return sign | lo;
    if (dhi < dlo) return sign | hi;
    return sign | ((lo & 1) ? hi : lo);
}

/// bf16 by comparing the two neighbouring candidates in double (the one past the largest
/// finite value is 2^128, where rounding up means infinity).
std::uint16_t ReferenceF32ToBf16(float f) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(f);
    const std::uint16_t sign = (b >> 16) & 0x8000;
    const std::uint32_t abs = b & 0x7fffffff;
    const auto lo = static_cast<std::uint16_t>(abs >> 16);
    const auto hi = static_cast<std::uint16_t>(lo + 1);
    auto value = [](std::uint16_t h) -> double {
        if (h == 0x7f80) return std::ldexp(1.0, 128);
        return static_cast<double>(std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16));
    };
    const double a = static_cast<double>(std::bit_cast<float>(abs));
    const double dlo = a - value(lo), dhi = value(hi) - a;
    if (dlo < dhi) return sign | lo;
    if (dhi < dlo) return sign | hi;
    return sign | ((lo & 1) ? hi : lo);
}

#ifdef MCS_HAVE_F16C_REFERENCE
__attribute__((target("f16c"))) std::uint16_t HardwareF32ToF16(float f) {
    return static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
#endif

TEST(Float16Test, BFloat16RoundTripsAllBitPatterns) {
    for (std::uint32_t i = 0; i < 65536; ++i) {
        const auto h = static_cast<std::uint16_t>(i);
        const float f = BFloat16ToFloat(h);
        ASSERT_EQ(std::bit_cast<std::uint32_t>(f), i << 16) << std::hex << i;
        ASSERT_EQ(FloatToBFloat16(f), h) << std::hex << i;
        ASSERT_EQ(std::isnan(f), IsNaNBf16(h)) << std::hex << i;
    }
}

TEST(Float16Test, Float16RoundTripsAllBitPatterns) {
    for (std::uint32_t i = 0; i < 65536; ++i) {
        const auto h = static_cast<std::uint16_t>(i);
        const float f = Float16ToFloat(h);
        ASSERT_EQ(FloatToFloat16(f), h) << std::hex << i;
        ASSERT_EQ(std::isnan(f), IsNaNF16(h)) << std::hex << i;
        if (!IsNaNF16(h)) {
            ASSERT_EQ(static_cast<double>(f), ReferenceF16Value(h)) << std::hex << i;
            ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << i;
        }
    }
}

TEST(Float16Test, NaNKeepsSignAndIsNeverInfinity) {
    // Payload only in the low 16 bits: plain truncation would give infinity.
    const float low_payload = std::bit_cast<float>(0xff800001u);
    EXPECT_TRUE(IsNaNBf16(FloatToBFloat16(low_payload)));
    EXPECT_EQ(FloatToBFloat16(low_payload) & 0x8000, 0x8000);
    EXPECT_TRUE(IsNaNF16(FloatToFloat16(low_payload)));
    EXPECT_EQ(FloatToFloat16(low_payload) & 0x8000, 0x8000);
    const float qnan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_TRUE(IsNaNBf16(FloatToBFloat16(qnan)));
    EXPECT_TRUE(IsNaNF16(FloatToFloat16(qnan)));
}

TEST(Float16Test, Float16EdgeCases) {
    EXPECT_EQ(FloatToFloat16(0.0f), 0x0000);
    EXPECT_EQ(FloatToFloat16(-0.0f), 0x8000);
    EXPECT_EQ(FloatToFloat16(1.0f), 0x3c00);
    EXPECT_EQ(FloatToFloat16(65504.0f), 0x7bff);
    EXPECT_EQ(FloatToFloat16(65519.996f), 0x7bff);
    EXPECT_EQ(FloatToFloat16(65520.0f), 0x7c00);  // tie with an odd mantissa: up to infinity
    EXPECT_EQ(FloatToFloat16(-1e10f), 0xfc00);
    EXPECT_EQ(FloatToFloat16(INFINITY), 0x7c00);
    EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
    EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -25)), 0x0000);         // tie: to even (zero)
    EXPECT_EQ(FloatToFloat16(std::ldexp(1.5f, -24)), 0x0002);         // tie: to even (2)
    EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
    EXPECT_EQ(FloatToFloat16(std::ldexp(1023.5f, -24)), 0x0400);      // subnormal rounds to normal
    EXPECT_EQ(FloatToFloat16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: to even
    EXPECT_EQ(FloatToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
}

TEST(Float16Test, BFloat16EdgeCases) {
    EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
    EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
    EXPECT_EQ(FloatToBFloat16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie: to even
    EXPECT_EQ(FloatToBFloat16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie: to even
    EXPECT_EQ(FloatToBFloat16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
    EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
    EXPECT_EQ(FloatToBFloat16(std::bit_cast<float>(0x00000001u)), 0x0000);  // tiny denormal
    EXPECT_EQ(FloatToBFloat16(-INFINITY), 0xff80);
}

TEST(Float16Test, RoundingMatchesReferencesOnRandomAndBoundaryFloats) {
    std::mt19937_64 rng(7);
    std::vector<float> inputs;
    std::uniform_int_distribution<std::uint32_t> bits;
    for (int i = 0; i < 200000; ++i) inputs.push_back(std::bit_cast<float>(bits(rng)));
    // Values in the fp16 range, and exact midpoints and their neighbours.
    std::uniform_real_distribution<float> in_range(-70000.0f, 70000.0f);
    for (int i = 0; i < 100000; ++i) inputs.push_back(in_range(rng) * std::ldexp(1.0f, -(i % 40)));
    for (std::uint32_t h = 0; h < 0x7c00; h += 7) {
        const float mid =
            static_cast<float>((ReferenceF16Value(static_cast<std::uint16_t>(h)) +
                                ReferenceF16Value(static_cast<std::uint16_t>(h + 1))) /
                               2);
        inputs.push_back(mid);
        inputs.push_back(std::nextafter(mid, 0.0f));
        inputs.push_back(std::nextafter(mid, INFINITY));
        inputs.push_back(-mid);
    }
    for (std::uint32_t h = 0; h < 0x7f80; h += 5) {
        inputs.push_back(std::bit_cast<float>((h << 16) | 0x8000u));
        inputs.push_back(std::bit_cast<float>((h << 16) | 0x7fffu));
    }
#ifdef MCS_HAVE_F16C_REFERENCE
    const bool have_f16c = __builtin_cpu_supports("f16c");
#endif
    for (float f : inputs) {
        if (std::isnan(f)) continue;
        ASSERT_EQ(FloatToBFloat16(f), ReferenceF32ToBf16(f)) << std::hexfloat << f;
        ASSERT_EQ(FloatToFloat16(f), ReferenceF32ToF16(f)) << std::hexfloat << f;
#ifdef MCS_HAVE_F16C_REFERENCE
        if (have_f16c) {
            ASSERT_EQ(FloatToFloat16(f), HardwareF32ToF16(f)) << std::hexfloat << f;
        }
#endif
    }
}

}  // namespace
}  // namespace mooncake::sparse
