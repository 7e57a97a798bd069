// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Status and Result<T>: the error model of the whole library. No exceptions cross the C++ core;
// the Python binding maps StatusCode to the mcs.Error hierarchy.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace mooncake::sparse {

enum class StatusCode : int {
    kOk = 0,
    kInvalidArgument = 1,    ///< Malformed input: shapes, dtypes, coordinates, boxes, messages.
    kNotFound = 2,           ///< A key, object, member or source does not exist.
    kStaleGeneration = 3,    ///< Generation fencing rejected a commit or read.
    kConflict = 4,           ///< A different payload under an existing logical key, or a lost race.
    kOutOfRange = 5,         ///< A range or offset outside an object.
    kResourceExhausted = 6,  ///< A quota, capacity or planning budget was exceeded.
    kFailedPrecondition = 7, ///< The operation is valid but not in the current state.
    kUnavailable = 8,        ///< A peer (daemon, master) is unreachable; retrying may help.
    kInternal = 9,           ///< An invariant broke: a bug.
    kUnimplemented = 10,     ///< A capability this build or machine lacks (e.g. no CUDA).
    kDataLoss = 11,          ///< A checksum mismatch or torn data was detected.
    kPermissionDenied = 12,  ///< The caller may not do this (e.g. a socket peer of another uid).
    kDeadlineExceeded = 13,  ///< A wait ended at its deadline before what it waited for happened.
};

/// The highest StatusCode value: loops over every code (e.g. the binding's code table) end here.
inline constexpr StatusCode kLastStatusCode = StatusCode::kDeadlineExceeded;

constexpr std::string_view StatusCodeName(StatusCode code) {
    switch (code) {
        case StatusCode::kOk: return "OK";
        case StatusCode::kInvalidArgument: return "InvalidArgument";
        case StatusCode::kNotFound: return "NotFound";
        case StatusCode::kStaleGeneration: return "StaleGeneration";
        case StatusCode::kConflict: return "Conflict";
        case StatusCode::kOutOfRange: return "OutOfRange";
        case StatusCode::kResourceExhausted: return "ResourceExhausted";
        case StatusCode::kFailedPrecondition: return "FailedPrecondition";
        case StatusCode::kUnavailable: return "Unavailable";
        case StatusCode::kInternal: return "Internal";
        case StatusCode::kUnimplemented: return "Unimplemented";
        case StatusCode::kDataLoss: return "DataLoss";
        case StatusCode::kPermissionDenied: return "PermissionDenied";
        case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    }
    return "Unknown";
}

/// A code plus a human-readable message. Cheap to copy when OK (empty string).
class [[nodiscard]] Status {
public:
    Status() = default;
    Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

    static Status Ok() { return {}; }

    bool ok() const { return code_ == StatusCode::kOk; }
    StatusCode code() const { return code_; }
    const std::string& message() const { return message_; }

    std::string ToString() const {
        if (ok()) return "OK";
        std::string out(StatusCodeName(code_));
        out += ": ";
        out += message_;
        return out;
    }

    /// Prefixes the message with context, keeping the code ("while planning x: ...").
    Status WithContext(std::string_view context) const {
        if (ok()) return *this;
        std::string msg(context);
        msg += ": ";
        msg += message_;
        return {code_, std::move(msg)};
    }

    friend bool operator==(const Status& a, const Status& b) {
        return a.code_ == b.code_ && a.message_ == b.message_;
    }

private:
    StatusCode code_ = StatusCode::kOk;
    std::string message_;
};

inline Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
inline Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
inline Status StaleGeneration(std::string msg) { return {StatusCode::kStaleGeneration, std::move(msg)}; }
inline Status Conflict(std::string msg) { return {StatusCode::kConflict, std::move(msg)}; }
inline Status OutOfRange(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
inline Status ResourceExhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
inline Status FailedPrecondition(std::string msg) { return {StatusCode::kFailedPrecondition, std::move(msg)}; }
inline Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
inline Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
inline Status Unimplemented(std::string msg) { return {StatusCode::kUnimplemented, std::move(msg)}; }
inline Status DataLoss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
inline Status PermissionDenied(std::string msg) {
    return {StatusCode::kPermissionDenied, std::move(msg)};
}
inline Status DeadlineExceeded(std::string msg) {
    return {StatusCode::kDeadlineExceeded, std::move(msg)};
}

/// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
    static_assert(!std::is_same_v<T, Status>, "Result<Status> is not meaningful");

public:
    Result(T value) : state_(std::in_place_index<1>, std::move(value)) {}  // NOLINT implicit
    Result(Status status) : state_(std::in_place_index<0>, std::move(status)) {  // NOLINT implicit
        assert(!std::get<0>(state_).ok() && "Result constructed from an OK Status");
        if (std::get<0>(state_).ok()) {
            state_.template emplace<0>(Internal("Result constructed from an OK status without a value"));
        }
    }

    bool ok() const { return state_.index() == 1; }
    const Status& status() const {
        static const Status kOkStatus;
        return ok() ? kOkStatus : std::get<0>(state_);
    }

    const T& value() const& { assert(ok()); return std::get<1>(state_); }
    T& value() & { assert(ok()); return std::get<1>(state_); }
    T&& value() && { assert(ok()); return std::get<1>(std::move(state_)); }

    const T& operator*() const& { return value(); }
    T& operator*() & { return value(); }
    T&& operator*() && { return std::move(*this).value(); }
    const T* operator->() const { return &value(); }
    T* operator->() { return &value(); }

    T ValueOr(T fallback) const& { return ok() ? value() : std::move(fallback); }

private:
    std::variant<Status, T> state_;
};

namespace internal {
inline const Status& AsStatus(const Status& s) { return s; }
template <typename T>
const Status& AsStatus(const Result<T>& r) { return r.status(); }
}  // namespace internal

}  // namespace mooncake::sparse

#define MCS_CONCAT_INNER_(a, b) a##b
#define MCS_CONCAT_(a, b) MCS_CONCAT_INNER_(a, b)

/// Returns the Status of `expr` (a Status or Result) from the enclosing function if not OK.
#define MCS_RETURN_IF_ERROR(expr)                                                   \
    do {                                                                            \
        const auto& mcs_status_or_result_ = (expr);                                 \
        if (!::mooncake::sparse::internal::AsStatus(mcs_status_or_result_).ok()) {  \
            return ::mooncake::sparse::internal::AsStatus(mcs_status_or_result_);   \
        }                                                                           \
    } while (0)

#define MCS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
    auto tmp = (expr);                             \
    if (!tmp.ok()) return tmp.status();            \
    lhs = std::move(tmp).value()

/// `MCS_ASSIGN_OR_RETURN(auto x, MakeX(...));` binds the value or returns the error.
#define MCS_ASSIGN_OR_RETURN(lhs, expr) \
    MCS_ASSIGN_OR_RETURN_IMPL_(MCS_CONCAT_(mcs_result_, __LINE__), lhs, expr)
