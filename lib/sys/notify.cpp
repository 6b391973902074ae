#include "sys/notify.hpp"

#include "util/text.hpp"

#include <systemd/sd-daemon.h>

#include <cstdint>
#include <ctime>
#include <string>

namespace modeld::sys {

namespace {

// sd_notify() itself returns 0 without $NOTIFY_SOCKET; a failure to send is not worth stopping
// for (the service manager then reports the unit as it sees it), so results are ignored.
void send(const std::string& state) { (void)sd_notify(0, state.c_str()); }

// The protocol is newline-separated assignments: a newline in the text would end STATUS= early
// and turn the rest into another assignment; `systemctl status` prints the text to a terminal.
std::string status_assignment(std::string_view status) { return "STATUS=" + util::escape_control(status); }

}  // namespace

void notify_ready() { send("READY=1"); }

void notify_status(std::string_view status) { send(status_assignment(status)); }

void notify_reloading(std::string_view status) {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  const auto usec = static_cast<std::uint64_t>(ts.tv_sec) * 1000000u + static_cast<std::uint64_t>(ts.tv_nsec) / 1000u;
  send("RELOADING=1\n" + status_assignment(status) + "\nMONOTONIC_USEC=" + std::to_string(usec));
}

void notify_ready(std::string_view status) { send("READY=1\n" + status_assignment(status)); }

void notify_stopping() { send("STOPPING=1"); }

void notify_reloading() { send("RELOADING=1"); }

void notify_watchdog() { send("WATCHDOG=1"); }

std::optional<std::chrono::microseconds> watchdog_interval() {
  std::uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return std::nullopt;
  return std::chrono::microseconds(usec / 2);
}

}  // namespace modeld::sys
