// Group membership of a connected peer, for the authorization of mutating routes.
//
// These are NSS lookups and run on the io_context thread: with local files they take
// microseconds, and they happen only for mutating requests from non-root peers.

#include "control/routes.hpp"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace modeld::control {
namespace {

// Reads "Groups:" of /proc/PID/status: the supplementary groups the process holds now (which
// include groups gained with sg/newgrp and miss groups added to the user after login).
bool process_has_group(pid_t pid, gid_t gid) {
  if (pid <= 0) return false;
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream groups(line.substr(7));
    unsigned long g = 0;
    while (groups >> g)
      if (g == gid) return true;
    return false;
  }
  return false;
}

// The supplementary groups of the peer's user in the group database.
bool user_has_group(uid_t uid, gid_t gid) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || !found) return false;
  if (pw.pw_gid == gid) return true;
  int n = 64;
  std::vector<gid_t> groups(static_cast<std::size_t>(n));
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) == -1) {
    // n now holds the number needed.
    groups.resize(static_cast<std::size_t>(n));
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) == -1) return false;
  }
  groups.resize(static_cast<std::size_t>(n));
  return std::find(groups.begin(), groups.end(), gid) != groups.end();
}

}  // namespace

bool peer_in_group(const Peer& peer, const std::string& group) {
  std::vector<char> buf(16384);
  struct group gr {};
  struct group* found = nullptr;
  if (getgrnam_r(group.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || !found) return false;
  const gid_t gid = gr.gr_gid;
  if (peer.gid == gid) return true;
  return user_has_group(peer.uid, gid) || process_has_group(peer.pid, gid);
}

}  // namespace modeld::control
