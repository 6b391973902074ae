#pragma once
// The names modeld accepts for what it deploys: repository ids on the Hub, commit ids, and
// modeld's own model names. One rule each, shared by the configuration, the Hub client, the
// store, the control API and modelctl. Pure functions of their argument; nothing blocks.

#include <string_view>

namespace modeld::repo {

/// Whether `repo` is a repository id modeld deploys: "namespace/name" (modeld requires the
/// namespace), each part of ASCII letters, digits, '-', '_' and '.', starting and ending with a
/// letter, digit or '_', the name at most 96 characters, no "--" or ".." anywhere and no ".git"
/// at the end: the rules of huggingface_hub's validate_repo_id (v1.28.0).
bool valid_repo_id(std::string_view repo) noexcept;

/// Whether `s` is a full commit id as the Hub writes it: 40 lower-case hex digits.
bool is_commit_id(std::string_view s) noexcept;

/// Whether `name` is a valid model name: [a-z0-9][a-z0-9._-]{0,63} (interface.md).
bool valid_model_name(std::string_view name) noexcept;

}  // namespace modeld::repo
