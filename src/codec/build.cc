// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// BuildSparseObject: validation of a global COO, the sort by (tile, element), duplicates,
// index narrowing, the tile index and the member checksums (docs/design.md §2).
//
// Every entry gets a 64-bit key `tile_linear * tile_volume + element_in_tile_linear` (both
// row-major; the in-tile offset uses the unclipped tile extents, which preserves element order
// inside a tile). Sorting keys is sorting by (tile, element). When the key does not fit 64 bits
// (padded grid volume * tile volume >= 2^64: absurd shapes only) a pair of keys
// (tile_linear, element_linear) is sorted with std::stable_sort instead.
//
// Keys are computed and checked in one parallel pass that also validates every coordinate and
// notes whether the input already is sorted; then, only if needed, an LSD radix sort (stable,
// so duplicates keep their input order and sums are deterministic) of `key << b | entry` packed
// into one 64-bit word (or (key, entry) pairs when that does not fit).

// GCC 12 reports a false -Wrestrict inside std::string operator+ inlined from contracts.h
// (Generation::ToString, via SourceDescriptor::Make); GCC bug 105329. The
// diagnostic is located in <string>, so this must come before any include.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "codec/codec.h"
#include "codec/codec_internal.h"

namespace mooncake::sparse {
namespace {

using namespace codec_internal;  // NOLINT(google-build-using-namespace): internal helpers only.

constexpr std::uint64_t kNone = std::numeric_limits<std::uint64_t>::max();
/// Below this many entries a pass runs on one thread (thread start-up would dominate).
constexpr std::uint64_t kMinParallelEntries = 1 << 16;

struct KeyPlan {
    std::size_t rank = 0;
    std::array<std::uint64_t, kMaxRank> lo{};      // source box begin
    std::array<std::uint64_t, kMaxRank> ext{};     // source box extent
    std::array<std::uint64_t, kMaxRank> ts{};      // tile extent
    std::array<Divider, kMaxRank> div{};           // by ts
    std::array<std::uint64_t, kMaxRank> grid{};    // tiles per dim over the global shape
    std::array<std::uint64_t, kMaxRank> gshape{};  // global extents
    bool single_key = true;
    std::uint64_t tile_volume = 1;  // prod(ts)
    Divider volume_div;             // by tile_volume
    std::uint64_t key_limit = 0;    // every single key is < key_limit
    bool exact_dims = false;        // div[d] is exact for every coordinate inside the shape
    bool exact_volume = false;      // volume_div is exact for every key

