#include "sys/listen_fds.hpp"

#include <systemd/sd-daemon.h>

#include <fcntl.h>

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

}  // namespace modeld::sys
