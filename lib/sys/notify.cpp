#include "sys/notify.hpp"

#include <systemd/sd-daemon.h>

#include <cstdint>
#include <string>

namespace modeld::sys {

namespace {

// sd_notify() itself returns 0 without $NOTIFY_SOCKET; a failure to send is not worth stopping
// for (the service manager then reports the unit as it sees it), so results are ignored.
void send(const std::string& state) { (void)sd_notify(0, state.c_str()); }

}  // namespace

void notify_ready() { send("READY=1"); }

void notify_status(std::string_view status) {
  // The protocol is newline-separated assignments: a newline in the text would end STATUS= early
  // and turn the rest into another assignment.
  std::string line = "STATUS=";
  for (char c : status) line.push_back(c == '\n' || c == '\r' ? ' ' : c);
  send(line);
}

void notify_stopping() { send("STOPPING=1"); }

void notify_reloading() { send("RELOADING=1"); }

void notify_watchdog() { send("WATCHDOG=1"); }

std::optional<std::chrono::microseconds> watchdog_interval() {
  std::uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return std::nullopt;
  return std::chrono::microseconds(usec / 2);
}

}  // namespace modeld::sys
