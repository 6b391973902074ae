// Leftovers of a stopped service: who still listens on a port (proc(5): /proc/net/tcp{,6},
// /proc/PID/fd).
#include "deploy/leftovers.hpp"

#include "sys/log.hpp"
#include "units/service_manager.hpp"
#include "util/files.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <unistd.h>

namespace modeld::deploy {

namespace fs = std::filesystem;

namespace {

// Inodes of the sockets listening on `port` in one /proc/net/tcp-style table: columns are
// "sl local_address rem_address st ..." with the port as 4 hex digits after ':' and state 0A
// (TCP_LISTEN); the inode is the 10th column.
void listening_inodes(const char* table, std::uint16_t port, std::set<std::string>& out) {
  auto text = util::read_file(table, 64u << 20);
  if (!text) return;
  std::istringstream in(*text);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream cols(line);
    std::string sl, local, remote, st, queues, timer, retr, uid, timeout, inode;
    if (!(cols >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
    const auto colon = local.rfind(':');
    if (colon == std::string::npos || st != "0A") continue;
    if (std::strtoul(local.c_str() + colon + 1, nullptr, 16) != port) continue;
    out.insert(inode);
  }
}

}  // namespace

PortUse port_use(std::uint16_t port) {
  PortUse use;
  std::set<std::string> inodes;
  listening_inodes("/proc/net/tcp", port, inodes);
  listening_inodes("/proc/net/tcp6", port, inodes);
  if (inodes.empty()) return use;
  use.listening = true;
  std::set<std::string> wanted;
  for (const auto& i : inodes) wanted.insert("socket:[" + i + "]");
  std::error_code ec;
  for (fs::directory_iterator p("/proc", ec), end; !ec && p != end; p.increment(ec)) {
    const auto name = p->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code fec;
    for (fs::directory_iterator fd(p->path() / "fd", fec), fend; !fec && fd != fend; fd.increment(fec)) {
      char buf[64];
      const ssize_t n = ::readlink(fd->path().c_str(), buf, sizeof buf - 1);
      if (n <= 0 || !wanted.contains(std::string(buf, static_cast<std::size_t>(n)))) continue;
      const auto pid = static_cast<std::uint32_t>(std::strtoul(name.c_str(), nullptr, 10));
      use.holders.push_back({pid, util::process_name(pid)});
      break;
    }
  }
  return use;
}

std::string describe_processes(const std::vector<ProcessRef>& procs) {
  if (procs.empty()) return "none";
  std::vector<std::string> items;
  for (const auto& p : procs) items.push_back(fmt::format("pid {} ({})", p.pid, p.name.empty() ? "exited" : p.name));
  return fmt::format("{}", fmt::join(items, ", "));
}

std::optional<PortUse> other_listeners(std::uint16_t port, const std::set<std::uint32_t>& ours, bool may_be_ours) {
  auto use = port_use(port);
  if (!use.listening) return std::nullopt;
  if (use.holders.empty()) return may_be_ours ? std::nullopt : std::optional<PortUse>(use);
  std::erase_if(use.holders, [&](const ProcessRef& p) { return ours.contains(p.pid); });
  if (use.holders.empty()) return std::nullopt;
  return use;
}

boost::asio::awaitable<std::set<std::uint32_t>> pids_or_none(units::ServiceManager& units, const std::string& unit) {
  auto pids = co_await units.pids(unit);
  if (!pids) {
    sys::logf(sys::Level::warning, "cannot list the processes of {}: {}; counting none", unit, pids.error().message);
    co_return std::set<std::uint32_t>{};
  }
  co_return std::set<std::uint32_t>(pids->begin(), pids->end());
}

}  // namespace modeld::deploy
