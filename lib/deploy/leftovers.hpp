#pragma once
// What a stopped model service can leave behind that would break the next one: processes still
// in its control group, and a TCP port still listened on (Linux /proc/net/tcp{,6} and
// /proc/PID/fd, proc(5)). Read-only; every function is cheap enough for a poll loop.

#include <cstdint>
#include <string>
#include <vector>

namespace modeld::deploy {

/// One process, by PID and the name in /proc/PID/comm ("" when it has exited meanwhile).
struct ProcessRef {
  std::uint32_t pid = 0;
  std::string name;
};

/// The name the kernel gives process `pid` (/proc/PID/comm, trimmed); "" when it is gone.
std::string process_name(std::uint32_t pid);

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

}  // namespace modeld::deploy
