// The YAML document a configuration is read from: parsed within bounds (size, nesting, values
// with aliases expanded), every string valid UTF-8 without control characters, no repeated key;
// key paths ("train.steps", "model.layers.2.units") looked up; --set assignments applied.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mirrored::config_document {

constexpr uint64_t kMaxConfigBytes = uint64_t(4) << 20;  // a configuration is text, never this large

// name: the file (or "--set ...") messages name. Throws ConfigError.
YAML::Node parse_document(const std::string& text, const std::string& name);
// Applies "a.b.c=value" to the document, creating mappings on the way. Throws ConfigError.
void apply_set(YAML::Node root, const std::string& assignment);

std::vector<std::string> split_path(const std::string& path);
// The node at parts[i..] below node; Undefined where there is none.
YAML::Node lookup(const YAML::Node& node, const std::vector<std::string>& parts, size_t i = 0);
// A node's kind and value for messages: "the string 'abc'", "a list", "nothing".
std::string describe(const YAML::Node& n);

}  // namespace mirrored::config_document
