// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// EncodeUpdate: dense (new, old) -> global COO, born sorted by (tile, element).
//
// The tensor is walked by "units": a unit is one tile row (the tiles sharing their coordinates
// in every dim but the last; for 1-D, one tile). Inside a unit the element rows are scanned
// whole, in row-major order, and the unit's entries are then put in (tile, element) order with
// a stable counting sort by tile column (see EncodeUnits). Units are independent, so threads
// take contiguous groups of units and write their own output chunk; chunks are concatenated in
// order.
//
// The segment scan compares raw bytes 64 at a time (SSE2 on x86-64: XOR/OR-reduce to skip equal
// blocks cheaply, then a byte-equality mask collapsed to one bit per element whose set bits are
// the changed elements). Bit comparison is exactly the overwrite rule (NaN-safe, -0.0 != +0.0)
// and a necessary condition for a scatter_add delta, whose value is then computed per
// candidate only.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "codec/codec.h"
#include "codec/codec_internal.h"

namespace mooncake::sparse {
namespace {

using namespace codec_internal;  // NOLINT(google-build-using-namespace): internal helpers only.

// ---------------------------------------------------------------------------------------------
// The scan: emit(i) for every element i in [0, n) whose kE bytes differ between a and b.
// ---------------------------------------------------------------------------------------------

/// One bit per element (at the element's first byte) from one bit per byte.
template <std::size_t kE>
inline std::uint64_t CollapseToElements(std::uint64_t m) {
    if constexpr (kE == 1) {
        return m;
    } else if constexpr (kE == 2) {
        return (m | (m >> 1)) & 0x5555555555555555ull;
    } else if constexpr (kE == 4) {
        m |= m >> 1;
        m |= m >> 2;
        return m & 0x1111111111111111ull;
    } else {
        m |= m >> 1;
        m |= m >> 2;
        m |= m >> 4;
        return m & 0x0101010101010101ull;
    }
}

template <std::size_t kE, typename Emit>
inline void ForEachDiff(const std::byte* a, const std::byte* b, std::size_t n, Emit&& emit) {
    const std::size_t bytes = n * kE;
    std::size_t off = 0;
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128();
    for (; off + 64 <= bytes; off += 64) {
        const auto* pa = reinterpret_cast<const __m128i*>(a + off);
        const auto* pb = reinterpret_cast<const __m128i*>(b + off);
        const __m128i a0 = _mm_loadu_si128(pa), a1 = _mm_loadu_si128(pa + 1);
        const __m128i a2 = _mm_loadu_si128(pa + 2), a3 = _mm_loadu_si128(pa + 3);
        const __m128i b0 = _mm_loadu_si128(pb), b1 = _mm_loadu_si128(pb + 1);
        const __m128i b2 = _mm_loadu_si128(pb + 2), b3 = _mm_loadu_si128(pb + 3);
        const __m128i x = _mm_or_si128(_mm_or_si128(_mm_xor_si128(a0, b0), _mm_xor_si128(a1, b1)),
                                       _mm_or_si128(_mm_xor_si128(a2, b2), _mm_xor_si128(a3, b3)));
        if (_mm_movemask_epi8(_mm_cmpeq_epi8(x, zero)) == 0xffff) continue;
        auto equal_bytes = [](__m128i p, __m128i q) {  // bit i: byte i equal
            return static_cast<std::uint64_t>(
                static_cast<std::uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(p, q))));
        };
        const std::uint64_t eq = equal_bytes(a0, b0) | equal_bytes(a1, b1) << 16 |
                                 equal_bytes(a2, b2) << 32 | equal_bytes(a3, b3) << 48;
        std::uint64_t diff = CollapseToElements<kE>(~eq);
        const std::size_t base = off / kE;
        while (diff) {
            emit(base + static_cast<std::size_t>(std::countr_zero(diff)) / kE);
            diff &= diff - 1;
        }
    }
#else
    // Portable: 8-byte words, OR-reduced over 64 bytes before looking at elements.
    for (; off + 64 <= bytes; off += 64) {
        std::uint64_t x = 0;
        for (int w = 0; w < 8; ++w) {
            x |= LoadAs<std::uint64_t>(a + off + w * 8) ^ LoadAs<std::uint64_t>(b + off + w * 8);
        }
        if (x == 0) continue;
        for (std::size_t i = off / kE; i < (off + 64) / kE; ++i) {
            if (std::memcmp(a + i * kE, b + i * kE, kE) != 0) emit(i);
        }
    }
#endif
    for (std::size_t i = off / kE; i < n; ++i) {
        if (std::memcmp(a + i * kE, b + i * kE, kE) != 0) emit(i);
    }
}

