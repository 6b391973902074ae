#pragma once
// File system helpers that know nothing of models: atomic replacement, fsync, reading, a
// process's name.

#include "util/error.hpp"

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

namespace modeld::util {

/// A file descriptor owned by one object and closed with it (-1: none); move-only. Does not block
/// beyond close(2).
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) noexcept : fd_(fd) {}
  OwnedFd(OwnedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept {
    if (this != &other) {
      close_now();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd() { close_now(); }

  /// The descriptor, still owned here; -1 when none (open(2) failed).
  int get() const noexcept { return fd_; }

 private:
  void close_now() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_;
};

/// Replaces `path` with `content` atomically: writes "path.tmp-PID", fsyncs it, renames it over
/// `path` and fsyncs the directory; a crash leaves either the old or the new content, never a mix.
/// Returns io_error (or disk_full on ENOSPC) naming the path.
Result<void> write_file_atomically(const std::filesystem::path& path, std::string_view content,
                                   unsigned mode = 0644);

/// Reads a whole file of at most `max_bytes`; returns io_error naming the path, or not_found when
/// it does not exist.
Result<std::string> read_file(const std::filesystem::path& path, std::size_t max_bytes = 64u << 20);

/// Reads a secret kept in a file of at most 64 KiB (a token, an API key): its first line without
/// trailing whitespace. Errors name the path, never the content.
Result<std::string> read_secret_file(const std::filesystem::path& path);

/// The name the kernel gives process `pid` (/proc/PID/comm, what ps shows; vLLM names its
/// workers "VLLM::Worker" there), trimmed; "" when the process is gone or lives in another PID
/// namespace. Reads one small file; does not block beyond that.
std::string process_name(std::uint32_t pid);

/// fsyncs the directory `dir`, making a rename or unlink inside it durable; returns io_error.
Result<void> fsync_directory(const std::filesystem::path& dir);

/// Renames `from` to `to` (same file system) and fsyncs the parent directory of `to`.
Result<void> durable_rename(const std::filesystem::path& from, const std::filesystem::path& to);

/// Maps an errno value from an operation on `path` to an Error ("PATH: what: strerror"); EROFS
/// adds a hint about modeld.service's sandbox (ReadWritePaths=, docs/hardening.md).
Error errno_error(int err, const std::filesystem::path& path, std::string_view what);

}  // namespace modeld::util
