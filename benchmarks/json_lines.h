// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The output of the C++ benchmarks: one JSON object per line on stdout, the same lines in the
// file of `--json PATH` when one is given. Standard library only (the planner's benchmark links
// nothing else).
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace mooncake::sparse::bench {

class JsonLinesOut {
public:
    /// Lines to stdout, and to `path` when it is not empty; a path that cannot be opened ends the
    /// program (status 1) with "<program>: cannot open --json PATH: <reason>" on stderr.
    JsonLinesOut(std::string_view program, const std::string& path) {
        if (path.empty()) return;
        file_ = std::fopen(path.c_str(), "w");
        if (file_ == nullptr) {
            std::fprintf(stderr, "%.*s: cannot open --json %s: %s\n",
                         static_cast<int>(program.size()), program.data(), path.c_str(),
                         std::strerror(errno));
            std::exit(1);
        }
    }
    ~JsonLinesOut() {
        if (file_ != nullptr) std::fclose(file_);
    }
    JsonLinesOut(const JsonLinesOut&) = delete;
    JsonLinesOut& operator=(const JsonLinesOut&) = delete;

    /// One line, flushed (a run that fails later keeps the lines it wrote).
    void Emit(std::string_view line) {
        Write(stdout, line);
        if (file_ != nullptr) Write(file_, line);
    }
    /// A line builder with str() (the benchmarks' JsonLine).
    template <typename Line>
        requires requires(const Line& l) { l.str(); }
    void Emit(const Line& line) {
        const std::string s = line.str();
        Emit(std::string_view(s));
    }

private:
    static void Write(std::FILE* f, std::string_view line) {
        std::fprintf(f, "%.*s\n", static_cast<int>(line.size()), line.data());
        std::fflush(f);
    }

    std::FILE* file_ = nullptr;
};

}  // namespace mooncake::sparse::bench
