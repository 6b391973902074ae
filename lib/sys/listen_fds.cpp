#include "sys/listen_fds.hpp"

#include <systemd/sd-daemon.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <cstring>

namespace modeld::sys {

std::vector<int> listen_fds() {
  std::vector<int> out;
  int n = sd_listen_fds(1);
  for (int i = 0; i < n; ++i) {
    int fd = SD_LISTEN_FDS_START + i;
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    out.push_back(fd);
  }
  return out;
}

std::string unix_socket_path(int fd) {
  sockaddr_un addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || addr.sun_family != AF_UNIX)
    return {};
  const auto offset = offsetof(sockaddr_un, sun_path);
  // Unnamed (len == offset) or abstract (leading NUL): no path in the file system.
  if (len <= offset || addr.sun_path[0] == '\0') return {};
  return std::string(addr.sun_path, strnlen(addr.sun_path, len - offset));
}

}  // namespace modeld::sys
