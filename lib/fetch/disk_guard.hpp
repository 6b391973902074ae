#pragma once
// The disk reserve while downloading: free space on the file system of the revision folder never
// drops below daemon.disk_reserve, whatever the listing claimed or whoever else writes there.
// Planning sums the listed sizes, but a listing may lie and other writers share the disk, so
// every block is checked against the file system itself (statvfs) before it is written.

#include "util/error.hpp"

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string_view>

namespace modeld::fetch {

/// Grants writes of new data on the file system of one folder while at least `reserve` bytes
/// would stay free; thread-safe (writes run on several disk-pool threads at once).
class DiskGuard {
 public:
  /// Watches the file system of `dir`, keeping `reserve` bytes free (0: only a full disk stops).
  DiskGuard(std::filesystem::path dir, std::uint64_t reserve);

  /// Grants `bytes` about to be written to `file` (a repository path, for the message), or
  /// returns disk_full naming the file, the folder, the free bytes and the reserve when free
  /// space minus the writes granted and not yet released would fall below the reserve. Blocks
  /// on statvfs(2): call it on the disk pool. io_error when statvfs fails.
  Result<void> acquire(std::string_view file, std::uint64_t bytes);

  /// Ends a grant of `bytes` once written (or failed): statvfs shows the bytes from now on.
  void release(std::uint64_t bytes);

 private:
  std::filesystem::path dir_;
  std::uint64_t reserve_;
  std::mutex mu_;
  std::uint64_t granted_ = 0;  // bytes granted whose writes have not returned yet
};

}  // namespace modeld::fetch
