// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// `_NodeServer`: the node daemon's server hosted in a Python process. This is how a node runs
// its daemon on a store whose client only exists in Python (upstream Mooncake Store): the
// sparse layer of the daemon then reads remote sources through that store while every process
// of the node talks to the daemon as usual (connect("unix://...")), so the daemon's caches and
// single-flight table dedup the node's range reads across nodes, and its tensors are published
// there (a daemon of another node reads them by TransferEngine). The standalone
// mooncake_sparse_node binary is the same server on the node's own segments.
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "arrays.h"
#include "bind_common.h"
#include "python_object_store.h"

#if MCS_PY_WITH_NODE_SERVER
#include "node/daemon_config.h"
#include "node/node_server.h"
#endif

namespace mooncake::sparse::py {

void RegisterNodeServer(pyb::module_& m) {
#if MCS_PY_WITH_NODE_SERVER
    pyb::class_<NodeServer>(m, "_NodeServer", "The node daemon's server, run in this process.")
        .def(pyb::init([](const pyb::dict& config, const pyb::object& sparse_objects) {
                 // The binary's keys and value syntax (sizes "256MiB", durations "10s"), parsed
                 // by the same code: SetConfigKey and ToServerOptions.
                 NodeDaemonConfig c;
                 for (const auto& [key, value] : config) {
                     if (!pyb::isinstance<pyb::str>(key)) {
                         ThrowIfError(InvalidArgument("node daemon configuration keys are str"));
                     }
                     std::string text;
                     if (pyb::isinstance<pyb::bool_>(value)) {
                         text = value.cast<bool>() ? "true" : "false";
                     } else if (pyb::isinstance<pyb::int_>(value) ||
                                pyb::isinstance<pyb::str>(value)) {
                         text = pyb::str(value).cast<std::string>();
                     } else {
                         ThrowIfError(InvalidArgument(
                             "node daemon configuration '" + key.cast<std::string>() +
                             "' must be a str, an int or a bool"));
                     }
                     ThrowIfError(SetConfigKey(c, key.cast<std::string>(), text)
                                      .WithContext("node daemon configuration"));
                 }
                 NodeServerOptions o = ValueOrThrow(ToServerOptions(c));
                 ThrowIfError(EnsureSocketDirectory(o.socket_path));
                 if (!sparse_objects.is_none()) {
                     // Sparse objects and tensors both live in the distributed store: a tensor
                     // put through this daemon is read by a daemon of another node, and by
                     // upstream's own get_tensor.
                     o.sparse_objects = MakePythonObjectStore(sparse_objects);
                     o.tensor_objects = o.sparse_objects;
                     o.tensor_pinned_quota_bytes = o.store.pinned_quota_bytes;
                 }
                 pyb::gil_scoped_release nogil;
                 return ValueOrThrow(NodeServer::Start(o));
             }),
             pyb::arg("config"), pyb::arg("sparse_objects") = pyb::none(),
             "Starts a server from the binary's configuration keys (node_config_keys()).")
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
    m.def("node_config_keys", [] {
        std::vector<std::string> keys;
        for (std::string_view k : ConfigKeys()) keys.emplace_back(k);
        return keys;
    }, "The node daemon's configuration keys (flags of mooncake_sparse_node, YAML keys).");
    m.def("default_socket_path", &DefaultSocketPath,
          "Where the node daemon listens, and clients look, when no socket path is given.");
    m.attr("HAS_NODE_SERVER") = true;
#else
    m.attr("HAS_NODE_SERVER") = false;
#endif
}

}  // namespace mooncake::sparse::py
