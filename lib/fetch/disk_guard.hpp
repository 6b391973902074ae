#pragma once
// The disk reserve while downloading: free space on the file system of the revision folder never
// drops below daemon.disk_reserve, whatever the listing claimed or whoever else writes there.
// Planning sums the listed sizes, but a listing may lie and other writers share the disk, so
// every block is checked against the file system itself (statvfs) before it is written.
// statvfs counts a write in flight partly (the pages it has copied so far) while its grant still
// counts it whole, so near the reserve a grant waits for the writes in flight to land and asks
// statvfs again: a download whose bytes fit is never stopped for counting a block twice.

#include "util/error.hpp"

#include <condition_variable>
#include <cstddef>
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
  /// space minus the writes granted and not yet released would fall below the reserve. When it
  /// would fall below only because of those writes, it first blocks until they are released and
  /// decides on a fresh statvfs(2). Blocks: call it on the disk pool, and release every grant
  /// once its write returns. io_error when statvfs fails.
  Result<void> acquire(std::string_view file, std::uint64_t bytes);

  /// Ends a grant of `bytes` once written (or failed): statvfs shows the bytes from now on;
  /// wakes the grants waiting for the writes in flight. Does not block beyond a mutex.
  void release(std::uint64_t bytes);

  /// How many acquire() calls are waiting for writes in flight to land (for tests and
  /// diagnostics); does not block beyond a mutex.
  std::size_t waiting();

 private:
  bool fits(std::uint64_t free, std::uint64_t bytes) const;

  std::filesystem::path dir_;
  std::uint64_t reserve_;
  std::mutex mu_;
  std::condition_variable landed_;  // notified when no granted write is in flight
  std::uint64_t granted_ = 0;       // bytes granted whose writes have not returned yet
  std::size_t waiting_ = 0;         // acquire() calls waiting on landed_
};

}  // namespace modeld::fetch
