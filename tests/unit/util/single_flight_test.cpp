#include "util/single_flight.hpp"

#include "unit/http/catch_result.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <algorithm>
#include <optional>
#include <vector>

using namespace modeld;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

// A computation that takes `delay` and counts its runs.
asio::awaitable<Result<int>> slow(int& runs, int value, std::chrono::milliseconds delay) {
  ++runs;
  asio::steady_timer t(co_await asio::this_coro::executor, delay);
  co_await t.async_wait(asio::use_awaitable);
  co_return value;
}

}  // namespace

TEST_CASE("single-flight runs one computation per key at a time and shares its result") {
  asio::io_context io;
  util::SingleFlight<int> flights;
  int runs_a = 0, runs_b = 0;
  std::vector<int> got;
  auto ask = [&](std::string key, int& runs, int value) {
    asio::co_spawn(io, flights.run(key, [&runs, value] { return slow(runs, value, 50ms); }),
                   [&](std::exception_ptr e, Result<int> r) {
                     REQUIRE_FALSE(e);
                     REQUIRE(r);
                     got.push_back(*r);
                   });
  };
  for (int i = 0; i < 5; ++i) ask("a", runs_a, 1);
  ask("b", runs_b, 2);
  io.run();
  CHECK(runs_a == 1);
  CHECK(runs_b == 1);
  CHECK(got.size() == 6);
  CHECK(std::count(got.begin(), got.end(), 1) == 5);
  CHECK(flights.in_flight() == 0);
  ask("a", runs_a, 1);  // a later call runs again: single-flight is no cache
  io.restart();
  io.run();
  CHECK(runs_a == 2);
}

TEST_CASE("when the caller that runs the computation is cancelled, a waiter runs it again itself") {
  asio::io_context io;
  util::SingleFlight<int> flights;
  int runs = 0;
  asio::cancellation_signal cancel;
  std::optional<Result<int>> leader, waiter;
  asio::co_spawn(io, flights.run("k", [&runs] { return slow(runs, 7, 200ms); }),
                 asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e, Result<int> r) {
                   if (e) leader.emplace(make_error(Errc::cancelled, "threw"));  // operation_aborted
                   else leader.emplace(std::move(r));
                 }));
  asio::co_spawn(io, flights.run("k", [&runs] { return slow(runs, 7, 20ms); }),
                 [&](std::exception_ptr e, Result<int> r) {
                   REQUIRE_FALSE(e);
                   waiter.emplace(std::move(r));
                 });
  asio::steady_timer t(io, 20ms);
  t.async_wait([&](auto) { cancel.emit(asio::cancellation_type::terminal); });
  io.run();
  REQUIRE(leader);
  CHECK_FALSE(*leader);
  REQUIRE(waiter);
  REQUIRE(*waiter);
  CHECK(**waiter == 7);
  CHECK(runs == 2);
}
