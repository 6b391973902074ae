#pragma once
// JSON text for files, the API and events. Messages quote what servers sent (X-Error-Message,
// a body's first bytes), which need not be UTF-8; nlohmann::json's dump() throws on such
// bytes, so every dump goes through here and replaces them instead.

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace modeld::util {

/// `j` as JSON text (`indent` < 0: one line), invalid UTF-8 in strings replaced by U+FFFD;
/// never throws on string content.
std::string dump_json(const nlohmann::json& j, int indent = -1);

}  // namespace modeld::util
