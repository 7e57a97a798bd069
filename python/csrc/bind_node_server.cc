// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// `_NodeServer`: the node daemon's server hosted in a Python process. This is how a node runs
// its daemon on a store whose client only exists in Python (upstream Mooncake Store): the
// sparse layer of the daemon then reads remote sources through that store while every process
// of the node talks to the daemon as usual (connect("unix://...")), so the daemon's caches and
// single-flight table dedup the node's range reads across nodes. The standalone
// mooncake_sparse_node binary is the same server on the node's own segments.
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "arrays.h"
#include "bind_common.h"
#include "python_object_store.h"

#if MCS_PY_WITH_NODE_SERVER
#include "daemon/node_server.h"
#endif

namespace mooncake::sparse::py {

void RegisterNodeServer(pyb::module_& m) {
#if MCS_PY_WITH_NODE_SERVER
    pyb::class_<NodeServer>(m, "_NodeServer", "The node daemon's server, run in this process.")
        .def(pyb::init([](const std::string& socket_path, const std::string& node_id,
                          const pyb::object& sparse_objects, std::uint64_t segment_size,
                          std::uint32_t num_segments, std::uint64_t pinned_quota_bytes,
                          std::uint64_t cache_capacity_bytes, std::uint32_t read_threads) {
                 NodeServerOptions o;
                 o.socket_path = socket_path;
                 o.node_id = node_id;
                 o.store.segment_size = segment_size;
                 o.store.num_segments = num_segments;
                 o.store.pinned_quota_bytes = pinned_quota_bytes;
                 o.cache_capacity_bytes = cache_capacity_bytes;
                 o.read_threads = read_threads;
                 if (!sparse_objects.is_none()) o.sparse_objects = MakePythonObjectStore(sparse_objects);
                 pyb::gil_scoped_release nogil;
                 return ValueOrThrow(NodeServer::Start(o));
             }),
             pyb::arg("socket_path"), pyb::arg("node_id") = "node0",
             pyb::arg("sparse_objects") = pyb::none(),
             pyb::arg("segment_size") = std::uint64_t{256} << 20, pyb::arg("num_segments") = 4,
             pyb::arg("pinned_quota_bytes") = 0,
             pyb::arg("cache_capacity_bytes") = std::uint64_t{1} << 30,
             pyb::arg("read_threads") = 2)
        .def("stop", &NodeServer::Stop, pyb::call_guard<pyb::gil_scoped_release>(),
             "Closes every connection and removes the socket file (idempotent).")
        .def("metrics",
             [](const NodeServer& s) {
                 std::vector<std::pair<std::string, double>> items;
                 {
                     pyb::gil_scoped_release nogil;
                     items = s.MetricItems();
                 }
                 return MetricsDict(items);
             })
        .def_property_readonly("socket_path",
                               [](const NodeServer& s) { return s.options().socket_path; });
    m.attr("HAS_NODE_SERVER") = true;
#else
    m.attr("HAS_NODE_SERVER") = false;
#endif
}

}  // namespace mooncake::sparse::py
