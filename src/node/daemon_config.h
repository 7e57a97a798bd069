// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Configuration of the node daemon `mooncake_sparse_node`: the same keys come from flags and
// from a YAML file (--config); an explicit flag wins over the file, the file over the default.
// Byte sizes accept a plain integer or a binary/decimal suffix ("256MiB", "1G", "64k").
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "node/node_server.h"
#include "mooncake/sparse/status.h"

namespace mooncake::sparse {

std::string DefaultSocketPath();

struct NodeDaemonConfig {
    std::string socket_path = DefaultSocketPath();
    std::string node_id = "node0";
    std::uint64_t segment_size = std::uint64_t{256} << 20;
    std::optional<std::uint32_t> num_segments;  ///< Or capacity; default 4 when neither.
    std::optional<std::uint64_t> capacity;      ///< Total segment bytes.
    std::uint64_t pinned_quota_bytes = 0;
    std::uint64_t cache_capacity_bytes = std::uint64_t{1} << 30;
    std::uint64_t client_buffer_max_bytes = std::uint64_t{1} << 30;
    std::uint64_t metadata_capacity_bytes = std::uint64_t{256} << 20;
    /// Materialization threads of one read call; 0: the hardware's threads, at most 8.
    std::uint32_t read_threads = 0;
    /// Reads build targets straight from the segments (no range copies, no range cache).
    bool read_in_place = false;
    /// Commits from clients' CUDA memory are checked and indexed on the GPU (a daemon built
    /// with the GPU codec, a usable GPU); off: on the host, from staging memory.
    bool gpu_commit_check = true;
    /// Host bytes pinned for the commits copied from clients' CUDA memory.
    std::uint64_t commit_staging_pinned_bytes = std::uint64_t{1} << 30;
    /// Entry bytes of the first group of a commit checked on the GPU; the groups after it grow
    /// threefold and are checked while the one before each is copied into the store. 0: the
    /// whole commit is checked before any of it is copied.
    std::uint64_t device_commit_group_bytes = 0;
    /// Runs of ranges of at least this many bytes that the daemon copies into a client's GPU
    /// memory (planned device reads, tensor restores) go to the copy engine, beside one gather
    /// kernel for the rest; 0: all by the kernel (a daemon built with the GPU codec).
    std::uint64_t device_gather_engine_bytes = std::uint64_t{256} << 10;
    std::uint32_t max_connections = 1024;
    /// A started frame must be complete (and a new connection must say Hello) within this.
    std::chrono::milliseconds frame_timeout{10000};
    /// A connection without state (no client buffer, no lease) idle this long is closed.
    std::chrono::milliseconds idle_timeout{60000};
    /// Populate every segment page in the background at start-up.
    bool prefault_segments = true;
    /// Segments in transparent huge pages where the kernel allows it (ShmStoreOptions).
    bool segment_huge_pages = false;
    /// Threads that pre-fault and pin the segments in the background.
    std::uint32_t prepare_threads = 4;
    std::string log_level = "info";  ///< debug | info | warning | error
};

/// "10s", "500ms", "2m", "1h", or a plain integer of seconds -> milliseconds ("0": none).
/// Errors: InvalidArgument (empty, not a number, unknown unit, overflow).
Result<std::chrono::milliseconds> ParseDuration(std::string_view text);

/// "4096", "64k", "256MiB", "1G", "2GB" -> bytes (k/M/G/T and KiB/MiB/GiB/TiB are powers of
/// 1024; KB/MB/GB/TB powers of 1000; case-insensitive).
/// Errors: InvalidArgument (empty, not a number, unknown suffix, overflow).
Result<std::uint64_t> ParseByteSize(std::string_view text);

/// Sets every key present in the YAML mapping `yaml` on `config`.
/// Errors: InvalidArgument (not a mapping, unknown key, bad value; the message names the key).
Status ApplyYamlConfig(std::string_view yaml, NodeDaemonConfig& config);

/// Reads `path` and applies it (ApplyYamlConfig).
/// Errors: NotFound (cannot read the file); InvalidArgument.
Status ApplyYamlConfigFile(const std::string& path, NodeDaemonConfig& config);

/// Sets one key from its text form (flags and YAML scalars share this).
/// Errors: InvalidArgument (unknown key or bad value).
Status SetConfigKey(NodeDaemonConfig& config, std::string_view key, std::string_view value);

/// The glog severity (0 INFO .. 2 ERROR) and verbosity of a log_level.
struct LogLevel {
    int min_severity = 0;
    int verbosity = 0;
};
/// Errors: InvalidArgument.
Result<LogLevel> ParseLogLevel(std::string_view level);

/// Every key SetConfigKey takes (the flags of the binary, YAML keys, Python keywords).
std::span<const std::string_view> ConfigKeys();

/// Where the daemon listens when no socket_path is given, and where clients look for it:
/// $XDG_RUNTIME_DIR/mooncake-sparse/node.sock when that directory exists, else
/// /tmp/mooncake-sparse-$EUID/node.sock.
std::string DefaultSocketPath();

/// Creates the socket's directory when it is missing (its last component only, mode 0700).
/// The default directory must belong to this user and not be writable by others.
/// Errors: InvalidArgument (cannot create it, not a directory); FailedPrecondition (the
/// default directory belongs to someone else).
Status EnsureSocketDirectory(const std::string& socket_path);

/// The resolved config as one JSON object of key -> value, each in a form SetConfigKey takes
/// (sizes in bytes, durations as "<n>ms"); unset optional keys are left out.
std::string ConfigToJson(const NodeDaemonConfig& config);

/// Validates a complete config and turns it into server options (segment count from capacity
/// when given; a capacity below one segment makes one segment of that size).
/// Errors: InvalidArgument.
Result<NodeServerOptions> ToServerOptions(const NodeDaemonConfig& config);

}  // namespace mooncake::sparse
