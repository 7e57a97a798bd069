// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The output of the C++ benchmarks: one JSON object per line on stdout, the same lines in the
// file of `--json PATH` when one is given. Standard library only (the planner's benchmark links
// nothing else).
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

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

/// One JSON object, built key by key; numbers stay numbers, non-finite doubles become null.
class JsonLine {
public:
    explicit JsonLine(std::string_view what) { Add("what", what); }

    JsonLine& Add(std::string_view key, std::string_view value) {
        Key(key);
        Quote(value);
        return *this;
    }
    JsonLine& Add(std::string_view key, const char* value) {
        return Add(key, std::string_view(value));
    }
    JsonLine& Add(std::string_view key, const std::string& value) {
        return Add(key, std::string_view(value));
    }
    JsonLine& Add(std::string_view key, bool value) {
        Key(key);
        text_ += value ? "true" : "false";
        return *this;
    }
    template <typename T>
        requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
    JsonLine& Add(std::string_view key, T value) {
        Key(key);
        text_ += std::to_string(value);
        return *this;
    }
    JsonLine& Add(std::string_view key, double value) {
        Key(key);
        if (!std::isfinite(value)) {
            text_ += "null";
        } else {
            char buf[64];
            std::snprintf(buf, sizeof(buf), "%.6g", value);
            text_ += buf;
        }
        return *this;
    }
    /// `value` is already JSON (an array or object).
    JsonLine& AddRaw(std::string_view key, std::string_view value) {
        Key(key);
        text_ += value;
        return *this;
    }

    std::string str() const { return text_ + "}"; }

private:
    void Key(std::string_view key) {
        text_ += text_.size() > 1 ? "," : "";
        Quote(key);
        text_ += ':';
    }
    void Quote(std::string_view s) {
        text_ += '"';
        for (char c : s) {
            if (c == '"' || c == '\\') {
                text_ += '\\';
                text_ += c;
            } else if (static_cast<unsigned char>(c) < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof(buf), "\\u%04x", c);
                text_ += buf;
            } else {
                text_ += c;
            }
        }
        text_ += '"';
    }
    std::string text_ = "{";
};

}  // namespace mooncake::sparse::bench
