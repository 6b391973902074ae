#pragma once
// Socket activation (sd_listen_fds(3)): the sockets systemd passed to the daemon.

#include <vector>

namespace modeld::sys {

/// The file descriptors passed by socket activation ($LISTEN_FDS, starting at fd 3), made
/// close-on-exec; empty when the daemon was started without them. Unsets the variables.
std::vector<int> listen_fds();

}  // namespace modeld::sys
