#include "deploy/model_watcher.hpp"

#include "unit/deploy/fake_units.hpp"

#include "hub/hub.hpp"
#include "http/client.hpp"
#include "store/store.hpp"
#include "units/service_manager.hpp"

#include <catch2/catch.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

using namespace modeld;
using namespace std::chrono_literals;
namespace asio = boost::asio;

using modeld::test::FakeUnits;

namespace {

std::shared_ptr<config::Config> one_model() {
  auto c = std::make_shared<config::Config>();
  config::ModelConfig m;
  m.name = "m";
  m.repo = "acme/m";
  m.serve.port = 1;
  m.serve.served_name = "m";
  m.serve.stop_timeout = 1s;
  m.health.watch_interval = 20ms;
  m.health.watch_failures = 3;
  c->models["m"] = m;
  return c;
}

struct Fixture {
  asio::io_context ioc;
  asio::thread_pool pool{1};
  std::filesystem::path dir;
  store::Store store;
  http::Client client{ioc.get_executor(), {}};
  hub::Hub hub{client, "http://127.0.0.1:1"};
  FakeUnits units;
  deploy::Services services;
  bool healthy = false;  // what the probe answers
  int probes = 0;
  int ready_waits = 0;

  Fixture()
      : dir(std::filesystem::temp_directory_path() / ("watchdog-test-" + std::to_string(::getpid()))),
        store((std::filesystem::create_directories(dir), dir)),
        services{one_model(), store, hub, client, client, units, pool} {}
  ~Fixture() {
    pool.join();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  deploy::ModelWatcher::Options options(std::chrono::milliseconds backoff = 10s) {
    deploy::ModelWatcher::Options o;
    o.backoff_base = backoff;
    o.probe = [this](const config::ModelConfig&) -> asio::awaitable<Result<void>> {
      ++probes;
      if (healthy) co_return Result<void>{};
      co_return make_error(Errc::health_failed, "completion check: POST /v1/completions answered 500: dead");
    };
    o.wait_ready = [this](const config::ModelConfig&, const sys::Fields&) -> asio::awaitable<Result<void>> {
      ++ready_waits;
      co_return Result<void>{};
    };
    return o;
  }

  // Runs the loop until `done` holds, at most `limit`.
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 10s) {
    ioc.restart();
    auto end = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < end) ioc.run_one_for(10ms);
    return done();
  }

  // Runs watchdog.stop() to its end.
  bool stop(deploy::ModelWatcher& w) {
    bool stopped = false;
    asio::co_spawn(ioc, w.stop(), [&](std::exception_ptr) { stopped = true; });
    return run_until([&] { return stopped; });
  }

  deploy::WatchdogStatus status(const deploy::ModelWatcher& w) {
    auto all = w.statuses();
    REQUIRE_FALSE(all.empty());
    return all.front();
  }
};

}  // namespace

TEST_CASE("restarts that follow each other back off: none before the first, then doubling up to the cap") {
  CHECK(deploy::watchdog_backoff(0, 10s, 10min) == 0ms);
  CHECK(deploy::watchdog_backoff(1, 10s, 10min) == 10s);
  CHECK(deploy::watchdog_backoff(2, 10s, 10min) == 20s);
  CHECK(deploy::watchdog_backoff(3, 10s, 10min) == 40s);
  CHECK(deploy::watchdog_backoff(7, 10s, 10min) == 10min);
  CHECK(deploy::watchdog_backoff(1000, 10s, 10min) == 10min);
}

TEST_CASE("watch_failures failed probes in a row get a live unit stopped, started and waited for") {
  Fixture fx;
  fx.units.on_start = [&] { fx.healthy = true; };
  deploy::ModelWatcher w(fx.ioc, fx.services, fx.options());
  w.start("m", false);
  REQUIRE(fx.run_until([&] { return fx.status(w).restarts == 1 && fx.status(w).state == "watching"; }));
  auto s = fx.status(w);
  CHECK(s.model == "m");
  CHECK(s.unit == "modeld-serve@m.service");
  CHECK(s.probe_failures == 3);
  CHECK(s.consecutive_failures == 0);
  REQUIRE(s.last_restart_reason);
  CHECK(s.last_restart_reason->rfind("3 probes in a row failed, the last: completion check", 0) == 0);
  CHECK(s.last_restart_at);
  CHECK(fx.units.calls == std::vector<std::string>{"stop", "reset_failed", "start"});
  CHECK(fx.ready_waits == 1);
  // Healthy again: probes go on, counters stay.
  const int before = fx.probes;
  REQUIRE(fx.run_until([&] { return fx.probes >= before + 2; }));
  s = fx.status(w);
  CHECK(s.last_probe_ok == true);
  CHECK(s.last_probe_at);
  CHECK(s.last_probe_seconds);
  CHECK(s.restarts == 1);
  REQUIRE(fx.stop(w));
  CHECK(fx.status(w).state == "stopped");
  CHECK_FALSE(w.running());
}

TEST_CASE("a second restart soon after the first waits in backoff") {
  Fixture fx;
  deploy::ModelWatcher w(fx.ioc, fx.services, fx.options(1h));
  w.start("m", false);
  REQUIRE(fx.run_until([&] { return fx.status(w).state == "backoff"; }));
  auto s = fx.status(w);
  CHECK(s.restarts == 1);
  CHECK(fx.units.calls == std::vector<std::string>{"stop", "reset_failed", "start"});
  // Stopping in the middle of the backoff restarts nothing more.
  REQUIRE(fx.stop(w));
  CHECK(fx.status(w).state == "stopped");
  CHECK(fx.status(w).restarts == 1);
  CHECK(fx.units.calls.size() == 3);
}

TEST_CASE("a unit that left the active state whose files are not linked any more is not restarted") {
  Fixture fx;
  fx.units.active_state = "inactive";
  deploy::ModelWatcher w(fx.ioc, fx.services, fx.options());
  w.start("m", false);
  REQUIRE(fx.run_until([&] { return !w.running(); }));
  auto s = fx.status(w);
  CHECK(s.state == "stopped");
  CHECK(s.restarts == 0);
  CHECK(fx.units.calls.empty());
}

TEST_CASE("stop() ends a watch that waits for readiness, and a later start watches again") {
  Fixture fx;
  auto o = fx.options();
  bool waiting = false;
  o.wait_ready = [&](const config::ModelConfig&, const sys::Fields&) -> asio::awaitable<Result<void>> {
    waiting = true;
    asio::steady_timer t(co_await asio::this_coro::executor, 1h);
    co_await t.async_wait(asio::use_awaitable);  // throws when cancelled
    co_return Result<void>{};
  };
  deploy::ModelWatcher w(fx.ioc, fx.services, o);
  w.start("m", true);
  CHECK(fx.status(w).state == "restarting");
  REQUIRE(fx.run_until([&] { return waiting; }));
  REQUIRE(fx.stop(w));
  CHECK_FALSE(w.running());
  CHECK(fx.status(w).state == "stopped");
  CHECK(fx.units.calls.empty());
  fx.healthy = true;
  w.start("m", false);
  REQUIRE(fx.run_until([&] { return fx.status(w).last_probe_ok == true; }));
  CHECK(fx.status(w).state == "watching");
  REQUIRE(fx.stop(w));
}
