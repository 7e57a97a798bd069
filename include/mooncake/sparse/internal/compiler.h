// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Compiler hints of the planner's hot loops: a prefetch and a forced inline. Both fall back to
// nothing on a compiler without the builtins, so they change speed, never results.
#pragma once

// Forces inlining of the small lambdas of the dedup merge, which GCC would otherwise call (and
// then keep their captured state in memory) for every one of millions of regions.
#if defined(__GNUC__) || defined(__clang__)
#define MCS_PLANNER_INLINE __attribute__((always_inline))
#else
#define MCS_PLANNER_INLINE
#endif

namespace mooncake::sparse::internal {

/// Asks the CPU to start fetching the cache line at `p` (no-op without a compiler builtin).
/// Planning a node touches tens of thousands of independent tile indexes and descriptors; on
/// cold memory each is a cache and TLB miss, so the batch loops fetch ahead instead of waiting
/// for one miss at a time.
inline void Prefetch(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
    __builtin_prefetch(p);
#else
    (void)p;
#endif
}

}  // namespace mooncake::sparse::internal
