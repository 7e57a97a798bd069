// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// XXH3-64 (seed 0, the default secret: what libxxhash's XXH3_64bits computes, and what every
// member checksum of a sparse object is), written so that host and device code compile the same
// functions: `__host__ __device__` under nvcc, plain inline functions under a host compiler.
// The host library checksums with libxxhash itself (Checksum, codec.h); this header is for
// device code (src/cuda/gpu_index.cu), and a CPU test checks it bit for bit against libxxhash.
//
// Long inputs (more than 240 bytes) decompose for a parallel machine. The long loop keeps eight
// 64-bit lanes; every full 1 KiB block adds to lane j the sum over its 16 stripes of
// StripeLane(stripe, j) (the input word of lane j ^ 1 plus a 32x32->64-bit product of lane j's
// word and the secret), then scrambles the lane. A block's sums do not depend on the lanes, so
// every block's BlockLane can be computed at once; a cheap serial pass per lane then chains
// acc = ScrambleLane(acc + sum), FinishLane adds the last partial block and the last stripe, and
// MergeAccs folds the eight lanes into the hash. Hash64 composes exactly these pieces, so the
// test of Hash64 tests the decomposition too.
//
// Reads are byte by byte (any alignment, little-endian by construction); device code that
// streams the full blocks loads words itself and calls StripeWord.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define MCS_XXH3_FN __host__ __device__ inline
#else
#define MCS_XXH3_FN inline
#endif

