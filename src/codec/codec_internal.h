// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Internals shared by the codec's translation units: thread fan-out, a growable POD buffer,
// inline 16-bit float conversions for the hot loops, and dtype helpers. Not part of the API.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "mooncake/sparse/contracts.h"
#include "mooncake/sparse/geometry.h"
#include "mooncake/sparse/status.h"
#include "transport/parallel_for.h"

namespace mooncake::sparse::codec_internal {

// ---------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------

using internal::ParallelFor;     // transport/parallel_for.h
using internal::ResolveThreads;

__extension__ typedef unsigned __int128 UInt128;

/// Splits [0, n) into `parts` contiguous pieces; piece i is [Begin(i), Begin(i + 1)).
/// Division by an invariant divisor d >= 1 without a divide instruction: a shift when d is a
/// power of two (exact for every n), else one 64x64->128-bit multiply by ceil(2^64 / d), which
/// is exact for every n < 2^32 and d < 2^32 (Lemire, Kaser and Kurz, "Faster remainder by
/// direct computation", 2019). Callers check Exact(n_max) once. Default tile shapes are
/// extent / 8, rarely a power of two: tile coordinates of every entry go through this.
struct Divider {
    std::uint64_t d = 1;
    std::uint64_t m = 0;  ///< ceil(2^64 / d) when shift < 0.
    int shift = 0;        ///< log2(d) when d is a power of two, else -1.

    Divider() = default;
    explicit Divider(std::uint64_t divisor) : d(divisor) {
        if (std::has_single_bit(d)) {
            shift = std::countr_zero(d);
        } else {
            shift = -1;
            m = ~std::uint64_t{0} / d + 1;
        }
    }
    /// True when Div/Mod are exact for every n <= n_max.
    bool Exact(std::uint64_t n_max) const {
        return shift >= 0 || (n_max < (std::uint64_t{1} << 32) && d < (std::uint64_t{1} << 32));
    }
    std::uint64_t Div(std::uint64_t n) const {
        __extension__ using U128 = unsigned __int128;  // GCC/Clang; __extension__: -Wpedantic
        return shift >= 0 ? n >> shift : static_cast<std::uint64_t>((U128{m} * n) >> 64);
    }
    std::uint64_t Mod(std::uint64_t n) const { return n - Div(n) * d; }
};

struct Split {
    std::uint64_t n = 0;
    std::uint64_t parts = 1;
    std::uint64_t Begin(std::uint64_t i) const {
        if (i >= parts) return n;
        std::uint64_t p;
        if (!__builtin_mul_overflow(n, i, &p)) return p / parts;
        return static_cast<std::uint64_t>((static_cast<UInt128>(n) * i) / parts);
    }
};

// ---------------------------------------------------------------------------------------------
// A contiguous growable buffer of trivially copyable T that never value-initialises; Clear()
// keeps the capacity for reuse.
// ---------------------------------------------------------------------------------------------
template <typename T>
class PodBuffer {
    static_assert(std::is_trivially_copyable_v<T>);

  public:
    /// Makes room for `n` more elements and returns where they go; Commit(k <= n) then says how
    /// many were written.
    T* Reserve(std::size_t n) {
        if (size_ + n > cap_) {
            const std::size_t cap = std::max<std::size_t>({size_ + n, cap_ * 2, 1024});
            std::unique_ptr<T[]> next(new T[cap]);
            if (size_) std::memcpy(next.get(), data_.get(), size_ * sizeof(T));
            data_ = std::move(next);
            cap_ = cap;
        }
        return data_.get() + size_;
    }
    void Commit(std::size_t k) { size_ += k; }
    void Clear() { size_ = 0; }
    std::size_t size() const { return size_; }
    const T* data() const { return data_.get(); }

  private:
    std::unique_ptr<T[]> data_;
    std::size_t size_ = 0;
    std::size_t cap_ = 0;
};

// ---------------------------------------------------------------------------------------------
// An append-only buffer of trivially copyable T kept as a list of blocks: growing never copies
// or value-initialises, and the contents are read back block by block.
// ---------------------------------------------------------------------------------------------
template <typename T>
class BlockBuffer {
    static_assert(std::is_trivially_copyable_v<T>);

  public:
    static constexpr std::size_t kBlockElements = std::size_t{1} << 16;

    /// Makes room for `n` more contiguous elements and returns where they go; Commit(k <= n)
    /// then says how many were written.
    T* Reserve(std::size_t n) {
        if (blocks_.empty() || blocks_.back().used + n > blocks_.back().cap) {
            const std::size_t cap = std::max(n, kBlockElements);
            blocks_.push_back(Block{std::unique_ptr<T[]>(new T[cap]), 0, cap});
        }
        Block& b = blocks_.back();
        return b.data.get() + b.used;
    }
    void Commit(std::size_t k) {
        blocks_.back().used += k;
        size_ += k;
    }
    std::size_t size() const { return size_; }

    /// Appends the contents, in order, to `out` (bytes).
    void AppendTo(std::vector<std::byte>& out) const {
        for (const Block& b : blocks_) {
            const auto* p = reinterpret_cast<const std::byte*>(b.data.get());
            out.insert(out.end(), p, p + b.used * sizeof(T));
        }
    }

  private:
    struct Block {
        std::unique_ptr<T[]> data;
        std::size_t used = 0;
        std::size_t cap = 0;
    };
    std::vector<Block> blocks_;
    std::size_t size_ = 0;
};

// ---------------------------------------------------------------------------------------------
// 16-bit floats (round to nearest even; NaNs stay NaN with their sign and top payload bits).
// ---------------------------------------------------------------------------------------------
inline float Bf16ToF32(std::uint16_t v) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16);
}

