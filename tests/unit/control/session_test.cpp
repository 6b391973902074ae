// The request loop the control server and the metrics listener share (control/session.hpp),
// driven with callables instead of a socket.

#include "control/session.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>

#include <exception>
#include <stdexcept>

namespace asio = boost::asio;
namespace http = boost::beast::http;
using modeld::control::detail::serve_requests;

namespace {

// What one run of serve_requests did.
struct Tally {
  int reads = 0;
  int answers = 0;
  int leaves = 0;
  bool stopped = false;
};

// Runs serve_requests to its end: reads succeed `reads_ok` times, answers while `answers_ok` say
// so; `stop_after` answers set the owner stopped; a read past `throw_at` throws.
Tally run(int reads_ok, int answers_ok, int stop_after = 1000, int throw_at = 1000) {
  Tally t;
  asio::io_context ioc;
  std::exception_ptr thrown;
  auto loop = serve_requests(
      1024, [&] { return t.stopped; },
      [&](boost::beast::flat_buffer&, http::request_parser<http::string_body>&) -> asio::awaitable<bool> {
        if (++t.reads > throw_at) throw std::runtime_error("read failed");
        co_return t.reads <= reads_ok;
      },
      [&](http::request<http::string_body>&) -> asio::awaitable<bool> {
        ++t.answers;
        if (t.answers >= stop_after) t.stopped = true;
        co_return t.answers <= answers_ok;
      },
      [&] { ++t.leaves; });
  asio::co_spawn(ioc, std::move(loop), [&](std::exception_ptr e) { thrown = e; });
  ioc.run();
  CHECK((thrown != nullptr) == (throw_at < 1000));
  return t;
}

}  // namespace

TEST_CASE("the request loop answers each request read until a read ends the connection") {
  auto t = run(3, 1000);
  CHECK(t.reads == 4);
  CHECK(t.answers == 3);
  CHECK(t.leaves == 1);
}

TEST_CASE("the request loop ends when an answer says the connection ends") {
  auto t = run(1000, 2);
  CHECK(t.reads == 3);
  CHECK(t.answers == 3);
  CHECK(t.leaves == 1);
}

TEST_CASE("the request loop reads nothing more once its owner stops") {
  auto t = run(1000, 1000, 2);
  CHECK(t.reads == 2);
  CHECK(t.answers == 2);
  CHECK(t.leaves == 1);
}

TEST_CASE("the request loop leaves the connection also when a read throws") {
  auto t = run(1000, 1000, 1000, 1);
  CHECK(t.reads == 2);
  CHECK(t.answers == 1);
  CHECK(t.leaves == 1);
}