namespace mooncake::sparse::xxh3 {

inline constexpr std::uint64_t kPrime32_1 = 0x9E3779B1U;
inline constexpr std::uint64_t kPrime32_2 = 0x85EBCA77U;
inline constexpr std::uint64_t kPrime32_3 = 0xC2B2AE3DU;
inline constexpr std::uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr std::uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr std::uint64_t kPrime64_3 = 0x165667B19E3779F9ULL;
inline constexpr std::uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr std::uint64_t kPrime64_5 = 0x27D4EB2F165667C5ULL;

inline constexpr std::size_t kSecretSize = 192;
inline constexpr std::size_t kStripeLen = 64;
inline constexpr std::size_t kLanes = 8;
/// Stripes of one block: (kSecretSize - kStripeLen) / 8.
inline constexpr std::size_t kStripesPerBlock = 16;
inline constexpr std::size_t kBlockLen = kStripeLen * kStripesPerBlock;  // 1024
/// Inputs up to this many bytes take the short paths (HashShort).
inline constexpr std::size_t kMidSizeMax = 240;

/// The secret (XXH3_kSecret), by value: device code copies it where it reads it from.
struct Secret {
    std::uint8_t bytes[kSecretSize];
};

MCS_XXH3_FN constexpr Secret DefaultSecret() {
    return Secret{{
        0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad,
        0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3,
        0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc,
        0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
        0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65,
        0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19,
        0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9,
        0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
        0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb,
        0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0,
        0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d,
        0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
        0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
    }};
}

// ---------------------------------------------------------------------------------------------
// Primitives
// ---------------------------------------------------------------------------------------------
MCS_XXH3_FN std::uint32_t Read32(const std::uint8_t* p) {
    return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
           std::uint32_t{p[3]} << 24;
}

MCS_XXH3_FN std::uint64_t Read64(const std::uint8_t* p) {
    return std::uint64_t{Read32(p)} | std::uint64_t{Read32(p + 4)} << 32;
}

MCS_XXH3_FN std::uint64_t Rotl64(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

MCS_XXH3_FN std::uint32_t Swap32(std::uint32_t x) {
    return ((x << 24) & 0xff000000U) | ((x << 8) & 0x00ff0000U) | ((x >> 8) & 0x0000ff00U) |
           ((x >> 24) & 0x000000ffU);
}

MCS_XXH3_FN std::uint64_t Swap64(std::uint64_t x) {
    return std::uint64_t{Swap32(static_cast<std::uint32_t>(x))} << 32 |
           Swap32(static_cast<std::uint32_t>(x >> 32));
}

/// The low 64 bits of the 128-bit product a * b, xor its high 64 bits.
MCS_XXH3_FN std::uint64_t Mul128Fold64(std::uint64_t a, std::uint64_t b) {
#if defined(__CUDA_ARCH__)
    return (a * b) ^ __umul64hi(a, b);
#else
    __extension__ using U128 = unsigned __int128;  // GCC/Clang; __extension__: -Wpedantic
    const U128 p = U128{a} * b;
    return static_cast<std::uint64_t>(p) ^ static_cast<std::uint64_t>(p >> 64);
#endif
}

MCS_XXH3_FN std::uint64_t Mul32To64(std::uint64_t x) {
    return (x & 0xFFFFFFFFULL) * (x >> 32);
}

MCS_XXH3_FN std::uint64_t Xxh64Avalanche(std::uint64_t h) {
    h ^= h >> 33;
    h *= kPrime64_2;
    h ^= h >> 29;
    h *= kPrime64_3;
    h ^= h >> 32;
    return h;
}

MCS_XXH3_FN std::uint64_t Avalanche(std::uint64_t h) {
    h ^= h >> 37;
    h *= 0x165667919E3779F9ULL;
    h ^= h >> 32;
    return h;
}

MCS_XXH3_FN std::uint64_t Rrmxmx(std::uint64_t h, std::uint64_t len) {
    h ^= Rotl64(h, 49) ^ Rotl64(h, 24);
    h *= 0x9FB21C651E98DF25ULL;
    h ^= (h >> 35) + len;
    h *= 0x9FB21C651E98DF25ULL;
    h ^= h >> 28;
    return h;
}

MCS_XXH3_FN std::uint64_t Mix16B(const std::uint8_t* in, const std::uint8_t* secret) {
    return Mul128Fold64(Read64(in) ^ Read64(secret), Read64(in + 8) ^ Read64(secret + 8));
}

// ---------------------------------------------------------------------------------------------
// Short inputs: 0 to 240 bytes
// ---------------------------------------------------------------------------------------------
/// XXH3_64bits of `len` <= kMidSizeMax bytes.
MCS_XXH3_FN std::uint64_t HashShort(const std::uint8_t* in, std::size_t len,
                                    const std::uint8_t* secret) {
    if (len == 0) return Xxh64Avalanche(Read64(secret + 56) ^ Read64(secret + 64));
    if (len <= 3) {
        const std::uint32_t combined = std::uint32_t{in[0]} << 16 |
                                       std::uint32_t{in[len >> 1]} << 24 |
                                       std::uint32_t{in[len - 1]} |
                                       static_cast<std::uint32_t>(len) << 8;
        const std::uint64_t bitflip = std::uint64_t{Read32(secret) ^ Read32(secret + 4)};
        return Xxh64Avalanche(std::uint64_t{combined} ^ bitflip);
    }
    if (len <= 8) {
        const std::uint32_t in1 = Read32(in);
        const std::uint32_t in2 = Read32(in + len - 4);
        const std::uint64_t bitflip = Read64(secret + 8) ^ Read64(secret + 16);
        const std::uint64_t in64 = std::uint64_t{in2} + (std::uint64_t{in1} << 32);
        return Rrmxmx(in64 ^ bitflip, len);
    }
    if (len <= 16) {
        const std::uint64_t bitflip1 = Read64(secret + 24) ^ Read64(secret + 32);
        const std::uint64_t bitflip2 = Read64(secret + 40) ^ Read64(secret + 48);
        const std::uint64_t lo = Read64(in) ^ bitflip1;
        const std::uint64_t hi = Read64(in + len - 8) ^ bitflip2;
        return Avalanche(len + Swap64(lo) + hi + Mul128Fold64(lo, hi));
    }
    std::uint64_t acc = len * kPrime64_1;
    if (len <= 128) {
        if (len > 32) {
            if (len > 64) {
                if (len > 96) {
                    acc += Mix16B(in + 48, secret + 96);
                    acc += Mix16B(in + len - 64, secret + 112);
                }
                acc += Mix16B(in + 32, secret + 64);
                acc += Mix16B(in + len - 48, secret + 80);
            }
            acc += Mix16B(in + 16, secret + 32);
            acc += Mix16B(in + len - 32, secret + 48);
        }
        acc += Mix16B(in, secret);
        acc += Mix16B(in + len - 16, secret + 16);
        return Avalanche(acc);
    }
    // 129 to 240 bytes.
    constexpr std::size_t kStartOffset = 3;
    constexpr std::size_t kLastOffset = 17;
    constexpr std::size_t kSecretSizeMin = 136;
    const std::size_t rounds = len / 16;
    for (std::size_t i = 0; i < 8; ++i) acc += Mix16B(in + 16 * i, secret + 16 * i);
    acc = Avalanche(acc);
    for (std::size_t i = 8; i < rounds; ++i) {
        acc += Mix16B(in + 16 * i, secret + 16 * (i - 8) + kStartOffset);
    }
    acc += Mix16B(in + len - 16, secret + kSecretSizeMin - kLastOffset);
    return Avalanche(acc);
}

// ---------------------------------------------------------------------------------------------
// Long inputs: more than 240 bytes, in the pieces a parallel machine computes apart
// ---------------------------------------------------------------------------------------------
/// Lane `lane`'s accumulator before the first block.
MCS_XXH3_FN std::uint64_t InitAcc(std::size_t lane) {
    switch (lane) {
        case 0: return kPrime32_3;
        case 1: return kPrime64_1;
        case 2: return kPrime64_2;
        case 3: return kPrime64_3;
        case 4: return kPrime64_4;
        case 5: return kPrime32_2;
        case 6: return kPrime64_5;
        default: return kPrime32_1;
    }
}

/// What one input word `word` of lane `lane` of a stripe contributes: `mine` (add to lane
/// `lane`: the product of the word xor the secret word `key`) and `pair` (add to lane
/// `lane ^ 1`: the word itself).
struct WordGain {
    std::uint64_t mine;
    std::uint64_t pair;
};
MCS_XXH3_FN WordGain StripeWord(std::uint64_t word, std::uint64_t key) {
    return {Mul32To64(word ^ key), word};
}

/// What lane `lane` gains from one stripe whose secret starts at `secret_at`.
MCS_XXH3_FN std::uint64_t StripeLane(const std::uint8_t* stripe, const std::uint8_t* secret_at,
                                     std::size_t lane) {
    const std::uint64_t own = Read64(stripe + 8 * lane);
    const std::uint64_t pair = Read64(stripe + 8 * (lane ^ 1));
    return pair + Mul32To64(own ^ Read64(secret_at + 8 * lane));
}

/// What lane `lane` gains from the 16 stripes of one full block (before its scramble).
MCS_XXH3_FN std::uint64_t BlockLane(const std::uint8_t* block, const std::uint8_t* secret,
                                    std::size_t lane) {
    std::uint64_t sum = 0;
    for (std::size_t s = 0; s < kStripesPerBlock; ++s) {
        sum += StripeLane(block + s * kStripeLen, secret + 8 * s, lane);
    }
    return sum;
}

/// The secret word lane `lane` is scrambled with.
MCS_XXH3_FN std::uint64_t ScrambleKey(const std::uint8_t* secret, std::size_t lane) {
    return Read64(secret + kSecretSize - kStripeLen + 8 * lane);
}

/// The scramble of a lane at the end of a full block, with its ScrambleKey.
MCS_XXH3_FN std::uint64_t ScrambleWithKey(std::uint64_t acc, std::uint64_t key) {
    acc ^= acc >> 47;
    acc ^= key;
    return acc * kPrime32_1;
}

/// The scramble of lane `lane` at the end of a full block.
MCS_XXH3_FN std::uint64_t ScrambleLane(std::uint64_t acc, const std::uint8_t* secret,
                                       std::size_t lane) {
    return ScrambleWithKey(acc, ScrambleKey(secret, lane));
}

/// The full blocks of a long input (`len` > kMidSizeMax) that the chain scrambles: the block
/// holding the last byte never is one, even when it is full.
MCS_XXH3_FN std::size_t FullBlocks(std::size_t len) { return (len - 1) / kBlockLen; }

/// Lane `lane` after the last partial block and the last stripe of a long input, given its
/// value `acc` after the FullBlocks(len) full blocks.
MCS_XXH3_FN std::uint64_t FinishLane(std::uint64_t acc, const std::uint8_t* in, std::size_t len,
                                     const std::uint8_t* secret, std::size_t lane) {
    const std::size_t blocks = FullBlocks(len);
    const std::size_t stripes = ((len - 1) - kBlockLen * blocks) / kStripeLen;
    const std::uint8_t* tail = in + blocks * kBlockLen;
    for (std::size_t s = 0; s < stripes; ++s) {
        acc += StripeLane(tail + s * kStripeLen, secret + 8 * s, lane);
    }
    constexpr std::size_t kLastAccStart = 7;
    return acc + StripeLane(in + len - kStripeLen,
                            secret + kSecretSize - kStripeLen - kLastAccStart, lane);
}

/// The hash of a long input of `len` bytes from its eight finished lanes.
MCS_XXH3_FN std::uint64_t MergeAccs(const std::uint64_t* acc, std::size_t len,
                                    const std::uint8_t* secret) {
    constexpr std::size_t kMergeAccsStart = 11;
    std::uint64_t h = len * kPrime64_1;
    for (std::size_t i = 0; i < 4; ++i) {
        const std::uint8_t* s = secret + kMergeAccsStart + 16 * i;
        h += Mul128Fold64(acc[2 * i] ^ Read64(s), acc[2 * i + 1] ^ Read64(s + 8));
    }
    return Avalanche(h);
}

/// XXH3_64bits(data, len): the short paths, or the long one composed of the pieces above.
MCS_XXH3_FN std::uint64_t Hash64(const void* data, std::size_t len, const std::uint8_t* secret) {
    const auto* in = static_cast<const std::uint8_t*>(data);
    if (len <= kMidSizeMax) return HashShort(in, len, secret);
    std::uint64_t acc[kLanes];
    const std::size_t blocks = FullBlocks(len);
    for (std::size_t lane = 0; lane < kLanes; ++lane) {
        std::uint64_t a = InitAcc(lane);
        for (std::size_t b = 0; b < blocks; ++b) {
            a = ScrambleLane(a + BlockLane(in + b * kBlockLen, secret, lane), secret, lane);
        }
        acc[lane] = FinishLane(a, in, len, secret, lane);
    }
    return MergeAccs(acc, len, secret);
}

}  // namespace mooncake::sparse::xxh3
