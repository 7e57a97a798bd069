// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// XXH3-64 with its AVX2 kernel: this file alone is compiled with -mavx2 (src/CMakeLists.txt, on
// x86-64), and Checksum (codec.cc) calls it only where the CPU has AVX2. The hash is the same
// whichever kernel computes it; AVX2 hashes a target object's members about twice as fast as
// the SSE2 kernel the rest of the library is built with.
//
// It includes nothing but xxhash, whose functions XXH_INLINE_ALL makes static: no inline function
// of another header is compiled here with AVX2 instructions that the linker could then pick for
// the files that run on any x86-64.
#if defined(__AVX2__)
#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace mooncake::sparse::codec_internal {

uint64_t ChecksumAvx2(const void* data, size_t size) { return XXH3_64bits(data, size); }

}  // namespace mooncake::sparse::codec_internal
#endif
