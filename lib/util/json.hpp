#pragma once
// JSON text for files, the API and events. Messages quote what servers sent (X-Error-Message,
// a body's first bytes), which need not be UTF-8; nlohmann::json's dump() throws on such
// bytes, so every dump goes through here and replaces them instead.

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

namespace modeld::util {

/// `j` as JSON text (`indent` < 0: one line), invalid UTF-8 in strings replaced by U+FFFD;
/// never throws on string content.
std::string dump_json(const nlohmann::json& j, int indent = -1);

/// `v`'s value as JSON, or null when it has none (the API's optional fields).
template <class T>
nlohmann::json or_null(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

}  // namespace modeld::util
