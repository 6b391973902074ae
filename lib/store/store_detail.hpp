#pragma once
// Internal to lib/store: name checks and tree walks shared by store.cpp and manifest.cpp.

#include "store/store.hpp"
#include "util/error.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace modeld::store::detail {

/// A (device, inode) pair, to count hard-linked files once.
using InodeKey = std::pair<std::uint64_t, std::uint64_t>;

/// Whether `commit` can be one folder name under .store/NAME/: 1-128 of [A-Za-z0-9._-], not
/// starting with '.' (so never ".", ".." or a hidden folder of ours).
bool valid_commit(std::string_view commit);

/// bad_request naming the model or commit when either is not a valid folder name.
Result<void> check_names(std::string_view name, std::string_view commit);

/// Sums the sizes of the regular files under `root` (not following symlinks), skipping files
/// whose (device, inode) is in `seen` and adding the others to it.
std::uint64_t tree_bytes(const std::filesystem::path& root, std::set<InodeKey>& seen);

/// Adds the (device, inode) of every regular file under `root` (not following symlinks) to `seen`.
void collect_inodes(const std::filesystem::path& root, std::set<InodeKey>& seen);

/// The names of the sub-folders of `dir` that are real directories (never symlinks), sorted;
/// none when `dir` cannot be read. Blocks (readdir, lstat).
std::vector<std::string> subdirectories(const std::filesystem::path& dir);

/// Whether `p` is a directory itself, not a symlink to one (lstat). Blocks.
bool is_real_directory(const std::filesystem::path& p);

/// Keeps manifests true across one link or unlink of modeld's own: a file's identity includes its
/// ctime, and a change of its link count (a hard link made or removed) changes the ctime.
/// Constructed just before the operation: holds the store's relinking lock exclusively (so
/// Store::manifest_still_matches_settled never sees the operation half-way) and remembers the
/// files of every manifest under the store (revisions for which `skip` is true excepted) whose
/// (device, inode) is in `inodes` and that still have their recorded identity. finish(): re-records
/// the ctime of each of those whose device, inode, size and mtime are unchanged, rewrites those
/// manifests (best effort: a stale manifest costs a re-hash later) and releases the lock; the
/// destructor calls it when the operation returns early. A file that differed from its manifest
/// before the operation is left differing. Blocks (stats, manifest reads and writes).
class Relinking {
 public:
  using Skip = std::function<bool(const std::string& name, const std::string& commit)>;
  Relinking(Store& store, const std::set<InodeKey>& inodes, const Skip& skip = {});
  Relinking(const Relinking&) = delete;
  Relinking& operator=(const Relinking&) = delete;
  ~Relinking() { finish(); }
  void finish();

 private:
  struct Recorded {
    std::string name;
    Manifest manifest;
    std::vector<std::size_t> files;  // indexes into manifest.files still as recorded
  };
  void remember(const std::string& name, const std::string& commit, const std::set<InodeKey>& inodes);

  Store& store_;
  std::unique_lock<std::shared_mutex> lock_;
  std::vector<Recorded> recorded_;
};

}  // namespace modeld::store::detail
