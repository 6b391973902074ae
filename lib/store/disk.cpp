// File identity, free space and the eviction plan.

#include "store/store.hpp"

#include "util/files.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <sys/stat.h>
#include <sys/statvfs.h>

namespace modeld::store {

namespace {
std::int64_t ns(const struct timespec& t) {
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + static_cast<std::int64_t>(t.tv_nsec);
}
}  // namespace

Result<FileIdentity> identity_of(const std::filesystem::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return util::errno_error(errno, path, "stat");
  if (!S_ISREG(st.st_mode)) return make_error(Errc::io_error, fmt::format("{}: not a regular file", path.string()));
  FileIdentity id;
  id.device = static_cast<std::uint64_t>(st.st_dev);
  id.inode = static_cast<std::uint64_t>(st.st_ino);
  id.size = static_cast<std::uint64_t>(st.st_size);
  id.mtime_ns = ns(st.st_mtim);
  id.ctime_ns = ns(st.st_ctim);
  return id;
}

Result<std::uint64_t> free_bytes(const std::filesystem::path& path) {
  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) != 0) return util::errno_error(errno, path, "statvfs");
  return static_cast<std::uint64_t>(vfs.f_bavail) * static_cast<std::uint64_t>(vfs.f_frsize);
}

DiskPlan plan_disk(std::uint64_t bytes_needed, std::uint64_t bytes_free, std::uint64_t reserve,
                   std::vector<EvictionCandidate> candidates) {
  DiskPlan plan;
  plan.bytes_needed = bytes_needed;
  plan.bytes_free = bytes_free;
  plan.reserve = reserve;
  // needed <= free - reserve + evicted, rearranged so that nothing is subtracted: free may be
  // below the reserve already, and 128 bits keep the sums from wrapping.
  __extension__ using u128 = unsigned __int128;
  u128 evicted = 0;
  auto fits = [&] { return u128(bytes_needed) + reserve <= u128(bytes_free) + evicted; };
  // stable: candidates that last served at the same moment keep the caller's order.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const auto& a, const auto& b) { return a.last_active < b.last_active; });
  for (auto& c : candidates) {
    if (fits()) break;
    if (c.size_bytes == 0) continue;  // deleting it would free nothing
    evicted += c.size_bytes;
    plan.evict.push_back(std::move(c));
  }
  plan.fits = fits();
  return plan;
}

}  // namespace modeld::store
