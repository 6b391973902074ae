#pragma once
// The page cache, read and filled: how much of a file is resident (mincore(2) over read-only
// mappings), dropping a file's pages (posix_fadvise DONTNEED), the host's memory from
// /proc/meminfo, and a warmer that reads files into the page cache in order, within a byte
// budget, with reader threads of its own. Knows nothing of models or deployments.

#include "util/error.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

namespace modeld::warm {

/// Bytes of `file` that are in the page cache now (whole pages, capped at the file's size),
/// measured with mincore(2) over read-only mappings of at most 1 GiB at a time. Blocks (mmap,
/// mincore). Errors: io_error naming the file when it cannot be opened or mapped.
Result<std::uint64_t> resident_bytes(const std::filesystem::path& file);

/// Asks the kernel to drop `file`'s clean pages from the page cache (posix_fadvise
/// POSIX_FADV_DONTNEED over the whole file); dirty pages stay. Blocks. Errors: io_error naming the file.
Result<void> drop_cached(const std::filesystem::path& file);

/// The host's memory as /proc/meminfo reports it, in bytes.
struct Memory {
  std::uint64_t available = 0;  ///< MemAvailable: what can be used without swapping
  std::uint64_t total = 0;      ///< MemTotal
};

/// Reads MemAvailable and MemTotal from `text` in /proc/meminfo's format ("MemTotal: 123 kB");
/// does not block. Errors: io_error when either line is missing or malformed.
Result<Memory> parse_meminfo(std::string_view text);

/// Reads and parses /proc/meminfo (or `path`). Blocks (a small read). Errors: io_error.
Result<Memory> read_memory(const std::filesystem::path& path = "/proc/meminfo");

/// A stop request shared by a warmer's threads and whoever may cancel it: request() wakes every
/// wait at once. Thread-safe.
class Stop {
 public:
  /// Asks the warmer to stop; never blocks for long (takes a mutex).
  void request();
  /// Whether request() was called; does not block.
  bool requested() const noexcept { return stopped_.load(std::memory_order_relaxed); }
  /// Waits until `deadline` or a stop request, whichever comes first; returns whether a stop was requested. Blocks.
  bool wait_until(std::chrono::steady_clock::time_point deadline);

 private:
  std::atomic<bool> stopped_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
};

/// Reads up to `n` bytes at byte `offset` of `fd` into `buffer`, as pread(2) does: the bytes read,
/// 0 at the file's end, -1 with errno set on an error. Blocks.
using ReadFn = std::function<ssize_t(int fd, void* buffer, std::size_t n, std::uint64_t offset)>;

/// How a warmer reads.
struct Options {
  std::uint64_t budget = 0;               ///< most bytes it may read into the page cache
  unsigned readers = 4;                   ///< reader threads of its own
  std::size_t block = 8u << 20;           ///< bytes per pread (one reusable buffer per reader)
  std::uint64_t max_bytes_per_s = 0;      ///< read rate limit over all readers; 0: the disk's speed
  std::chrono::milliseconds progress_every{250};  ///< least time between two progress calls
  ReadFn read;                            ///< how blocks are read; empty: pread(2) (tests inject faults here)
};

/// What a warmer found and read so far, in bytes, over the files it was given.
struct Progress {
  std::uint64_t bytes_total = 0;            ///< size of every file given
  std::uint64_t bytes_resident_before = 0;  ///< in the page cache before it read anything
  std::uint64_t bytes_warmed = 0;           ///< read by it into the page cache
};

/// A file the warmer left alone, and why ("RAM budget", or the error that stopped it).
struct Skipped {
  std::filesystem::path path;
  std::uint64_t bytes = 0;  ///< the file's size (0 when it could not be opened)
  std::string reason;
};

/// A read that failed while warming: an error other than EINTR (those are retried), e.g. EIO.
struct ReadFailure {
  std::filesystem::path path;  ///< the file, as given
  std::uint64_t offset = 0;    ///< the byte of the file the failed read started at
  int err = 0;                 ///< its errno
};

/// The outcome of a warmer's run.
struct Report {
  Progress totals;
  std::vector<std::filesystem::path> warmed;  ///< files now read in whole, in the order given
  std::vector<Skipped> skipped;               ///< in the order given
  bool budget_reached = false;                ///< some file did not fit in the budget
  bool stopped = false;                       ///< a stop request ended it early
  std::optional<ReadFailure> read_failure;    ///< the first read error, which ended it early (warmed then empty)
};

/// Called with the running totals (from the calling thread once residency is measured, then from
/// a reader thread at most every progress_every, and once at the end); must not block for long.
using ProgressFn = std::function<void(const Progress&)>;

/// Measures what of `files` is resident, then reads the non-resident pages of the first files
/// (in the given order) whose non-resident bytes fit together in `options.budget`: the first
/// file that does not fit and every later one are skipped ("RAM budget"). A file that cannot be
/// opened is skipped with its error and the others still warmed. `options.readers` threads of
/// its own pread `options.block` bytes at a time, skipping pages mincore shows resident; a stop
/// request ends it after the blocks in flight, and so does a read error (report.read_failure:
/// an error is not a skip). Blocks until done (run it off the event loop).
Report warm_files(const std::vector<std::filesystem::path>& files, const Options& options, const ProgressFn& progress,
                  Stop& stop);

}  // namespace modeld::warm
