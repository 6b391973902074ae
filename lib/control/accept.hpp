#pragma once
// What the control socket's server and the TCP /metrics listener share: accepting connections
// and running detached coroutines whose exceptions are logged. Internal to lib/control (it pulls
// in Asio; keep it out of public headers).

#include "sys/log.hpp"
#include "sys/task.hpp"

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace modeld::control::detail {

/// Runs `task` detached on `executor`; an exception escaping it is logged as an error line
/// "`what` failed: MESSAGE" (sys::log_failure) instead of ending the process.
inline void spawn_logged(boost::asio::any_io_executor executor, boost::asio::awaitable<void> task,
                         std::string what) {
  boost::asio::co_spawn(std::move(executor), std::move(task), sys::log_failure(std::move(what)));
}

/// Makes an emit on `slot` call `owner->stop()` (idempotent) while `owner` lives: how the server
/// and the metrics listener hang off the daemon's cancellation tree. An unconnected slot does nothing.
template <class Owner>
void stop_on(boost::asio::cancellation_slot slot, const std::shared_ptr<Owner>& owner) {
  if (!slot.is_connected()) return;
  slot.assign([weak = std::weak_ptr<Owner>(owner)](boost::asio::cancellation_type) {
    if (auto o = weak.lock()) o->stop();
  });
}

/// Stops `owner` once (sets `owner.stopped`, closes `owner.acceptor`) and closes every
/// connection still alive in `table` (id -> weak_ptr to a connection with close()); the
/// connections are copied first, as closing one wakes its coroutine, which leaves the table.
template <class Owner, class Table>
void stop_listening(Owner& owner, Table& table) {
  if (owner.stopped) return;
  owner.stopped = true;
  boost::system::error_code ec;
  owner.acceptor.close(ec);
  std::vector<decltype(table.begin()->second.lock())> open;
  for (auto& [id, weak] : table)
    if (auto c = weak.lock()) open.push_back(std::move(c));
  for (auto& c : open) c->close();
}

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
