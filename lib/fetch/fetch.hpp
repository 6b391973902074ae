#pragma once
// The download engine: fetches the files of one revision into its folder over several
// connections at once, hashing inline (SHA-256 for LFS files, git blob SHA-1 for the rest) so a
// fresh download needs no second read. When fewer files remain than connections, an idle
// connection takes the second half of the largest remaining part of a file (ranged multi-part
// download), so the last huge shard does not crawl on one connection; the hash follows the
// contiguous prefix, re-reading from the page cache only the parts that arrived out of order.
// Bytes go to a partial file under `.modeld/partial/` whose sidecar records the byte ranges on
// disk (partial.hpp); a file gets its final name only after its size and hash match the listing
// and its data is fsynced.

#include "hub/hub.hpp"
#include "util/error.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace modeld::fetch {

/// Progress of one file being downloaded.
struct FileProgress {
  std::string path;                 ///< repository path
  std::uint64_t bytes_done = 0;     ///< bytes on disk or received
  std::uint64_t bytes_total = 0;    ///< the file's size
  double rate_bytes_per_s = 0;      ///< recent rate of this file; 0 until known
  unsigned connections = 0;         ///< connections fetching parts of it now
};

/// Counters of one download run, updated on the io_context thread.
struct Progress {
  std::uint64_t bytes_done = 0;   ///< bytes of the listed files on disk (resumed bytes included)
  std::uint64_t bytes_total = 0;  ///< sum of the sizes of the files to fetch
  unsigned files_done = 0;         ///< files verified and given their final name
  unsigned files_total = 0;        ///< number of files to fetch
  double rate_bytes_per_s = 0;    ///< moving average over the last few seconds
  std::vector<FileProgress> files;  ///< the files in flight, in listing order
};

/// What a run needs to know besides the files.
struct Options {
  std::string repo;                   ///< "org/name"
  std::string commit;                 ///< 40 hex digits; every file is fetched at this commit
  std::filesystem::path dest_dir;     ///< the revision folder; files land at dest_dir/PATH
  unsigned parallel_files = 8;        ///< connections at once (files, or parts of a large file)
  std::uint64_t max_bytes_per_s = 0;  ///< 0 = unlimited
  /// Bytes that must stay free on dest_dir's file system (daemon.disk_reserve): a write that
  /// would cross it ends the run with disk_full instead (disk_guard.hpp), partial files kept.
  std::uint64_t disk_reserve = 0;
  unsigned max_attempts = 5;  ///< attempts of one file in a row that bring no byte (hub-protocol.md "Retries")
  /// Failures in a row across the whole run with no byte arriving anywhere; failures of requests
  /// sent before the current retry pause began count once with it, so N connections failing at
  /// once on a dead Hub spend one retry, not N.
  unsigned retry_budget = 5;
  /// Most time the run may spend paused for retries in total (backoff and Retry-After); a
  /// Retry-After longer than what is left fails at once.
  std::chrono::milliseconds max_retry_wait = std::chrono::minutes(30);
  /// A file is split across idle connections only into parts of at least this many bytes.
  std::uint64_t min_part_size = 16u << 20;
  /// Least time between two on_progress calls (the final call comes regardless).
  std::chrono::milliseconds progress_interval = std::chrono::milliseconds(500);
  /// First retry delay; later ones double up to 8x (1, 2, 4, 8, 8 s by default), with jitter
  /// (hub::RetryPolicy's backoff; the budget and pause are hub::RetryBudget's).
  /// A Retry-After (seconds or HTTP-date) from the server is honoured when longer, and pauses
  /// every connection of the run. Tests shorten it.
  std::chrono::milliseconds backoff_base{1000};
};

/// A file that was downloaded and checked against the listing.
struct Fetched {
  std::string path;       ///< repository-relative, as listed
  std::uint64_t size = 0;  ///< bytes
  std::string digest;  ///< sha256 (LFS) or git blob sha1, lower-case hex, equal to the listing's
};

/// Downloads files for one revision. Memory is a fixed budget whatever the file sizes: each
/// connection holds one write block of clamp(16 MiB / parallel_files, 256 KiB, 2 MiB) (plus the
/// HTTP client's 1 MiB read block), and each file whose out-of-order parts are being hashed one
/// read block of the same size. Workers are coroutines on the caller's executor, each bound to its
/// own cancellation signal; the run forwards the caller's cancellation to all of them, and the
/// first failure cancels the others.
class Fetcher {
 public:
  /// `disk_pool` runs file writes, fsync and hashing so the event loop never blocks on them.
  Fetcher(hub::Hub& hub, http::Client& client, boost::asio::thread_pool& disk_pool, Options options);

  /// Fetches `files` (each a listing entry not yet present under dest_dir), calling
  /// `on_progress` at most every progress_interval and once at the end. Partial files already
  /// in `.modeld/partial/` for the same commit and digest keep their trusted ranges (partial.hpp):
  /// those bytes are re-hashed from disk, and only the holes are requested, with Range.
  /// Stops within a second when the awaiting coroutine is cancelled (Errc::cancelled), leaving
  /// partial files for a later resume. Errors name the file: size_mismatch, checksum_mismatch
  /// (what arrived: e.g. an HTML page or an LFS pointer), hub_* and network errors after
  /// retries, disk_full (the disk_reserve reached, or ENOSPC), io_error; plan_invalid for a path that is not a safe relative path.
  /// The result lists the files in the order of `files`.
  boost::asio::awaitable<Result<std::vector<Fetched>>> run(std::vector<repo::RepoFile> files,
                                                           std::function<void(const Progress&)> on_progress);

 private:
  hub::Hub& hub_;
  http::Client& client_;
  boost::asio::thread_pool& pool_;
  Options options_;
};

}  // namespace modeld::fetch
