#pragma once
// What the control socket's server and the TCP /metrics listener share: accepting connections,
// running detached coroutines whose exceptions are logged, and rate-limiting the journal lines
// about refused connections. Internal to lib/control (it pulls
// in Asio; keep it out of public headers).

#include "sys/log.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <optional>
#include <string>
#include <utility>

namespace modeld::control::detail {

/// Runs `task` detached on `executor`; an exception escaping it is logged as an error line
/// "`what` failed: MESSAGE" instead of ending the process.
inline void spawn_logged(boost::asio::any_io_executor executor, boost::asio::awaitable<void> task,
                         std::string what) {
  boost::asio::co_spawn(std::move(executor), std::move(task), [what = std::move(what)](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      sys::logf(sys::Level::error, "{} failed: {}", what, ex.what());
    }
  });
}

/// Counts refused connections so that they are told at most once per 10 s: a client in a
/// reconnect loop must not flood the journal. Not thread-safe (one per listener, on its loop).
class RefusalNotes {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds every{10};  ///< the shortest time between two lines

  /// Counts one refused connection at `now`. Returns how many were counted since the last line
  /// was due (this one included) when a line is due now, else nullopt (write nothing then).
  std::optional<std::size_t> count(Clock::time_point now = Clock::now()) {
    ++since_line_;
    if (last_line_ && now - *last_line_ < every) return std::nullopt;
    last_line_ = now;
    return std::exchange(since_line_, 0);
  }

 private:
  std::size_t since_line_ = 0;
  std::optional<Clock::time_point> last_line_;
};

/// Accepts connections on `owner.acceptor` until it is closed or `owner.stopped` is set, giving
/// each socket to `owner.accepted(socket)`. A failed accept (EMFILE and the like, which repeat at
/// once) is logged as a warning naming `where` and retried after 100 ms rather than spun on.
/// `owner` must outlive the loop (callers hold a shared_ptr to it in the coroutine's frame).
template <class Owner>
boost::asio::awaitable<void> accept_each(Owner& owner, std::string where) {
  namespace asio = boost::asio;
  constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
  asio::steady_timer backoff(owner.executor);
  while (!owner.stopped) {
    auto [ec, socket] = co_await owner.acceptor.async_accept(use_tuple);
    if (owner.stopped || ec == asio::error::operation_aborted) co_return;
    if (ec) {
      sys::logf(sys::Level::warning, "{}: accept: {}, retrying", where, ec.message());
      backoff.expires_after(std::chrono::milliseconds(100));
      co_await backoff.async_wait(use_tuple);
      continue;
    }
    owner.accepted(std::move(socket));
  }
}

}  // namespace modeld::control::detail
