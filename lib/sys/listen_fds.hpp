#pragma once
// Socket activation (sd_listen_fds(3)): the sockets systemd passed to the daemon.

#include <string>
#include <vector>

namespace modeld::sys {

/// The file descriptors passed by socket activation ($LISTEN_FDS, starting at fd 3), made
/// close-on-exec; empty when the daemon was started without them. Unsets the variables.
std::vector<int> listen_fds();

/// The file system path the AF_UNIX socket `fd` is bound to (getsockname), e.g. the
/// ListenStream= of the socket unit; empty when `fd` is not such a socket, is unnamed or
/// abstract, or getsockname fails.
std::string unix_socket_path(int fd);

}  // namespace modeld::sys