// ---------------------------------------------------------------------------------------------
// Per-candidate value rules. op(new_bits, old_bits, &out) -> keep?
// ---------------------------------------------------------------------------------------------
template <typename V>
struct OverwriteOp {
    bool operator()(V nv, V /*ov*/, V& out) const {
        out = nv;
        return true;
    }
};

/// Keeps d unless |d| <= threshold: a NaN delta (a weight that turned NaN, inf - inf) is kept,
/// since dropping it would hide the change.
inline bool PassesThreshold(double d, double threshold) { return !(std::fabs(d) <= threshold); }

template <bool kBf16>
struct AddHalfOp {
    double threshold;
    bool operator()(std::uint16_t nv, std::uint16_t ov, std::uint16_t& out) const {
        const float d = kBf16 ? Bf16ToF32(nv) - Bf16ToF32(ov) : F16ToF32(nv) - F16ToF32(ov);
        if (!PassesThreshold(d, threshold)) return false;
        out = kBf16 ? F32ToBf16(d) : F32ToF16(d);
        return (out & 0x7fff) != 0;  // a delta that rounds to zero in the dtype is dropped
    }
};

template <typename F, typename V>
struct AddFloatOp {
    double threshold;
    bool operator()(V nv, V ov, V& out) const {
        const F d = std::bit_cast<F>(nv) - std::bit_cast<F>(ov);
        if (!PassesThreshold(static_cast<double>(d), threshold)) return false;
        out = std::bit_cast<V>(d);
        return true;
    }
};

/// Integers: the stored delta wraps (so old + delta == new exactly under the wrapping apply);
/// the threshold compares the true magnitude |new - old|.
template <typename T>
struct AddIntOp {
    using V = std::make_unsigned_t<T>;
    double threshold;
    bool operator()(V nv, V ov, V& out) const {
        const T n = static_cast<T>(nv), o = static_cast<T>(ov);
        const std::uint64_t mag =
            n >= o ? static_cast<std::uint64_t>(n) - static_cast<std::uint64_t>(o)
                   : static_cast<std::uint64_t>(o) - static_cast<std::uint64_t>(n);
        if (!(static_cast<double>(mag) > threshold)) return false;
        out = static_cast<V>(nv - ov);
        return true;
    }
};

// ---------------------------------------------------------------------------------------------
// The walk.
// ---------------------------------------------------------------------------------------------
struct Walk {
    std::size_t rank = 0;
    std::array<std::uint64_t, kMaxRank> shape{};
    std::array<std::uint64_t, kMaxRank> ts{};
    std::array<std::uint64_t, kMaxRank> grid{};
    std::uint64_t units = 0;  // tile rows (rank >= 2) or tiles (rank 1)
    const std::byte* new_data = nullptr;
    const std::byte* old_data = nullptr;
};

template <typename IdxT, typename V>
struct Chunk {
    BlockBuffer<IdxT> idx;
    BlockBuffer<V> val;
};

/// Scans [col0, col0 + len) of element row `row_lin` (leading coordinates `lead`, rank - 1 of
/// them) and appends its entries to (idx_out, val_out), in column order. Long segments are cut
/// into pieces of kPiece elements so that the output reservation per piece stays small.
template <typename IdxT, std::size_t kE, typename Op, typename IdxBuf, typename ValBuf>
void ScanRow(const Walk& w, const Op& op, std::uint64_t row_lin, const IdxT* lead,
             std::uint64_t col0, std::uint64_t len, IdxBuf& idx_out, ValBuf& val_out) {
    using V = UIntOfSize<kE>;
    constexpr std::size_t kPiece = 4096;
    const std::size_t rank = w.rank;
    const std::size_t last = rank - 1;
    for (std::uint64_t p0 = 0; p0 < len; p0 += kPiece) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, len - p0));
        const std::uint64_t c0 = col0 + p0;
        const std::uint64_t elem0 = row_lin * w.shape[last] + c0;
        const std::byte* a = w.new_data + elem0 * kE;
        const std::byte* b = w.old_data + elem0 * kE;
        IdxT* oi = idx_out.Reserve(n * rank);
        V* ov = val_out.Reserve(n);
        std::size_t k = 0;
        ForEachDiff<kE>(a, b, n, [&](std::size_t i) {
            V v;
            if (!op(LoadAs<V>(a + i * kE), LoadAs<V>(b + i * kE), v)) return;
            IdxT* e = oi + k * rank;
            for (std::size_t d = 0; d < last; ++d) e[d] = lead[d];
            e[last] = static_cast<IdxT>(c0 + i);
            ov[k] = v;
            ++k;
        });
        idx_out.Commit(k * rank);
        val_out.Commit(k);
    }
}

