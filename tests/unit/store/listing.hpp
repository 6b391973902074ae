#pragma once
// Test helpers of the store tests: digests and listing entries for file contents.

#include "repo/snapshot.hpp"
#include "verify/hash.hpp"

#include <optional>
#include <span>
#include <string>

namespace modeld::test {

/// The lower-case hex digest of `content` (sha256, or the git blob sha1 of it).
inline std::string digest(verify::HashKind kind, const std::string& content) {
  verify::Hasher h(kind, content.size());
  h.update(std::span<const char>(content.data(), content.size()));
  return h.hex();
}

/// The listing entry the Hub gives for `content` at `path` (LFS when `lfs`, with a blob id of a
/// stand-in pointer text).
inline repo::RepoFile listed(const std::string& path, const std::string& content, bool lfs) {
  repo::RepoFile f{path, content.size(), digest(verify::HashKind::git_sha1, lfs ? "ptr:" + content : content),
                  std::nullopt};
  if (lfs) f.lfs_sha256 = digest(verify::HashKind::sha256, content);
  return f;
}

}  // namespace modeld::test
