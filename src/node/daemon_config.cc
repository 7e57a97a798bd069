// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
#include "node/daemon_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cctype>
#include <charconv>
#include <utility>

#include "store/shm_segment.h"

#include <nlohmann/json.hpp>

namespace mooncake::sparse {
namespace {

std::string Lower(std::string_view s) {
    std::string out(s);
    std::transform(out.begin(), out.end(), out.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return out;
}

std::string_view Trim(std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return s;
}

Result<std::uint64_t> ParseUnsigned(std::string_view text, std::string_view what) {
    text = Trim(text);
    std::uint64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return InvalidArgument(std::string(what) + ": '" + std::string(text) +
                               "' is not a non-negative integer");
    }
    return v;
}

Result<std::uint32_t> ParseU32(std::string_view text, std::string_view what) {
    MCS_ASSIGN_OR_RETURN(std::uint64_t v, ParseUnsigned(text, what));
    if (v > 0xffffffffu) return InvalidArgument(std::string(what) + " is too large");
    return static_cast<std::uint32_t>(v);
}

}  // namespace

Result<std::uint64_t> ParseByteSize(std::string_view text) {
    text = Trim(text);
    std::size_t digits = 0;
    while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
        ++digits;
    }
    if (digits == 0) {
        return InvalidArgument("byte size '" + std::string(text) + "' does not start with digits");
    }
    MCS_ASSIGN_OR_RETURN(std::uint64_t value, ParseUnsigned(text.substr(0, digits), "byte size"));
    const std::string suffix = Lower(Trim(text.substr(digits)));
    struct Unit {
        const char* name;
        std::uint64_t factor;
    };
    static constexpr Unit kUnits[] = {
        {"", 1},
        {"b", 1},
        {"k", 1ull << 10},   {"kib", 1ull << 10}, {"kb", 1000ull},
        {"m", 1ull << 20},   {"mib", 1ull << 20}, {"mb", 1000ull * 1000},
        {"g", 1ull << 30},   {"gib", 1ull << 30}, {"gb", 1000ull * 1000 * 1000},
        {"t", 1ull << 40},   {"tib", 1ull << 40}, {"tb", 1000ull * 1000 * 1000 * 1000},
    };
    for (const Unit& u : kUnits) {
        if (suffix == u.name) {
            std::uint64_t bytes = 0;
            if (__builtin_mul_overflow(value, u.factor, &bytes)) {
                return InvalidArgument("byte size '" + std::string(text) + "' overflows");
            }
            return bytes;
        }
    }
    return InvalidArgument("byte size '" + std::string(text) + "' has an unknown unit '" +
                           suffix + "' (use k/M/G/T, KiB/MiB/GiB/TiB or KB/MB/GB/TB)");
}

Result<std::chrono::milliseconds> ParseDuration(std::string_view text) {
    text = Trim(text);
    std::size_t digits = 0;
    while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
        ++digits;
    }
    if (digits == 0) {
        return InvalidArgument("duration '" + std::string(text) + "' does not start with digits");
    }
    MCS_ASSIGN_OR_RETURN(std::uint64_t value, ParseUnsigned(text.substr(0, digits), "duration"));
    const std::string unit = Lower(Trim(text.substr(digits)));
    std::uint64_t factor = 0;
    if (unit == "ms") {
        factor = 1;
    } else if (unit.empty() || unit == "s") {
        factor = 1000;
    } else if (unit == "m" || unit == "min") {
        factor = 60 * 1000;
    } else if (unit == "h") {
        factor = 3600 * 1000;
    } else {
        return InvalidArgument("duration '" + std::string(text) + "' has an unknown unit '" +
                               unit + "' (use ms, s, m or h)");
    }
    std::uint64_t ms = 0;
    if (__builtin_mul_overflow(value, factor, &ms) || ms > (std::uint64_t{1} << 40)) {
        return InvalidArgument("duration '" + std::string(text) + "' is too long");
    }
    return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