    /// The tile coordinate of in-shape coordinate u in dim d (garbage for an out-of-shape u,
    /// which ComputeKeys rejects anyway).
    std::uint64_t TileCoordOf(std::size_t d, std::uint64_t u) const {
        return exact_dims ? div[d].Div(u) : u / ts[d];
    }
    std::uint64_t TileOf(std::uint64_t key) const {
        return exact_volume ? volume_div.Div(key) : key / tile_volume;
    }
};

struct ChunkResult {
    std::uint64_t first_bad = kNone;  // first entry with a coordinate outside the box
    bool strict = true;               // keys strictly increasing inside the chunk
    bool nondecreasing = true;
    std::uint64_t first_key = 0, last_key = 0;    // single key, or tile key in pair mode
    std::uint64_t first_elem = 0, last_elem = 0;  // pair mode only
};

/// Computes the keys of entries [begin, end) and validates their coordinates; stops at the
/// first bad entry of the chunk.
template <typename InT, bool kSingle>
ChunkResult ComputeKeys(const std::byte* in, const KeyPlan& p, std::uint64_t begin,
                        std::uint64_t end, std::uint64_t* keys, std::uint64_t* elems) {
    ChunkResult r;
    const std::size_t rank = p.rank;
    std::uint64_t prev_k = 0, prev_e = 0;
    for (std::uint64_t i = begin; i < end; ++i) {
        const std::byte* e = in + i * rank * sizeof(InT);
        std::uint64_t tile = 0, local = 0, elem = 0;
        bool bad = false;
        for (std::size_t d = 0; d < rank; ++d) {
            // A negative signed value becomes >= 2^63 here and fails the box test too.
            const auto u = static_cast<std::uint64_t>(LoadAs<InT>(e + d * sizeof(InT)));
            bad |= (u - p.lo[d]) >= p.ext[d];
            const std::uint64_t t = p.TileCoordOf(d, u);
            if constexpr (kSingle) {
                const std::uint64_t l = u - t * p.ts[d];
                tile = tile * p.grid[d] + t;
                local = local * p.ts[d] + l;
            } else {
                tile = tile * p.grid[d] + t;
                elem = elem * p.gshape[d] + u;
            }
        }
        if (bad) {
            r.first_bad = i;
            return r;
        }
        if constexpr (kSingle) {
            const std::uint64_t key = tile * p.tile_volume + local;
            if (i > begin) {
                r.strict &= key > prev_k;
                r.nondecreasing &= key >= prev_k;
            } else {
                r.first_key = key;
            }
            keys[i] = key;
            prev_k = key;
        } else {
            if (i > begin) {
                const bool gt = tile > prev_k || (tile == prev_k && elem > prev_e);
                const bool eq = tile == prev_k && elem == prev_e;
                r.strict &= gt;
                r.nondecreasing &= gt || eq;
            } else {
                r.first_key = tile;
                r.first_elem = elem;
            }
            keys[i] = tile;
            elems[i] = elem;
            prev_k = tile;
            prev_e = elem;
        }
    }
    r.last_key = prev_k;
    r.last_elem = prev_e;
    return r;
}

/// The message for an entry that ComputeKeys flagged.
template <typename InT>
std::string BadEntryMessage(const std::byte* in, std::size_t rank, std::uint64_t i,
                            const Box& box) {
    for (std::size_t d = 0; d < rank; ++d) {
        const InT v = LoadAs<InT>(in + (i * rank + d) * sizeof(InT));
        if constexpr (std::is_signed_v<InT>) {
            if (v < 0) {
                return "entry " + std::to_string(i) + " coordinate " + std::to_string(v) +
                       " in dim " + std::to_string(d) + " is negative";
            }
        }
        const auto u = static_cast<std::uint64_t>(v);
        if (u < static_cast<std::uint64_t>(box.begin(d)) ||
            u >= static_cast<std::uint64_t>(box.end(d))) {
            return "entry " + std::to_string(i) + " coordinate " + std::to_string(u) + " in dim " +
                   std::to_string(d) + " is outside the source box " + box.ToString();
        }
    }
    return "entry " + std::to_string(i) + " is outside the source box " + box.ToString();
}

template <typename InT>
std::string CoordString(const std::byte* in, std::size_t rank, std::uint64_t i) {
    std::string s = "(";
    for (std::size_t d = 0; d < rank; ++d) {
        if (d) s += ", ";
        s += std::to_string(LoadAs<InT>(in + (i * rank + d) * sizeof(InT)));
    }
    return s + ")";
}

// ---------------------------------------------------------------------------------------------
// LSD radix sort, stable, optionally multi-threaded (per-thread histograms, then each thread
// scatters its own contiguous chunk, which keeps the sort stable).
// ---------------------------------------------------------------------------------------------
template <typename T, typename KeyFn>
void RadixSort(std::vector<T>& a, int key_bits, int threads, KeyFn key_of) {
    const std::size_t n = a.size();
    if (n < 2 || key_bits <= 0) return;
    const int passes = (key_bits + 10) / 11;
    const int bits = (key_bits + passes - 1) / passes;
    const std::size_t buckets = std::size_t{1} << bits;
    const std::uint64_t digit_mask = buckets - 1;
    const int parts = n >= kMinParallelEntries ? std::max(threads, 1) : 1;
    const Split split{n, static_cast<std::uint64_t>(parts)};

    std::vector<T> tmp(n);
    std::vector<std::uint64_t> hist(static_cast<std::size_t>(parts) * buckets);
    T* src = a.data();
    T* dst = tmp.data();
    for (int pass = 0; pass < passes; ++pass) {
        const int shift = pass * bits;
        std::fill(hist.begin(), hist.end(), 0);
        ParallelFor(parts, static_cast<std::size_t>(parts), [&](std::size_t t) {
            std::uint64_t* h = hist.data() + t * buckets;
            for (std::uint64_t i = split.Begin(t), end = split.Begin(t + 1); i < end; ++i) {
                ++h[(key_of(src[i]) >> shift) & digit_mask];
            }
        });
        // Exclusive prefix over (bucket, part): offsets in place. Skip a pass whose digit is the
        // same for every element (nothing would move).
        bool trivial = false;
        std::uint64_t sum = 0;
        for (std::size_t b = 0; b < buckets; ++b) {
            std::uint64_t bucket_total = 0;
            for (int t = 0; t < parts; ++t) {
                std::uint64_t& h = hist[static_cast<std::size_t>(t) * buckets + b];
                const std::uint64_t c = h;
                h = sum;
                sum += c;
                bucket_total += c;
            }
            if (bucket_total == n) trivial = true;
        }
        if (trivial) continue;
        ParallelFor(parts, static_cast<std::size_t>(parts), [&](std::size_t t) {
            std::uint64_t* h = hist.data() + t * buckets;
            for (std::uint64_t i = split.Begin(t), end = split.Begin(t + 1); i < end; ++i) {
                const T v = src[i];
                dst[h[(key_of(v) >> shift) & digit_mask]++] = v;
            }
        });
        std::swap(src, dst);
    }
    if (src != a.data()) std::memcpy(a.data(), src, n * sizeof(T));
}

struct KeyIndex {
    std::uint64_t key;
    std::uint64_t index;
};

// ---------------------------------------------------------------------------------------------
// Value sums for duplicates="sum".
// ---------------------------------------------------------------------------------------------
/// Sums the values of the sorted entries [first, last) (entry order) into `out`.
using SumFn = void (*)(const std::byte* values, const std::uint64_t* perm, std::uint64_t first,
                       std::uint64_t last, std::byte* out);

template <typename T, typename Acc, typename ToAcc, typename FromAcc>
void SumGroup(const std::byte* values, const std::uint64_t* perm, std::uint64_t first,
              std::uint64_t last, std::byte* out, ToAcc to_acc, FromAcc from_acc) {
    Acc acc = to_acc(LoadAs<T>(values + perm[first] * sizeof(T)));
    for (std::uint64_t j = first + 1; j < last; ++j) {
        acc = acc + to_acc(LoadAs<T>(values + perm[j] * sizeof(T)));
    }
    StoreAs<T>(out, from_acc(acc));
}

SumFn SumFnFor(DType t) {
    switch (t) {
        case DType::kBFloat16:
            return [](const std::byte* v, const std::uint64_t* p, std::uint64_t f, std::uint64_t l,
                      std::byte* o) {
                SumGroup<std::uint16_t, float>(v, p, f, l, o, Bf16ToF32, F32ToBf16);
            };
        case DType::kFloat16:
            return [](const std::byte* v, const std::uint64_t* p, std::uint64_t f, std::uint64_t l,
                      std::byte* o) {
                SumGroup<std::uint16_t, float>(v, p, f, l, o, F16ToF32, F32ToF16);
            };
        case DType::kFloat32:
            return [](const std::byte* v, const std::uint64_t* p, std::uint64_t f, std::uint64_t l,
                      std::byte* o) {
                SumGroup<float, double>(
                    v, p, f, l, o, [](float x) { return static_cast<double>(x); },
                    [](double x) { return static_cast<float>(x); });
            };
        case DType::kFloat64:
            return [](const std::byte* v, const std::uint64_t* p, std::uint64_t f, std::uint64_t l,
                      std::byte* o) {
                SumGroup<double, double>(
                    v, p, f, l, o, [](double x) { return x; }, [](double x) { return x; });
            };
        default:
            break;
    }
    // Integers: two's complement wrap-around, like the apply kernel.
    switch (DTypeSize(t)) {
        case 1:
            return [](const std::byte* v, const std::uint64_t* p, std::uint64_t f, std::uint64_t l,
                      std::byte* o) {
                SumGroup<std::uint8_t, std::uint32_t>(
                    v, p, f, l, o, [](std::uint8_t x) { return std::uint32_t{x}; },
                    [](std::uint32_t x) { return static_cast<std::uint8_t>(x); });
            };
        case 2:
            return [](const std::byte* v, const std::uint64_t* p, std::uint64_t f, std::uint64_t l,
                      std::byte* o) {
                SumGroup<std::uint16_t, std::uint32_t>(
                    v, p, f, l, o, [](std::uint16_t x) { return std::uint32_t{x}; },
                    [](std::uint32_t x) { return static_cast<std::uint16_t>(x); });
            };
        case 4:
            return [](const std::byte* v, const std::uint64_t* p, std::uint64_t f, std::uint64_t l,
                      std::byte* o) {
                SumGroup<std::uint32_t, std::uint32_t>(
                    v, p, f, l, o, [](std::uint32_t x) { return x; },
                    [](std::uint32_t x) { return x; });
            };
        default:
            return [](const std::byte* v, const std::uint64_t* p, std::uint64_t f, std::uint64_t l,
                      std::byte* o) {
                SumGroup<std::uint64_t, std::uint64_t>(
                    v, p, f, l, o, [](std::uint64_t x) { return x; },
                    [](std::uint64_t x) { return x; });
            };
    }
}

// ---------------------------------------------------------------------------------------------
// The typed body: InT is the input index type, OutT the narrowed output index type.
// ---------------------------------------------------------------------------------------------
struct BuildInput {
    const std::byte* indices = nullptr;
    const std::byte* values = nullptr;
    std::uint64_t nnz = 0;
    std::size_t value_bytes = 0;
    DType value_dtype = DType::kBFloat16;
    DuplicatePolicy duplicates = DuplicatePolicy::kError;
    int threads = 1;
    Box box;
};

template <typename InT, typename OutT>
Status BuildTyped(const BuildInput& in, const KeyPlan& plan, SparseObject& obj) {
    const std::size_t rank = plan.rank;
    const std::uint64_t nnz = in.nnz;
    const int parts = nnz >= kMinParallelEntries ? in.threads : 1;
    const Split split{nnz, static_cast<std::uint64_t>(parts)};

    // 1. Keys + validation + sortedness, one pass.
    std::vector<std::uint64_t> keys(nnz);
    std::vector<std::uint64_t> elems(plan.single_key ? 0 : nnz);
    std::vector<ChunkResult> chunks(static_cast<std::size_t>(parts));
    ParallelFor(parts, static_cast<std::size_t>(parts), [&](std::size_t t) {
        chunks[t] = plan.single_key
                        ? ComputeKeys<InT, true>(in.indices, plan, split.Begin(t),
                                                 split.Begin(t + 1), keys.data(), nullptr)
                        : ComputeKeys<InT, false>(in.indices, plan, split.Begin(t),
                                                  split.Begin(t + 1), keys.data(), elems.data());
    });
    bool strict = true, nondecreasing = true;
    for (std::size_t t = 0; t < chunks.size(); ++t) {
        const ChunkResult& c = chunks[t];
        if (c.first_bad != kNone) {
            return InvalidArgument(BadEntryMessage<InT>(in.indices, rank, c.first_bad, in.box));
        }
        strict &= c.strict;
        nondecreasing &= c.nondecreasing;
        if (t > 0 && split.Begin(t) < split.Begin(t + 1)) {
            // Compare with the last non-empty chunk before this one.
            std::size_t p = t;
            bool found = false;
            while (p > 0 && !found) {
                --p;
                found = split.Begin(p) < split.Begin(p + 1);
            }
            if (found) {
                const ChunkResult& prev = chunks[p];
                const bool gt = c.first_key > prev.last_key ||
                                (c.first_key == prev.last_key && c.first_elem > prev.last_elem);
                const bool eq = c.first_key == prev.last_key && c.first_elem == prev.last_elem;
                strict &= gt;
                nondecreasing &= gt || eq;
            }
        }
    }

    // 2. Sort unless the input already is sorted: `perm[j]` is the input entry of sorted
    // position j, and keys/elems are rewritten in sorted order.
    std::vector<std::uint64_t> perm;
    if (!nondecreasing) {  // (strict implies nondecreasing)
        perm.resize(nnz);
        if (plan.single_key) {
            const int key_bits = static_cast<int>(std::bit_width(plan.key_limit - 1));
            const int idx_bits = std::max(1, static_cast<int>(std::bit_width(nnz - 1)));
            if (key_bits + idx_bits <= 64) {
                std::vector<std::uint64_t> packed(nnz);
                ParallelFor(parts, static_cast<std::size_t>(parts), [&](std::size_t t) {
                    for (std::uint64_t i = split.Begin(t), end = split.Begin(t + 1); i < end; ++i) {
                        packed[i] = (keys[i] << idx_bits) | i;
                    }
                });
                RadixSort(packed, key_bits, parts,
                          [idx_bits](std::uint64_t v) { return v >> idx_bits; });
                const std::uint64_t idx_mask = (std::uint64_t{1} << idx_bits) - 1;
                ParallelFor(parts, static_cast<std::size_t>(parts), [&](std::size_t t) {
                    for (std::uint64_t i = split.Begin(t), end = split.Begin(t + 1); i < end; ++i) {
                        keys[i] = packed[i] >> idx_bits;
                        perm[i] = packed[i] & idx_mask;
                    }
                });
            } else {
                std::vector<KeyIndex> pairs(nnz);
                for (std::uint64_t i = 0; i < nnz; ++i) pairs[i] = {keys[i], i};
                RadixSort(pairs, key_bits, parts, [](const KeyIndex& v) { return v.key; });
                for (std::uint64_t i = 0; i < nnz; ++i) {
                    keys[i] = pairs[i].key;
                    perm[i] = pairs[i].index;
                }
            }
        } else {
            std::iota(perm.begin(), perm.end(), std::uint64_t{0});
            std::stable_sort(perm.begin(), perm.end(), [&](std::uint64_t a, std::uint64_t b) {
                return keys[a] != keys[b] ? keys[a] < keys[b] : elems[a] < elems[b];
            });
            std::vector<std::uint64_t> k2(nnz), e2(nnz);
            for (std::uint64_t i = 0; i < nnz; ++i) {
                k2[i] = keys[perm[i]];
                e2[i] = elems[perm[i]];
            }
            keys.swap(k2);
            elems.swap(e2);
        }
    }
    auto source_of = [&](std::uint64_t j) { return perm.empty() ? j : perm[j]; };
    auto same_coord = [&](std::uint64_t j) {  // sorted position j repeats j - 1
        return keys[j] == keys[j - 1] && (plan.single_key || elems[j] == elems[j - 1]);
    };

    // 3. Duplicates.
    std::vector<std::uint64_t> group_start;  // only when duplicates are summed
    if (!strict) {
        for (std::uint64_t j = 1; j < nnz; ++j) {
            if (!same_coord(j)) continue;
            if (in.duplicates == DuplicatePolicy::kError) {
                const std::uint64_t a = std::min(source_of(j - 1), source_of(j));
                const std::uint64_t b = std::max(source_of(j - 1), source_of(j));
                return InvalidArgument("duplicate coordinate " +
                                       CoordString<InT>(in.indices, rank, a) + " at entries " +
                                       std::to_string(a) + " and " + std::to_string(b) +
                                       " (pass duplicates=sum with scatter_add to coalesce)");
            }
            break;
        }
        if (in.duplicates != DuplicatePolicy::kError) {
            group_start.reserve(nnz + 1);
            for (std::uint64_t j = 0; j < nnz; ++j) {
                if (j == 0 || !same_coord(j)) group_start.push_back(j);
            }
            if (group_start.size() == nnz) group_start.clear();  // no duplicates after all
        }
    }
    const bool summing = !group_start.empty();
    const std::uint64_t out_n = summing ? group_start.size() : nnz;
    if (summing) group_start.push_back(nnz);

    // 4. Gather narrowed indices and values in sorted order.
    const std::size_t vb = in.value_bytes;
    obj.indices.resize(out_n * rank * sizeof(OutT));
    obj.values.resize(out_n * vb);
    std::byte* out_idx = obj.indices.data();
    std::byte* out_val = obj.values.data();
    auto write_index = [&](std::uint64_t out_pos, std::uint64_t src) {
        const std::byte* s = in.indices + src * rank * sizeof(InT);
        std::byte* o = out_idx + out_pos * rank * sizeof(OutT);
        for (std::size_t d = 0; d < rank; ++d) {
            StoreAs<OutT>(o + d * sizeof(OutT),
                          static_cast<OutT>(LoadAs<InT>(s + d * sizeof(InT))));
        }
    };
    if (summing) {
        std::vector<std::uint64_t> identity;
        if (perm.empty()) {
            identity.resize(nnz);
            std::iota(identity.begin(), identity.end(), std::uint64_t{0});
        }
        const std::uint64_t* p = perm.empty() ? identity.data() : perm.data();
        const SumFn sum =
            in.duplicates == DuplicatePolicy::kSum ? SumFnFor(in.value_dtype) : SumFn{};
        std::vector<std::uint64_t> out_keys(out_n), out_elems(plan.single_key ? 0 : out_n);
        for (std::uint64_t g = 0; g < out_n; ++g) {
            const std::uint64_t first = group_start[g], last = group_start[g + 1];
            write_index(g, p[first]);
            if (in.duplicates == DuplicatePolicy::kLast) {
                // The sort is stable: the group's last entry is the last in input order.
                std::memcpy(out_val + g * vb, in.values + p[last - 1] * vb, vb);
            } else {
                sum(in.values, p, first, last, out_val + g * vb);
            }
            out_keys[g] = keys[first];
            if (!plan.single_key) out_elems[g] = elems[first];
        }
        keys.swap(out_keys);
        elems.swap(out_elems);
    } else if (perm.empty() && std::is_same_v<InT, OutT>) {
        std::memcpy(out_idx, in.indices, nnz * rank * sizeof(OutT));
        std::memcpy(out_val, in.values, nnz * vb);
    } else {
        const int gparts = out_n >= kMinParallelEntries ? in.threads : 1;
        const Split gsplit{out_n, static_cast<std::uint64_t>(gparts)};
        VisitElementSize(vb, [&](auto size_tag) {
            constexpr std::size_t kVB = decltype(size_tag)::value;
            using V = UIntOfSize<kVB>;
            // A sorted key decodes to its coordinates with shifts or multiplies (Divider),
            // which beats a random-access gather from the input indices.
            const bool decode = plan.single_key && plan.exact_dims && plan.exact_volume;
            ParallelFor(gparts, static_cast<std::size_t>(gparts), [&](std::size_t t) {
                const std::uint64_t begin = gsplit.Begin(t), end = gsplit.Begin(t + 1);
                if (decode) {
                    std::uint64_t cur_tile = kNone;
                    std::array<std::uint64_t, kMaxRank> base{};
                    for (std::uint64_t j = begin; j < end; ++j) {
                        const std::uint64_t key = keys[j];
                        const std::uint64_t tile = plan.TileOf(key);
                        if (tile != cur_tile) {
                            cur_tile = tile;
                            std::uint64_t rest = tile;
                            for (std::size_t d = rank; d-- > 0;) {
                                base[d] = (rest % plan.grid[d]) * plan.ts[d];
                                rest /= plan.grid[d];
                            }
                        }
                        // local < tile_volume: exact for div[d] whenever exact_volume is.
                        std::uint64_t local = key - tile * plan.tile_volume;
                        std::byte* o = out_idx + j * rank * sizeof(OutT);
                        for (std::size_t d = rank; d-- > 0;) {
                            const std::uint64_t q = plan.div[d].Div(local);
                            StoreAs<OutT>(o + d * sizeof(OutT),
                                          static_cast<OutT>(base[d] + (local - q * plan.ts[d])));
                            local = q;
                        }
                        StoreAs<V>(out_val + j * kVB, LoadAs<V>(in.values + source_of(j) * kVB));
                    }
                } else {
                    for (std::uint64_t j = begin; j < end; ++j) {
                        const std::uint64_t src = source_of(j);
                        write_index(j, src);
                        StoreAs<V>(out_val + j * kVB, LoadAs<V>(in.values + src * kVB));
                    }
                }
            });
        });
    }

    // 5. Tile index over the output entries.
    obj.tile_coords.clear();
    obj.tile_ptr.clear();
    obj.tile_ptr.push_back(0);
    auto tile_of = [&](std::uint64_t j) {
        return plan.single_key ? plan.TileOf(keys[j]) : keys[j];
    };
    std::uint64_t cur_tile = 0;
    for (std::uint64_t j = 0; j < out_n; ++j) {
        const std::uint64_t t = tile_of(j);
        if (j > 0 && t == cur_tile) continue;
        if (j > 0) obj.tile_ptr.push_back(j);
        cur_tile = t;
        std::array<TileCoord, kMaxRank> tc{};
        std::uint64_t rest = t;
        for (std::size_t d = rank; d-- > 0;) {
            tc[d] = static_cast<TileCoord>(rest % plan.grid[d]);
            rest /= plan.grid[d];
        }
        obj.tile_coords.insert(obj.tile_coords.end(), tc.begin(), tc.begin() + rank);
    }
    if (out_n > 0) obj.tile_ptr.push_back(out_n);
    obj.desc.nnz = out_n;
    obj.desc.num_tiles = obj.tile_ptr.size() - 1;
    return Status::Ok();
}

Status CheckArrayBytes(const char* what, const HostArray& a) {
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

Result<SparseObject> BuildSparseObject(SourceDescriptor desc, const HostArray& indices,
                                       const HostArray& values, const EncodeOptions& options) {
    // --- Descriptor, box, tile shape, policy ---------------------------------------------------
    if (Status s = ValidateShape(desc.global_shape); !s.ok()) {
        return s.WithContext("global_shape");
    }
    const std::size_t rank = desc.global_shape.size();
    if (desc.box.rank() == 0) {
        MCS_ASSIGN_OR_RETURN(desc.box, Box::Whole(desc.global_shape));
    }
    if (desc.box.rank() != rank || !InsideShape(desc.box, desc.global_shape)) {
        return InvalidArgument("source box " + desc.box.ToString() +
                               " is not inside global_shape " + ShapeString(desc.global_shape));
    }
    desc.tile_shape = options.tile_shape ? ClampTileShape(*options.tile_shape, desc.global_shape)
                                         : DefaultTileShape(desc.global_shape);
    MCS_RETURN_IF_ERROR(ValidateTileShape(desc.tile_shape, desc.global_shape));
    if (options.num_threads < 0) {
        return InvalidArgument("num_threads " + std::to_string(options.num_threads) +
                               " is negative (0 means all hardware threads)");
    }
    if (options.duplicates == DuplicatePolicy::kLast && desc.apply != ApplyMode::kOverwrite) {
        return InvalidArgument(
            "duplicates=last needs apply=overwrite (scatter_add sums repeated coordinates)");
    }
    if (options.duplicates == DuplicatePolicy::kSum && desc.apply != ApplyMode::kScatterAdd) {
        return InvalidArgument(
            "duplicates=sum needs apply=scatter_add (overwrite with repeated "
            "coordinates has no single meaning)");
    }

    // --- indices -------------------------------------------------------------------------------
    if (!IsIntegerDType(indices.dtype)) {
        return InvalidArgument("indices dtype " + std::string(DTypeName(indices.dtype)) +
                               " is not an integer type");
    }
    const bool flat_1d = indices.shape.size() == 1 && rank == 1;
    if (!flat_1d && (indices.shape.size() != 2 || indices.shape[1] != static_cast<Index>(rank))) {
        return InvalidArgument("indices shape " + ShapeString(indices.shape) + " is not [nnz, " +
                               std::to_string(rank) + "] for a rank-" + std::to_string(rank) +
                               " tensor");
    }
    if (indices.shape[0] < 0) return InvalidArgument("indices shape has a negative extent");
    MCS_RETURN_IF_ERROR(CheckArrayBytes("indices", indices));
    const auto nnz = static_cast<std::uint64_t>(indices.shape[0]);

    // --- values --------------------------------------------------------------------------------
    if (!IsNumericDType(values.dtype)) {
        return InvalidArgument("values dtype " + std::string(DTypeName(values.dtype)) +
                               " is not numeric");
    }
    if (values.shape.size() != 1) {
        return InvalidArgument("values shape " + ShapeString(values.shape) + " is not 1-D [nnz]");
    }
    if (values.shape[0] != static_cast<Index>(nnz)) {
        return InvalidArgument("values has " + std::to_string(values.shape[0]) +
                               " entries but indices has " + std::to_string(nnz));
    }
    MCS_RETURN_IF_ERROR(CheckArrayBytes("values", values));
    if (options.duplicates == DuplicatePolicy::kSum && !SupportsAdd(values.dtype)) {
        return InvalidArgument("duplicates=sum is not supported for " +
                               std::string(DTypeName(values.dtype)) + " values");
    }

    // --- Output descriptor fields --------------------------------------------------------------
    const Index max_extent = *std::max_element(desc.global_shape.begin(), desc.global_shape.end());
    desc.index_dtype = NarrowestIndexDType(max_extent);
    desc.value_dtype = values.dtype;
    desc.nnz = 0;
    desc.num_tiles = 0;

    SparseObject obj;
    obj.coordinate_space = "global";
    obj.desc = desc;

    if (nnz > 0) {
        KeyPlan plan;
        plan.rank = rank;
        std::uint64_t grid_volume = 1;
        bool fits = true;
        for (std::size_t d = 0; d < rank; ++d) {
            const auto g = static_cast<std::uint64_t>(desc.global_shape[d]);
            const auto t = static_cast<std::uint64_t>(desc.tile_shape[d]);
            plan.lo[d] = static_cast<std::uint64_t>(desc.box.begin(d));
            plan.ext[d] = static_cast<std::uint64_t>(desc.box.shape()[d]);
            plan.ts[d] = t;
            plan.div[d] = Divider(t);
            plan.grid[d] = g / t + (g % t != 0);
            plan.gshape[d] = g;
            fits &= !__builtin_mul_overflow(grid_volume, plan.grid[d], &grid_volume);
            fits &= !__builtin_mul_overflow(plan.tile_volume, t, &plan.tile_volume);
        }
        fits &= !__builtin_mul_overflow(grid_volume, plan.tile_volume, &plan.key_limit);
        plan.single_key = fits;
        plan.exact_dims = true;
        for (std::size_t d = 0; d < rank; ++d) {
            plan.exact_dims &= plan.div[d].Exact(plan.gshape[d] - 1);
        }
        plan.volume_div = Divider(plan.tile_volume);
        plan.exact_volume = fits && plan.volume_div.Exact(plan.key_limit - 1);

        BuildInput in;
        in.indices = indices.data.data();
        in.values = values.data.data();
        in.nnz = nnz;
        in.value_bytes = DTypeSize(values.dtype);
        in.value_dtype = values.dtype;
        in.duplicates = options.duplicates;
        in.threads = ResolveThreads(options.num_threads);
        in.box = desc.box;

        Status status;
        VisitIntegerDType(indices.dtype, [&](auto in_tag) {
            VisitUnsignedIndexDType(desc.index_dtype, [&](auto out_tag) {
                status = BuildTyped<decltype(in_tag), decltype(out_tag)>(in, plan, obj);
            });
        });
        MCS_RETURN_IF_ERROR(status);
    } else {
        obj.tile_ptr = {0};
    }

    // --- Final validation of the descriptor ----------------------------------------------------
    // A source_ref is usually assigned by the store at commit; validate with a stand-in so that
    // an empty one is not an error here.
    SourceDescriptor check = obj.desc;
    if (check.source_ref.empty()) check.source_ref = "<uncommitted>";
    MCS_RETURN_IF_ERROR(SourceDescriptor::Make(std::move(check)));
    UpdateChecksums(obj);
    return obj;
}

}  // namespace mooncake::sparse

namespace mooncake::sparse {
namespace {

/// The fast path of BuildSparseObject(desc, OwnedCoo): rank-2 entries of index type T already
/// sorted by (tile, element), strictly, inside `box`. Fills the tile index of `obj` and returns
/// true; false (obj's tile index then is garbage) when an entry is out of order or outside the
/// box, which the general path then reports or sorts.
template <typename T>
bool SortedTileIndex2D(const std::byte* indices, std::uint64_t nnz, const Box& box,
                       std::span<const Index> tile_shape, std::span<const Index> global_shape,
                       SparseObject& obj) {
    const auto lo0 = static_cast<std::uint64_t>(box.begin(0));
    const auto lo1 = static_cast<std::uint64_t>(box.begin(1));
    const auto ext0 = static_cast<std::uint64_t>(box.shape()[0]);
    const auto ext1 = static_cast<std::uint64_t>(box.shape()[1]);
    const auto ts0 = static_cast<std::uint64_t>(tile_shape[0]);
    const auto ts1 = static_cast<std::uint64_t>(tile_shape[1]);
    const auto g1 = static_cast<std::uint64_t>(global_shape[1]);
    const std::uint64_t grid1 = g1 / ts1 + (g1 % ts1 != 0);
    std::vector<TileCoord>& coords = obj.tile_coords;
    std::vector<std::uint64_t>& ptr = obj.tile_ptr;
    coords.clear();
    ptr.clear();
    // A small object's tile index in one allocation each; a large one grows from there.
    const std::size_t guess = static_cast<std::size_t>(std::min<std::uint64_t>(nnz, 15)) + 1;
    ptr.reserve(guess);
    coords.reserve(2 * (guess - 1));
    ptr.push_back(0);
    std::uint64_t tile = 0;
    std::uint64_t i = 0;
    while (i < nnz) {
        // Entry i opens a tile: it must lie in the box, and its tile must follow the last one.
        const std::uint64_t r = LoadAs<T>(indices + (2 * i) * sizeof(T));
        const std::uint64_t c = LoadAs<T>(indices + (2 * i + 1) * sizeof(T));
        if ((r - lo0) >= ext0 || (c - lo1) >= ext1) return false;
        const std::uint64_t tr = r / ts0, tc = c / ts1;
        const std::uint64_t next = tr * grid1 + tc;
        if (i > 0) {
            if (next <= tile) return false;
            ptr.push_back(i);
        }
        tile = next;
        coords.push_back(static_cast<TileCoord>(tr));
        coords.push_back(static_cast<TileCoord>(tc));
        // The part of the tile inside the box: rows [r_lo, r_lo + r_n), columns likewise.
        const std::uint64_t r_lo = std::max(tr * ts0, lo0);
        const std::uint64_t r_n = std::min(tr * ts0 + ts0, lo0 + ext0) - r_lo;
        const std::uint64_t c_lo = std::max(tc * ts1, lo1);
        const std::uint64_t c_n = std::min(tc * ts1 + ts1, lo1 + ext1) - c_lo;
        // The rest of the tile's entries: inside it, each after the one before in row-major
        // order. The loop leaves at the first entry of another tile (or outside the box).
        std::uint64_t prev_r = r, prev_c = c;
        bool ordered = true;
        for (++i; i < nnz; ++i) {
            const std::uint64_t er = LoadAs<T>(indices + (2 * i) * sizeof(T));
            const std::uint64_t ec = LoadAs<T>(indices + (2 * i + 1) * sizeof(T));
            if ((er - r_lo) >= r_n || (ec - c_lo) >= c_n) break;
            // Branch-free: at low density consecutive entries share a row about half the time.
            ordered &= (er > prev_r) | ((er == prev_r) & (ec > prev_c));
            prev_r = er;
            prev_c = ec;
        }
        if (!ordered) return false;
    }
    ptr.push_back(nnz);
    return true;
}

/// The fast path's checks that read no entry: the descriptor the object will have (box,
/// tile_shape, index/value dtypes and nnz set; num_tiles 0) when (indices, values) of `desc`
/// are rank-2, non-empty, of the narrowest index dtype and of consistent sizes, the box and the
/// tile shape valid and no duplicates to coalesce. nullopt: the general path decides.
std::optional<SourceDescriptor> PlanSorted(SourceDescriptor desc, DType index_dtype_in,
                                           DType value_dtype, std::uint64_t index_bytes,
                                           std::uint64_t nnz, std::uint64_t value_bytes,
                                           const EncodeOptions& options) {
    const std::size_t rank = desc.global_shape.size();
    if (rank != 2 || nnz == 0 || options.duplicates != DuplicatePolicy::kError ||
        options.num_threads < 0 || !ValidateShape(desc.global_shape).ok() ||
        !IsNumericDType(value_dtype)) {
        return std::nullopt;
    }
    const Index max_extent = *std::max_element(desc.global_shape.begin(), desc.global_shape.end());
    const DType index_dtype = NarrowestIndexDType(max_extent);
    if (index_dtype_in != index_dtype || index_bytes != nnz * rank * DTypeSize(index_dtype) ||
        value_bytes != nnz * DTypeSize(value_dtype)) {
        return std::nullopt;
    }
    if (desc.box.rank() == 0) {
        auto whole = Box::Whole(desc.global_shape);
        if (!whole.ok()) return std::nullopt;
        desc.box = std::move(whole).value();
    }
    if (desc.box.rank() != rank || !InsideShape(desc.box, desc.global_shape)) return std::nullopt;
    Shape tile_shape = options.tile_shape ? ClampTileShape(*options.tile_shape, desc.global_shape)
                                          : DefaultTileShape(desc.global_shape);
    if (!ValidateTileShape(tile_shape, desc.global_shape).ok()) return std::nullopt;
    desc.tile_shape = std::move(tile_shape);
    desc.index_dtype = index_dtype;
    desc.value_dtype = value_dtype;
    desc.nnz = nnz;
    desc.num_tiles = 0;
    return desc;
}

/// Completes the fast path once `obj` holds the tile index of the entries PlanSorted planned:
/// true when the final descriptor validates (then it is `obj`'s), else false.
bool FinishSorted(SourceDescriptor planned, SparseObject& obj) {
    if (obj.tile_ptr.empty()) return false;
    planned.num_tiles = obj.tile_ptr.size() - 1;
    // The general path fills in these fields itself, so it still may take over from here. An
    // object that is not committed yet has no source_ref, which Validate requires: it is
    // validated under a stand-in name that is cleared again (the descriptor is not copied).
    const bool unnamed = planned.source_ref.empty();
    if (unnamed) planned.source_ref = "<uncommitted>";
    const bool valid = SourceDescriptor::Validate(planned).ok();
    if (unnamed) planned.source_ref.clear();
    if (!valid) return false;
    obj.coordinate_space = "global";
    obj.desc = std::move(planned);
    return true;
}

/// The fast path's checks and tile index: true when (indices, values) of `desc` are rank-2,
/// of the narrowest index dtype, sorted by (tile, element) without duplicates and inside the
/// box; then `obj` holds the tile index and a final descriptor, and its members are left for
/// the caller to fill with the bytes. False: the general path decides (errors included).
bool SortedFastPath(SourceDescriptor desc, DType index_dtype_in, DType value_dtype,
                    const std::byte* indices, std::uint64_t index_bytes, std::uint64_t nnz,
                    std::uint64_t value_bytes, const EncodeOptions& options, SparseObject& obj) {
    std::optional<SourceDescriptor> planned = PlanSorted(
        std::move(desc), index_dtype_in, value_dtype, index_bytes, nnz, value_bytes, options);
    if (!planned) return false;
    bool sorted = false;
    VisitUnsignedIndexDType(planned->index_dtype, [&](auto tag) {
        sorted = SortedTileIndex2D<decltype(tag)>(indices, nnz, planned->box, planned->tile_shape,
                                                  planned->global_shape, obj);
    });
    return sorted && FinishSorted(std::move(*planned), obj);
}

}  // namespace

Result<SparseObject> BuildSparseObject(SourceDescriptor desc, OwnedCoo coo,
                                       const EncodeOptions& options) {
    SparseObject obj;
    if (SortedFastPath(desc, coo.index_dtype, coo.value_dtype, coo.indices.data(),
                       coo.indices.size(), coo.nnz, coo.values.size(), options, obj)) {
        obj.indices = std::move(coo.indices);
        obj.values = std::move(coo.values);
        UpdateChecksums(obj);
        return obj;
    }
    // Everything else, errors included, is the general path's.
    const auto nnz = static_cast<Index>(coo.nnz);
    const auto rank = static_cast<Index>(desc.global_shape.size());
    const HostArray idx{coo.index_dtype, {nnz, rank}, coo.indices};
    const HostArray val{coo.value_dtype, {nnz}, coo.values};
    return BuildSparseObject(std::move(desc), idx, val, options);
}

std::optional<SparseObject> IndexCanonicalEntries(SourceDescriptor desc, const HostArray& indices,
                                                  const HostArray& values,
                                                  const EncodeOptions& options) {
    SparseObject obj;
    const bool shaped = indices.shape.size() == 2 && values.shape.size() == 1 &&
                        indices.shape[0] >= 0 && values.shape[0] == indices.shape[0];
    if (!shaped || !SortedFastPath(std::move(desc), indices.dtype, values.dtype,
                                   indices.data.data(), indices.data.size(),
                                   std::uint64_t(indices.shape[0]), values.data.size(), options,
                                   obj)) {
        return std::nullopt;
    }
    obj.checksum_indices = Checksum(indices.data);
    obj.checksum_values = Checksum(values.data);
    obj.checksum_tile_coords = Checksum(std::as_bytes(std::span(obj.tile_coords)));
    obj.checksum_tile_ptr = Checksum(std::as_bytes(std::span(obj.tile_ptr)));
    return obj;
}

std::optional<SourceDescriptor> PlanCanonicalEntries(SourceDescriptor desc, const CooLayout& coo,
                                                     const EncodeOptions& options) {
    const bool shaped = coo.index_shape.size() == 2 && coo.value_shape.size() == 1 &&
                        coo.index_shape[0] >= 0 && coo.value_shape[0] == coo.index_shape[0];
    if (!shaped) return std::nullopt;
    return PlanSorted(std::move(desc), coo.index_dtype, coo.value_dtype, coo.index_bytes,
                      std::uint64_t(coo.index_shape[0]), coo.value_bytes, options);
}

std::optional<SparseObject> FinishCanonicalEntries(SourceDescriptor planned,
                                                   std::vector<TileCoord> tile_coords,
                                                   std::vector<std::uint64_t> tile_ptr,
                                                   std::uint64_t checksum_indices,
                                                   std::uint64_t checksum_values) {
    const std::size_t rank = planned.global_shape.size();
    if (tile_ptr.size() < 2 || tile_ptr.front() != 0 || tile_ptr.back() != planned.nnz ||
        tile_coords.size() != (tile_ptr.size() - 1) * rank) {
        return std::nullopt;
    }
    SparseObject obj;
    obj.tile_coords = std::move(tile_coords);
    obj.tile_ptr = std::move(tile_ptr);
    if (!FinishSorted(std::move(planned), obj)) return std::nullopt;
    obj.checksum_indices = checksum_indices;
    obj.checksum_values = checksum_values;
    obj.checksum_tile_coords = Checksum(std::as_bytes(std::span(obj.tile_coords)));
    obj.checksum_tile_ptr = Checksum(std::as_bytes(std::span(obj.tile_ptr)));
    return obj;
}

Result<SparseObject> BuildSparseObjectSortedFirst(SourceDescriptor desc, const HostArray& indices,
                                                  const HostArray& values,
                                                  const EncodeOptions& options) {
    if (std::optional<SparseObject> obj = IndexCanonicalEntries(desc, indices, values, options)) {
        obj->indices.assign(indices.data.begin(), indices.data.end());
        obj->values.assign(values.data.begin(), values.data.end());
        return std::move(*obj);
    }
    return BuildSparseObject(std::move(desc), indices, values, options);
}

}  // namespace mooncake::sparse
