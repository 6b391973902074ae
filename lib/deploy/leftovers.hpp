#pragma once
// What a stopped model service can leave behind that would break the next one: processes still
// in its control group, and a TCP port still listened on (Linux /proc/net/tcp{,6} and
// /proc/PID/fd, proc(5)). Read-only; every function is cheap enough for a poll loop.

#include <boost/asio/awaitable.hpp>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace modeld::units { class ServiceManager; }

namespace modeld::deploy {

/// One process, by PID and the name in /proc/PID/comm ("" when it has exited meanwhile).
struct ProcessRef {
  std::uint32_t pid = 0;
  std::string name;
};

/// Processes that hold a TCP socket listening on `port` (any address, IPv4 or IPv6), found by
/// the socket inodes of /proc/net/tcp and tcp6 in state LISTEN and the /proc/PID/fd links to
/// them; `listening` is true whenever such a socket exists, even when its holder cannot be seen.
struct PortUse {
  bool listening = false;
  std::vector<ProcessRef> holders;
};

/// Reads who listens on TCP `port` now (see PortUse).
PortUse port_use(std::uint16_t port);

/// "pid 12 (python3), pid 13 (VLLM::Worker)" for `procs`; "none" when empty.
std::string describe_processes(const std::vector<ProcessRef>& procs);

/// Who listens on `port` now besides the processes in `ours`; nullopt when nobody else does. A
/// listener whose holder modeld cannot see (another PID namespace) counts unless `may_be_ours`.
std::optional<PortUse> other_listeners(std::uint16_t port, const std::set<std::uint32_t>& ours, bool may_be_ours);

/// The processes of `unit`'s control group; none (with a warning) when the service manager cannot
/// list them, since a transient bus error must not cost the host its model (the unit state and
/// the ports are checked besides). Asks the manager (its thread, not the caller's blocks).
boost::asio::awaitable<std::set<std::uint32_t>> pids_or_none(units::ServiceManager& units, const std::string& unit);

}  // namespace modeld::deploy