Status SetConfigKey(NodeDaemonConfig& c, std::string_view key, std::string_view value) {
    const auto bytes = [&](std::uint64_t& out) -> Status {
        auto v = ParseByteSize(value);
        if (!v.ok()) return v.status().WithContext(key);
        out = *v;
        return Status::Ok();
    };
    if (key == "socket_path") {
        c.socket_path = std::string(Trim(value));
    } else if (key == "node_id") {
        c.node_id = std::string(Trim(value));
    } else if (key == "segment_size") {
        return bytes(c.segment_size);
    } else if (key == "num_segments") {
        MCS_ASSIGN_OR_RETURN(c.num_segments, ParseU32(value, key));
    } else if (key == "capacity") {
        std::uint64_t v = 0;
        MCS_RETURN_IF_ERROR(bytes(v));
        c.capacity = v;
    } else if (key == "pinned_quota_bytes") {
        return bytes(c.pinned_quota_bytes);
    } else if (key == "cache_capacity_bytes") {
        return bytes(c.cache_capacity_bytes);
    } else if (key == "client_buffer_max_bytes") {
        return bytes(c.client_buffer_max_bytes);
    } else if (key == "metadata_capacity_bytes") {
        return bytes(c.metadata_capacity_bytes);
    } else if (key == "read_threads") {
        MCS_ASSIGN_OR_RETURN(c.read_threads, ParseU32(value, key));
    } else if (key == "max_connections") {
        MCS_ASSIGN_OR_RETURN(c.max_connections, ParseU32(value, key));
    } else if (key == "frame_timeout" || key == "idle_timeout") {
        auto v = ParseDuration(value);
        if (!v.ok()) return v.status().WithContext(key);
        (key == "frame_timeout" ? c.frame_timeout : c.idle_timeout) = *v;
    } else if (key == "prefault_segments" || key == "read_in_place" ||
               key == "gpu_commit_check" || key == "segment_huge_pages") {
        bool& flag = key == "prefault_segments"   ? c.prefault_segments
                     : key == "read_in_place"     ? c.read_in_place
                     : key == "segment_huge_pages" ? c.segment_huge_pages
                                                  : c.gpu_commit_check;
        const std::string v = Lower(Trim(value));
        if (v == "true" || v == "1" || v == "yes" || v == "on") {
            flag = true;
        } else if (v == "false" || v == "0" || v == "no" || v == "off") {
            flag = false;
        } else {
            return InvalidArgument(std::string(key) + ": '" + std::string(value) +
                                   "' is not true or false");
        }
    } else if (key == "commit_staging_pinned_bytes") {
        return bytes(c.commit_staging_pinned_bytes);
    } else if (key == "device_commit_group_bytes") {
        return bytes(c.device_commit_group_bytes);
    } else if (key == "device_gather_engine_bytes") {
        return bytes(c.device_gather_engine_bytes);
    } else if (key == "prepare_threads") {
        MCS_ASSIGN_OR_RETURN(c.prepare_threads, ParseU32(value, key));
        if (c.prepare_threads == 0 || c.prepare_threads > 256) {
            return InvalidArgument("prepare_threads must be 1 .. 256");
        }
    } else if (key == "log_level") {
        MCS_RETURN_IF_ERROR(ParseLogLevel(value));
        c.log_level = Lower(Trim(value));
    } else {
        return InvalidArgument("unknown configuration key '" + std::string(key) + "'");
    }
    return Status::Ok();
}

Result<LogLevel> ParseLogLevel(std::string_view level) {
    const std::string l = Lower(Trim(level));
    if (l == "debug") return LogLevel{0, 1};
    if (l == "info") return LogLevel{0, 0};
    if (l == "warning" || l == "warn") return LogLevel{1, 0};
    if (l == "error") return LogLevel{2, 0};
    return InvalidArgument("log_level '" + std::string(level) +
                           "' is not one of debug, info, warning, error");
}

Result<NodeServerOptions> ToServerOptions(const NodeDaemonConfig& c) {
    if (c.socket_path.empty()) return InvalidArgument("socket_path is empty");
    if (c.node_id.empty()) return InvalidArgument("node_id is empty");
    const std::uint64_t page = PageSize();
    if (c.segment_size == 0 || c.segment_size % page != 0) {
        return InvalidArgument("segment_size " + std::to_string(c.segment_size) +
                               " must be a positive multiple of the page size " +
                               std::to_string(page));
    }
    NodeServerOptions o;
    o.socket_path = c.socket_path;
    o.node_id = c.node_id;
    o.store.segment_size = c.segment_size;
    if (c.capacity && c.num_segments) {
        return InvalidArgument("give num_segments or capacity, not both");
    }
    if (c.capacity) {
        if (*c.capacity == 0) return InvalidArgument("capacity must be positive");
        if (*c.capacity < c.segment_size) {
            o.store.segment_size = (*c.capacity + page - 1) / page * page;
            o.store.num_segments = 1;
        } else {
            const std::uint64_t n = (*c.capacity + c.segment_size - 1) / c.segment_size;
            if (n > 64) {
                return InvalidArgument("capacity " + std::to_string(*c.capacity) + " needs " +
                                       std::to_string(n) + " segments of " +
                                       std::to_string(c.segment_size) +
                                       " bytes; at most 64 (raise segment_size)");
            }
            o.store.num_segments = static_cast<std::uint32_t>(n);
        }
    } else {
        o.store.num_segments = c.num_segments.value_or(4);
        if (o.store.num_segments == 0 || o.store.num_segments > 64) {
            return InvalidArgument("num_segments must be 1 .. 64");
        }
    }
    o.store.pinned_quota_bytes = c.pinned_quota_bytes;
    o.store.metadata_capacity_bytes = c.metadata_capacity_bytes;
    o.store.prefault = c.prefault_segments;
    o.store.huge_pages = c.segment_huge_pages;
    o.store.prepare_threads = c.prepare_threads;
    o.store.prepare_in_background = true;  // Listen at once.
    o.frame_timeout = c.frame_timeout;
    o.idle_timeout = c.idle_timeout;
    o.store.name = "mooncake_sparse_node";
    o.cache_capacity_bytes = c.cache_capacity_bytes;
    if (c.client_buffer_max_bytes < page) {
        return InvalidArgument("client_buffer_max_bytes must be at least one page");
    }
    o.client_buffer_max_bytes = c.client_buffer_max_bytes;
    o.read_threads = c.read_threads != 0
                         ? c.read_threads
                         : std::clamp<std::uint32_t>(std::thread::hardware_concurrency(), 1, 8);
    o.read_in_place = c.read_in_place;
    o.commit_staging_pinned_bytes = c.commit_staging_pinned_bytes;
    o.device_commit_group_bytes = c.device_commit_group_bytes;
    if (c.max_connections == 0) return InvalidArgument("max_connections must be positive");
    o.max_connections = c.max_connections;
    return o;
}