inline std::uint16_t F32ToBf16(float f) {
    std::uint32_t b = std::bit_cast<std::uint32_t>(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        // NaN: truncate (so every bf16 NaN round-trips bit-exactly) but never to infinity.
        auto h = static_cast<std::uint16_t>(b >> 16);
        if ((h & 0x7f) == 0) h |= 0x40;
        return h;
    }
    b += 0x7fffu + ((b >> 16) & 1u);
    return static_cast<std::uint16_t>(b >> 16);
}

inline float F16ToF32(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    const std::uint32_t mant = h & 0x3ffu;
    std::uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // Subnormal: mant * 2^-24 is exact in float32.
            bits = sign | std::bit_cast<std::uint32_t>(static_cast<float>(mant) * 0x1p-24f);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    return std::bit_cast<float>(bits);
}

inline std::uint16_t F32ToF16(float f) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(f);
    const auto sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
    const std::uint32_t abs = b & 0x7fffffffu;
    if (abs > 0x7f800000u) {  // NaN: keep the top payload bits, never become infinity.
        auto h = static_cast<std::uint16_t>(sign | 0x7c00u | ((abs >> 13) & 0x3ffu));
        if ((h & 0x3ff) == 0) h |= 0x200;
        return h;
    }
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
    if (abs >= 0x38800000u) {  // Normal fp16 (>= 2^-14).
        std::uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
        r -= 112u << 23;
        return static_cast<std::uint16_t>(sign | (r >> 13));
    }
    if (abs <= 0x33000000u) return sign;  // <= 2^-25: rounds to (signed) zero.
    // Subnormal: round(value / 2^-24) to nearest even.
    const std::uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - (abs >> 23);  // 14..24
    std::uint32_t q = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
}

// ---------------------------------------------------------------------------------------------
// DTypes
// ---------------------------------------------------------------------------------------------
constexpr bool IsIntegerDType(DType t) {
    switch (t) {
        case DType::kUInt8:
        case DType::kInt8:
        case DType::kUInt16:
        case DType::kInt16:
        case DType::kUInt32:
        case DType::kInt32:
        case DType::kUInt64:
        case DType::kInt64:
            return true;
        default:
            return false;
    }
}
constexpr bool IsNumericDType(DType t) { return t != DType::kBool && DTypeSize(t) != 0; }
constexpr bool IsFloat8(DType t) { return t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2; }
/// Whether W += v is implemented for the dtype (every numeric dtype but the float8s).
constexpr bool SupportsAdd(DType t) { return IsNumericDType(t) && !IsFloat8(t); }

template <std::size_t N>
struct UIntOfSizeT;
template <>
struct UIntOfSizeT<1> {
    using type = std::uint8_t;
};
template <>
struct UIntOfSizeT<2> {
    using type = std::uint16_t;
};
template <>
struct UIntOfSizeT<4> {
    using type = std::uint32_t;
};
template <>
struct UIntOfSizeT<8> {
    using type = std::uint64_t;
};
template <std::size_t N>
using UIntOfSize = typename UIntOfSizeT<N>::type;

/// Calls f(T{}) with T the C++ type of an integer dtype. Returns false for other dtypes.
template <typename F>
bool VisitIntegerDType(DType t, F&& f) {
    switch (t) {
        case DType::kUInt8:
            f(std::uint8_t{});
            return true;
        case DType::kInt8:
            f(std::int8_t{});
            return true;
        case DType::kUInt16:
            f(std::uint16_t{});
            return true;
        case DType::kInt16:
            f(std::int16_t{});
            return true;
        case DType::kUInt32:
            f(std::uint32_t{});
            return true;
        case DType::kInt32:
            f(std::int32_t{});
            return true;
        case DType::kUInt64:
            f(std::uint64_t{});
            return true;
        case DType::kInt64:
            f(std::int64_t{});
            return true;
        default:
            return false;
    }
}

/// Calls f(T{}) with T the C++ type of an unsigned index dtype. Returns false otherwise.
template <typename F>
bool VisitUnsignedIndexDType(DType t, F&& f) {
    switch (t) {
        case DType::kUInt16:
            f(std::uint16_t{});
            return true;
        case DType::kUInt32:
            f(std::uint32_t{});
            return true;
        case DType::kUInt64:
            f(std::uint64_t{});
            return true;
        default:
            return false;
    }
}

/// Calls f(std::integral_constant<size_t, N>{}) for an element size of 1, 2, 4 or 8 bytes.
template <typename F>
bool VisitElementSize(std::size_t bytes, F&& f) {
    switch (bytes) {
        case 1:
            f(std::integral_constant<std::size_t, 1>{});
            return true;
        case 2:
            f(std::integral_constant<std::size_t, 2>{});
            return true;
        case 4:
            f(std::integral_constant<std::size_t, 4>{});
            return true;
        case 8:
            f(std::integral_constant<std::size_t, 8>{});
            return true;
        default:
            return false;
    }
}

template <typename T>
inline T LoadAs(const std::byte* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}
template <typename T>
inline void StoreAs(std::byte* p, T v) {
    std::memcpy(p, &v, sizeof(T));
}

/// a * b * c ... with overflow detection (for byte sizes computed from user shapes).
inline bool CheckedProduct(std::span<const Index> factors, std::uint64_t scale,
                           std::uint64_t* out) {
    std::uint64_t p = scale;
    for (Index f : factors) {
        if (f < 0) return false;
        if (__builtin_mul_overflow(p, static_cast<std::uint64_t>(f), &p)) return false;
    }
    *out = p;
    return true;
}

inline std::string ShapeString(std::span<const Index> shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

}  // namespace mooncake::sparse::codec_internal