/// Encodes units [unit_begin, unit_end) into `out`, in (tile, element) order.
///
/// Rank 1: a unit is one tile, a contiguous range: scanned straight into `out`.
/// Rank >= 2: a unit is one tile row. Its element rows are scanned whole and in row-major order
/// (long contiguous streams, which the hardware prefetchers like: twice the speed of a tile-by-
/// tile walk over 2 KiB segments) into a staging buffer, which is then reordered by tile column
/// with a stable counting sort: (row, col) order within each tile column is (tile, element)
/// order.
template <typename IdxT, std::size_t kE, typename Op>
void EncodeUnits(const Walk& w, std::uint64_t unit_begin, std::uint64_t unit_end, const Op& op,
                 Chunk<IdxT, UIntOfSize<kE>>& out) {
    using V = UIntOfSize<kE>;
    const std::size_t rank = w.rank;
    const std::size_t last = rank - 1;
    const std::uint64_t row_len = w.shape[last];

    if (rank == 1) {
        for (std::uint64_t u = unit_begin; u < unit_end; ++u) {
            const std::uint64_t c0 = u * w.ts[0];
            const std::uint64_t c1 = std::min(w.shape[0], c0 + w.ts[0]);
            ScanRow<IdxT, kE>(w, op, 0, nullptr, c0, c1 - c0, out.idx, out.val);
        }
        return;
    }

    const std::uint64_t columns = w.grid[last];
    const std::uint64_t col_tile = w.ts[last];
    const int col_shift = std::has_single_bit(col_tile) ? std::countr_zero(col_tile) : -1;
    auto bucket_of = [&](IdxT col) -> std::size_t {
        return static_cast<std::size_t>(col_shift >= 0
                                            ? static_cast<std::uint64_t>(col) >> col_shift
                                            : static_cast<std::uint64_t>(col) / col_tile);
    };
    std::vector<std::uint64_t> row_lin;  // element rows of the unit, row-major
    std::vector<IdxT> row_coords;        // [rows, rank - 1]
    PodBuffer<IdxT> stage_idx;
    PodBuffer<V> stage_val;
    std::vector<std::uint64_t> offsets;
    for (std::uint64_t u = unit_begin; u < unit_end; ++u) {
        // Tile coordinates of the unit over dims [0, last), and its element-row box.
        std::array<std::uint64_t, kMaxRank> lo{}, hi{}, cur{};
        std::uint64_t rest = u;
        for (std::size_t d = last; d-- > 0;) {
            const std::uint64_t t = rest % w.grid[d];
            rest /= w.grid[d];
            lo[d] = t * w.ts[d];
            hi[d] = std::min(w.shape[d], lo[d] + w.ts[d]);
        }
        row_lin.clear();
        row_coords.clear();
        cur = lo;
        while (true) {
            std::uint64_t lin = 0;
            for (std::size_t d = 0; d < last; ++d) {
                lin = lin * w.shape[d] + cur[d];
                row_coords.push_back(static_cast<IdxT>(cur[d]));
            }
            row_lin.push_back(lin);
            std::size_t d = last;
            while (d-- > 0) {
                if (++cur[d] < hi[d]) break;
                cur[d] = lo[d];
            }
            if (d == static_cast<std::size_t>(-1)) break;
        }

        if (columns == 1) {  // one tile per tile row: row-major order is already the order
            for (std::size_t r = 0; r < row_lin.size(); ++r) {
                ScanRow<IdxT, kE>(w, op, row_lin[r], row_coords.data() + r * last, 0, row_len,
                                  out.idx, out.val);
            }
            continue;
        }
        stage_idx.Clear();
        stage_val.Clear();
        for (std::size_t r = 0; r < row_lin.size(); ++r) {
            ScanRow<IdxT, kE>(w, op, row_lin[r], row_coords.data() + r * last, 0, row_len,
                              stage_idx, stage_val);
        }
        const std::size_t m = stage_val.size();
        if (m == 0) continue;
        const IdxT* si = stage_idx.data();
        const V* sv = stage_val.data();
        offsets.assign(columns, 0);
        for (std::size_t k = 0; k < m; ++k) ++offsets[bucket_of(si[k * rank + last])];
        std::uint64_t sum = 0;
        for (std::uint64_t& o : offsets) {
            const std::uint64_t c = o;
            o = sum;
            sum += c;
        }
        IdxT* oi = out.idx.Reserve(m * rank);
        V* ov = out.val.Reserve(m);
        for (std::size_t k = 0; k < m; ++k) {
            const IdxT* e = si + k * rank;
            const std::uint64_t p = offsets[bucket_of(e[last])]++;
            std::memcpy(oi + p * rank, e, rank * sizeof(IdxT));
            ov[p] = sv[k];
        }
        out.idx.Commit(m * rank);
        out.val.Commit(m);
    }
}