std::span<const std::string_view> ConfigKeys() {
    static constexpr std::string_view kKeys[] = {
        "socket_path",          "node_id",          "segment_size",
        "num_segments",         "capacity",         "pinned_quota_bytes",
        "cache_capacity_bytes", "client_buffer_max_bytes", "metadata_capacity_bytes",
        "read_threads",         "max_connections",  "frame_timeout",
        "idle_timeout",         "prefault_segments", "prepare_threads",
        "log_level",            "read_in_place",    "commit_staging_pinned_bytes",
        "gpu_commit_check",     "device_gather_engine_bytes", "segment_huge_pages",
        "device_commit_group_bytes"};
    return kKeys;
}

std::string DefaultSocketPath() {
    // XDG_RUNTIME_DIR (/run/user/UID) is per-user and private, but a container's root or a
    // service account often has none; /tmp always exists.
    const char* runtime = std::getenv("XDG_RUNTIME_DIR");
    struct stat st {};
    if (runtime != nullptr && runtime[0] == '/' && ::stat(runtime, &st) == 0 &&
        S_ISDIR(st.st_mode)) {
        return std::string(runtime) + "/mooncake-sparse/node.sock";
    }
    return "/tmp/mooncake-sparse-" + std::to_string(::geteuid()) + "/node.sock";
}

Status EnsureSocketDirectory(const std::string& socket_path) {
    const auto slash = socket_path.rfind('/');
    if (slash == std::string::npos || slash == 0) return Status::Ok();
    const std::string dir = socket_path.substr(0, slash);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
        if (errno != ENOENT) {
            return InvalidArgument("socket directory " + dir + ": " + std::strerror(errno));
        }
        // Only the last component is created, private to this user (the socket's own mode is
        // 0600 too); a missing parent is a typo worth reporting.
        if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
            return InvalidArgument("cannot create socket directory " + dir + ": " +
                                   std::strerror(errno));
        }
        if (::stat(dir.c_str(), &st) != 0) {
            return InvalidArgument("socket directory " + dir + ": " + std::strerror(errno));
        }
    }
    if (!S_ISDIR(st.st_mode)) return InvalidArgument(dir + " is not a directory");
    if (dir == DefaultSocketPath().substr(0, DefaultSocketPath().rfind('/')) &&
        (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0)) {
        // Under /tmp anyone could have made it first.
        return FailedPrecondition("socket directory " + dir +
                                  " is not owned by this user or is writable by others");
    }
    return Status::Ok();
}

std::string ConfigToJson(const NodeDaemonConfig& c) {
    nlohmann::ordered_json j;
    j["socket_path"] = c.socket_path;
    j["node_id"] = c.node_id;
    j["segment_size"] = c.segment_size;
    if (c.num_segments) j["num_segments"] = *c.num_segments;
    if (c.capacity) j["capacity"] = *c.capacity;
    j["pinned_quota_bytes"] = c.pinned_quota_bytes;
    j["cache_capacity_bytes"] = c.cache_capacity_bytes;
    j["client_buffer_max_bytes"] = c.client_buffer_max_bytes;
    j["metadata_capacity_bytes"] = c.metadata_capacity_bytes;
    j["read_threads"] = c.read_threads;
    j["read_in_place"] = c.read_in_place;
    j["commit_staging_pinned_bytes"] = c.commit_staging_pinned_bytes;
    j["gpu_commit_check"] = c.gpu_commit_check;
    j["device_gather_engine_bytes"] = c.device_gather_engine_bytes;
    j["device_commit_group_bytes"] = c.device_commit_group_bytes;
    j["max_connections"] = c.max_connections;
    j["frame_timeout"] = std::to_string(c.frame_timeout.count()) + "ms";
    j["idle_timeout"] = std::to_string(c.idle_timeout.count()) + "ms";
    j["prefault_segments"] = c.prefault_segments;
    j["segment_huge_pages"] = c.segment_huge_pages;
    j["prepare_threads"] = c.prepare_threads;
    j["log_level"] = c.log_level;
    return j.dump();
}

}  // namespace mooncake::sparse
