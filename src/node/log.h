// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Logging of the node server. The server code is also hosted inside Python processes next to
// upstream Mooncake's extension, which bundles its own glog and gflags; two glogs in one process
// can bind to each other's symbols, so the server itself does not link glog. It writes through
// a sink: the mooncake_sparse_node binary installs one that forwards to glog (flags, log files,
// levels as usual); a hosted server writes warnings and errors to stderr.
#pragma once

#include <sstream>
#include <string>

namespace mooncake::sparse::daemon {

enum class LogSeverity : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

/// Receives every line at or above the minimum severity. Must be thread-safe.
using LogSink = void (*)(LogSeverity severity, const char* file, int line, const std::string& text);

/// Installs `sink` (nullptr: the default stderr sink) and the lowest severity passed to it.
void SetLogSink(LogSink sink, LogSeverity min_severity);

bool LogEnabled(LogSeverity severity);
void EmitLog(LogSeverity severity, const char* file, int line, const std::string& text);

/// One line, emitted when it goes out of scope.
class LogLine {
public:
    LogLine(LogSeverity severity, const char* file, int line)
        : severity_(severity), file_(file), line_(line) {}
    ~LogLine() { EmitLog(severity_, file_, line_, stream_.str()); }
    LogLine(const LogLine&) = delete;
    LogLine& operator=(const LogLine&) = delete;
    std::ostream& stream() { return stream_; }

private:
    LogSeverity severity_;
    const char* file_;
    int line_;
    std::ostringstream stream_;
};

}  // namespace mooncake::sparse::daemon

/// MCS_LOG(kWarning) << "..."; the operands are not evaluated when the severity is filtered.
#define MCS_LOG(severity)                                                                     \
    if (!::mooncake::sparse::daemon::LogEnabled(::mooncake::sparse::daemon::LogSeverity::severity)) \
        ;                                                                                     \
    else                                                                                      \
        ::mooncake::sparse::daemon::LogLine(::mooncake::sparse::daemon::LogSeverity::severity,    \
                                            __FILE__, __LINE__)                               \
            .stream()
