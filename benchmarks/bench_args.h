// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Flag values of the C++ benchmarks. Standard library only.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

namespace mooncake::sparse::bench {

/// `text` as a positive decimal integer, or nullopt (empty, not a number, trailing characters,
/// zero).
inline std::optional<std::uint64_t> ParsePositive(const std::string& text) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || end == nullptr || *end != '\0' || v == 0) return std::nullopt;
    return v;
}

}  // namespace mooncake::sparse::bench
