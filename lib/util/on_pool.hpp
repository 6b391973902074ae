#pragma once
// Running blocking work (disk I/O, hashing) off the event loop.

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <utility>

namespace modeld::util {

/// As on_pool below, on any executor of the disk pool, e.g. a strand of it, so that jobs posted
/// there run one at a time and in order (a record's writes).
// Not a coroutine: the executor and `f` travel inside the initiation, never as coroutine
// parameters (GCC 12 mishandles class temporaries passed to coroutines).
template <class R, class Executor, class F>
boost::asio::awaitable<R> on_executor(const Executor& pool_ex, F f) {
  namespace asio = boost::asio;
  return asio::async_initiate<const asio::use_awaitable_t<>&, void(R)>(
      [pool_ex](auto handler, F fn) {
        auto ex = asio::prefer(asio::get_associated_executor(handler), asio::execution::outstanding_work.tracked);
        asio::post(pool_ex, [handler = std::move(handler), fn = std::move(fn), ex]() mutable {
          R r = fn();
          asio::post(ex, [handler = std::move(handler), r = std::move(r)]() mutable {
            std::move(handler)(std::move(r));
          });
        });
      },
      asio::use_awaitable, std::move(f));
}

/// Runs `f` (blocking: disk or hashing) on `pool` and resumes the awaiting coroutine on its own
/// executor with f's result of type R. The posted-back handler tracks outstanding work, so the
/// io_context does not run out of work while the pool is busy. The job itself cannot be
/// interrupted: keep jobs to one block (a few MiB) so a cancellation waits for at most one.
template <class R, class F>
boost::asio::awaitable<R> on_pool(boost::asio::thread_pool& pool, F f) {
  return on_executor<R>(pool.get_executor(), std::move(f));
}

}  // namespace modeld::util
