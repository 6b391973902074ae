#pragma once
// stopping_old (stop_old.cpp): the old service stopped and gone, its GPU memory back.

#include "deploy/phase.hpp"

#include <chrono>

namespace modeld::deploy {

/// When stopping_old found nothing of the old service left (ns since the epoch, a SwitchMarks
/// mark); 0 when no model was active, so nothing was stopped.
struct Stopped {
  std::int64_t stop_done_ns = 0;
};

/// stopping_old: check that the new revision's files are still the verified ones (unless
/// planning put stopping_old first), record through `decisions` that the old model may go, then
/// stop the active model's unit and wait until nothing of it is left (then, when it was stopped, its
/// GPU memory back); returns when nothing of it was left.
boost::asio::awaitable<Result<Stopped>> run_stopping_old(Services& s, const Run& run, Decisions& decisions);

/// How long to wait for a unit to become inactive after StopUnit: its stop_timeout (the
/// drop-in's TimeoutStopSec=, after which systemd sends SIGKILL to the whole cgroup) plus a
/// grace for that kill and the cgroup to empty, so modeld never gives up just before systemd acts.
std::chrono::milliseconds stop_wait(std::chrono::milliseconds stop_timeout);

}  // namespace modeld::deploy