template <typename IdxT, std::size_t kE, typename Op>
void EncodeAll(const Walk& w, int threads, const Op& op, EncodedUpdate& result) {
    using V = UIntOfSize<kE>;
    const std::uint64_t n_chunks =
        threads <= 1 ? 1
                     : std::min<std::uint64_t>(w.units, static_cast<std::uint64_t>(threads) * 8);
    const Split split{w.units, n_chunks};
    std::vector<Chunk<IdxT, V>> chunks(n_chunks);
    ParallelFor(threads, n_chunks, [&](std::size_t c) {
        EncodeUnits<IdxT, kE>(w, split.Begin(c), split.Begin(c + 1), op, chunks[c]);
    });
    std::uint64_t nnz = 0;
    for (const auto& c : chunks) nnz += c.val.size();
    result.nnz = nnz;
    // reserve + insert: one copy, no zero-fill.
    result.indices.reserve(nnz * w.rank * sizeof(IdxT));
    result.values.reserve(nnz * kE);
    for (const auto& c : chunks) {
        c.idx.AppendTo(result.indices);
        c.val.AppendTo(result.values);
    }
}

template <typename IdxT>
void Dispatch(const Walk& w, int threads, DType dtype, ApplyMode apply, double threshold,
              EncodedUpdate& result) {
    if (apply == ApplyMode::kOverwrite) {
        VisitElementSize(DTypeSize(dtype), [&](auto size_tag) {
            constexpr std::size_t kE = decltype(size_tag)::value;
            EncodeAll<IdxT, kE>(w, threads, OverwriteOp<UIntOfSize<kE>>{}, result);
        });
        return;
    }
    switch (dtype) {
        case DType::kBFloat16:
            EncodeAll<IdxT, 2>(w, threads, AddHalfOp<true>{threshold}, result);
            break;
        case DType::kFloat16:
            EncodeAll<IdxT, 2>(w, threads, AddHalfOp<false>{threshold}, result);
            break;
        case DType::kFloat32:
            EncodeAll<IdxT, 4>(w, threads, AddFloatOp<float, std::uint32_t>{threshold}, result);
            break;
        case DType::kFloat64:
            EncodeAll<IdxT, 8>(w, threads, AddFloatOp<double, std::uint64_t>{threshold}, result);
            break;
        default:
            VisitIntegerDType(dtype, [&](auto tag) {
                using T = decltype(tag);
                EncodeAll<IdxT, sizeof(T)>(w, threads, AddIntOp<T>{threshold}, result);
            });
            break;
    }
}

Status CheckDense(const char* what, const HostArray& a) {
    std::uint64_t expected = 0;
    if (!CheckedProduct(a.shape, DTypeSize(a.dtype), &expected) || expected != a.data.size()) {
        return InvalidArgument(std::string(what) + " holds " + std::to_string(a.data.size()) +
                               " bytes, but its shape " + ShapeString(a.shape) + " of " +
                               std::string(DTypeName(a.dtype)) + " needs " +
                               (expected ? std::to_string(expected) : std::string("more")));
    }
    return Status::Ok();
}

}  // namespace

