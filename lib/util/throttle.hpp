#pragma once
// Rate-limiting a repeated journal line (refused clients), so that a client in a loop cannot
// flood the journal.

#include <chrono>
#include <cstddef>
#include <optional>

namespace modeld::util {

/// Counts events and says when one deserves a line again: at most once per `period`. Not
/// thread-safe (one owner on the event loop).
class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;

  /// A throttle letting one line through per `period` (the first event always gets one).
  explicit LogThrottle(Clock::duration period) : period_(period) {}

  /// Counts one event at `now`; when a line is due, returns how many events happened since the
  /// last line (this one included) and starts a new period, else nullopt. Never blocks.
  std::optional<std::size_t> count(Clock::time_point now = Clock::now()) {
    ++since_;
    if (noted_ && now - last_ < period_) return std::nullopt;
    noted_ = true;
    last_ = now;
    const std::size_t n = since_;
    since_ = 0;
    return n;
  }

 private:
  Clock::duration period_;
  Clock::time_point last_{};
  bool noted_ = false;
  std::size_t since_ = 0;
};

}  // namespace modeld::util
