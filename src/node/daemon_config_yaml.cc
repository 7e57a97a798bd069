// Copyright 2026 The mooncake-sparse Authors. Apache-2.0.
//
// The YAML side of the daemon's configuration: only the binary links yaml-cpp (the Python
// extension shares its process with upstream's bundled copy), so this lives apart from the
// key parsing in daemon_config.cc.
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>
#include <string>

#include "node/daemon_config.h"

namespace mooncake::sparse {

Status ApplyYamlConfig(std::string_view yaml, NodeDaemonConfig& config) {
    YAML::Node root;
    try {
        root = YAML::Load(std::string(yaml));
    } catch (const YAML::Exception& e) {
        return InvalidArgument(std::string("config is not valid YAML: ") + e.what());
    }
    if (root.IsNull()) return Status::Ok();  // An empty file sets nothing.
    if (!root.IsMap()) return InvalidArgument("config must be a YAML mapping of key: value");
    for (const auto& entry : root) {
        if (!entry.first.IsScalar()) return InvalidArgument("config keys must be scalars");
        const std::string key = entry.first.Scalar();
        if (!entry.second.IsScalar()) {
            return InvalidArgument("config key '" + key + "' must have a scalar value");
        }
        MCS_RETURN_IF_ERROR(SetConfigKey(config, key, entry.second.Scalar()));
    }
    return Status::Ok();
}

Status ApplyYamlConfigFile(const std::string& path, NodeDaemonConfig& config) {
    std::ifstream in(path);
    if (!in) return NotFound("cannot read config file '" + path + "'");
    std::stringstream text;
    text << in.rdbuf();
    return ApplyYamlConfig(text.str(), config).WithContext(path);
}

}  // namespace mooncake::sparse
