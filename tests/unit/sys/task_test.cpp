#include "sys/task.hpp"
#include "unit/sys/captured_stderr.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/error.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/system/system_error.hpp>
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

using namespace modeld::sys;
using modeld::sys::test::CapturedStderr;
namespace asio = boost::asio;

namespace {

asio::awaitable<void> returns() { co_return; }

asio::awaitable<void> throws(std::exception_ptr e) {
  std::rethrow_exception(e);
  co_return;
}

// What the stderr sink (verbose) writes while `task` runs to its end with log_failure("the task").
std::string logged_by(asio::awaitable<void> task) {
  CapturedStderr cap;
  init_logging(Sink::stderr_only, true);
  asio::io_context io;
  Fields f;
  f.model = "kimi";
  asio::co_spawn(io, std::move(task), log_failure("the task", f));
  io.run();
  return cap.text();
}

}  // namespace

TEST_CASE("a spawned task that fails is logged at error with its name and fields, one that returns is not") {
  CHECK(logged_by(returns()).empty());
  CHECK(logged_by(throws(std::make_exception_ptr(std::runtime_error("disk on fire")))) ==
        "ERROR [kimi] the task failed: disk on fire\n");
  CHECK(logged_by(throws(std::make_exception_ptr(42))) ==
        "ERROR [kimi] the task failed: an exception that is not a std::exception\n");
}

TEST_CASE("a spawned task ended by cancellation is logged at debug only") {
  const auto aborted = std::make_exception_ptr(boost::system::system_error(asio::error::operation_aborted));
  const auto text = logged_by(throws(aborted));
  CHECK_THAT(text, Catch::StartsWith("DEBUG [kimi] the task ended by cancellation: "));
  const auto refused = std::make_exception_ptr(boost::system::system_error(asio::error::connection_refused));
  CHECK_THAT(logged_by(throws(refused)), Catch::StartsWith("ERROR [kimi] the task failed: "));
}
