#pragma once
// What a repository holds at one commit, as the Hub's listing describes it
// (../shared/docs/hub-protocol.md "Listing files"). Plain data without Asio, shared by the
// stages that read listings (hub), download them (fetch), keep them (store) and check them (verify).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace modeld::repo {

/// One file of a repository at a commit, as the listing describes it.
struct RepoFile {
  std::string path;               ///< repository-relative, '/'-separated
  std::uint64_t size = 0;         ///< real content size in bytes
  std::string blob_id;            ///< git blob sha1 (of the LFS pointer for LFS files)
  std::optional<std::string> lfs_sha256;  ///< content sha256 for LFS files
  /// Whether the file is stored in LFS (the listing gave its content sha256).
  bool is_lfs() const { return lfs_sha256.has_value(); }
};

/// A repository at one commit.
struct Snapshot {
  std::string repo;      ///< "org/name"
  std::string revision;  ///< what was asked for (branch, tag or commit)
  std::string commit;    ///< 40 hex digits
  std::vector<RepoFile> files;  ///< sorted by path
};

}  // namespace modeld::repo
