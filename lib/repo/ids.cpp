#include "repo/ids.hpp"

namespace modeld::repo {

namespace {

bool ascii_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// A character that may start or end a part of a repository id (a regex word character in ASCII).
bool word_char(char c) { return ascii_alnum(c) || c == '_'; }

// One part of a repository id (the namespace or the name): non-empty, of the allowed
// characters, and a word character at both ends.
bool valid_repo_part(std::string_view part) {
  if (part.empty() || !word_char(part.front()) || !word_char(part.back())) return false;
  for (char c : part)
    if (!word_char(c) && c != '-' && c != '.') return false;
  return true;
}

}  // namespace

// The rules are those huggingface_hub v1.28.0 documents for validate_repo_id
// (src/huggingface_hub/utils/_validators.py, its docstring "Rules" and REPO_ID_REGEX): "repo_name"
// or "namespace/repo_name"; letters, digits, '-', '_', '.' (ASCII, as the docstring says; the
// regex's \w there is Unicode-aware, which the library later restricted to ASCII); each part
// bounded by word characters, so it cannot start or end with '-' or '.'; the name 1..96
// characters; "--" and ".." forbidden; no ".git" suffix. modeld also requires the namespace:
// its contract's repositories are "org/name".
bool valid_repo_id(std::string_view repo) noexcept {
  const auto slash = repo.find('/');
  if (slash == std::string_view::npos) return false;
  const auto name = repo.substr(slash + 1);
  if (!valid_repo_part(repo.substr(0, slash)) || !valid_repo_part(name) || name.size() > 96) return false;
  if (repo.find("--") != std::string_view::npos || repo.find("..") != std::string_view::npos) return false;
  return !repo.ends_with(".git");
}

bool is_commit_id(std::string_view s) noexcept {
  return s.size() == 40 && s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

bool valid_model_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 64) return false;
  auto lower_alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!lower_alnum(name[0])) return false;
  for (char c : name)
    if (!lower_alnum(c) && c != '.' && c != '_' && c != '-') return false;
  return true;
}

}  // namespace modeld::repo