Result<EncodedUpdate> EncodeUpdate(const HostArray& new_values, const HostArray& old_values,
                                   const EncodeUpdateOptions& options) {
    if (new_values.dtype != old_values.dtype) {
        return InvalidArgument("new dtype " + std::string(DTypeName(new_values.dtype)) +
                               " != old dtype " + std::string(DTypeName(old_values.dtype)));
    }
    const DType dtype = new_values.dtype;
    if (!IsNumericDType(dtype)) {
        return InvalidArgument("dtype " + std::string(DTypeName(dtype)) + " is not numeric");
    }
    if (new_values.shape != old_values.shape) {
        return InvalidArgument("new shape " + ShapeString(new_values.shape) + " != old shape " +
                               ShapeString(old_values.shape));
    }
    if (Status s = ValidateShape(new_values.shape); !s.ok()) return s.WithContext("new/old");
    MCS_RETURN_IF_ERROR(CheckDense("new", new_values));
    MCS_RETURN_IF_ERROR(CheckDense("old", old_values));
    if (!(options.threshold >= 0.0)) {
        return InvalidArgument("threshold " + std::to_string(options.threshold) +
                               " must be a non-negative number");
    }
    if (options.apply == ApplyMode::kOverwrite && options.threshold != 0.0) {
        return InvalidArgument(
            "a threshold applies to scatter_add only; overwrite keeps every "
            "changed value (got threshold " +
            std::to_string(options.threshold) + ")");
    }
    if (options.apply == ApplyMode::kScatterAdd && !SupportsAdd(dtype)) {
        return InvalidArgument("scatter_add is not supported for " + std::string(DTypeName(dtype)) +
                               "; use overwrite");
    }
    if (options.num_threads < 0) {
        return InvalidArgument("num_threads " + std::to_string(options.num_threads) +
                               " is negative (0 means all hardware threads)");
    }
    const Shape& shape = new_values.shape;
    Shape tile_shape =
        options.tile_shape ? ClampTileShape(*options.tile_shape, shape) : DefaultTileShape(shape);
    MCS_RETURN_IF_ERROR(ValidateTileShape(tile_shape, shape));

    EncodedUpdate result;
    result.rank = shape.size();
    result.value_dtype = dtype;
    result.index_dtype = NarrowestIndexDType(*std::max_element(shape.begin(), shape.end()));
    result.tile_shape = tile_shape;

    Walk w;
    w.rank = shape.size();
    w.units = 1;
    for (std::size_t d = 0; d < w.rank; ++d) {
        w.shape[d] = static_cast<std::uint64_t>(shape[d]);
        w.ts[d] = static_cast<std::uint64_t>(tile_shape[d]);
        w.grid[d] = w.shape[d] / w.ts[d] + (w.shape[d] % w.ts[d] != 0);
        if (w.rank == 1 || d + 1 < w.rank) w.units *= w.grid[d];
    }
    w.new_data = new_values.data.data();
    w.old_data = old_values.data.data();
    // Below ~1 MiB of input a second thread costs more than it saves.
    const int threads =
        new_values.data.size() < (std::size_t{1} << 20) ? 1 : ResolveThreads(options.num_threads);

    VisitUnsignedIndexDType(result.index_dtype, [&](auto tag) {
        Dispatch<decltype(tag)>(w, threads, dtype, options.apply, options.threshold, result);
    });
    return result;
}

std::vector<Result<EncodedUpdate>> EncodeUpdates(std::span<const EncodePair> pairs,
                                                 const EncodeUpdateOptions& options) {
    std::vector<Result<EncodedUpdate>> out(pairs.size(), Internal("unset"));
    if (options.num_threads < 0) {
        for (auto& r : out) {
            r = InvalidArgument("num_threads " + std::to_string(options.num_threads) +
                                " is negative (0 means all hardware threads)");
        }
        return out;
    }
    // Past this many elements a tensor's tile rows keep every thread busy on their own.
    constexpr std::uint64_t kLargeElements = std::uint64_t{1} << 20;
    std::vector<std::size_t> small, large;
    for (std::size_t i = 0; i < pairs.size(); ++i) {
        std::uint64_t n = 1;
        for (Index e : pairs[i].new_values.shape) n *= e > 0 ? std::uint64_t(e) : 0;
        (n >= kLargeElements ? large : small).push_back(i);
    }
    EncodeUpdateOptions one = options;
    one.num_threads = 1;
    ParallelFor(options.num_threads, small.size(), [&](std::size_t k) {
        const EncodePair& p = pairs[small[k]];
        out[small[k]] = EncodeUpdate(p.new_values, p.old_values, one);
    }, 0);
    for (std::size_t i : large) out[i] = EncodeUpdate(pairs[i].new_values, pairs[i].old_values, options);
    return out;
}

}  // namespace mooncake::sparse
