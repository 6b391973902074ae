#include "util/files.hpp"
#include "util/text.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace modeld::util {

Error errno_error(int err, const std::filesystem::path& path, std::string_view what) {
  Errc code = err == ENOSPC || err == EDQUOT ? Errc::disk_full
              : err == ENOENT                ? Errc::not_found
                                             : Errc::io_error;
  // Under modeld.service's sandbox (ProtectSystem=strict) every path outside ReadWritePaths= is
  // read-only, however writable its disk: say so where the operator meets it.
  const std::string_view hint =
      err == EROFS ? " (under modeld.service's sandbox every path outside ReadWritePaths= is read-only: add "
                     "ReadWritePaths= for it in a drop-in, see /usr/share/doc/modeld/hardening.md)"
                   : "";
  return make_error(code, fmt::format("{}: {}: {}{}", path.string(), what, std::strerror(err), hint));
}

Result<void> fsync_directory(const std::filesystem::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_error(errno, dir, "open directory");
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return errno_error(err, dir, "fsync directory");
  return {};
}

Result<void> durable_rename(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return errno_error(errno, to, "rename");
  return fsync_directory(to.parent_path());
}

Result<void> write_file_atomically(const std::filesystem::path& path, std::string_view content,
                                   unsigned mode) {
  auto tmp = path;
  tmp += fmt::format(".tmp-{}", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return errno_error(errno, tmp, "create");
  const char* p = content.data();
  std::size_t left = content.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return errno_error(err, path, "write");
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fchmod(fd, mode) != 0 || ::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return errno_error(err, path, "fsync");
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return errno_error(err, path, "rename");
  }
  return fsync_directory(path.parent_path());
}

Result<std::string> read_file(const std::filesystem::path& path, std::size_t max_bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_error(errno, path, "open");
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return errno_error(err, path, "read");
    }
    if (n == 0) break;
    if (out.size() + static_cast<std::size_t>(n) > max_bytes) {
      ::close(fd);
      return make_error(Errc::io_error,
                        fmt::format("{}: larger than the limit of {} bytes", path.string(), max_bytes));
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return out;
}

Result<std::string> read_secret_file(const std::filesystem::path& path) {
  auto text = read_file(path, 64 * 1024);
  if (!text) return text.error();
  std::string s = std::move(*text);
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return std::string(trim(s));
}

std::string process_name(std::uint32_t pid) {
  auto comm = read_file(std::filesystem::path("/proc") / std::to_string(pid) / "comm", 4096);
  if (!comm) return "";
  return std::string(trim(*comm));
}

}  // namespace modeld::util
