#pragma once
// Partial files of the download engine: `dest_dir/.modeld/partial/NAME.part` holds the bytes of
// one file received so far, at their offsets (several parts of a file may be written at once, so a
// partial may have holes), and `NAME.part.json` (the sidecar) says which file, at which commit, of
// which size and digest those bytes belong to and which byte ranges hold them, so a later run can
// tell which bytes may be kept. Everything here blocks on the file system; the engine runs it on
// its disk pool.
//
// Which ranges are trusted after a crash: the sidecar is rewritten (atomically, without fsync)
// every few hundred milliseconds with the ranges written so far, and with the kernel's boot id.
// After a daemon crash or kill -9 on the same boot the page cache still holds every completed
// write, so those ranges are trusted. After a reboot (power loss) only the ranges of the last
// durable record are: the data was fdatasync'ed before that record was written and fsynced.

#include "fetch/ranges.hpp"
#include "util/error.hpp"
#include "verify/hash.hpp"

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace modeld::fetch {

/// Which file a partial file holds bytes of; stored in the sidecar JSON
/// {"commit", "path", "size", "digest_kind": "sha256"|"git_sha1", "digest", "boot_id",
/// "ranges": [[BEGIN, END], ...], "synced": [[BEGIN, END], ...]} (the last three are the state
/// that PartialFile keeps; a sidecar without "ranges", from modeld 0.1, means [0, file length)).
struct Sidecar {
  std::string commit;
  std::string path;
  std::uint64_t size = 0;
  verify::HashKind kind = verify::HashKind::sha256;
  std::string digest;  ///< lower-case hex, as the listing gives it

  /// The sidecar as one line of JSON.
  std::string to_json() const;
  /// Parses to_json()'s output; nullopt for anything else (the partial is then discarded).
  static std::optional<Sidecar> parse(std::string_view json);

  bool operator==(const Sidecar&) const = default;
};

/// The folder that holds the partial files of a revision folder: dest_dir/.modeld/partial.
std::filesystem::path partial_dir(const std::filesystem::path& dest_dir);

/// The partial file's name for a repository path: '%' becomes "%25" and '/' becomes "%2F", so
/// distinct paths never share a name, then ".part". Names that would pass 200 bytes use the
/// sha256 of the path instead (NAME_MAX is 255).
std::string partial_name(std::string_view repo_path);

/// Alignment (bytes) of file offsets, lengths and buffers for O_DIRECT writes; 4096 covers
/// every common logical block size.
inline constexpr std::size_t kDirectAlign = 4096;

/// The running kernel's boot id (/proc/sys/kernel/random/boot_id), or "" when unreadable.
std::string current_boot_id();

/// One partial file with its sidecar. read_at and write_at may run on several threads at once
/// (positioned I/O on one descriptor); record is serialised inside; open, truncate, promote,
/// discard and close need the caller to have no other call running. Errors name the file's path.
class PartialFile {
 public:
  /// Names the partial of `expected.path` under `dest_dir`; touches nothing yet.
  PartialFile(const std::filesystem::path& dest_dir, Sidecar expected);
  ~PartialFile();
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;

  /// Opens the partial for writing: keeps the bytes on disk when the sidecar describes the expected
  /// file and the partial is not longer than it, else deletes both and starts an empty partial
  /// after writing the sidecar atomically. Returns the byte ranges that hold trusted bytes (see
  /// the file comment; empty for a fresh partial); io_error, disk_full.
  Result<RangeSet> open();

  /// Rewrites the sidecar with `written` as the ranges on disk. `durable`: fdatasync the data
  /// first and make the new sidecar durable too (fsync, rename, fsync the folder), so the ranges
  /// survive a power loss; otherwise an atomic rename only (trusted on the same boot). io_error,
  /// disk_full.
  Result<void> record(const RangeSet& written, bool durable);

  /// Reads up to `buf.size()` bytes at `offset`; returns the count (0 at the end); io_error.
  Result<std::size_t> read_at(std::uint64_t offset, std::span<char> buf);

  /// Writes all of `data` at `offset`; io_error, or disk_full on ENOSPC/EDQUOT. The part that is
  /// kDirectAlign-aligned both in the file and in memory is written with O_DIRECT when the file
  /// system allows it (no page-cache copy); the rest is buffered.
  Result<void> write_at(std::uint64_t offset, std::span<const char> data);

  /// Cuts the partial to `length` bytes; io_error.
  Result<void> truncate(std::uint64_t length);

  /// fsyncs the partial's data; io_error.
  Result<void> sync();

  /// Gives the partial its final name dest_dir/PATH: creates the parent folders, renames (same
  /// file system) and fsyncs the folder, removes the sidecar and fsyncs the partial folder.
  /// io_error, disk_full.
  Result<void> promote();

  /// Closes and deletes the partial and its sidecar (nothing is reported: a leftover is
  /// discarded by the next open() anyway).
  void discard();

  /// Closes the file descriptor, keeping the files.
  void close();

  const std::filesystem::path& part_path() const { return part_; }
  const std::filesystem::path& sidecar_path() const { return sidecar_; }
  const std::filesystem::path& final_path() const { return final_; }

 private:
  std::string sidecar_json(const RangeSet& written) const;
  void open_direct();

  Sidecar expected_;
  std::string boot_id_;
  RangeSet synced_;  // ranges of the last durable record
  std::mutex record_mutex_;
  std::filesystem::path dir_;
  std::filesystem::path part_;
  std::filesystem::path sidecar_;
  std::filesystem::path final_;
  int fd_ = -1;
  int direct_fd_ = -1;  // the same file opened with O_DIRECT; -1 where unsupported
};

}  // namespace modeld::fetch
