#pragma once
// Polling a condition until a deadline on the event loop: one timer per wait, no busy loop.

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <functional>

namespace modeld::util {

/// How a poll_until() ended.
enum class PollEnd {
  done,       ///< the check said it is done
  deadline,   ///< the deadline passed (the check ran once more at or after it and was not done)
  cancelled,  ///< the awaiting coroutine was cancelled (between checks or during a pause)
};

/// Awaits `check` (true: done, stop polling), then pauses `interval` (cut short at `deadline`)
/// and checks again, until the check is done, a check that began at or after `deadline` is not
/// done, or the awaiting coroutine is cancelled; never throws on cancellation, and a check
/// always runs at least once. Callers keep what the check saw (its error, the state to report)
/// in their own variables.
boost::asio::awaitable<PollEnd> poll_until(std::chrono::steady_clock::time_point deadline,
                                           std::chrono::milliseconds interval,
                                           std::function<boost::asio::awaitable<bool>()> check);

/// Pauses `duration` on a timer of the awaiting coroutine's executor; false when the pause was
/// cancelled (the coroutine's cancellation, checked before the pause too), true otherwise.
boost::asio::awaitable<bool> pause_for(std::chrono::steady_clock::duration duration);

}  // namespace modeld::util
