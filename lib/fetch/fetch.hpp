#pragma once
// The download engine: fetches the files of one revision into its folder, several at once,
// hashing inline (SHA-256 for LFS files, git blob SHA-1 for the rest) so a fresh download needs
// no second read. Bytes go to a partial file under `.modeld/partial/`; a file gets its final
// name only after its size and hash match the listing and its data is fsynced.

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

/// Counters of one download run, updated on the io_context thread.
struct Progress {
  std::uint64_t bytes_done = 0;   ///< bytes of the listed files on disk (resumed bytes included)
  std::uint64_t bytes_total = 0;  ///< sum of the sizes of the files to fetch
  unsigned files_done = 0;         ///< files verified and given their final name
  unsigned files_total = 0;        ///< number of files to fetch
  double rate_bytes_per_s = 0;    ///< moving average over the last few seconds
};

/// What a run needs to know besides the files.
struct Options {
  std::string repo;                   ///< "org/name"
  std::string commit;                 ///< 40 hex digits; every file is fetched at this commit
  std::filesystem::path dest_dir;     ///< the revision folder; files land at dest_dir/PATH
  unsigned parallel_files = 8;        ///< files in flight at once
  std::uint64_t max_bytes_per_s = 0;  ///< 0 = unlimited
  unsigned max_attempts = 5;          ///< per file, for retryable failures (hub-protocol.md "Retries")
  /// Least time between two on_progress calls (the final call comes regardless).
  std::chrono::milliseconds progress_interval = std::chrono::milliseconds(500);
  /// First retry delay; later ones double up to 8x (1, 2, 4, 8, 8 s by default), with jitter.
  /// A Retry-After (seconds) from the server is honoured when longer. Tests shorten it.
  std::chrono::milliseconds backoff_base{1000};
};

/// A file that was downloaded and checked against the listing.
struct Fetched {
  std::string path;       ///< repository-relative, as listed
  std::uint64_t size = 0;  ///< bytes
  std::string digest;  ///< sha256 (LFS) or git blob sha1, lower-case hex, equal to the listing's
};

/// Downloads files for one revision. Memory: each file in flight holds one write block of
/// clamp(32 MiB / parallel_files, 256 KiB, 4 MiB), so a run stays near 32 MiB whatever the file
/// count (past 128 files in flight, 256 KiB each). Workers are coroutines on the caller's executor,
/// each bound to its own cancellation signal; the run forwards the caller's cancellation to all of
/// them, and the first failure cancels the others.
class Fetcher {
 public:
  /// `disk_pool` runs file writes, fsync and hashing so the event loop never blocks on them.
  Fetcher(hub::Hub& hub, http::Client& client, boost::asio::thread_pool& disk_pool, Options options);

  /// Fetches `files` (each a listing entry not yet present under dest_dir), calling
  /// `on_progress` at most every progress_interval and once at the end. Partial files already
  /// in `.modeld/partial/` for the same commit and digest are re-hashed and continued with Range.
  /// Stops within a second when the awaiting coroutine is cancelled (Errc::cancelled), leaving
  /// partial files for a later resume. Errors name the file: size_mismatch, checksum_mismatch
  /// (what arrived: e.g. an HTML page or an LFS pointer), hub_* and network errors after
  /// retries, disk_full, io_error; plan_invalid for a path that is not a safe relative path.
  /// The result lists the files in the order of `files`.
  boost::asio::awaitable<Result<std::vector<Fetched>>> run(std::vector<hub::RepoFile> files,
                                                           std::function<void(const Progress&)> on_progress);

 private:
  hub::Hub& hub_;
  http::Client& client_;
  boost::asio::thread_pool& pool_;
  Options options_;
};

}  // namespace modeld::fetch
