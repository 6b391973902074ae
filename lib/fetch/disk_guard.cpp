#include "fetch/disk_guard.hpp"

#include "store/store.hpp"
#include "util/quantities.hpp"

#include <fmt/format.h>

namespace modeld::fetch {

DiskGuard::DiskGuard(std::filesystem::path dir, std::uint64_t reserve) : dir_(std::move(dir)), reserve_(reserve) {}

bool DiskGuard::fits(std::uint64_t free, std::uint64_t bytes) const {
  return free >= util::add_bytes(bytes, reserve_);
}

Result<void> DiskGuard::acquire(std::string_view file, std::uint64_t bytes) {
  std::unique_lock lock(mu_);
  auto free = store::free_bytes(dir_);
  if (!free) return free.error();
  if (!fits(*free, util::add_bytes(granted_, bytes)) && fits(*free, bytes)) {
    // Only the writes in flight stand in the way, and statvfs may already count part of them:
    // let them land, then count again with nothing counted twice.
    ++waiting_;
    landed_.wait(lock, [&] { return granted_ == 0; });
    --waiting_;
    free = store::free_bytes(dir_);
    if (!free) return free.error();
  }
  const std::uint64_t busy = util::add_bytes(granted_, bytes);
  if (!fits(*free, busy)) {
    const std::uint64_t left = *free > busy ? *free - busy : 0;
    return make_error(Errc::disk_full,
                      fmt::format("{}: writing {} more bytes would leave {} bytes free on the file system of {} "
                                  "({} free, {} being written), below daemon.disk_reserve ({} bytes): stopped "
                                  "before the reserve was crossed",
                                  file, bytes, left, dir_.string(), *free, granted_, reserve_),
                      std::vector<std::string>{std::string(file)});
  }
  granted_ = busy;
  return {};
}

void DiskGuard::release(std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  granted_ = granted_ > bytes ? granted_ - bytes : 0;
  if (granted_ == 0) landed_.notify_all();
}

std::size_t DiskGuard::waiting() {
  std::lock_guard lock(mu_);
  return waiting_;
}

}  // namespace modeld::fetch
