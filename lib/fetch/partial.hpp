#pragma once
// Partial files of the download engine: `dest_dir/.modeld/partial/NAME.part` holds the bytes of
// one file received so far, and `NAME.part.json` (the sidecar) says which file, at which commit,
// of which size and digest those bytes belong to, so a later run can tell whether the bytes may be
// continued. Everything here blocks on the file system; the engine runs it on its disk pool.

#include "util/error.hpp"
#include "verify/hash.hpp"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace modeld::fetch {

/// What a partial file is a prefix of; stored as the sidecar JSON
/// {"commit", "path", "size", "digest_kind": "sha256"|"git_sha1", "digest"}.
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

/// One partial file with its sidecar. Not thread-safe: one caller at a time (the engine awaits
/// each call before the next). Errors name the partial file's path.
class PartialFile {
 public:
  /// Names the partial of `expected.path` under `dest_dir`; touches nothing yet.
  PartialFile(const std::filesystem::path& dest_dir, Sidecar expected);
  ~PartialFile();
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;

  /// Opens the partial for writing: keeps the bytes on disk when the sidecar equals the expected
  /// one and the partial is not longer than the file, else deletes both and starts an empty partial
  /// after writing the sidecar atomically. Returns the bytes already on disk; io_error, disk_full.
  Result<std::uint64_t> open();

  /// Reads up to `buf.size()` bytes at `offset`; returns the count (0 at the end); io_error.
  Result<std::size_t> read_at(std::uint64_t offset, std::span<char> buf);

  /// Writes all of `data` at `offset`; io_error, or disk_full on ENOSPC/EDQUOT.
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
  Sidecar expected_;
  std::filesystem::path dir_;
  std::filesystem::path part_;
  std::filesystem::path sidecar_;
  std::filesystem::path final_;
  int fd_ = -1;
};

}  // namespace modeld::fetch
