#include "util/poll.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

namespace modeld::util {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {
// Checked before every co_await: with the awaitable default (throw_if_cancelled), awaiting after
// a cancellation would throw instead of returning a value.
asio::awaitable<bool> is_cancelled() {
  co_return (co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none;
}
}  // namespace

asio::awaitable<bool> pause_for(Clock::duration duration) {
  if (co_await is_cancelled()) co_return false;
  asio::steady_timer timer(co_await asio::this_coro::executor);
  timer.expires_after(duration);
  auto [ec] = co_await timer.async_wait(asio::as_tuple(asio::use_awaitable));
  co_return ec != asio::error::operation_aborted;
}

asio::awaitable<PollEnd> poll_until(Clock::time_point deadline, std::chrono::milliseconds interval,
                                    std::function<asio::awaitable<bool>()> check) {
  for (;;) {
    if (co_await is_cancelled()) co_return PollEnd::cancelled;
    const auto began = Clock::now();
    if (co_await check()) co_return PollEnd::done;
    if (began >= deadline) co_return PollEnd::deadline;
    const auto now = Clock::now();
    // One more check at the deadline itself, so what it saw there is what the caller reports.
    if (!co_await pause_for(std::max<Clock::duration>(Clock::duration{}, std::min<Clock::duration>(interval, deadline - now))))
      co_return PollEnd::cancelled;
  }
}

}  // namespace modeld::util
