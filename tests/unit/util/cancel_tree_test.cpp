#include "util/cancel_tree.hpp"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <catch2/catch.hpp>

#include <chrono>
#include <vector>

using namespace modeld;
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

// Waits an hour on a timer; records whether the wait was cut short.
asio::awaitable<void> wait_long(bool& aborted) {
  asio::steady_timer t(co_await asio::this_coro::executor, 1h);
  auto [ec] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
  aborted = ec == asio::error::operation_aborted;
}

}  // namespace

TEST_CASE("one emit of a cancel tree ends every task bound to one of its children") {
  asio::io_context io;
  util::CancelTree tree;
  bool first = false, second = false, ended_first = false, ended_second = false;
  asio::co_spawn(io, wait_long(first), asio::bind_cancellation_slot(tree.child(), [&](std::exception_ptr) {
                   ended_first = true;
                 }));
  asio::co_spawn(io, wait_long(second), asio::bind_cancellation_slot(tree.child(), [&](std::exception_ptr) {
                   ended_second = true;
                 }));
  io.poll();
  CHECK_FALSE(ended_first);
  CHECK_FALSE(tree.emitted());
  tree.emit();
  CHECK(tree.emitted());
  io.run_for(10s);  // returns once both tasks ended; the bound is a safety net, not a wait
  CHECK(ended_first);
  CHECK(ended_second);
  CHECK(first);
  CHECK(second);
}

TEST_CASE("a cancel tree runs the handlers its children were given, once, in the order they were made") {
  util::CancelTree tree;
  std::vector<int> order;
  tree.child().assign([&](asio::cancellation_type) { order.push_back(1); });
  tree.child().assign([&](asio::cancellation_type t) {
    CHECK(t == asio::cancellation_type::terminal);
    order.push_back(2);
  });
  tree.emit();
  tree.emit();
  CHECK(order == std::vector<int>{1, 2});
  // A child made after the emit is never emitted.
  tree.child().assign([&](asio::cancellation_type) { order.push_back(3); });
  tree.emit();
  CHECK(order == std::vector<int>{1, 2});
}
