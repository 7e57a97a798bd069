// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Status, Result<T> and the MCS_RETURN_IF_ERROR / MCS_ASSIGN_OR_RETURN macros.

#include "mooncake/sparse/status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace mooncake::sparse {
namespace {

using ::mooncake::sparse::testing::IsOk;
using ::mooncake::sparse::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(StatusTest, DefaultIsOk) {
    Status s;
    EXPECT_TRUE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kOk);
    EXPECT_EQ(s.message(), "");
    EXPECT_EQ(s.ToString(), "OK");
    EXPECT_EQ(Status::Ok(), Status());
    EXPECT_THAT(s, IsOk());
}

TEST(StatusTest, FactoriesSetCodeAndMessage) {
    const std::vector<std::pair<Status, StatusCode>> cases = {
        {InvalidArgument("a"), StatusCode::kInvalidArgument},
        {NotFound("a"), StatusCode::kNotFound},
        {StaleGeneration("a"), StatusCode::kStaleGeneration},
        {Conflict("a"), StatusCode::kConflict},
        {OutOfRange("a"), StatusCode::kOutOfRange},
        {ResourceExhausted("a"), StatusCode::kResourceExhausted},
        {FailedPrecondition("a"), StatusCode::kFailedPrecondition},
        {Unavailable("a"), StatusCode::kUnavailable},
        {Internal("a"), StatusCode::kInternal},
        {Unimplemented("a"), StatusCode::kUnimplemented},
        {DataLoss("a"), StatusCode::kDataLoss},
        {PermissionDenied("a"), StatusCode::kPermissionDenied},
        {DeadlineExceeded("a"), StatusCode::kDeadlineExceeded},
    };
    // Every code up to kLastStatusCode has a factory case above and a name.
    EXPECT_EQ(cases.size(), static_cast<std::size_t>(kLastStatusCode));
    for (const auto& [status, code] : cases) {
        EXPECT_FALSE(status.ok());
        EXPECT_EQ(status.code(), code);
        EXPECT_EQ(status.message(), "a");
        EXPECT_THAT(status, StatusIs(code));
        EXPECT_THAT(status, Not(IsOk()));
        EXPECT_EQ(status.ToString(), std::string(StatusCodeName(code)) + ": a");
    }
}

TEST(StatusTest, CodeNamesAreStable) {
    // The Python binding and log scrapers depend on these spellings.
    EXPECT_EQ(StatusCodeName(StatusCode::kOk), "OK");
    EXPECT_EQ(StatusCodeName(StatusCode::kInvalidArgument), "InvalidArgument");
    EXPECT_EQ(StatusCodeName(StatusCode::kNotFound), "NotFound");
    EXPECT_EQ(StatusCodeName(StatusCode::kStaleGeneration), "StaleGeneration");
    EXPECT_EQ(StatusCodeName(StatusCode::kConflict), "Conflict");
    EXPECT_EQ(StatusCodeName(StatusCode::kResourceExhausted), "ResourceExhausted");
    EXPECT_EQ(StatusCodeName(StatusCode::kPermissionDenied), "PermissionDenied");
    for (int c = 0; c <= static_cast<int>(kLastStatusCode); ++c) {
        EXPECT_NE(StatusCodeName(static_cast<StatusCode>(c)), "Unknown") << c;
    }
    EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(99)), "Unknown");
}

TEST(StatusTest, WithContextPrefixesMessageAndKeepsCode) {
    Status s = NotFound("no such key").WithContext("while planning x");
    EXPECT_THAT(s, StatusIs(StatusCode::kNotFound));
    EXPECT_EQ(s.message(), "while planning x: no such key");
    EXPECT_THAT(Status::Ok().WithContext("ctx"), IsOk());
    EXPECT_EQ(Status::Ok().WithContext("ctx").message(), "");
}

TEST(StatusTest, EqualityComparesCodeAndMessage) {
    EXPECT_EQ(InvalidArgument("x"), InvalidArgument("x"));
    EXPECT_FALSE(InvalidArgument("x") == InvalidArgument("y"));
    EXPECT_FALSE(InvalidArgument("x") == NotFound("x"));
}

TEST(ResultTest, HoldsValue) {
    Result<int> r = 42;
    ASSERT_TRUE(r.ok());
    EXPECT_THAT(r, IsOk());
    EXPECT_EQ(r.value(), 42);
    EXPECT_EQ(*r, 42);
    EXPECT_TRUE(r.status().ok());
    EXPECT_EQ(r.ValueOr(7), 42);
}

TEST(ResultTest, HoldsError) {
    Result<int> r = NotFound("gone");
    EXPECT_FALSE(r.ok());
    EXPECT_THAT(r, StatusIs(StatusCode::kNotFound));
    EXPECT_EQ(r.status().message(), "gone");
    EXPECT_EQ(r.ValueOr(7), 7);
}

TEST(ResultTest, MoveOnlyValueAndArrow) {
    Result<std::unique_ptr<std::string>> r = std::make_unique<std::string>("abc");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->get()->size(), 3u);
    std::unique_ptr<std::string> taken = std::move(r).value();
    EXPECT_EQ(*taken, "abc");

    Result<std::string> s = std::string("hello");
    EXPECT_EQ(s->size(), 5u);
    s.value() += "!";
    EXPECT_EQ(*s, "hello!");
}

Status FailsIf(bool fail) { return fail ? InvalidArgument("asked to fail") : Status::Ok(); }
Result<int> Half(int x) {
    if (x % 2 != 0) return InvalidArgument("odd " + std::to_string(x));
    return x / 2;
}

Status ReturnIfErrorUser(bool fail, int* reached) {
    MCS_RETURN_IF_ERROR(FailsIf(fail));
    MCS_RETURN_IF_ERROR(Half(4));  // A Result works too.
    ++*reached;
    return Status::Ok();
}

Result<int> AssignOrReturnUser(int x) {
    MCS_ASSIGN_OR_RETURN(int h, Half(x));
    MCS_ASSIGN_OR_RETURN(auto q, Half(h));
    return q + 1000;
}

TEST(StatusMacrosTest, ReturnIfErrorPropagatesFirstError) {
    int reached = 0;
    EXPECT_THAT(ReturnIfErrorUser(false, &reached), IsOk());
    EXPECT_EQ(reached, 1);
    Status s = ReturnIfErrorUser(true, &reached);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_EQ(s.message(), "asked to fail");
    EXPECT_EQ(reached, 1);
}

TEST(StatusMacrosTest, AssignOrReturnBindsOrPropagates) {
    Result<int> ok = AssignOrReturnUser(8);
    ASSERT_THAT(ok, IsOk());
    EXPECT_EQ(*ok, 1002);
    Result<int> first = AssignOrReturnUser(3);
    EXPECT_THAT(first, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(first.status().message(), HasSubstr("odd 3"));
    Result<int> second = AssignOrReturnUser(6);  // 6 -> 3 -> odd.
    EXPECT_THAT(second, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(second.status().message(), HasSubstr("odd 3"));
}

TEST(StatusMatcherTest, DescribesMismatch) {
    ::testing::StringMatchResultListener listener;
    const bool matched = ::testing::ExplainMatchResult(
        StatusIs(StatusCode::kNotFound), Status(InvalidArgument("bad")), &listener);
    EXPECT_FALSE(matched);
    EXPECT_THAT(listener.str(), HasSubstr("InvalidArgument: bad"));
}

}  // namespace
}  // namespace mooncake::sparse
