// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The gmock matchers and macros of Status / Result that every test suite uses: one copy.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <utility>

#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

// Printers so that failures show codes and messages instead of bytes.
inline void PrintTo(const Status& s, std::ostream* os) { *os << s.ToString(); }
template <typename T>
void PrintTo(const Result<T>& r, std::ostream* os) {
    *os << (r.ok() ? std::string("Result(value)") : "Result(" + r.status().ToString() + ")");
}
inline void PrintTo(StatusCode c, std::ostream* os) { *os << StatusCodeName(c); }

namespace testing {

/// Matches a Status or a Result<T> whose code is `code`.
MATCHER_P(StatusIs, code,
          std::string(negation ? "doesn't have" : "has") + " status code " +
              std::string(::mooncake::sparse::StatusCodeName(code))) {
    const ::mooncake::sparse::Status& s = ::mooncake::sparse::internal::AsStatus(arg);
    *result_listener << "whose status is " << s.ToString();
    return s.code() == code;
}

/// Matches a Status or a Result<T> whose code is `code` and whose message contains `substr`.
MATCHER_P2(StatusIsWithMessage, code, substr,
           std::string(negation ? "doesn't have" : "has") + " status code " +
               std::string(::mooncake::sparse::StatusCodeName(code)) +
               " and a message containing '" + std::string(substr) + "'") {
    const ::mooncake::sparse::Status& s = ::mooncake::sparse::internal::AsStatus(arg);
    *result_listener << "whose status is " << s.ToString();
    return s.code() == code && s.message().find(substr) != std::string::npos;
}

/// Matches an OK Status or a Result<T> that holds a value.
MATCHER(IsOk, std::string(negation ? "isn't" : "is") + " OK") {
    const ::mooncake::sparse::Status& s = ::mooncake::sparse::internal::AsStatus(arg);
    *result_listener << "whose status is " << s.ToString();
    return s.ok();
}

}  // namespace testing
}  // namespace mooncake::sparse

#define MCS_TEST_CONCAT_INNER_(a, b) a##b
#define MCS_TEST_CONCAT_(a, b) MCS_TEST_CONCAT_INNER_(a, b)
#define MCS_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)                         \
    auto tmp = (expr);                                                         \
    ASSERT_TRUE(tmp.ok()) << #expr << " failed: " << tmp.status().ToString(); \
    lhs = std::move(tmp).value()
/// `ASSERT_OK_AND_ASSIGN(auto x, MakeX(...));` in a test body (a void function).
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
    MCS_ASSERT_OK_AND_ASSIGN_IMPL_(MCS_TEST_CONCAT_(mcs_test_result_, __LINE__), lhs, expr)
#define ASSERT_OK(expr) ASSERT_THAT((expr), ::mooncake::sparse::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::mooncake::sparse::testing::IsOk())
#define MCS_ASSERT_OK(expr) ASSERT_OK(expr)
#define MCS_EXPECT_OK(expr) EXPECT_OK(expr)
