#pragma once
// The sd_notify protocol (sd_notify(3)): readiness, status text and the watchdog.

#include <chrono>
#include <optional>
#include <string_view>

namespace modeld::sys {

/// Tells the service manager that start-up is complete (READY=1); no-op without $NOTIFY_SOCKET.
void notify_ready();

/// Sets the one-line status `systemctl status` shows (STATUS=...), control characters escaped
/// (util::escape_control); no-op without $NOTIFY_SOCKET.
void notify_status(std::string_view status);

/// Tells the service manager that the daemon is stopping (STOPPING=1).
void notify_stopping();

/// Tells the service manager that the daemon is reloading its configuration (RELOADING=1).
void notify_reloading();

/// RELOADING=1 with STATUS=`status` and MONOTONIC_USEC (CLOCK_MONOTONIC now, which systemd 253's
/// Type=notify-reload wants) in one message, so `systemctl status` says why it reloads.
void notify_reloading(std::string_view status);

/// READY=1 with STATUS=`status` (escaped as by notify_status()) in one message: start-up or a
/// reload is complete.
void notify_ready(std::string_view status);

/// Pets the watchdog (WATCHDOG=1).
void notify_watchdog();

/// The interval at which to pet the watchdog (half of WatchdogSec=), or nullopt when the
/// watchdog is off (sd_watchdog_enabled(3)).
std::optional<std::chrono::microseconds> watchdog_interval();

}  // namespace modeld::sys
