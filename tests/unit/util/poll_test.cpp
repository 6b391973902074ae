#include "util/poll.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <optional>

using namespace modeld;
using namespace std::chrono_literals;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

// Polls on a fresh io_context, counting checks; `done_at` is the check that says done (0: never).
struct Poll {
  asio::io_context ioc;
  int checks = 0;
  std::optional<util::PollEnd> end;

  void start(Clock::time_point deadline, std::chrono::milliseconds interval, int done_at,
             asio::cancellation_slot slot = {}) {
    auto check = [this, done_at]() -> asio::awaitable<bool> { co_return ++checks == done_at; };
    asio::co_spawn(ioc, util::poll_until(deadline, interval, check),
                   asio::bind_cancellation_slot(slot, [this](std::exception_ptr e, util::PollEnd r) {
                     if (e) std::rethrow_exception(e);
                     end = r;
                   }));
  }
};

}  // namespace

TEST_CASE("polling stops at the check that says done") {
  Poll p;
  p.start(Clock::now() + 30s, 1ms, 3);
  p.ioc.run_for(30s);
  REQUIRE(p.end);
  CHECK(*p.end == util::PollEnd::done);
  CHECK(p.checks == 3);
}

TEST_CASE("polling ends at the deadline after checking at least once, pausing between checks") {
  Poll p;
  const auto start = Clock::now();
  p.start(start + 100ms, 20ms, 0);
  p.ioc.run_for(30s);
  REQUIRE(p.end);
  CHECK(*p.end == util::PollEnd::deadline);
  CHECK(Clock::now() - start >= 100ms);
  CHECK(p.checks >= 2);
  CHECK(p.checks <= 8);  // paused, not busy

  Poll late;
  late.start(Clock::now() - 1s, 20ms, 0);
  late.ioc.run_for(30s);
  REQUIRE(late.end);
  CHECK(*late.end == util::PollEnd::deadline);
  CHECK(late.checks == 1);
}

TEST_CASE("polling ends cancelled when the awaiting coroutine is cancelled during a pause") {
  Poll p;
  asio::cancellation_signal cancel;
  p.start(Clock::now() + 1h, 1h, 0, cancel.slot());
  asio::steady_timer soon(p.ioc, 20ms);
  soon.async_wait([&](boost::system::error_code) { cancel.emit(asio::cancellation_type::terminal); });
  p.ioc.run_for(30s);
  REQUIRE(p.end);
  CHECK(*p.end == util::PollEnd::cancelled);
  CHECK(p.checks == 1);
}
