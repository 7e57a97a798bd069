// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "node/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace mooncake::sparse::daemon {
namespace {

void StderrSink(LogSeverity severity, const char* file, int line, const std::string& text) {
    static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm tm{};
    localtime_r(&t, &tm);
    const char* base = file;
    for (const char* p = file; *p; ++p) {
        if (*p == '/') base = p + 1;
    }
    std::fprintf(stderr, "%c%02d%02d %02d:%02d:%02d %s:%d] %s\n", kLetters[int(severity) & 3],
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, base, line,
                 text.c_str());
}

std::atomic<LogSink> g_sink{&StderrSink};
std::atomic<int> g_min{int(LogSeverity::kWarning)};

}  // namespace

void SetLogSink(LogSink sink, LogSeverity min_severity) {
    g_sink.store(sink ? sink : &StderrSink, std::memory_order_release);
    g_min.store(int(min_severity), std::memory_order_release);
}

bool LogEnabled(LogSeverity severity) {
    return int(severity) >= g_min.load(std::memory_order_relaxed);
}

void EmitLog(LogSeverity severity, const char* file, int line, const std::string& text) {
    g_sink.load(std::memory_order_acquire)(severity, file, line, text);
}

}  // namespace mooncake::sparse::daemon
