#pragma once
// Internal to lib/store: name checks and tree walks shared by store.cpp and manifest.cpp.

#include "util/error.hpp"

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <utility>

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

}  // namespace modeld::store::detail
