// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// Helpers shared by the node tests: a private socket directory and a small in-process server.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "../status_matchers.h"
#include "node/node_server.h"

namespace mooncake::sparse::testing {

/// A private directory for the socket, removed at the end.
class TempDir {
public:
    TempDir() {
        char tmpl[] = "/tmp/mcs-node-test-XXXXXX";
        path_ = ::mkdtemp(tmpl);
    }
    ~TempDir() { std::filesystem::remove_all(path_); }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string Path(const std::string& name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

/// Two 4 MiB segments, 16 MiB client buffers.
inline NodeServerOptions SmallServer(const std::string& socket, const std::string& name,
                                     std::uint64_t cache_capacity_bytes) {
    NodeServerOptions o;
    o.socket_path = socket;
    o.store.segment_size = 4 << 20;
    o.store.num_segments = 2;
    o.store.name = name;
    o.client_buffer_max_bytes = 16 << 20;
    o.cache_capacity_bytes = cache_capacity_bytes;
    return o;
}

}  // namespace mooncake::sparse::testing
